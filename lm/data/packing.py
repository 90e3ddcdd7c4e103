"""Packing by document: whole documents laid into fixed-length rows, best-fit, with segment ids.

A row holds `length + 1` tokens, so that inputs = row[:-1] and targets = row[1:] are `length` long.
Documents (each (n_i,) token ids, ending with the end-of-text id where the tokenizer has one) longer
than a row are first cut into row-sized pieces (the last piece holds the rest); then the pieces are
placed best-fit-decreasing: longest first (ties in input order), each into the open row with the
least room that still fits it (ties: the row opened first), or a new row. Within a row the pieces lie
in the order they were placed, and padding fills the end.

Per row (R rows, W = length + 1):
  tokens       (R, W) int32  the pieces' ids, pad_id after them
  segment_ids  (R, W) int32  1, 2, ... for the row's first, second, ... piece; 0 for padding
  positions    (R, W) int32  0, 1, ... restarting at each piece; 0 on padding
  weights      (R, W) float32  only when pack_documents was given per-token weights (supervised
                              fine-tuning: 1 on the assistant's tokens, 0 on the prompt's), 0 on padding
For training (`examples`), each (R, length): inputs, targets, segment_ids, positions of the inputs,
and weights (float32): 1 where the target is the next token of the same piece, 0 where it belongs to
the next document or is padding; times the target token's own weight where the rows carry weights. The
model attends within a segment only (lm/models/gpt.py).

The result is a pure function of the documents in their order. Placing a piece costs a bisect (and
at times an insert) in the sorted list of the distinct room sizes of the open rows, at most W of them,
and a heap operation on the rows with that room: O(n log n) for n pieces (about 4 s for a million
documents of up to 100 tokens into rows of 1025).

train_batches and eval_batches serve packed rows as the trainer's batches (the language model's
data.packing=documents): shuffled per epoch and sharded over processes like text.train_windows.
"""

import bisect
import dataclasses
import heapq
from collections.abc import Sequence

import grain
import numpy as np


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """Rows of packed documents, each array (R, length + 1) int32 (see the module docstring)."""

    tokens: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray
    weights: np.ndarray | None = None  # each token's loss weight as a target (None: every token counts)


def split_documents(documents: Sequence[np.ndarray], size: int) -> list[np.ndarray]:
    """The documents cut into pieces of at most `size` tokens, in order (a document of n tokens gives
    ceil(n / size) pieces, all but the last exactly `size` long); empty documents give none."""
    return [document[start:start + size] for document in documents for start in range(0, len(document), size)]


def best_fit(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit-decreasing bin packing of items of sizes (n,), each 1..capacity, into rows of capacity:
    per row (in the order rows are opened), the indices of its items in the order they were placed."""
    rows: list[list[int]] = []
    rows_with_room: dict[int, list[int]] = {}  # room -> a heap of the open rows with exactly that room left
    rooms: list[int] = []  # the keys of rows_with_room, ascending
    for item in np.argsort(-np.asarray(sizes), kind="stable").tolist():  # longest first, ties in input order
        size = int(sizes[item])
        i = bisect.bisect_left(rooms, size)  # the least room that still fits
        if i == len(rooms):
            row, room = len(rows), capacity
            rows.append([])
        else:
            room = rooms[i]
            row = heapq.heappop(rows_with_room[room])
            if not rows_with_room[room]:
                del rows_with_room[room], rooms[i]
        rows[row].append(item)
        if room > size:
            if room - size not in rows_with_room:
                bisect.insort(rooms, room - size)
            heapq.heappush(rows_with_room.setdefault(room - size, []), row)
    return rows


def pack_documents(documents: Sequence[np.ndarray], length: int, pad_id: int = 0,
                   weights: Sequence[np.ndarray] | None = None) -> PackedRows:
    """documents (each (n_i,) ids) packed best-fit into rows of length + 1 tokens (module docstring);
    weights, if given, (n_i,) per document, travel with its tokens into the rows' weights."""
    width = length + 1
    pieces = split_documents(documents, width)
    rows = best_fit([len(piece) for piece in pieces], width)
    tokens = np.full((len(rows), width), pad_id, np.int32)
    segment_ids = np.zeros((len(rows), width), np.int32)
    positions = np.zeros((len(rows), width), np.int32)
    weight_pieces = None if weights is None else split_documents(weights, width)
    row_weights = None if weights is None else np.zeros((len(rows), width), np.float32)
    ramp = np.arange(width, dtype=np.int32)
    for row, members in enumerate(rows):
        start = 0
        for segment, item in enumerate(members, 1):
            piece = pieces[item]
            end = start + len(piece)
            tokens[row, start:end] = piece
            segment_ids[row, start:end] = segment
            positions[row, start:end] = ramp[:len(piece)]
            if row_weights is not None:
                row_weights[row, start:end] = weight_pieces[item]
            start = end
    return PackedRows(tokens, segment_ids, positions, row_weights)


def examples(rows: PackedRows) -> dict[str, np.ndarray]:
    """Training examples of packed rows, each (R, length): inputs, targets, segment_ids and positions
    (of the inputs) int32, weights float32 (1: the target continues the input's piece; 0: a boundary
    or padding; times the target's own weight where the rows carry weights)."""
    segments = rows.segment_ids
    weights = ((segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)).astype(np.float32)
    return {
        "inputs": rows.tokens[:, :-1],
        "targets": rows.tokens[:, 1:],
        "segment_ids": segments[:, :-1],
        "positions": rows.positions[:, :-1],
        "weights": weights if rows.weights is None else weights * rows.weights[:, 1:],
    }


def padding_fraction(rows: PackedRows) -> float:
    """The share of the rows' token slots that are padding."""
    return float(np.mean(rows.segment_ids == 0)) if rows.segment_ids.size else 0.0


class ExampleRows:
    """Row indices of a global batch (G,) -> this process's rows [start, stop) of the examples, each (B, length)."""

    def __init__(self, rows: dict[str, np.ndarray], start: int, stop: int):
        self.rows, self.start, self.stop = rows, start, stop

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        chosen = indices[self.start:self.stop]
        return {key: values[chosen] for key, values in self.rows.items()}


def train_batches(rows: PackedRows, batch_size: int, seed: int, shard: tuple[int, int] = (0, 1),
                  start_step: int = 0) -> grain.IterDataset:
    """Endless batches of packed rows (examples), the semantics of text.train_windows: every row once per
    epoch, in a permutation drawn from the seed and the epoch; the k-th batch is this process's rows
    [index * B, (index + 1) * B) of global batch start_step + k (G = B * count rows, shard = (index, count)),
    so global batch s is a function of (rows, seed, s) alone, whatever the number of processes."""
    index, count = shard
    order = grain.MapDataset.range(len(rows.tokens)).shuffle(seed=seed).repeat()
    global_batches = order.batch(batch_size * count, drop_remainder=True)  # row indices, (G,) each
    chosen = ExampleRows(examples(rows), index * batch_size, (index + 1) * batch_size)
    return global_batches[start_step:].map(chosen).to_iter_dataset()


def eval_batches(rows: PackedRows, batch_size: int, num_batches: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """num_batches fixed batches of batch_size packed rows (examples): the rows in a seeded permutation,
    repeated as often as the batches need."""
    order = np.resize(np.random.default_rng(seed).permutation(len(rows.tokens)), (num_batches, batch_size))
    chosen = ExampleRows(examples(rows), 0, batch_size)  # (the examples made once, for every batch)
    return [chosen(indices) for indices in order]
