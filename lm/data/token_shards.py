"""Token shards: the folder `lm prepare --source` writes and `data.source=tokens:DIR` reads, and the parallel
tokenising that fills it.

A folder holds the documents of two splits, train and val, in shards of whole documents, each document its
ids followed by the end-of-text id:

  train-00000.bin  (N,) little-endian ids: uint16 when the vocabulary fits (65,536 ids or fewer), else uint32
  train-00000.idx  (D + 1,) little-endian uint64: where the shard's D documents start in the .bin, then N
                   (document i is ids[idx[i]:idx[i + 1]])
  train-00001.bin  ... a shard ends after the document that brings it to shard_tokens ids or more
  val-00000.bin    ... the val split, likewise
  tokenizer.json   the tokenizer (lm.data.bpe.BPETokenizer.load reads it)
  meta.json        the manifest: the arguments the folder was prepared with, the tokenizer (ids, end-of-text
                   id, the sha256 of its JSON), the token dtype, each split's documents (once known) and its
                   shards in order ({name, documents, tokens} each), and whether it is complete

A shard's files are written under .partial names and renamed once whole; then the shard is added to meta.json
(itself replaced whole). A shard meta.json does not list is not done: a prepare stopped anywhere resumes after
the last listed shard, and writes again what it would have written.

Tokenising: documents are cut into tasks of about TASK_CHARACTERS characters (a long document into pieces at
places where the tokenizer splits anyway, bpe.split_text, when bpe.splits_exactly says it is safe), encoded by
worker processes that each load the tokenizer once and encode on one core, and taken back in order.
"""

import collections
import contextlib
import ctypes
import dataclasses
import hashlib
import itertools
import multiprocessing
import os
import pathlib
import signal
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import tokenizers

from lm.data import bpe
from lm.data.files import DATA_DIR_ENV
from lm.errors import UserError
from lm.runs import read_json, write_json

FORMAT = "lm token shards 1"  # meta.json's "format"
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val")
SPEC_PREFIX = "tokens:"  # data.source=tokens:DIR
PIECE_CHARACTERS = 100_000  # a longer document is encoded in pieces of about this size (the same ids)
TASK_CHARACTERS = 1 << 18  # the characters a worker encodes at a time
TASKS_PER_WORKER = 2  # tasks in flight per worker: the source is read no further ahead
PARTIAL = ".partial"  # a file being written
PR_SET_PDEATHSIG = 1  # Linux's prctl option: the signal a process gets when its parent dies


Flat = tuple[np.ndarray, np.ndarray]  # documents as (ids (N,), offsets (D + 1,)): i is ids[offsets[i]:offsets[i + 1]]


def token_dtype(vocab_size: int) -> str:
    """The dtype of a vocabulary's ids in a shard: uint16 when they fit, else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def little_endian(dtype: str) -> np.dtype:
    """The layout of a dtype's ids in a file (uint16: <u2). (Not lm.data.tokens.TOKEN_DTYPES: importing that
    module imports grain and JAX, a second of lm prepare's start.)"""
    return np.dtype(dtype).newbyteorder("<")


def tokenizer_digest(tokenizer: tokenizers.Tokenizer) -> str:
    """The sha256 of the tokenizer's JSON: equal digests, equal ids."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


# --- writing -----------------------------------------------------------------------------------------


def new_meta(arguments: dict) -> dict:
    """The manifest of a folder nothing is written into yet (module docstring)."""
    return {"format": FORMAT, "arguments": arguments, "tokenizer": None, "token_dtype": None,
            "source_documents": None, "splits": {split: {"documents": None, "shards": []} for split in SPLITS},
            "complete": False}


def written_documents(meta: dict, split: str) -> int:
    """The documents of the split's shards that meta.json lists."""
    return sum(shard["documents"] for shard in meta["splits"][split]["shards"])


def split_done(meta: dict, split: str) -> bool:
    return meta["splits"][split]["documents"] == written_documents(meta, split)


def save_meta(folder: pathlib.Path, meta: dict) -> None:
    write_json(folder / META_FILE, meta)


class ShardWriter:
    """Writes a split's id stream into shards from number `index` on, each closed after the document that
    brings it to shard_tokens ids or more; on_shard(shard) is called with {name, documents, tokens} once a
    shard is whole on disk."""

    def __init__(self, folder: pathlib.Path, split: str, index: int, shard_tokens: int, dtype: str,
                 on_shard: Callable[[dict], None]):
        self.folder, self.split, self.index = folder, split, index
        self.shard_tokens, self.dtype, self.on_shard = shard_tokens, little_endian(dtype), on_shard
        self.file = None  # the open shard's .bin.partial
        self.starts = [0]  # where the open shard's finished documents start, then where the next one does

    @property
    def name(self) -> str:
        return f"{self.split}-{self.index:05d}"

    def write(self, ids: np.ndarray, ends: np.ndarray) -> None:
        """ids: (n,) the next ids of the stream; ends: (k,) increasing positions in ids (1..n) just after the
        documents that end there (after their end-of-text id). The ids after the last end begin a document
        the next call goes on with."""
        start = 0
        for end in ends:
            self.append(ids[start:end])
            start = end
            self.starts.append(self.size)
            if self.size >= self.shard_tokens:
                self.close_shard()
        self.append(ids[start:])

    def finish(self) -> None:
        """Closes the last shard; every document must have ended."""
        if self.file is None:
            return
        if self.size != self.starts[-1]:
            raise ValueError(f"{self.name}: the stream stops inside a document")
        self.close_shard()

    def append(self, ids: np.ndarray) -> None:
        if not len(ids):
            return
        if self.file is None:
            self.file, self.size = open(self.folder / f"{self.name}.bin{PARTIAL}", "wb"), 0
        np.ascontiguousarray(ids, self.dtype).tofile(self.file)
        self.size += len(ids)

    def close_shard(self) -> None:
        self.file.close()
        self.file = None
        np.array(self.starts, "<u8").tofile(self.folder / f"{self.name}.idx{PARTIAL}")
        for suffix in (".bin", ".idx"):
            (self.folder / f"{self.name}{suffix}{PARTIAL}").replace(self.folder / f"{self.name}{suffix}")
        self.on_shard({"name": self.name, "documents": len(self.starts) - 1, "tokens": self.size})
        self.index, self.starts = self.index + 1, [0]


# --- tokenising in parallel ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
    """Texts encoded together: documents or pieces of one, in order; ends[i]: texts[i] ends its document."""

    texts: list[str]
    ends: list[bool]
    megabytes: float  # the texts' UTF-8 size, for the progress line


def make_tasks(documents: Iterable[str], split_long: bool, size: int = TASK_CHARACTERS) -> Iterator[Task]:
    """The documents as tasks of about size characters or more (the last may be smaller), a document longer
    than PIECE_CHARACTERS cut into pieces (bpe.split_text) if split_long, else whole."""
    texts, ends, characters = [], [], 0
    for document in documents:
        pieces = bpe.split_text(document, PIECE_CHARACTERS) if split_long else [document]
        for i, piece in enumerate(pieces):
            texts.append(piece)
            ends.append(i == len(pieces) - 1)
            characters += len(piece)
            if characters >= size:
                yield Task(texts, ends, sum(len(text.encode("utf-8")) for text in texts) / 1e6)
                texts, ends, characters = [], [], 0
    if texts:
        yield Task(texts, ends, sum(len(text.encode("utf-8")) for text in texts) / 1e6)


class TaskEncoder:
    """Encodes a task into ((n,) ids, (k,) the positions just after each document that ends in it): the texts'
    ids in order, the end-of-text id after each document's last piece."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, dtype: str):
        self.tokenizer = tokenizer
        self.end_id, self.dtype = tokenizer.token_to_id(bpe.END_OF_TEXT), little_endian(dtype)

    def __call__(self, task: Task) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.tokenizer.encode_batch_fast(task.texts, add_special_tokens=False)
        pieces = [encoding.ids + [self.end_id] if end else encoding.ids
                  for encoding, end in zip(encodings, task.ends, strict=True)]
        lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
        ids = np.fromiter(itertools.chain.from_iterable(pieces), self.dtype, int(lengths.sum()))
        return ids, np.cumsum(lengths)[np.array(task.ends, bool)]


_worker_encoder: TaskEncoder | None = None  # a worker process's


def start_worker(tokenizer: tokenizers.Tokenizer, dtype: str) -> None:
    global _worker_encoder
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the main process, which ends the workers
    die_with_parent()
    _worker_encoder = TaskEncoder(tokenizer, dtype)


def die_with_parent() -> None:
    """On Linux, this process is killed when the one that started it dies (a killed lm prepare leaves no
    worker behind); elsewhere nothing."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl: not Linux
        pass


def encode_in_worker(task: Task) -> tuple[np.ndarray, np.ndarray]:
    return _worker_encoder(task)


@contextlib.contextmanager
def one_thread_each() -> Iterator[None]:
    """TOKENIZERS_PARALLELISM=false while worker processes start (they inherit it: one core each, the workers
    are the parallelism), then as it was."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def encode_tasks(tasks: Iterable[Task], tokenizer: tokenizers.Tokenizer, dtype: str,
                 workers: int) -> Iterator[tuple[Task, tuple[np.ndarray, np.ndarray]]]:
    """Each task with its encoding (TaskEncoder), in order: encoded in this process (workers=1) or by `workers`
    processes, with at most TASKS_PER_WORKER * workers tasks in flight (tasks are drawn no further ahead)."""
    if workers == 1:
        encoder = TaskEncoder(tokenizer, dtype)
        yield from ((task, encoder(task)) for task in tasks)
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)  # fork: the tokenizer as it is
    with one_thread_each():
        pool = context.Pool(workers, start_worker, (tokenizer, dtype))
    with pool:  # (leaving it, early too, ends the workers)
        pending = collections.deque()
        for task in tasks:
            pending.append((task, pool.apply_async(encode_in_worker, (task,))))
            if len(pending) >= TASKS_PER_WORKER * workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()


# --- reading: data.source=tokens:DIR ------------------------------------------------------------------


def is_spec(spec: str) -> bool:
    return spec.startswith(SPEC_PREFIX)


def find_folder(spec: str, option: str) -> pathlib.Path:
    """The folder of a tokens:DIR spec: DIR (a relative one in the working directory, else in $LM_DATA_DIR),
    which must hold a meta.json; a UserError naming where it looked otherwise."""
    name = pathlib.Path(spec.removeprefix(SPEC_PREFIX)).expanduser()
    places = [name]
    if not name.is_absolute() and os.environ.get(DATA_DIR_ENV):
        places.append(pathlib.Path(os.environ[DATA_DIR_ENV]) / name)
    for place in places:
        if (place / META_FILE).is_file():
            return place
    raise UserError(f"{option}={spec}: no {META_FILE} in {' nor '.join(map(str, places))}: give a folder that "
                    "lm prepare --source=SPEC --out=DIR wrote")


def open_folder(spec: str, option: str, tokenizer: tokenizers.Tokenizer, tokenizer_option: str) -> tuple[
        pathlib.Path, dict]:
    """(folder, meta) of a tokens:DIR spec named by option; UserErrors for a folder that is not lm prepare
    --source's, one it has not finished, or one prepared with another tokenizer than tokenizer_option's."""
    folder = find_folder(spec, option)
    remedy = f"prepare {folder} again (delete it, then run lm prepare --source=... --out={folder})"
    meta = read_json(folder / META_FILE, remedy)
    if meta.get("format") != FORMAT:
        raise UserError(f"{option}={spec}: {folder} holds token files of lm prepare --text, not the shards of "
                        f"lm prepare --source: use data.dataset=token_file, or {remedy}")
    if not meta["complete"]:
        shards = sum(len(meta["splits"][split]["shards"]) for split in SPLITS)
        raise UserError(f"{option}={spec}: lm prepare has not finished {folder} ({shards} shards so far): run "
                        "its command again, it resumes")
    recorded = meta["tokenizer"]
    if recorded["sha256"] != tokenizer_digest(tokenizer):
        raise UserError(f"{tokenizer_option} is not the tokenizer {folder} was prepared with "
                        f"(--tokenizer={meta['arguments']['tokenizer']}, {recorded['vocab_size']} ids): set "
                        f"--config.data.tokenizer={folder / TOKENIZER_FILE} "
                        f"--config.data.vocab_size={recorded['vocab_size']}")
    return folder, meta


def read_split(folder: pathlib.Path, meta: dict, split: str) -> Flat:
    """The split's documents as (ids (N,), offsets (D + 1,) int64): a single shard's ids memory-mapped, several
    shards' joined. A UserError if a shard's files do not hold what meta.json records."""
    dtype = little_endian(meta["token_dtype"])
    ids, offsets, start = [], [], 0
    for shard in meta["splits"][split]["shards"]:
        path = folder / shard["name"]
        try:
            shard_ids = np.memmap(path.with_suffix(".bin"), dtype, mode="r")
            starts = np.fromfile(path.with_suffix(".idx"), "<u8").astype(np.int64)
        except (OSError, ValueError) as e:
            raise UserError(f"{path}.bin or .idx cannot be read ({e}): prepare {folder} again") from e
        if len(shard_ids) != shard["tokens"] or len(starts) != shard["documents"] + 1 or starts[-1] != len(shard_ids):
            raise UserError(f"{path}.bin and .idx do not hold the {shard['documents']} documents of {shard['tokens']} "
                            f"ids {folder / META_FILE} records: prepare {folder} again")
        ids.append(shard_ids)
        offsets.append(starts[:-1] + start)
        start += len(shard_ids)
    offsets.append(np.array([start]))
    return (ids[0] if len(ids) == 1 else np.concatenate(ids)), np.concatenate(offsets)


def read_documents(spec: str, split: str, option: str, tokenizer: tokenizers.Tokenizer,
                   tokenizer_option: str) -> Flat:
    """The split's documents of the tokens:DIR spec named by option (open_folder, read_split)."""
    folder, meta = open_folder(spec, option, tokenizer, tokenizer_option)
    return read_split(folder, meta, split)
