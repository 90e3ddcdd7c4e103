"""Output heads: what a model puts on the hidden states of its Transformer stack, one module per kind
of prediction. Each returns float32; the losses that go with them are in lm/losses.py.

  LMHead            (B, T, D) -> (B, T, V) token logits: the token table's transpose (tied) or its own kernel
  PooledClassifier  (B, T, D) -> (B, K): the [CLS] token (position 0) or the mean over the real positions,
                    [a tanh dense "pooler" (BERT)], then a dense to the classes (ViT, sentence classification)
  TokenTagger       (B, T, D) -> (B, T, K): a dense per position (token classification, e.g. tagging)
  SpanHead          (B, T, D) -> start and end logits (B, T) each, MASKED_LOGIT where mask is False (span extraction)
  RegressionHead    (B, D) -> (B,): a dense to one value (e.g. sentence-pair similarity)

LMHead and PooledClassifier take a softcap (model.logit_softcap): logits z -> softcap * tanh(z / softcap), 0: none.

A model that must keep the parameter names it had before its head became a module calls
`nn.share_scope(self, head)`: the head's parameters then sit in the model's scope under their own
names (GPT's `lm_head`, ViT's `head`), as they always did, so old checkpoints load.
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.attention import capped
from lm.layers.embedding import TokenEmbedding
from lm.layers.linear import Linear
from lm.layers.partitioning import constrain

POOLS = ("cls", "mean")
MASKED_LOGIT = float(jnp.finfo(jnp.float32).min)  # finite, so a softmax over positions gives exactly 0 there


def pool(x: jax.Array, kind: str, mask: jax.Array | None = None) -> jax.Array:
    """(B, T, D) -> (B, D): x[:, 0] for "cls"; for "mean" the mean over the positions where mask (B, T)
    is True (all positions when mask is None)."""
    if kind not in POOLS:
        raise ValueError(f"pool {kind!r}: use one of {POOLS}")
    if kind == "cls":
        return x[:, 0]
    if mask is None:
        return jnp.mean(x, axis=1)
    weights = mask.astype(x.dtype)[..., None]  # (B, T, 1)
    return jnp.sum(x * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1)


def head_dense(in_dim: int, out_dim: int, dtype: Any, kernel_init: Callable, name: str) -> Linear:
    """An in_dim -> out_dim Linear with bias, from the residual stream ('embed') to an unsharded output."""
    return Linear((in_dim,), (out_dim,), ("embed", None), dtype=dtype, kernel_init=kernel_init, name=name)


class LMHead(nn.Module):
    """hidden (B, L, D) -> logits (B, L, vocab_size) float32, as one (B*L, D) x (D, V) matmul.

    embedding given (tied): the token table's attend, h . E^T; else a bias-free kernel 'lm_head' (D, V)
    of padded_vocab_size columns. The padding rows are cut off, so they never compete in a softmax.
    multiplier: the logits times it (μP's readout multiplier base_width / width; 1: none), before the softcap.
    softcap > 0: the logits capped to softcap * tanh(z / softcap).
    """

    vocab_size: int
    padded_vocab_size: int
    embedding: TokenEmbedding | None = None
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)
    softcap: float = 0.0
    multiplier: float = 1.0

    @nn.compact
    def __call__(self, hidden: jax.Array) -> jax.Array:
        embed_dim = hidden.shape[-1]
        if self.embedding is not None:
            project = self.embedding.attend  # (N, D) -> (N, V padded)
        else:
            project = Linear((embed_dim,), (self.padded_vocab_size,), ("embed", "vocab"), use_bias=False,
                             dtype=self.dtype, kernel_init=self.kernel_init, name="lm_head")
        logits = project(hidden.reshape(-1, embed_dim)).reshape(*hidden.shape[:-1], -1)
        logits = constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))[..., : self.vocab_size]
        if self.multiplier != 1:
            logits = logits * self.multiplier
        return capped(logits, self.softcap)


class PooledClassifier(nn.Module):
    """hidden (B, T, D) [, mask (B, T)] -> class logits (B, num_classes) float32.

    pooled = pool(hidden, pool, mask); with pooler (BERT), pooled = tanh(W_p pooled + b_p) ('pooler',
    D -> D); logits = W pooled + b ('head'). kernel_init: of both (zeros for a ViT's head, as big_vision).
    multiplier: the logits times it (μP's readout multiplier; 1: none), before the softcap. softcap > 0: the
    logits capped to softcap * tanh(z / softcap).
    """

    num_classes: int
    pool: str = "cls"
    pooler: bool = False
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)
    softcap: float = 0.0
    multiplier: float = 1.0

    @nn.compact
    def __call__(self, hidden: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        embed_dim = hidden.shape[-1]
        pooled = pool(hidden, self.pool, mask)  # (B, D)
        if self.pooler:
            pooled = jnp.tanh(head_dense(embed_dim, embed_dim, self.dtype, self.kernel_init, "pooler")(pooled))
        logits = head_dense(embed_dim, self.num_classes, self.dtype, self.kernel_init, "head")(pooled).astype(
            jnp.float32)
        if self.multiplier != 1:
            logits = logits * self.multiplier
        return capped(logits, self.softcap)  # (B, K)


class TokenTagger(nn.Module):
    """hidden (B, T, D) -> per-position tag logits (B, T, num_tags) float32."""

    num_tags: int
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, hidden: jax.Array) -> jax.Array:
        return head_dense(hidden.shape[-1], self.num_tags, self.dtype, self.kernel_init, "tagger")(hidden).astype(
            jnp.float32)


class SpanHead(nn.Module):
    """hidden (B, T, D), mask (B, T) bool (True where a span may start or end) -> (start, end) logits,
    (B, T) float32 each, from one D -> 2 dense; MASKED_LOGIT where mask is False."""

    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, hidden: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = head_dense(hidden.shape[-1], 2, self.dtype, self.kernel_init, "span")(hidden).astype(jnp.float32)
        logits = jnp.where(mask[..., None], logits, MASKED_LOGIT)  # (B, T, 2)
        return logits[..., 0], logits[..., 1]


class RegressionHead(nn.Module):
    """pooled (B, D) -> one value per row (B,) float32."""

    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, pooled: jax.Array) -> jax.Array:
        return head_dense(pooled.shape[-1], 1, self.dtype, self.kernel_init, "regression")(pooled)[..., 0].astype(
            jnp.float32)
