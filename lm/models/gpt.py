"""GPT: a decoder-only Transformer language model.

tokens (B, T) -> token embedding [x sqrt(D)] [+ position table] -> TransformerStack (causal) -> logits (B, T, V).
Every block option (norm, MLP, positions, MoE, init, ...) comes from the TransformerConfig; see
lm/layers/transformer.py.

Given logit_positions (N, c), N chunks of c indices into the B * T positions (b * T + t), with their targets
(N, c) and logits_reduce, the model returns logits_reduce(logits (c, V), targets (c,)) of each chunk, stacked: the
vocabulary-wide head is computed for those positions alone, not for all B * T, in a scan over the chunks, so one
chunk's logits exist at a time (scoring continuations, lm/eval/scoring.py: a CPU spends more on a large logits
buffer than on the matmul that fills it).

Given targets, the model returns the per-token cross-entropy (B, T) instead of the logits (or, given
logits_reduce, logits_reduce(logits, targets): any tree of (B, T) arrays, e.g. the cross-entropy beside the
logsumexp that a z-loss needs). With loss_chunk = c > 0 it computes it c positions at a time, recomputing
each chunk's logits in the backward pass, so the (B, T, V) logits (3.3 GB in float32 for GPT-2 at batch 16)
never exist at once. loss_chunk = -1 (AUTO_CHUNK) derives c from the row's length and the vocabulary
(derived_loss_chunk): chunks of at most 2^24 logits a row (256 positions for GPT-2's 1024 x 50304), and no
chunking where a whole row's logits fit that (a character-level model's).

Rows of packed documents (lm/data/packing.py) come with segment_ids (B, T) and positions (B, T): a
token attends only to the earlier tokens of its own document, and its position (for the learned table
and RoPE) counts from the document's start, so each document's logits are those it has alone. An
attention_mask (B, 1, T, T) (True: the query may see the key) narrows that further, e.g. to documents that share
one context and branch after it (lm/eval/scoring.py: each choice sees the context and its own tokens).

With model.context_parallel=ring_zigzag on a mesh with a context axis, the model puts the tokens, their positions,
segment ids and targets in the zig-zag order (lm.layers.attention.context_order) before the Transformer, so that
the context axis splits them in balanced chunks, and its per-token outputs back in the row's order after it.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lm.errors import UserError
from lm.layers.attention import context_order
from lm.layers.embedding import embed
from lm.layers.heads import LMHead
from lm.layers.partitioning import constrain
from lm.layers.transformer import TransformerConfig, TransformerStack
from lm.losses import cross_entropy


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    context_length: int  # the training length; the learned position table has this many rows
    transformer: TransformerConfig
    tie_embeddings: bool = True
    vocab_multiple: int = 64  # embedding rows are padded to a multiple, so 'vocab' can be sharded
    scale_embeddings: bool = False  # token embeddings times sqrt(D) (Vaswani et al. 3.4), e.g. for sinusoids
    loss_chunk: int = 0  # positions per chunk of the cross-entropy given targets; 0: all logits at once; -1: derived

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple


class GPT(nn.Module):
    """Call with tokens (B, T) int32 -> logits (B, T, V); with targets (B, T) -> per-token
    cross-entropy (B, T), or logits_reduce(logits, targets) (a tree of (B, T) arrays). Packed rows:
    segment_ids (B, T) (1, 2, ... per document, 0 padding) and positions (B, T) (restarting at 0 per
    document), both or neither. With decode=True, reads and
    advances the KV cache (rows of one sequence each: no segment ids). With logit_positions (N, c),
    targets (N, c) and logits_reduce: the logits of those positions only, reduced chunk by chunk (module
    docstring). attention_mask (B, 1, T, T), True where a query may see a key: combined with the causal and
    segment masks."""

    config: GPTConfig

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        train: bool = False,
        decode: bool = False,
        capture_weights: bool = False,
        targets: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        logit_positions: jax.Array | None = None,
        logits_reduce: Callable[[jax.Array, jax.Array], Any] | None = None,
        attention_mask: jax.Array | None = None,
    ) -> jax.Array:
        cfg = self.config
        blocks = cfg.transformer
        if (segment_ids is None) != (positions is None) or (decode and segment_ids is not None):
            raise ValueError("packed rows take both segment_ids and positions, and are not for decoding")
        cache_index = None
        if positions is None:
            positions = jnp.arange(tokens.shape[1])
        if decode:
            index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
            cache_index = index.value
            positions = cache_index + positions
            if not self.is_initializing():
                index.value = cache_index + tokens.shape[1]

        order = None if decode else context_order(tokens.shape[1], blocks.context_parallel)
        if order is not None:  # the zig-zag layout of the context axis (module docstring)
            tokens, positions = tokens[:, order], positions[..., order]
            segment_ids = None if segment_ids is None else segment_ids[:, order]
            length = tokens.shape[1]
            if logit_positions is not None:  # b * T + t, row b's token t, is now at b * T + (the place of t)
                logit_positions = logit_positions // length * length + jnp.asarray(np.argsort(order))[
                    logit_positions % length]
            elif targets is not None:
                targets = targets[:, order]
        x, token_embed = embed(tokens, positions, cfg.padded_vocab_size, cfg.context_length, blocks,
                               cfg.scale_embeddings, train)  # (B, T, D)
        x = TransformerStack(blocks, causal=True, name="decoder")(
            x, mask=attention_mask, positions=positions, segment_ids=segment_ids, cache_index=cache_index,
            train=train, capture_weights=capture_weights,
        )

        head = LMHead(cfg.vocab_size, cfg.padded_vocab_size, token_embed if cfg.tie_embeddings else None,
                      blocks.dtype, blocks.inits.readout, blocks.logit_softcap, blocks.width_ratio, name="head")
        nn.share_scope(self, head)  # an untied kernel stays GPT's 'lm_head', as in older checkpoints

        if logit_positions is not None:
            chosen = jnp.take(x.reshape(-1, x.shape[-1]), logit_positions, axis=0)  # (N, c, D)
            return self._reduced_logits(chosen, targets, head, logits_reduce)
        if targets is None:
            return in_row_order(head(x), order)
        per_token = logits_reduce or cross_entropy
        chunk = (derived_loss_chunk(x.shape[1], cfg.padded_vocab_size) if cfg.loss_chunk == AUTO_CHUNK
                 else cfg.loss_chunk)
        if not chunk:
            return in_row_order(per_token(head(x), targets), order)
        return in_row_order(self._chunked_per_token(x, targets, head, per_token, chunk), order)

    def _reduced_logits(self, hidden: jax.Array, targets: jax.Array, head: LMHead,
                        reduce: Callable[[jax.Array, jax.Array], Any]) -> Any:
        """hidden (N, c, D), targets (N, c) -> reduce(logits (c, V), targets (c,)) of each chunk, stacked along a
        leading N: a scan over the chunks, each chunk's c positions the head's batch of c rows of one position."""

        def body(module, carry, inputs):
            h, y = inputs  # (c, D), (c,)
            return carry, reduce(head(h[:, None])[:, 0], y)

        scan = nn.scan(body, variable_broadcast="params", split_rngs={"params": False})
        return scan(self, None, (hidden, targets))[1]

    def _chunked_per_token(self, x: jax.Array, targets: jax.Array, head: LMHead,
                           per_token: Callable[[jax.Array, jax.Array], Any], chunk: int) -> Any:
        """x (B, T, D), targets (B, T) -> per_token(logits, targets) (a tree of (B, T) arrays), chunk
        positions at a time (a scan over the T / c chunks; each chunk's logits are recomputed in the backward
        pass rather than kept)."""
        batch, length, embed_dim = x.shape
        if length % chunk:
            raise UserError(f"model.loss_chunk={chunk} does not divide the sequence length {length}; "
                            "pick a divisor of data.context_length, or 0 for no chunking")

        def by_chunk(a: jax.Array) -> jax.Array:  # (B, T, ...) -> (T / c, B, c, ...): batch sharding kept
            return a.reshape(batch, length // chunk, chunk, *a.shape[2:]).swapaxes(0, 1)

        def body(module, carry, inputs):
            h, y = inputs  # (B, c, D), (B, c)
            return carry, per_token(head(h), y)

        scan = nn.scan(nn.remat(body, prevent_cse=False), variable_broadcast="params", split_rngs={"params": False})
        _, chunked = scan(self, None, (by_chunk(x), by_chunk(targets)))  # leaves (T / c, B, c)
        return jax.tree.map(lambda leaf: leaf.swapaxes(0, 1).reshape(batch, length), chunked)


AUTO_CHUNK = -1  # model.loss_chunk: derived from the row's length and the vocabulary (derived_loss_chunk)
LOGITS_PER_CHUNK_ROW = 2**24  # a derived chunk's logits per row: 64 MiB in float32
MIN_CHUNK = 8  # fewer positions a chunk would starve the head's matmul: the whole logits instead


def derived_loss_chunk(length: int, vocab: int) -> int:
    """model.loss_chunk=-1: the positions per chunk of the loss for rows of `length` tokens and a (padded)
    vocabulary: 0 (the whole logits at once) where a row's length x vocab logits are LOGITS_PER_CHUNK_ROW or
    fewer, else the largest divisor of length whose chunk holds no more (256 for GPT-2's 1024 x 50304, 128 for
    Llama 3's 2048 x 128256); 0 too where that divisor is under MIN_CHUNK (a length with no fitting divisor).

    The budget is per row, so a chunk's logits scale with the batch as the activations do: (B, 256, 50304) in
    float32 is 0.8 GiB at batch 16, where the whole logits are 3.1 GiB (and as much again for their gradient)."""
    if length * vocab <= LOGITS_PER_CHUNK_ROW:
        return 0
    fitting = max((c for c in range(1, length + 1) if length % c == 0 and c * vocab <= LOGITS_PER_CHUNK_ROW),
                  default=0)
    return fitting if fitting >= MIN_CHUNK else 0


def in_row_order(tree: Any, order: np.ndarray | None) -> Any:
    """Leaves (B, T, ...) whose tokens are in `order` (the index in the row of each place; None: the row's own)
    put back in the row's order, the rows and tokens split as the activations' (the rest as XLA likes)."""
    if order is None:
        return tree
    free = jax.sharding.PartitionSpec.UNCONSTRAINED
    return jax.tree.map(lambda leaf: constrain(leaf[:, np.argsort(order)], ("batch", "length")
                                               + (free,) * (leaf.ndim - 2)), tree)


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
