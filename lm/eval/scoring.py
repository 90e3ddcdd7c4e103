"""Log-likelihoods of continuations, computed as lm-evaluation-harness's Hugging Face model (HFLM) computes them.

A request is (context, continuation) text. Tokenised as the harness's _encode_pair does for a causal model: the
context's trailing whitespace moves to the front of the continuation; the whole text context + continuation is
encoded, and so is the context alone; the continuation's ids are the whole text's ids after the context's count
(so a token spanning the boundary counts as continuation). An empty context is the prefix token (BOS, else EOS).
The ids context + continuation are cut from the left to max_length + 1, the model reads all but the last, and the
answer is (the sum of the continuation's log-probabilities, whether every continuation token is the argmax).

Rolling log-likelihood (WikiText): the text's ids in disjoint windows of max_length predicted tokens, the first
conditioned on the prefix token, each later one on the token before it, the last one on as many as fit (the
harness's get_rolling_token_windows with context_len=1, then make_disjoint_window), summed.

Batches: each sequence is right-padded to the smallest of a few bucket lengths (max_length halved num_buckets - 1
times) that holds it, and rows are grouped by bucket into batches of batch_size (padded with empty rows), so the
jitted scorer compiles one program per bucket used.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lm.errors import UserError

Apply = Callable[[object, jax.Array], jax.Array]  # (params, ids (B, T) int32) -> logits (B, T, V) float32
Encode = Callable[[str], list[int]]


@dataclasses.dataclass(frozen=True)
class Scorer:
    """A causal language model to score with: its apply, params and tokenizer's encode (text -> ids, special
    tokens as the tokenizer adds them by default, as transformers' tokenizers do in the harness)."""

    apply: Apply
    params: object
    encode: Encode
    max_length: int  # the model's context: the longest sequence it reads
    prefix_token_id: int | None  # what an empty context becomes (BOS, else EOS); None: the tokenizer has neither
    batch_size: int = 32
    num_buckets: int = 4

    @functools.cached_property
    def score_batch(self) -> Callable:
        """Jitted (params, inputs (B, T), targets (B, T), weights (B, T)) -> (log-likelihood (B,), greedy (B,))."""
        return jax.jit(functools.partial(score_batch, self.apply))


def score_batch(apply: Apply, params, inputs: jax.Array, targets: jax.Array, weights: jax.Array):
    """The sum over the positions where weights is 1 of log p(target), and whether each such target is the argmax
    of its logits; inputs, targets int32 (B, T), weights float32 (B, T) -> (B,) float32, (B,) bool."""
    logits = apply(params, inputs).astype(jnp.float32)  # (B, T, V)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    target_log_probs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (B, T)
    greedy = (jnp.argmax(logits, axis=-1) == targets) | (weights == 0)
    return jnp.sum(jnp.where(weights > 0, target_log_probs, 0.0), axis=-1), jnp.all(greedy, axis=-1)


def encode_pair(encode: Encode, context: str, continuation: str,
                prefix_token_id: int | None) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) of a request, as the harness tokenises it (see the module docstring)."""
    if not context:
        ids = encode(continuation)
        if prefix_token_id is None:
            raise UserError("an empty context needs a prefix token, and this tokenizer has no BOS or EOS token")
        return ([prefix_token_id], ids) if not ids or ids[0] != prefix_token_id else (ids[:1], ids[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode(context + continuation)
    context_ids = encode(context)
    return context_ids, whole[len(context_ids):]


def rolling_windows(ids: Sequence[int], prefix_token_id: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """The disjoint (context ids, continuation ids) windows that predict every id of ids once: the first window
    predicts the first min(max_length, N) ids after the prefix token, each later one the next max_length ids after
    the one id before them; the last, of k < max_length ids, after the max_length + 1 - k ids before them (the
    harness's windows, whose last one fills the model's context)."""
    ids = list(ids)
    if not ids:
        return []
    first = min(max_length, len(ids))
    windows = [([prefix_token_id], ids[:first])]
    for start in range(first, len(ids), max_length):
        continuation = ids[start:start + max_length]
        windows.append((ids[start + len(continuation) - max_length - 1:start], continuation))
    return windows


def bucket_lengths(max_length: int, num_buckets: int) -> list[int]:
    """max_length halved num_buckets - 1 times (not below 8), ascending: [32, 64, 128, 256] for 256, 4."""
    lengths = {max_length}
    for _ in range(num_buckets - 1):
        lengths.add(max(8, min(lengths) // 2))
    return sorted(lengths)


def token_loglikelihoods(scorer: Scorer, requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                         ) -> list[tuple[float, bool]]:
    """(log-likelihood, is_greedy) of each (context ids, continuation ids) request, in order (see the module
    docstring). A continuation longer than max_length is a UserError, as the harness refuses it too."""
    max_length = scorer.max_length
    buckets = bucket_lengths(max_length, scorer.num_buckets)
    rows: dict[int, list[tuple[int, np.ndarray, int]]] = {length: [] for length in buckets}
    for index, (context, continuation) in enumerate(requests):
        if not 0 < len(continuation) <= max_length or not context:
            raise UserError(f"a continuation of {len(continuation)} tokens after {len(context)} of context: the "
                            f"model reads {max_length} tokens; a task's continuation must fit (and not be empty)")
        sequence = np.asarray([*context, *continuation], np.int32)[-(max_length + 1):]
        length = len(sequence) - 1
        rows[next(b for b in buckets if b >= length)].append((index, sequence, len(continuation)))
    results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
    for bucket, bucket_rows in rows.items():
        for start in range(0, len(bucket_rows), scorer.batch_size):
            batch = bucket_rows[start:start + scorer.batch_size]
            inputs = np.zeros((scorer.batch_size, bucket), np.int32)
            targets = np.zeros((scorer.batch_size, bucket), np.int32)
            weights = np.zeros((scorer.batch_size, bucket), np.float32)
            for row, (_, sequence, continuation_length) in enumerate(batch):
                length = len(sequence) - 1
                inputs[row, :length], targets[row, :length] = sequence[:-1], sequence[1:]
                weights[row, length - continuation_length:length] = 1.0
            loglikelihood, greedy = jax.device_get(scorer.score_batch(scorer.params, inputs, targets, weights))
            for row, (index, _, _) in enumerate(batch):
                results[index] = (float(loglikelihood[row]), bool(greedy[row]))
    return results


def loglikelihoods(scorer: Scorer, requests: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
    """(log-likelihood, is_greedy) of each (context, continuation) text request, in order."""
    pairs = [encode_pair(scorer.encode, context, continuation, scorer.prefix_token_id)
             for context, continuation in requests]
    return token_loglikelihoods(scorer, pairs)


def rolling_loglikelihoods(scorer: Scorer, texts: Sequence[str]) -> list[float]:
    """The log-likelihood of each whole text, scored in rolling windows (see the module docstring)."""
    if scorer.prefix_token_id is None:
        raise UserError("rolling log-likelihood conditions a text's first token on a prefix token, and this "
                        "tokenizer has no BOS or EOS token")
    windows, owners = [], []
    for index, text in enumerate(texts):
        for window in rolling_windows(scorer.encode(text), scorer.prefix_token_id, scorer.max_length):
            windows.append(window)
            owners.append(index)
    totals = [0.0] * len(texts)
    for owner, (loglikelihood, _) in zip(owners, token_loglikelihoods(scorer, windows), strict=True):
        totals[owner] += loglikelihood
    return totals
