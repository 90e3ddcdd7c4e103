"""What the fine-tuning tasks share: reading their files, fixed-length rows of [CLS] A [SEP] (B [SEP])
and the train and eval batches of such rows.

Every task encodes a split as `Rows`, a dict of (N, ...) arrays that always holds
  tokens    (N, T) int32  piece ids, [PAD] after the end
  segments  (N, T) int32  0 for [CLS] A [SEP], 1 for B [SEP] (and the padding)
  mask      (N, T) int32  1 for real tokens, 0 for padding
and the task's targets (label (N,), score (N,), tags (N, T), start and end (N,), ...). T is
data.max_seq_len for every split, so the train and eval steps compile once.
"""

import gzip
import pathlib
from collections.abc import Sequence
from typing import TypeVar

import grain
import numpy as np

from lm.data.files import find_file
from lm.data.wordpiece import WordPieceTokenizer
from lm.errors import UserError

Rows = dict[str, np.ndarray]
T = TypeVar("T")


def read_lines(relative_path: str) -> tuple[pathlib.Path, list[str]]:
    """The lines (no line ends) of a data file under $LM_DATA_DIR, gunzipped when it ends in .gz; a
    missing file is a UserError naming where it looked and how to provide it."""
    path = find_file(relative_path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return path, f.read().splitlines()


def choose(items: Sequence[T], limit: int, seed: int | None = None) -> list[T]:
    """The first `limit` items (0: all), or with a seed `limit` of them drawn at random (the first `limit` of a
    permutation by numpy's default_rng(seed)), kept in their order: one seed draws the same examples in every
    run, and a larger draw holds every smaller one of that seed (a learning curve's subsets are nested)."""
    if not limit or limit >= len(items):
        return list(items)
    if seed is None:
        return list(items[:limit])
    picked = np.sort(np.random.default_rng(seed).permutation(len(items))[:limit])
    return [items[i] for i in picked]


def label_error(path: pathlib.Path, line: int, value: str, allowed: str) -> UserError:
    return UserError(f"{path}:{line}: label {value!r} is not one of the task's labels ({allowed}); fix or remove "
                     "that line")


def truncate_pair(a: list[int], b: list[int], max_pieces: int) -> tuple[list[int], list[int]]:
    """a and b cut to max_pieces pieces together, the longer one first (BERT's _truncate_seq_pair)."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_pieces:
        (a if len(a) > len(b) else b).pop()
    return a, b


def pad_rows(sequences: Sequence[tuple[Sequence[int], Sequence[int]]], length: int, pad_id: int) -> Rows:
    """(ids, segments) pairs of at most length each -> tokens, segments, mask (N, length) int32."""
    tokens = np.full((len(sequences), length), pad_id, np.int32)
    segments = np.zeros((len(sequences), length), np.int32)
    mask = np.zeros((len(sequences), length), np.int32)
    for row, (ids, segment_ids) in enumerate(sequences):
        tokens[row, : len(ids)], segments[row, : len(ids)], mask[row, : len(ids)] = ids, segment_ids, 1
    return {"tokens": tokens, "segments": segments, "mask": mask}


def encode_sentences(tokenizer: WordPieceTokenizer, firsts: Sequence[str], seconds: Sequence[str] | None,
                     length: int) -> Rows:
    """Sentences (or sentence pairs) -> rows [CLS] A [SEP] (B [SEP]), truncated to length."""
    a_ids = tokenizer.encode_batch(firsts)
    b_ids = tokenizer.encode_batch(seconds) if seconds is not None else [[] for _ in a_ids]
    special = 3 if seconds is not None else 2
    pairs = [tokenizer.encode_pair(*truncate_pair(a, b, length - special)) for a, b in zip(a_ids, b_ids, strict=True)]
    return pad_rows(pairs, length, tokenizer.pad_id)


class BatchRows:
    """Row indices of a global batch (G,) -> this process's rows [start, stop) of them, as a batch."""

    def __init__(self, rows: Rows, start: int, stop: int):
        self.rows, self.start, self.stop = rows, start, stop

    def __call__(self, indices: np.ndarray) -> Rows:
        picked = np.asarray(indices[self.start : self.stop])
        return {name: array[picked] for name, array in self.rows.items()}


def train_batches(rows: Rows, batch_size: int, seed: int, shard: tuple[int, int] = (0, 1),
                  start_step: int = 0) -> grain.IterDataset:
    """Endless batches of rows, each row once per epoch in an order reshuffled every epoch: the k-th is
    this process's part [index * B, (index + 1) * B) of global batch start_step + k (G = B * count rows,
    shard = (index, count)), which depends on the seed and the step only, so a run resumes anywhere."""
    index, count = shard
    size = len(rows["tokens"])
    if size < batch_size * count:
        raise UserError(f"{size} training examples are fewer than one global batch of {batch_size * count}: "
                        "use a smaller train.batch_size or more data")
    order = grain.MapDataset.range(size).shuffle(seed=seed).repeat()
    global_batches = order.batch(batch_size * count, drop_remainder=True)
    return global_batches[start_step:].map(BatchRows(rows, index * batch_size, (index + 1) * batch_size)) \
        .to_iter_dataset()


def eval_batches(rows: Rows, batch_size: int) -> list[Rows]:
    """A split in order as ceil(N / batch_size) batches of batch_size rows, with `valid` (B,) int32: the
    last one filled up with copies of row 0 that have valid 0."""
    size = len(rows["tokens"])
    batches = []
    for start in range(0, size, batch_size):
        indices = np.arange(start, start + batch_size)
        valid = indices < size
        batch = {name: array[np.where(valid, indices, 0)] for name, array in rows.items()}
        batches.append({**batch, "valid": valid.astype(np.int32)})
    return batches
