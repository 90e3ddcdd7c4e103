"""Mixtures of sources: which source each training row comes from, as a pure function of the seed and the
global batch index, so that a run resumes at any step, on any number of processes, to the same batches.

data.mixture is `SPEC=WEIGHT,SPEC=WEIGHT,...` (each SPEC a lm/data/sources.py spec, the weights positive
and normalised to sum to 1). Each source's documents are packed into rows of their own (lm/data/packing.py);
a weight is the share of the rows, hence of the token slots, drawn from that source.

The global stream of rows (row n = s * G + r of global batch s, G rows each) is cut into blocks of
BLOCK_ROWS rows. Every block holds the same number of rows of each source, quota_j (BLOCK_ROWS split by the
weights, largest remainder first), in an order drawn from (seed, block). So before row n source j has given
block * quota_j rows plus its count among the first n % BLOCK_ROWS of the block's: the k-th row of source j
is then row k % R_j of its own permutation for epoch k // R_j (R_j rows, drawn from (seed, j, epoch)). Every
source goes through its rows once per epoch of its own; over any run the shares are the weights to within
one block (quota rounding: at most 0.5 / BLOCK_ROWS each).
"""

import dataclasses
import functools
import itertools
from collections.abc import Iterator, Sequence

import numpy as np

from lm.data import packing
from lm.errors import UserError

BLOCK_ROWS = 4096  # rows of the global stream with a fixed count from each source
MIXTURE_STREAM = 0x6D6978  # the stream of the blocks' orders, apart from the sources' epochs
FORM = "SPEC=WEIGHT,SPEC=WEIGHT,... (e.g. files:corpus/*.jsonl=0.7,files:tinyshakespeare/input.txt=0.3)"


@dataclasses.dataclass(frozen=True)
class Component:
    """One source of a mixture: its spec and its weight (normalised: the weights sum to 1)."""

    spec: str
    weight: float


def parse_mixture(text: str, option: str = "data.mixture") -> list[Component]:
    """The components of `SPEC=WEIGHT,...`, weights normalised; a UserError naming option for a malformed
    entry, a weight that is not a positive number, a repeated spec, or a weight too small for a block."""
    entries = [entry.strip() for entry in text.split(",")]
    parsed = []
    for entry in entries:
        spec, equals, weight = entry.rpartition("=")
        try:
            value = float(weight)
        except ValueError:
            value = float("nan")
        if not equals or not spec.strip() or not np.isfinite(value) or value <= 0:
            raise UserError(f"{option}={text}: {entry!r} is not SPEC=WEIGHT with a positive weight: use {FORM}")
        parsed.append((spec.strip(), value))
    specs = [spec for spec, _ in parsed]
    if len(set(specs)) < len(specs):
        repeated = next(spec for spec in specs if specs.count(spec) > 1)
        raise UserError(f"{option}={text}: {repeated} is named twice: give each source once, with its whole weight")
    total = sum(value for _, value in parsed)
    components = [Component(spec, value / total) for spec, value in parsed]
    for component in components:
        if component.weight * BLOCK_ROWS < 0.5:
            raise UserError(f"{option}={text}: {component.spec} has a share of {component.weight:.2g}, under "
                            f"one row in {BLOCK_ROWS} (the block whose rows follow the weights): raise its weight")
    return components


def block_quota(weights: Sequence[float], block_rows: int = BLOCK_ROWS) -> np.ndarray:
    """(K,) rows of each source in a block of block_rows: floor(block_rows * w_j), the rest one each to the
    largest remainders (ties: the first source); they sum to block_rows."""
    exact = np.asarray(weights, np.float64) * block_rows
    quota = np.floor(exact).astype(np.int64)
    rest = block_rows - int(quota.sum())
    quota[np.argsort(-(exact - quota), kind="stable")[:rest]] += 1
    return quota


class MixedRows:
    """Which row of which source each row of the global stream is: rows(start, count) -> (sources, indices),
    each (count,) int64 (module docstring)."""

    def __init__(self, row_counts: Sequence[int], weights: Sequence[float], seed: int,
                 block_rows: int = BLOCK_ROWS):
        if min(row_counts) < 1:
            raise ValueError(f"every source needs at least one row, not {list(row_counts)}")
        self.row_counts, self.seed, self.block_rows = list(row_counts), seed, block_rows
        self.quota = block_quota(weights, block_rows)
        self.block = functools.lru_cache(maxsize=2)(self.block)  # a batch meets one block, at most two
        self.epoch_order = functools.lru_cache(maxsize=2 * len(row_counts))(self.epoch_order)

    def block(self, number: int) -> tuple[np.ndarray, np.ndarray]:
        """Block number's (block_rows,) sources, and each row's rank among the block's rows of its source."""
        labels = np.repeat(np.arange(len(self.quota)), self.quota)
        sources = np.random.default_rng([MIXTURE_STREAM, self.seed, number]).permutation(labels)
        ranks = np.empty(self.block_rows, np.int64)
        for source in range(len(self.quota)):
            where = sources == source
            ranks[where] = np.arange(int(where.sum()))
        return sources, ranks

    def epoch_order(self, source: int, epoch: int) -> np.ndarray:
        """(R_source,) the order in which source goes through its rows in its epoch."""
        return np.random.default_rng([self.seed, source, epoch]).permutation(self.row_counts[source])

    def rows(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(sources, indices) of rows [start, start + count) of the global stream."""
        sources, indices = np.empty(count, np.int64), np.empty(count, np.int64)
        for n in range(start, start + count):
            number, position = divmod(n, self.block_rows)
            block_sources, ranks = self.block(number)
            source = block_sources[position]
            k = number * int(self.quota[source]) + int(ranks[position])  # rows source j gave before this one
            epoch, within = divmod(k, self.row_counts[source])
            sources[n - start], indices[n - start] = source, self.epoch_order(source, epoch)[within]
        return sources, indices


class MixtureBatches:
    """Endless batches of a mixture's packed rows: the k-th is this process's rows [index * B, (index + 1) * B)
    of global batch start_step + k (G = B * count rows, shard = (index, count)), as packing.examples plus
    "source" (B,) int32, the component each row comes from. Global batch s is a function of (rows, weights,
    seed, s) alone, whatever the number of processes."""

    def __init__(self, rows: Sequence[packing.PackedRows], weights: Sequence[float], batch_size: int, seed: int,
                 shard: tuple[int, int] = (0, 1), start_step: int = 0):
        self.examples = [packing.examples(source_rows) for source_rows in rows]
        self.mixed = MixedRows([len(source_rows.tokens) for source_rows in rows], weights, seed)
        self.batch_size, self.shard, self.start_step = batch_size, shard, start_step

    def batch(self, step: int) -> dict[str, np.ndarray]:
        index, count = self.shard
        sources, indices = self.mixed.rows((step * count + index) * self.batch_size, self.batch_size)
        batch = {key: np.empty((self.batch_size, *values.shape[1:]), values.dtype)
                 for key, values in self.examples[0].items()}
        for source, examples in enumerate(self.examples):
            chosen = sources == source
            for key, values in examples.items():
                batch[key][chosen] = values[indices[chosen]]
        return {**batch, "source": sources.astype(np.int32)}

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return map(self.batch, itertools.count(self.start_step))

