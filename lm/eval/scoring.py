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
times) that holds it, and rows are grouped by bucket into batches of batch_size (padded with empty rows). The model's
logits are computed at the continuations' positions only, all of a batch's together (the vocabulary-wide head is
most of a small model's work, and the context most of a sequence), in chunks of scored_chunk positions, each
chunk's logits reduced to (log p(target), is the argmax) before the next is computed: a CPU spends more on page
faults and passes over a large logits buffer than on the matmul that fills it. The positions are padded to
scored_chunk times one of 1, 2, 3, 4, 6, 8, 12, ... (powers of two and three times them), so the jitted scorer
compiles one program per (bucket, count) used, a few per bucket. A batch's result is waited for only once the next
batch is dispatched (lm.progress.await_each), so the host builds the next one while the devices work, and a long
pass prints its progress every so often ('hellaswag batches: 120 of 1,256 | 3,840.0 requests/s | ETA 0:02:00'); a
request's log-probabilities are summed on the host, in float64. On a mesh (params sharded over several devices of
this process, as in training) the batches are split over its batch axes, as the eval step's are.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from lm import sharding
from lm.errors import UserError
from lm.progress import Progress, await_each

Apply = Callable[..., tuple[jax.Array, jax.Array]]  # (params, ids (B, T), positions (N, c), targets (N, c)) ->
#   target_scores at those of the B * T positions (b * T + t), each (N, c): gpt_apply's
Encode = Callable[[str], list[int]]
SCORED_CHUNK = 64  # positions whose logits exist at once (64 x 50,257 float32: 13 MB)
SCORED_MULTIPLES = tuple(sorted({multiple << shift for shift in range(24) for multiple in (1, 3)}))  # 1, 2, 3, 4, 6..


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
    num_buckets: int = 8  # lengths: max_length halved num_buckets - 1 times, not below 8
    scored_chunk: int = SCORED_CHUNK  # a batch scores this many positions times one of SCORED_MULTIPLES


def target_scores(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """logits (..., V), targets int32 (...) -> (log p(target) float32 (...), whether the target is the argmax, the
    first maximum, of its logits (...)). log p is the target's logit minus the logits' logsumexp (both shifted by
    the maximum, as log_softmax shifts them), and the argmax the least index holding the maximum: on a CPU both are
    much faster than a log-softmax and an argmax over the vocabulary, with the same values."""
    logits = logits.astype(jnp.float32)
    top = jnp.max(logits, axis=-1, keepdims=True)
    log_sum = jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1))
    target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    vocabulary = jnp.arange(logits.shape[-1], dtype=jnp.int32)
    argmax = jnp.min(jnp.where(logits == top, vocabulary, logits.shape[-1]), axis=-1)
    return (target_logits - top[..., 0]) - log_sum, argmax == targets


@functools.partial(jax.jit, static_argnums=0)  # compiled per apply (one per Scorer's model) and shape
def score_batch(apply: Apply, params, inputs: jax.Array, positions: jax.Array, targets: jax.Array):
    """apply, jitted: inputs int32 (B, T), positions and targets int32 (N, c) -> (N, c) float32, (N, c) bool."""
    return apply(params, inputs, positions, targets)


def gpt_apply(model) -> Apply:
    """The Apply of a GPT (lm/models/gpt.py, a flax module): its target_scores at the given positions alone, one
    chunk of c positions' logits at a time."""
    return lambda params, ids, positions, targets: model.apply(
        {"params": params}, ids, logit_positions=positions, targets=targets, logits_reduce=target_scores)


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


Row = tuple[int, np.ndarray, int]  # a request's index, its ids cut to max_length + 1, its continuation's length


def token_loglikelihoods(scorer: Scorer, requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                         what: str = "scoring") -> list[tuple[float, bool]]:
    """(log-likelihood, is_greedy) of each (context ids, continuation ids) request, in order (see the module
    docstring); a long pass prints its progress as '<what> batches: ...'. A continuation longer than max_length is
    a UserError, as the harness refuses it too."""
    max_length, batch_size = scorer.max_length, scorer.batch_size
    buckets = bucket_lengths(max_length, scorer.num_buckets)
    rows: dict[int, list[Row]] = {length: [] for length in buckets}
    for index, (context, continuation) in enumerate(requests):
        if not 0 < len(continuation) <= max_length or not context:
            raise UserError(f"a continuation of {len(continuation)} tokens after {len(context)} of context: the "
                            f"model reads {max_length} tokens; a task's continuation must fit (and not be empty), as "
                            "the harness requires too: leave the task out, or score a model with a longer context")
        sequence = np.asarray([*context, *continuation], np.int32)[-(max_length + 1):]
        rows[next(b for b in buckets if b >= len(sequence) - 1)].append((index, sequence, len(continuation)))
    place = batch_placement(scorer.params, batch_size)
    batches = [(bucket, bucket_rows[start:start + batch_size]) for bucket, bucket_rows in rows.items()
               for start in range(0, len(bucket_rows), batch_size)]

    def dispatch(bucket: int, batch: list[Row]):  # the batch's per-position (log p, greedy), on the devices
        inputs, positions, targets = batch_arrays(batch, batch_size, bucket, scorer.scored_chunk)
        return score_batch(scorer.apply, scorer.params, place(inputs), positions, targets)

    progress = Progress(f"{what} batches", len(batches), "requests")
    scored = await_each((dispatch(*bucket_batch) for bucket_batch in batches), progress,
                        [len(batch) for _, batch in batches])
    results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
    for (_, batch), found in zip(batches, jax.device_get(scored), strict=True):
        log_probs, greedy = (array.reshape(-1) for array in found)  # the batch's scored positions, in order
        ends = np.cumsum([count for _, _, count in batch])  # each row's scored positions end there
        for (index, _, count), end in zip(batch, ends, strict=True):  # summed in float64
            results[index] = (float(np.sum(log_probs[end - count:end], dtype=np.float64)),
                              bool(np.all(greedy[end - count:end])))
    return results


def batch_arrays(batch: list[Row], batch_size: int, bucket: int, chunk: int):
    """The arrays score_batch takes for batch's rows: inputs (batch_size, bucket), each row's ids but the last,
    right-padded with 0 (so are the missing rows); positions (N, chunk) in the flattened inputs (row * bucket + t)
    and their targets (N, chunk): each row's continuation's, row after row, then zeros. N is the least of
    SCORED_MULTIPLES that holds them."""
    tokens = sum(count for _, _, count in batch)
    scored = next(n for n in SCORED_MULTIPLES if n * chunk >= tokens) * chunk
    inputs = np.zeros((batch_size, bucket), np.int32)
    positions, targets = np.zeros(scored, np.int32), np.zeros(scored, np.int32)
    end = 0
    for row, (_, sequence, count) in enumerate(batch):
        length = len(sequence) - 1
        inputs[row, :length] = sequence[:-1]
        positions[end:end + count] = row * bucket + np.arange(length - count, length)
        targets[end:end + count] = sequence[-count:]
        end += count
    return inputs, positions.reshape(-1, chunk), targets.reshape(-1, chunk)


def batch_placement(params, batch_size: int) -> Callable[[np.ndarray], np.ndarray | jax.Array]:
    """How a batch's inputs (batch_size, T) go to the devices: split over the batch axes of the mesh that params
    are on, when it has several devices, all of this process, and they divide batch_size (as the eval step's batches
    are split); else as they are (one device, or the host-local params of a multi-host run's evaluators)."""
    leaves = jax.tree.leaves(params)
    mesh = getattr(leaves[0].sharding, "mesh", None) if leaves and isinstance(leaves[0], jax.Array) else None
    if (not isinstance(mesh, Mesh) or mesh.size == 1 or not leaves[0].is_fully_addressable
            or batch_size % sharding.batch_shards(mesh)):
        return lambda array: array
    return functools.partial(jax.device_put, device=sharding.batch_sharding(mesh))


def loglikelihoods(scorer: Scorer, requests: Sequence[tuple[str, str]], what: str = "scoring",
                   ) -> list[tuple[float, bool]]:
    """(log-likelihood, is_greedy) of each (context, continuation) text request, in order (the progress of a long
    pass as '<what> batches: ...')."""
    pairs = [encode_pair(scorer.encode, context, continuation, scorer.prefix_token_id)
             for context, continuation in requests]
    return token_loglikelihoods(scorer, pairs, what)


def rolling_loglikelihoods(scorer: Scorer, texts: Sequence[str], what: str = "scoring") -> list[float]:
    """The log-likelihood of each whole text, scored in rolling windows (see the module docstring; the progress of
    a long pass as '<what> batches: ...')."""
    if scorer.prefix_token_id is None:
        raise UserError("rolling log-likelihood conditions a text's first token on a prefix token, and this "
                        "tokenizer has no BOS or EOS token")
    windows, owners = [], []
    for index, text in enumerate(texts):
        for window in rolling_windows(scorer.encode(text), scorer.prefix_token_id, scorer.max_length):
            windows.append(window)
            owners.append(index)
    totals = [0.0] * len(texts)
    for owner, (loglikelihood, _) in zip(owners, token_loglikelihoods(scorer, windows, what), strict=True):
        totals[owner] += loglikelihood
    return totals
