"""GPT: a decoder-only Transformer language model.

tokens (B, T) -> token embedding [x sqrt(D)] [+ position table] -> TransformerStack (causal) -> logits (B, T, V).
Every block option (norm, MLP, positions, MoE, init, ...) comes from the TransformerConfig; see
lm/layers/transformer.py.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers import Linear, constrain
from lm.layers.embedding import embed
from lm.layers.transformer import TransformerConfig, TransformerStack


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    context_length: int  # the training length; the learned position table has this many rows
    transformer: TransformerConfig
    tie_embeddings: bool = True
    vocab_multiple: int = 64  # embedding rows are padded to a multiple, so 'vocab' can be sharded
    scale_embeddings: bool = False  # token embeddings times sqrt(D) (Vaswani et al. 3.4), e.g. for sinusoids

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple


class GPT(nn.Module):
    """Call with tokens (B, T) int32. With decode=True, reads and advances the KV cache."""

    config: GPTConfig

    @nn.compact
    def __call__(
        self, tokens: jax.Array, train: bool = False, decode: bool = False, capture_weights: bool = False
    ) -> jax.Array:
        cfg = self.config
        blocks = cfg.transformer
        embed_dim = blocks.embed_dim
        cache_index = None
        positions = jnp.arange(tokens.shape[1])
        if decode:
            index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
            cache_index = index.value
            positions = cache_index + positions
            if not self.is_initializing():
                index.value = cache_index + tokens.shape[1]

        x, token_embed = embed(tokens, positions, cfg.padded_vocab_size, cfg.context_length, blocks,
                               cfg.scale_embeddings, train)  # (B, T, D)
        x = TransformerStack(blocks, causal=True, name="decoder")(
            x, positions=positions, cache_index=cache_index, train=train, capture_weights=capture_weights
        )

        if cfg.tie_embeddings:
            logits = token_embed.attend(x.reshape(-1, embed_dim)).reshape(*x.shape[:-1], -1)  # (B, T, V)
        else:
            logits = Linear(
                (embed_dim,),
                (cfg.padded_vocab_size,),
                ("embed", "vocab"),
                use_bias=False,
                dtype=blocks.dtype,
                kernel_init=blocks.inits.dense,
                name="lm_head",
            )(x)
        logits = constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))
        return logits[..., : cfg.vocab_size]  # (B, T, V): padding rows never compete


def flops_per_token(config: GPTConfig, active_params: int) -> float:
    """Training FLOPs per token (forward + backward): 6 N for the matmuls + 12 L T D for attention.

    N counts the parameters a token multiplies with (active_params: one token uses top_k of each
    mixture-of-experts layer's experts): it leaves out the position table, and the token table too
    unless it doubles as the (tied) output layer.
    """
    blocks = config.transformer
    matmul_params = active_params
    if blocks.position == "learned":
        matmul_params -= config.context_length * blocks.embed_dim
    if not config.tie_embeddings:
        matmul_params -= config.padded_vocab_size * blocks.embed_dim
    attention = 12 * blocks.num_layers * config.context_length * blocks.embed_dim
    return 6 * matmul_params + attention
