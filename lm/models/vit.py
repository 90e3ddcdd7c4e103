"""ViT: a Vision Transformer classifier (Dosovitskiy et al. 2020) from the shared blocks.

images (B, H, W, C) -> non-overlapping P x P patches (B, N, P*P*C), N = (H/P) * (W/P)
    -> linear patch embedding (B, N, D) [+ position table] [, a learned [CLS] token in front]
    -> TransformerStack (unmasked, bidirectional; its final norm for pre-norm)
    -> pool: the [CLS] token's output, or the mean over the patch tokens (global average pooling)
    -> classifier head -> logits (B, num_classes).

Positions (`position`):
  learned   a trained (N, D) table added to the patch embeddings (the [CLS] token gets none)
  sincos2d  a fixed 2-D sin-cos table over the patch grid (lm/layers/positions.py sincos_2d_table)
  sinusoidal  the 1-D sin-cos table over the patch index (row-major)
  rope, alibi applied inside attention over the token index ([CLS] at 0)
  none      nothing: the model is then invariant to the order of the patches when pooling is 'gap'
Every other TransformerConfig switch (norm, norm_position, mlp, MoE, init, dropout, dtype) applies.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.errors import UserError
from lm.layers import Linear, constrain, param_init
from lm.layers.heads import PooledClassifier
from lm.layers.positions import ATTENTION_KINDS, sincos_2d_table, sinusoidal_table
from lm.layers.transformer import TransformerConfig, TransformerStack

HEAD_POOLS = {"cls": "cls", "gap": "mean"}  # model.pool -> the pooling of lm/layers/heads.py
POOLS = tuple(HEAD_POOLS)
VIT_POSITIONS = ("learned", "sincos2d", "sinusoidal", "none") + ATTENTION_KINDS


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    transformer: TransformerConfig  # its `position` is only used for rope/alibi; see stack_position
    num_classes: int = 10
    image_size: int = 32
    channels: int = 3
    patch_size: int = 4
    pool: str = "gap"  # cls | gap
    position: str = "sincos2d"  # see VIT_POSITIONS

    def __post_init__(self):
        if self.pool not in POOLS:
            raise UserError(f"model.pool={self.pool!r}: use one of {POOLS}")
        if self.position not in VIT_POSITIONS:
            raise UserError(f"model.position={self.position!r}: a ViT takes one of {VIT_POSITIONS}")
        if self.patch_size < 1 or self.image_size % self.patch_size:
            raise UserError(f"model.patch_size={self.patch_size} does not divide the image size {self.image_size}")
        if self.position == "sincos2d" and self.transformer.embed_dim % 4:
            raise UserError(f"sincos2d positions need model.embed_dim divisible by 4, got {self.transformer.embed_dim}")
        if self.position == "sinusoidal" and self.transformer.embed_dim % 2:
            raise UserError(f"sinusoidal positions need an even model.embed_dim, got {self.transformer.embed_dim}")
        if self.transformer.position != stack_position(self.position):
            raise ValueError(f"transformer.position must be {stack_position(self.position)!r} for a ViT with "
                             f"position {self.position!r}")

    @property
    def grid_size(self) -> int:  # patches per side
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size**2

    @property
    def num_tokens(self) -> int:  # the sequence length the encoder sees
        return self.num_patches + (self.pool == "cls")


def stack_position(position: str) -> str:
    """The TransformerConfig position for a ViT position: rope/alibi act in attention, the rest are
    added to the patch embeddings here, so the stack sees 'none'."""
    return position if position in ATTENTION_KINDS else "none"


def patchify(images: jax.Array, patch_size: int) -> jax.Array:
    """(B, H, W, C) -> (B, N, P*P*C), patches in row-major grid order, each flattened (row, col, channel)."""
    batch, height, width, channels = images.shape
    p = patch_size
    x = images.reshape(batch, height // p, p, width // p, p, channels)  # (B, H/P, P, W/P, P, C)
    x = x.transpose(0, 1, 3, 2, 4, 5)  # (B, H/P, W/P, P, P, C)
    return x.reshape(batch, (height // p) * (width // p), p * p * channels)


def unpatchify(patches: jax.Array, patch_size: int, image_size: int) -> jax.Array:
    """The inverse of patchify: (B, N, P*P*C) -> (B, H, W, C) for square images."""
    batch, _, flat = patches.shape
    p, grid = patch_size, image_size // patch_size
    channels = flat // (p * p)
    x = patches.reshape(batch, grid, grid, p, p, channels).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(batch, image_size, image_size, channels)


class PatchEmbedding(nn.Module):
    """images (B, H, W, C) -> patch embeddings (B, N, D): one Linear over each flattened patch
    (the same as a P x P convolution with stride P)."""

    patch_size: int
    embed_dim: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        patches = patchify(images, self.patch_size)  # (B, N, P*P*C)
        x = Linear((patches.shape[-1],), (self.embed_dim,), (None, "embed"), dtype=self.dtype,
                   kernel_init=nn.initializers.lecun_normal(), name="projection")(patches)
        return constrain(x, ("batch", "length", "embed"))  # (B, N, D)


class ViT(nn.Module):
    """Call with images (B, H, W, C) float (normalised) -> logits (B, num_classes) float32."""

    config: ViTConfig

    @nn.compact
    def __call__(self, images: jax.Array, train: bool = False, capture_weights: bool = False) -> jax.Array:
        cfg = self.config
        blocks = cfg.transformer
        dim = blocks.embed_dim
        x = PatchEmbedding(cfg.patch_size, dim, blocks.dtype, name="patch_embed")(images)  # (B, N, D)
        x = x + self._position_table()[None].astype(blocks.dtype)
        if cfg.pool == "cls":
            cls = self.param("cls", param_init(nn.initializers.zeros, (None, None, "embed")), (1, 1, dim), jnp.float32)
            x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (x.shape[0], 1, dim)), x], axis=1)  # (B, 1+N, D)
        x = nn.Dropout(blocks.dropout, deterministic=not train)(x)
        x = constrain(x, ("batch", "length", "embed"))
        x = TransformerStack(blocks, causal=False, name="encoder")(
            x, positions=jnp.arange(x.shape[1]), train=train, capture_weights=capture_weights
        )  # (B, T, D)
        classifier = PooledClassifier(cfg.num_classes, HEAD_POOLS[cfg.pool], dtype=blocks.dtype,
                                      kernel_init=nn.initializers.zeros, softcap=blocks.logit_softcap,
                                      multiplier=blocks.width_ratio, name="classifier")  # zero init, as big_vision
        nn.share_scope(self, classifier)  # its dense stays the ViT's 'head', as in older checkpoints
        return classifier(x)  # (B, num_classes)

    def _position_table(self) -> jax.Array:
        """(N, D) added to the patch embeddings (zeros for none/rope/alibi)."""
        cfg = self.config
        n, dim = cfg.num_patches, cfg.transformer.embed_dim
        if cfg.position == "learned":
            init = param_init(nn.initializers.normal(0.02), (None, "embed"))
            return self.param("position_embed", init, (n, dim), jnp.float32)
        if cfg.position == "sincos2d":
            return sincos_2d_table(cfg.grid_size, cfg.grid_size, dim)
        if cfg.position == "sinusoidal":
            return sinusoidal_table(jnp.arange(n), dim)
        return jnp.zeros((n, dim), jnp.float32)


def flops_per_image(config: ViTConfig, active_params: int) -> float:
    """Training FLOPs per image (forward + backward): 6 N per token for the matmuls (N: the active
    parameters less the position table, the [CLS] token and the head, which runs once per image)
    + 12 L T D per token for attention scores and values, T = num_tokens."""
    blocks, tokens = config.transformer, config.num_tokens
    dim = blocks.embed_dim
    head = dim * config.num_classes + config.num_classes
    per_token = active_params - head - (config.num_patches * dim if config.position == "learned" else 0)
    per_token -= dim if config.pool == "cls" else 0
    return tokens * (6 * per_token + 12 * blocks.num_layers * tokens * dim) + 6 * head
