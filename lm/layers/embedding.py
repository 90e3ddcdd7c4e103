"""Token embeddings plus position tables: the input layer of every Transformer model."""

import math

import flax.linen as nn
import jax

from lm.layers.partitioning import constrain, param_init
from lm.layers.positions import PositionEmbedding
from lm.layers.transformer import TransformerConfig


def embed(tokens: jax.Array, positions: jax.Array, vocab_size: int, max_length: int, cfg: TransformerConfig,
          scale: bool, train: bool) -> tuple[jax.Array, nn.Embed]:
    """tokens (B, L), positions (L,) -> (B, L, D) token embedding [* sqrt(D)] + position table, with
    dropout; and the token table (the decoder's output layer reuses it). Call inside a compact method.
    The scale keeps the tokens from drowning in a fixed sinusoidal table of amplitude 1 when the
    embeddings start small (N(0, 1/sqrt(D)) with the xavier scheme)."""
    table = nn.Embed(vocab_size, cfg.embed_dim, dtype=cfg.dtype,
                     embedding_init=param_init(cfg.inits.embedding, ("vocab", "embed")), name="token_embed")
    position_table = PositionEmbedding(cfg.position, max_length, cfg.embed_dim, cfg.inits.embedding,
                                       name="position_embed")(positions)
    x = table(tokens) * (math.sqrt(cfg.embed_dim) if scale else 1.0) + position_table[None].astype(cfg.dtype)
    x = nn.Dropout(cfg.dropout, deterministic=not train)(x)
    return constrain(x, ("batch", "length", "embed")), table
