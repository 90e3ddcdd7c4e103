"""Batched greedy and beam search over a generic step function, for both encoder-decoder families.

Notation: B batch rows (source sentences), K beam size, N = B or B*K decoder rows, V target vocabulary,
L = max_length (the most tokens generated after bos, eos included).

A step function is the whole model interface:
    step_fn(state, tokens (N,)) -> (logits or log-probs (N, V), new state)
It feeds y_{t-1} and scores y_t. `state` is any pytree; every leaf that changes per row has leading axis N
(scalars, e.g. the KV cache's 'index', are shared by all rows). Whatever else the model reads (parameters, the
encoder memory) is closed over by step_fn (see `rnn_step_fn`, `transformer_step_fn`).

Outputs are (B, L) int32 ids after bos: the hypothesis, its eos, then pad (0). A hypothesis that never emits eos
is cut at L tokens (no eos).

Beam search (as in the Flax WMT example / tensor2tensor) keeps, per source row, K *alive* beams (no eos yet,
ranked by log-prob sum) and K *finished* hypotheses (ranked by score). Each step scores all K*V extensions,
keeps the 2K best, sends those ending in eos to the finished set and the best K others to the alive set. The
score of a finished hypothesis of n tokens (eos counted) with log-prob sum s is the GNMT length penalty form
    score = s / ((5 + n) / 6) ** alpha.
At the last step (n = L) every candidate is finished (the cut ones too, scored the same way). The loop stops
early once, for every row, the worst of K finished scores beats the best alive beam could still reach
(alive_log_prob / penalty(L), an upper bound since log-probs are <= 0 and alpha >= 0).
Beam rows are flat: row b*K + k is beam k of source row b (`tile_beams` lays the state out so).

Jitting: `greedy_search` and `beam_search` are jitted with step_fn static. A closure over concrete arrays bakes
them into the compiled program as constants, which is fine for small models and tests; for real models call
them (and the adapters) inside your own jitted function, so parameters and memory stay traced arguments:

    @jax.jit
    def translate(params, source, source_mask):
        memory = model.apply({"params": params}, source, source_mask, method=EncoderDecoder.encode)
        step_fn, state = transformer_step_fn(model, params, memory, source_mask, max_length, beam_size=4)
        return beam_search(step_fn, state, source.shape[0], 4, BOS, EOS, max_length)
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

StepFn = Callable[[Any, jax.Array], tuple[jax.Array, Any]]  # (state, tokens (N,)) -> ((N, V), new state)

NEG_INF = -1.0e7  # a finite "impossible" score: no nan from inf - inf, no inf in top_k ties


def tile_beams(tree: Any, beam_size: int, batch_size: int | None = None) -> Any:
    """Repeats every leaf with a leading axis (of size batch_size, if given) K times along axis 0:
    (B, ...) -> (B*K, ...), row b*K + k = row b. Scalars (and, with batch_size, leaves of another leading size)
    stay as they are."""

    def tile(x):
        x = jnp.asarray(x)
        if x.ndim == 0 or (batch_size is not None and x.shape[0] != batch_size):
            return x
        return jnp.repeat(x, beam_size, axis=0)

    return jax.tree.map(tile, tree)


def gather_rows(tree: Any, rows: jax.Array, num_rows: int) -> Any:
    """x[rows] for every leaf with leading axis num_rows; rows (M,) int. Other leaves (scalars) unchanged."""

    def gather(x):
        if x.ndim == 0 or x.shape[0] != num_rows:
            return x
        return jnp.take(x, rows, axis=0)

    return jax.tree.map(gather, tree)


def gnmt_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT (Wu et al. 2016): ((5 + length) / 6) ** alpha; length counts the generated tokens, eos included."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


# ---------------------------------------------------------------------------------------------
# Greedy search
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("step_fn", "batch_size", "bos_id", "eos_id", "max_length"))
def greedy_search(step_fn: StepFn, state: Any, batch_size: int, bos_id: int, eos_id: int,
                  max_length: int) -> jax.Array:
    """Argmax decoding of B rows: -> (B, L) int32 ids after bos, eos, then pad 0.

    The loop stops early when every row has emitted eos. A finished row keeps being fed eos (its outputs are
    ignored), so the state stays well defined."""

    def cond(carry):
        i, _, _, _, finished = carry
        return (i < max_length) & ~jnp.all(finished)

    def body(carry):
        i, state, tokens, out, finished = carry  # tokens (B,) y_{i-1}; out (B, L); finished (B,)
        logits, state = step_fn(state, tokens)  # (B, V)
        next_tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # (B,)
        next_tokens = jnp.where(finished, 0, next_tokens)  # pad after eos
        out = jax.lax.dynamic_update_slice(out, next_tokens[:, None], (0, i))
        finished = finished | (next_tokens == eos_id)
        fed = jnp.where(finished, eos_id, next_tokens)  # (B,)
        return i + 1, state, fed, out, finished

    tokens = jnp.full((batch_size,), bos_id, jnp.int32)
    out = jnp.zeros((batch_size, max_length), jnp.int32)
    finished = jnp.zeros((batch_size,), bool)
    _, _, _, out, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), state, tokens, out, finished))
    return out


# ---------------------------------------------------------------------------------------------
# Beam search
# ---------------------------------------------------------------------------------------------


@functools.partial(
    jax.jit, static_argnames=("step_fn", "batch_size", "beam_size", "bos_id", "eos_id", "max_length", "length_penalty")
)
def beam_search(step_fn: StepFn, state: Any, batch_size: int, beam_size: int, bos_id: int, eos_id: int,
                max_length: int, length_penalty: float = 0.6) -> tuple[jax.Array, jax.Array]:
    """Beam search of B rows with K beams each (see the module docstring for the algorithm and scoring).

    state: already tiled to B*K rows (`tile_beams`), row b*K + k for beam k of source row b.
    Returns (sequences (B, L) int32: the best hypothesis, eos if it has one, then pad 0; scores (B,) float32:
    its log-prob sum / ((5 + n) / 6) ** length_penalty, n its number of tokens incl. eos)."""
    B, K, L, alpha = batch_size, beam_size, max_length, length_penalty
    penalty = functools.partial(gnmt_penalty, alpha=alpha)
    batch_rows = jnp.arange(B)[:, None]  # (B, 1) for gathers along the beam axis

    def cond(carry):
        i, _, alive_lp, _, _, finished_scores, finished_flags = carry
        best_alive = alive_lp[:, 0] / penalty(L)  # (B,) the best score any alive beam can still reach
        worst_finished = jnp.min(jnp.where(finished_flags, finished_scores, NEG_INF), axis=1)  # (B,)
        return (i < L) & ~jnp.all(worst_finished >= best_alive)

    def body(carry):
        i, state, alive_lp, alive_seqs, finished_seqs, finished_scores, finished_flags = carry
        # alive_lp (B, K) log-prob sums, sorted; alive_seqs (B, K, L); finished_* (B, K, L), (B, K), (B, K)
        tokens = _last_tokens(alive_seqs, i, bos_id)  # (B*K,) y_{i-1}: bos, then each beam's last token
        logits, state = step_fn(state, tokens)  # (B*K, V)
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # (B*K, V)
        V = log_probs.shape[-1]
        candidates = (alive_lp[:, :, None] + log_probs.reshape(B, K, V)).reshape(B, K * V)  # (B, K*V)

        # The 2K best extensions: enough that K of them are not eos.
        top_lp, top_index = jax.lax.top_k(candidates, 2 * K)  # (B, 2K)
        top_beam = top_index // V  # (B, 2K) parent beam
        top_token = (top_index % V).astype(jnp.int32)  # (B, 2K)
        top_seqs = alive_seqs[batch_rows, top_beam]  # (B, 2K, L)
        top_seqs = jax.lax.dynamic_update_slice(top_seqs, top_token[:, :, None], (0, 0, i))
        real = top_lp > NEG_INF / 2  # (B, 2K) descends from a real beam
        is_eos = top_token == eos_id  # (B, 2K)

        # Finished: the eos extensions, and at the last step every extension (cut at L tokens).
        new_flags = real & (is_eos | (i == L - 1))  # (B, 2K)
        new_scores = jnp.where(new_flags, top_lp / penalty(i + 1), NEG_INF)  # (B, 2K)
        all_scores = jnp.concatenate([finished_scores, new_scores], axis=1)  # (B, 3K)
        all_seqs = jnp.concatenate([finished_seqs, top_seqs], axis=1)  # (B, 3K, L)
        all_flags = jnp.concatenate([finished_flags, new_flags], axis=1)  # (B, 3K)
        finished_scores, keep = jax.lax.top_k(all_scores, K)  # (B, K)
        finished_seqs = all_seqs[batch_rows, keep]  # (B, K, L)
        finished_flags = all_flags[batch_rows, keep]  # (B, K)

        # Alive: the K best extensions that are not eos; the state rows follow their parents.
        alive_candidates = jnp.where(is_eos, NEG_INF, top_lp)  # (B, 2K)
        alive_lp, keep = jax.lax.top_k(alive_candidates, K)  # (B, K)
        alive_seqs = top_seqs[batch_rows, keep]  # (B, K, L)
        parent = jnp.take_along_axis(top_beam, keep, axis=1)  # (B, K)
        rows = (jnp.arange(B)[:, None] * K + parent).reshape(B * K)  # (B*K,) flat parent rows
        state = gather_rows(state, rows, B * K)
        return i + 1, state, alive_lp, alive_seqs, finished_seqs, finished_scores, finished_flags

    # Only beam 0 is live at first (the K copies are identical), so the first step does not pick K duplicates.
    alive_lp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (K - 1), jnp.float32), (B, 1))  # (B, K)
    alive_seqs = jnp.zeros((B, K, L), jnp.int32)
    finished_seqs = jnp.zeros((B, K, L), jnp.int32)
    finished_scores = jnp.full((B, K), NEG_INF, jnp.float32)
    finished_flags = jnp.zeros((B, K), bool)
    carry = (jnp.int32(0), state, alive_lp, alive_seqs, finished_seqs, finished_scores, finished_flags)
    _, _, alive_lp, alive_seqs, finished_seqs, finished_scores, finished_flags = jax.lax.while_loop(cond, body, carry)

    # Every row has a finished hypothesis (the last step finishes all); the alive fallback is only a safeguard.
    has_finished = finished_flags[:, 0]  # (B,) top_k sorted, so slot 0 is the best
    sequences = jnp.where(has_finished[:, None], finished_seqs[:, 0], alive_seqs[:, 0])  # (B, L)
    scores = jnp.where(has_finished, finished_scores[:, 0], alive_lp[:, 0] / penalty(L))  # (B,)
    return sequences, scores


def _last_tokens(seqs: jax.Array, i: jax.Array, bos_id: int) -> jax.Array:
    """The token each beam feeds at step i: bos at i = 0, else seqs[:, :, i - 1]. seqs (B, K, L) -> (B*K,)."""
    previous = jax.lax.dynamic_index_in_dim(seqs, jnp.maximum(i - 1, 0), axis=2, keepdims=False)  # (B, K)
    return jnp.where(i == 0, bos_id, previous).reshape(-1).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# Model adapters
# ---------------------------------------------------------------------------------------------


def rnn_step_fn(model, params, memory, beam_size: int = 1) -> tuple[StepFn, Any]:
    """For `lm.models.seq2seq.Seq2Seq`: memory from `encode` (B rows) -> (step_fn, initial state), N = B*beam_size
    rows (the memory and state tiled with `tile_beams` when beam_size > 1). The step is `decode_step`
    (its attention weights are dropped); the memory is closed over, never reordered (beams of a row share it)."""
    from lm.models.seq2seq import Seq2Seq

    if beam_size > 1:
        memory = tile_beams(memory, beam_size)
    variables = {"params": params}
    state = model.apply(variables, memory, method=Seq2Seq.initial_state)  # leaves (N, ...)

    def step_fn(state, tokens):  # tokens (N,) -> logits (N, V), state
        logits, state, _ = model.apply(variables, memory, state, tokens, method=Seq2Seq.decode_step)
        return logits, state

    return step_fn, state


def transformer_step_fn(model, params, memory: jax.Array, source_mask: jax.Array, max_length: int,
                        beam_size: int = 1) -> tuple[StepFn, Any]:
    """For `lm.models.encoder_decoder.EncoderDecoder`: memory (B, S, D) from `encode` and source_mask (B, S) ->
    (step_fn, state): the state is a zero KV cache of N = B*beam_size rows and max_length positions
    ({'...': {'cached_key' (N, L, K, Dh), ...}, 'index': ()}); memory and mask are tiled and closed over.
    max_length must not exceed the model's position table (config.max_length)."""
    from lm.models.encoder_decoder import EncoderDecoder

    if beam_size > 1:
        memory, source_mask = tile_beams((memory, source_mask), beam_size)
    rows = memory.shape[0]
    shapes = jax.eval_shape(
        lambda: model.init(jax.random.key(0), jnp.zeros((rows, max_length), jnp.int32), memory, source_mask,
                           decode=True, method=EncoderDecoder.decode)
    )["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def step_fn(cache, tokens):  # tokens (N,) -> logits (N, V), cache
        logits, variables = model.apply({"params": params, "cache": cache}, tokens[:, None], memory, source_mask,
                                        decode=True, method=EncoderDecoder.decode, mutable=["cache"])
        return logits[:, 0], variables["cache"]  # (N, V)

    return step_fn, cache
