"""GPT: a decoder-only Transformer language model.

tokens (B, T) -> token + learned position embedding -> num_layers x Block -> [final norm] -> logits
(B, T, V). Blocks are pre-norm (x + f(norm(x)), with a final norm) or post-norm
(norm(x + f(x)), the 2017 original, no final norm). GPT-2 initialisation: N(0, 0.02) weights,
residual output projections scaled by 1/sqrt(2 * num_layers).
"""

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.errors import UserError
from lm.layers import Linear, Mlp, MultiHeadAttention, Norm, constrain, param_init

NORM_POSITIONS = ("pre", "post")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    context_length: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    embed_dim: int
    mlp_ratio: int = 4
    dropout: float = 0.0
    norm_position: str = "pre"
    tie_embeddings: bool = True
    use_bias: bool = True
    compute_dtype: Any = jnp.float32
    vocab_multiple: int = 64  # embedding rows are padded to a multiple, so 'vocab' can be sharded

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def __post_init__(self):
        if self.norm_position not in NORM_POSITIONS:
            raise UserError(f"model.norm_position={self.norm_position!r}: use one of {NORM_POSITIONS}")
        if self.embed_dim % self.num_heads:
            raise UserError(
                f"model.embed_dim={self.embed_dim} is not divisible by model.num_heads={self.num_heads}"
            )


class Block(nn.Module):
    config: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array, train: bool, cache_index: jax.Array | None) -> jax.Array:
        cfg = self.config
        residual_init = nn.initializers.normal(0.02 / math.sqrt(2 * cfg.num_layers))
        attention = MultiHeadAttention(
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.embed_dim // cfg.num_heads,
            causal=True,
            use_bias=cfg.use_bias,
            dtype=cfg.compute_dtype,
            out_kernel_init=residual_init,
            name="attention",
        )
        mlp = Mlp(
            hidden_dim=cfg.mlp_ratio * cfg.embed_dim,
            use_bias=cfg.use_bias,
            dtype=cfg.compute_dtype,
            out_kernel_init=residual_init,
            name="mlp",
        )
        dropout = nn.Dropout(cfg.dropout, deterministic=not train)
        norm_attention = Norm(dtype=cfg.compute_dtype, name="norm_attention")
        norm_mlp = Norm(dtype=cfg.compute_dtype, name="norm_mlp")

        if cfg.norm_position == "pre":
            x = x + dropout(attention(norm_attention(x), cache_index))
            x = x + dropout(mlp(norm_mlp(x)))
        else:
            x = norm_attention(x + dropout(attention(x, cache_index)))
            x = norm_mlp(x + dropout(mlp(x)))
        return constrain(x, ("batch", "length", "embed"))


class GPT(nn.Module):
    """Call with tokens (B, T) int32. With decode=True, reads and advances the KV cache."""

    config: GPTConfig

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool = False, decode: bool = False) -> jax.Array:
        cfg = self.config
        length = tokens.shape[1]
        token_embed = nn.Embed(
            cfg.padded_vocab_size,
            cfg.embed_dim,
            dtype=cfg.compute_dtype,
            embedding_init=param_init(nn.initializers.normal(0.02), ("vocab", "embed")),
            name="token_embed",
        )
        position_embed = nn.Embed(
            cfg.context_length,
            cfg.embed_dim,
            dtype=cfg.compute_dtype,
            embedding_init=param_init(nn.initializers.normal(0.02), (None, "embed")),
            name="position_embed",
        )

        cache_index = None
        positions = jnp.arange(length)
        if decode:
            index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
            cache_index = index.value
            positions = cache_index + positions
            if not self.is_initializing():
                index.value = cache_index + length

        x = token_embed(tokens) + position_embed(positions)[None]  # (B, T, D)
        x = nn.Dropout(cfg.dropout, deterministic=not train)(x)
        x = constrain(x, ("batch", "length", "embed"))
        for i in range(cfg.num_layers):
            x = Block(cfg, name=f"block_{i}")(x, train, cache_index)
        if cfg.norm_position == "pre":
            x = Norm(dtype=cfg.compute_dtype, name="norm_final")(x)

        if cfg.tie_embeddings:
            logits = token_embed.attend(x.reshape(-1, cfg.embed_dim)).reshape(*x.shape[:-1], -1)  # (B, T, V)
        else:
            logits = Linear(
                (cfg.embed_dim,),
                (cfg.padded_vocab_size,),
                ("embed", "vocab"),
                use_bias=False,
                dtype=cfg.compute_dtype,
                name="lm_head",
            )(x)
        logits = constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))
        return logits[..., : cfg.vocab_size]  # (B, T, V): padding rows never compete


def flops_per_token(config: GPTConfig, num_params: int) -> float:
    """Training FLOPs per token (forward + backward): 6 N for the matmuls + 12 L T D for attention.

    N counts every parameter that multiplies an activation: it leaves out the position table,
    and the token table too unless it doubles as the (tied) output layer.
    """
    matmul_params = num_params - config.context_length * config.embed_dim
    if not config.tie_embeddings:
        matmul_params -= config.padded_vocab_size * config.embed_dim
    attention = 12 * config.num_layers * config.context_length * config.embed_dim
    return 6 * matmul_params + attention
