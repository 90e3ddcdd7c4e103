"""Token embeddings plus position tables: the input layer of every Transformer model.

The token table is looked up in float32 and the rows cast to the compute dtype afterwards. Casting
the table first (what `nn.Embed(dtype=bfloat16)` does) makes the lookup's gradient a bfloat16
scatter-add into the (V, D) table: on a GPU, many tokens of a small vocabulary land on the same rows,
and XLA:GPU runs such bf16 scatters very slowly (2.5x slower steps than fp32 for the character-level
GPT on an H100). Looked up in float32, the gradient is a float32 scatter-add.
"""

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.partitioning import constrain, param_init, take_rows
from lm.layers.positions import PositionEmbedding
from lm.layers.transformer import TransformerConfig


class TokenEmbedding(nn.Module):
    """A (num_embeddings, features) float32 table ('embedding', as nn.Embed names it, so checkpoints
    of either load): ids (...) -> rows (..., features) in dtype; attend(x) is the tied output layer."""

    num_embeddings: int
    features: int
    dtype: Any = jnp.float32  # compute dtype of the rows and of attend
    embedding_init: Callable = nn.initializers.normal(1.0)

    def setup(self):
        self.embedding = self.param("embedding", self.embedding_init, (self.num_embeddings, self.features),
                                    jnp.float32)

    def __call__(self, ids: jax.Array) -> jax.Array:
        return take_rows(self.embedding, ids).astype(self.dtype)  # float32 gather, then cast

    def attend(self, query: jax.Array) -> jax.Array:
        """query (..., features) -> (..., num_embeddings) logits, a matmul in dtype."""
        return jnp.dot(query.astype(self.dtype), self.embedding.astype(self.dtype).T)


def embed(tokens: jax.Array, positions: jax.Array, vocab_size: int, max_length: int, cfg: TransformerConfig,
          scale: bool, train: bool) -> tuple[jax.Array, TokenEmbedding]:
    """tokens (B, L), positions (L,) or per row (B, L) -> (B, L, D) token embedding [* sqrt(D)] + position
    table, with dropout; and the token table (the decoder's output layer reuses it). Call inside a compact method.
    The scale keeps the tokens from drowning in a fixed sinusoidal table of amplitude 1 when the
    embeddings start small (N(0, 1/sqrt(D)) with the xavier scheme); under μP it is sqrt(mup_base_width), what it
    is at the base width, as the embeddings' initialisation is."""
    table = TokenEmbedding(vocab_size, cfg.embed_dim, dtype=cfg.dtype,
                           embedding_init=param_init(cfg.inits.embedding, ("vocab", "embed")), name="token_embed")
    position_table = PositionEmbedding(cfg.position, max_length, cfg.embed_dim, cfg.inits.embedding,
                                       name="position_embed")(positions)
    multiplier = math.sqrt(cfg.mup_base_width if cfg.mup else cfg.embed_dim) if scale else 1.0
    x = table(tokens) * multiplier + position_table.astype(cfg.dtype)
    x = nn.Dropout(cfg.dropout, deterministic=not train)(x)
    return constrain(x, ("batch", "length", "embed")), table
