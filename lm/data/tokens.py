"""Token ids for the language model without a tokenizer: pre-tokenised files (nanoGPT's train.bin /
val.bin: a raw little-endian array of ids), memory-mapped so that a corpus of billions of tokens is
never loaded, and synthetic uniformly random ids for throughput runs that need no data files.

Both give batches {"inputs": (B, T) int32, "targets": (B, T) int32} with the training pipeline's
semantics (Experiment.train_data): global batch s depends on the seed and s only, and process
`index` of `count` takes its rows [index * B, (index + 1) * B).
"""

import itertools
import pathlib
from collections.abc import Iterator

import grain
import numpy as np

from lm.data import text
from lm.data.files import find_file
from lm.errors import UserError

TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}  # data.token_dtype -> file layout
CHECK_AT_OPEN = 1 << 20  # ids checked against the vocabulary when a file is opened; the rest batch by batch
TRAIN_STREAM, EVAL_STREAM = 0, 1  # synthetic ids: the first entropy word, so eval never repeats training
FILE_FORMAT = "a raw array of little-endian token ids, as nanoGPT's data/*/prepare.py writes"


def find_token_file(path: str, field: str, what: str = FILE_FORMAT) -> pathlib.Path:
    """path if absolute, else $LM_DATA_DIR/path (or the download cache); field names the config
    option it came from, what says what the file holds. A missing file is a UserError naming where
    it looked."""
    how = f"or give {field} as an absolute path; the file is {what}"
    candidate = pathlib.Path(path).expanduser()
    if not candidate.is_absolute():
        return find_file(path, how=how)
    if not candidate.is_file():
        raise UserError(f"data file {candidate} not found ({field}); give a path that exists, absolute or "
                        f"relative to $LM_DATA_DIR: {what}")
    return candidate


def open_tokens(path: str, dtype: str, length: int, vocab_size: int, field: str) -> np.memmap:
    """The (N,) token ids of a file, memory-mapped read-only (never read whole). UserErrors: a dtype
    other than uint16/uint32, a size that is not a whole number of ids, too few ids for one window
    of length + 1, an id >= vocab_size among the first CHECK_AT_OPEN (the rest are checked as
    batches are built)."""
    if dtype not in TOKEN_DTYPES:
        raise UserError(f"data.token_dtype={dtype!r}: use one of {sorted(TOKEN_DTYPES)}")
    item = TOKEN_DTYPES[dtype]
    found = find_token_file(path, field)
    size = found.stat().st_size
    if size % item.itemsize:
        raise UserError(f"{found} ({field}) has {size} bytes, not a whole number of {dtype} token ids "
                        f"({item.itemsize} bytes each): is data.token_dtype right?")
    if size // item.itemsize <= length:
        raise UserError(f"{found} ({field}) holds {size // item.itemsize} tokens, too few for one window of "
                        f"data.context_length={length} + 1: use a bigger file or a shorter context")
    tokens = np.memmap(found, dtype=item, mode="r")
    check_ids(tokens[:CHECK_AT_OPEN], vocab_size, found)
    return tokens


def check_ids(ids: np.ndarray, vocab_size: int, source) -> None:
    """Raises a UserError if an id of ids (any shape, unsigned) is >= vocab_size; source names the file."""
    top = int(ids.max()) if ids.size else 0
    if top >= vocab_size:
        raise UserError(f"token id {top} in {source} is out of the vocabulary (data.vocab_size={vocab_size}): "
                        "set data.vocab_size to the tokenizer's, or data.token_dtype to the file's")


class ModelIds:
    """A batch of windows {"inputs", "targets"}: (B, T) file ids -> (B, T) int32 for the model, every id
    checked against vocab_size on the way (cheap, on the host: a huge file is never scanned)."""

    def __init__(self, vocab_size: int, source):
        self.vocab_size, self.source = vocab_size, source

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for ids in batch.values():
            check_ids(ids, self.vocab_size, self.source)
        return {name: ids.astype(np.int32) for name, ids in batch.items()}


def _source(tokens: np.ndarray) -> str:
    return str(getattr(tokens, "filename", None) or "the token ids")


def train_windows(
    tokens: np.ndarray, length: int, batch_size: int, seed: int, shard: tuple[int, int], start_step: int,
    vocab_size: int,
) -> grain.IterDataset:
    """text.train_windows over a file's (N,) ids (the same batches, shards and resume), as int32
    (B, T) inputs and targets, each id checked < vocab_size."""
    windows = text.train_windows(tokens, length, batch_size, seed, shard, start_step)
    return windows.map(ModelIds(vocab_size, _source(tokens)))


def eval_windows(
    tokens: np.ndarray, length: int, batch_size: int, num_batches: int, vocab_size: int, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """text.eval_windows over a file's (N,) ids: num_batches fixed batches of int32 (B, T), ids checked."""
    to_model = ModelIds(vocab_size, _source(tokens))
    return [to_model(b) for b in text.eval_windows(tokens, length, batch_size, num_batches, seed)]


def random_windows(rng: np.random.Generator, vocab_size: int, length: int, rows: int) -> dict[str, np.ndarray]:
    """(rows, length + 1) uniform ids in [0, vocab_size) -> int32 inputs and targets, (rows, length) each."""
    return text.to_example(rng.integers(0, vocab_size, size=(rows, length + 1), dtype=np.int32))


class SyntheticBatches:
    """Endless training batches of uniformly random ids, for throughput runs without data files.
    Global batch s, (G, T + 1) ids with G = batch_size * count, is drawn from
    np.random.default_rng([TRAIN_STREAM, seed, s]) alone; the k-th batch is this process's rows
    [index * B, (index + 1) * B) of global batch start_step + k, shard = (index, count). About 0.2 ms
    for 32 x 1025 ids."""

    def __init__(self, vocab_size: int, length: int, batch_size: int, seed: int,
                 shard: tuple[int, int] = (0, 1), start_step: int = 0):
        self.vocab_size, self.length, self.batch_size, self.seed = vocab_size, length, batch_size, seed
        self.shard, self.start_step = shard, start_step

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        index, count = self.shard
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        for step in itertools.count(self.start_step):
            rng = np.random.default_rng([TRAIN_STREAM, self.seed, step])
            batch = random_windows(rng, self.vocab_size, self.length, self.batch_size * count)
            yield {name: ids[rows] for name, ids in batch.items()}


def synthetic_eval(
    vocab_size: int, length: int, batch_size: int, num_batches: int, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """A fixed set of num_batches batches of random ids, (B, T) int32 inputs and targets, drawn from
    their own stream (never one of the training batches)."""
    rng = np.random.default_rng([EVAL_STREAM, seed])
    return [random_windows(rng, vocab_size, length, batch_size) for _ in range(num_batches)]
