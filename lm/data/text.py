"""Character-level text: the tokenizer, the train/val split, and the random-window pipeline."""

import json
import pathlib

import grain
import numpy as np

from lm.data.files import find_file
from lm.errors import UserError

TINY_SHAKESPEARE = (
    "tinyshakespeare/input.txt",
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
)
DATASETS = {"tinyshakespeare": TINY_SHAKESPEARE}


class CharTokenizer:
    """Maps each distinct character of a text to an id (sorted order, as in char-rnn/nanoGPT)."""

    def __init__(self, chars: str):
        self.chars = chars
        self._ids = {c: i for i, c in enumerate(chars)}

    @classmethod
    def fit(cls, text: str) -> "CharTokenizer":
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ValueError(f"characters {unknown!r} are not in the vocabulary")
        return np.array([self._ids[c] for c in text], dtype=np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def save(self, path: pathlib.Path) -> None:
        path.write_text(json.dumps({"chars": self.chars}))

    @classmethod
    def load(cls, path: pathlib.Path) -> "CharTokenizer":
        return cls(json.loads(path.read_text())["chars"])


def load_text(dataset: str) -> str:
    """The corpus as text; an empty file or one that is not UTF-8 is a UserError naming it."""
    if dataset not in DATASETS:
        raise ValueError(f"data.dataset={dataset!r}: known datasets are {sorted(DATASETS)}")
    path = find_file(*DATASETS[dataset])
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); replace it with the "
                        "plain-text corpus (see docs/data-files.md)") from e
    if not text.strip():
        raise UserError(f"{path} is empty; replace it with the plain-text corpus (see docs/data-files.md)")
    return text


def split_tokens(tokens: np.ndarray, train_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """First train_fraction of the stream for training, the rest for validation."""
    cut = int(len(tokens) * train_fraction)
    return tokens[:cut], tokens[cut:]


class TokenWindows:
    """Random-access source: window i is tokens[i : i + length + 1] (inputs plus shifted targets)."""

    def __init__(self, tokens: np.ndarray, length: int):
        if len(tokens) <= length:
            raise UserError(f"{len(tokens)} tokens are too few for windows of {length} + 1: use more text or a "
                            "shorter data.context_length")
        self.tokens = tokens
        self.length = length

    def __len__(self) -> int:
        return len(self.tokens) - self.length

    def __getitem__(self, index: int) -> np.ndarray:
        return self.tokens[index : index + self.length + 1]


def to_example(windows: np.ndarray) -> dict[str, np.ndarray]:
    """(B, T + 1) windows -> inputs (B, T) and next-token targets (B, T)."""
    return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


class WindowRows:
    """Window indices of a global batch (G,) -> this process's rows [start, stop) as an example."""

    def __init__(self, windows: TokenWindows, start: int, stop: int):
        self.windows, self.start, self.stop = windows, start, stop

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return to_example(np.stack([self.windows[int(i)] for i in indices[self.start : self.stop]]))


def train_windows(
    tokens: np.ndarray, length: int, batch_size: int, seed: int, shard: tuple[int, int] = (0, 1),
    start_step: int = 0,
) -> grain.IterDataset:
    """Endless batches of windows at random offsets: every offset once per epoch, reshuffled each
    epoch. The k-th batch is this process's rows [index * B, (index + 1) * B) of global batch
    start_step + k (G = B * count windows, shard = (index, count), B = batch_size), so the global
    batches are the same whatever the number of processes, and a run resumes at any step."""
    index, count = shard
    windows = TokenWindows(tokens, length)
    order = grain.MapDataset.range(len(windows)).shuffle(seed=seed).repeat()
    global_batches = order.batch(batch_size * count, drop_remainder=True)  # window indices, (G,) each
    rows = WindowRows(windows, index * batch_size, (index + 1) * batch_size)
    return global_batches[start_step:].map(rows).to_iter_dataset()


def eval_windows(
    tokens: np.ndarray, length: int, batch_size: int, num_batches: int, seed: int
) -> list[dict[str, np.ndarray]]:
    """A fixed set of num_batches batches of windows at seeded random offsets (the same every eval)."""
    source = TokenWindows(tokens, length)
    starts = np.random.default_rng(seed).integers(0, len(source), size=(num_batches, batch_size))
    return [to_example(np.stack([source[s] for s in row])) for row in starts]
