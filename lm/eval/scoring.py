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

Batches: requests whose (cut) contexts are the same ids, a multiple-choice document's choices, form a group that
reads its context once: the context, then each continuation but its last id as a branch that sees the context and
itself alone (an attention mask), at the positions it has alone (a group longer than max_length is split). Groups
are packed into rows (segment ids keep them apart), longest first, each row as long as the smallest of a few bucket
lengths (max_length halved num_buckets - 1 times, those under SHORTEST_ROW left out) that holds its longest group,
filled up with the longest groups that fit; rows of a bucket go in batches of batch_size (the last padded with
empty rows to one of 1, 2, 3, 4, 6, 8, 12, ...). The model's logits are computed at the continuations' positions
only, all of a batch's together (the vocabulary-wide head is most of a small model's work, and the context most of
a sequence), in chunks of scored_chunk positions, each chunk's logits reduced to (log p(target), is the argmax)
before the next is computed: a CPU spends more on page faults and passes over a large logits buffer than on the
matmul that fills it. The positions are padded to scored_chunk times one of 1, 2, 3, 4, 6, 8, 12, ... (powers of two
and three times them), so the jitted scorer compiles one program per (bucket, rows, count) used, a few per bucket,
once per process for a model (it is jitted per model, not per Scorer). A batch's result is waited for only once the
next batch is dispatched (lm.progress.await_each), so the host builds the next one while the devices work, and a
long pass prints its progress every so often ('hellaswag batches: 120 of 1,256 | 3,840.0 requests/s | ETA 0:02:00'); a
request's log-probabilities are summed on the host, in float64. On a mesh (params sharded over several devices of
this process, as in training) the batches are split over its batch axes, as the eval step's are.
"""

import bisect
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from lm import sharding
from lm.errors import UserError
from lm.progress import Progress, await_each

Apply = Callable[..., tuple[jax.Array, jax.Array]]  # (params, Rows, positions (N, c), targets (N, c)) ->
#   target_scores at those of the B * T positions (b * T + t), each (N, c): GPTApply's
Encode = Callable[[str], list[int]]
SCORED_CHUNK = 64  # positions whose logits exist at once (64 x 50,257 float32: 13 MB)
SHORTEST_ROW = 256  # packed rows are at least this long (or max_length): short groups share a row densely
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


class Rows(NamedTuple):
    """A batch of packed rows, each array (B, T) int32: the ids; segment ids (a group's, 1, 2, ... in its row; 0:
    padding); positions (from the group's start; a branch continues its context's); branches (0: a group's context;
    1, 2, ...: its requests' own ids, each seeing the context and itself alone)."""

    tokens: jax.Array
    segment_ids: jax.Array
    positions: jax.Array
    branches: jax.Array


@functools.partial(jax.jit, static_argnums=0)  # compiled per apply (equal for equal models) and shape
def score_batch(apply: Apply, params, rows: Rows, positions: jax.Array, targets: jax.Array):
    """apply, jitted: rows (B, T) each, positions and targets int32 (N, c) -> (N, c) float32, (N, c) bool."""
    return apply(params, rows, positions, targets)


def branch_mask(branches: jax.Array) -> jax.Array:
    """branches (B, T) -> (B, 1, T, T): a query sees the keys of its group's context (branch 0) and of its own
    branch (with the causal and segment masks: the earlier ones of its group)."""
    keys = branches[:, None, :]
    return ((keys == 0) | (keys == branches[:, :, None]))[:, None]


@dataclasses.dataclass(frozen=True)
class GPTApply:
    """The Apply of a GPT (lm/models/gpt.py, a flax module): its target_scores at the given positions alone, one
    chunk of c positions' logits at a time, over packed rows. Equal for equal models, so score_batch compiles a
    shape once per process, whichever Scorer asks."""

    model: object

    def __call__(self, params, rows: Rows, positions: jax.Array, targets: jax.Array):
        return self.model.apply({"params": params}, rows.tokens, segment_ids=rows.segment_ids,
                                positions=rows.positions, attention_mask=branch_mask(rows.branches),
                                logit_positions=positions, targets=targets, logits_reduce=target_scores)


gpt_apply = GPTApply


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


Group = tuple[np.ndarray, list[tuple[int, np.ndarray]]]  # a context's ids, [(request index, continuation ids)]


def groups(requests: Sequence[tuple[Sequence[int], Sequence[int]]], max_length: int) -> list[Group]:
    """The requests grouped by their context ids, each request's ids cut from the left to max_length + 1 first (a
    request shares its group's context ids exactly, after the cut); a group is split where its length
    (group_length) would pass max_length. A continuation longer than max_length is a UserError, as the harness
    refuses it too."""
    by_context: dict[tuple[int, ...], list[tuple[int, np.ndarray]]] = {}
    for index, (context, continuation) in enumerate(requests):
        if not 0 < len(continuation) <= max_length or not context:
            raise UserError(f"a continuation of {len(continuation)} tokens after {len(context)} of context: the "
                            f"model reads {max_length} tokens; a task's continuation must fit (and not be empty), as "
                            "the harness requires too: leave the task out, or score a model with a longer context")
        sequence = np.asarray([*context, *continuation], np.int32)[-(max_length + 1):]
        count = len(continuation)
        by_context.setdefault(tuple(sequence[:-count]), []).append((index, sequence[-count:]))
    found: list[Group] = []
    for context, members in by_context.items():
        ids, length = np.asarray(context, np.int32), max_length + 1  # (a new group at the first member)
        for index, continuation in members:
            if length + len(continuation) - 1 > max_length:
                found.append((ids, []))
                length = len(ids)
            found[-1][1].append((index, continuation))
            length += len(continuation) - 1
    return found


def group_length(group: Group) -> int:
    """The ids a group takes in a row: its context, then each continuation but its last id."""
    return len(group[0]) + sum(len(continuation) - 1 for _, continuation in group[1])


def pack(found: list[Group], buckets: list[int]) -> list[tuple[int, list[Group]]]:
    """The groups in rows: (the row's length, its groups). Longest first, each row as long as the least bucket
    that holds its first group, then filled with the longest groups left that fit."""
    left = sorted(found, key=group_length)
    lengths = [group_length(group) for group in left]
    rows = []
    while left:
        row, longest = [left.pop()], lengths.pop()
        bucket = next(b for b in buckets if b >= longest)
        free = bucket - longest
        while (fits := bisect.bisect_right(lengths, free)) > 0:
            free -= lengths.pop(fits - 1)
            row.append(left.pop(fits - 1))
        rows.append((bucket, row))
    return rows


def token_loglikelihoods(scorer: Scorer, requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                         what: str = "scoring") -> list[tuple[float, bool]]:
    """(log-likelihood, is_greedy) of each (context ids, continuation ids) request, in order (see the module
    docstring); a long pass prints its progress as '<what> batches: ...'. A continuation longer than max_length is
    a UserError, as the harness refuses it too."""
    batch_size, shortest = scorer.batch_size, min(scorer.max_length, SHORTEST_ROW)
    lengths = [length for length in bucket_lengths(scorer.max_length, scorer.num_buckets) if length >= shortest]
    rows = pack(groups(requests, scorer.max_length), lengths)
    place, shards = batch_placement(scorer.params, batch_size)
    by_bucket: dict[int, list[list[Group]]] = {}
    for bucket, row in rows:
        by_bucket.setdefault(bucket, []).append(row)
    batches = [(bucket, bucket_rows[start:start + batch_size]) for bucket, bucket_rows in sorted(by_bucket.items())
               for start in range(0, len(bucket_rows), batch_size)]

    def dispatch(bucket: int, batch: list[list[Group]]):  # the batch's per-position (log p, greedy), on the devices
        count = padded_rows(len(batch), batch_size, shards)
        packed, positions, targets = batch_arrays(batch, count, bucket, scorer.scored_chunk)
        return score_batch(scorer.apply, scorer.params, Rows(*map(place, packed)), positions, targets)

    def members(batch: list[list[Group]]) -> list[tuple[int, np.ndarray]]:  # its requests, in scored order
        return [member for row in batch for _, group_members in row for member in group_members]

    progress = Progress(f"{what} batches", len(batches), "requests")
    scored = await_each((dispatch(*bucket_batch) for bucket_batch in batches), progress,
                        [len(members(batch)) for _, batch in batches])
    results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
    for (_, batch), found in zip(batches, jax.device_get(scored), strict=True):
        log_probs, greedy = (array.reshape(-1) for array in found)  # the batch's scored positions, in order
        end = 0
        for index, continuation in members(batch):  # summed in float64
            start, end = end, end + len(continuation)
            results[index] = (float(np.sum(log_probs[start:end], dtype=np.float64)), bool(np.all(greedy[start:end])))
    return results


def padded_rows(count: int, batch_size: int, shards: int) -> int:
    """The rows a batch of count rows is padded to: the least of SCORED_MULTIPLES that holds them (a few shapes to
    compile), batch_size where that is smaller or not a multiple of the batch's shards."""
    rows = next(n for n in SCORED_MULTIPLES if n >= count)
    return rows if rows <= batch_size and rows % shards == 0 else batch_size


def batch_arrays(batch: list[list[Group]], count: int, bucket: int, chunk: int):
    """The arrays score_batch takes for batch's rows (see Rows), count rows of bucket ids each (padded with 0); the
    scored positions (N, chunk) in the flattened rows (row * bucket + t) and their targets (N, chunk): each
    request's continuation's, request after request, then zeros. A continuation's first id is predicted at its
    context's last position, each later one at its branch's id before it. N is the least of SCORED_MULTIPLES that
    holds them."""
    packed = np.zeros((4, count, bucket), np.int32)  # tokens, segment ids, positions, branches
    positions, targets = [], []
    for row, groups_in_row in enumerate(batch):
        at = 0
        for segment, (context, group_members) in enumerate(groups_in_row, 1):
            width = len(context)
            fill(packed[:, row, at:at + width], context, segment, np.arange(width), 0)
            context_end, at = row * bucket + at + width - 1, at + width
            for branch, (_, continuation) in enumerate(group_members, 1):
                width = len(continuation) - 1
                fill(packed[:, row, at:at + width], continuation[:-1], segment, len(context) + np.arange(width), branch)
                positions.extend([context_end, *range(row * bucket + at, row * bucket + at + width)])
                targets.extend(continuation)
                at += width
    scored = next(n for n in SCORED_MULTIPLES if n * chunk >= len(positions)) * chunk
    positions, targets = (np.pad(np.asarray(a, np.int32), (0, scored - len(a))) for a in (positions, targets))
    return packed, positions.reshape(-1, chunk), targets.reshape(-1, chunk)


def fill(span: np.ndarray, *values) -> None:
    """span (4, width) of the packed rows = the values (tokens, segment ids, positions, branches), each an array
    of width or one number."""
    for field, value in zip(span, values, strict=True):
        field[:] = value


def batch_placement(params, batch_size: int) -> tuple[Callable[[np.ndarray], np.ndarray | jax.Array], int]:
    """How a batch's arrays (rows, T) go to the devices, and the shards its rows are split in: over the batch axes
    of the mesh that params are on, when it has several devices, all of this process, and they divide batch_size
    (as the eval step's batches are split); else as they are, in 1 (one device, or the host-local params of a
    multi-host run's evaluators)."""
    leaves = jax.tree.leaves(params)
    mesh = getattr(leaves[0].sharding, "mesh", None) if leaves and isinstance(leaves[0], jax.Array) else None
    if (not isinstance(mesh, Mesh) or mesh.size == 1 or not leaves[0].is_fully_addressable
            or batch_size % sharding.batch_shards(mesh)):
        return (lambda array: array), 1
    return functools.partial(jax.device_put, device=sharding.batch_sharding(mesh)), sharding.batch_shards(mesh)


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
