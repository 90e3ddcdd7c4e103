r"""Tokenize text files or a source's documents for a GPT: token files or token shards, and the tokenizer.

  lm prepare --text=input.txt [--text=more.txt ...] --tokenizer=bpe --vocab_size=2048 \
      --out=/data/shakespeare_bpe [--val_fraction=0.1]
  lm prepare --text='books/*.txt' --tokenizer=gpt2 --out=/data/books_gpt2
  lm prepare --source='files:/data/web/*.jsonl.gz' --tokenizer=gpt2 --out=/data/web_gpt2 \
      [--val_fraction=0.01 | --val_source=SPEC] [--workers=N] [--shard_tokens=67108864]

--tokenizer=bpe trains a byte-level BPE of --vocab_size ids on the texts; --tokenizer=gpt2 is GPT-2's own
(50,257 ids, from $LM_DATA_DIR/vocab); any other value is the path of a tokenizer.json (with <|endoftext|>).

--source (any spec of lm/data/sources.py: files:GLOB, tfds:..., hf:...; --text_field, --skip_bad_records as
data.* has them) writes token shards (lm/data/token_shards.py): train-00000.bin/.idx ... and val-*, each
document's ids followed by <|endoftext|>, with the document starts in the .idx, and a meta.json manifest.
The val split is the last --val_fraction of the documents (at least one; default 0.01, as data.val_fraction;
a single document: its last tokens) or --val_source's documents. The documents are read in order here and
tokenized by --workers processes (default: all cores) with a progress line; memory does not grow with the
corpus. A shard is recorded once whole: the same command run again after a kill resumes after the last one
and writes the same bytes; other arguments into the same --out are refused. Train on the shards with
--config.data.dataset=source --config.data.source=tokens:DIR (the command is printed at the end).

--text: the files are read as UTF-8 (a --text with * or ? is a glob) and
tokenized one after another, <|endoftext|> between two files; the last --val_fraction of the ids is the
validation split. It writes into --out:

  train.bin, val.bin  little-endian token ids, uint16 when the vocabulary fits (else uint32)
  tokenizer.json      the tokenizer (Hugging Face's format; lm.data.bpe.BPETokenizer.load reads it)
  meta.json           tokenizer, vocab_size, token_dtype, train_tokens, val_tokens, texts

and prints the lm train command that trains configs/gpt2.py on them (data.tokenizer makes the tokenizer
part of the run, so that `lm sample --workdir=RUN --prompt=...` prints text).
"""

import glob
import itertools
import json
import os
import pathlib
import sys
from collections.abc import Iterable, Iterator

import numpy as np
from absl import app, flags

from lm.cli import define_string_once, parse_flags, reject_arguments
from lm.data import token_shards
from lm.data.bpe import MIN_VOCAB_SIZE, BPETokenizer, split_text, splits_exactly
from lm.data.sources import Source
from lm.errors import UserError, run_user_errors
from lm.progress import Progress
from lm.runs import read_json

TOKENIZERS = ("bpe", "gpt2")  # else the path of a tokenizer.json
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
UINT16_IDS = 1 << 16
PIECE_CHARACTERS = 1 << 22  # tokenized a piece at a time, with a progress line now and then
TEXT_VAL_FRACTION = 0.1  # --text: the ids held out by default
SOURCE_VAL_FRACTION = 0.01  # --source: the documents held out by default (data.val_fraction's default)
SHARD_TOKENS = 1 << 26  # --source: ids a shard reaches before it is closed (128 MiB of uint16)
SOURCE_OPTIONS = {"--config.data.skip_bad_records=True": "--skip_bad_records",  # a Source's messages name the
                  "--config.data.text_field": "--text_field"}  # options of a training run: prepare's flags instead
EXIT_INTERRUPTED = 130  # a shell's code for Ctrl-C
SOURCE_FLAGS = ("val_source", "text_field", "skip_bad_records", "workers", "shard_tokens")  # --source's only

_TEXT = flags.DEFINE_multi_string("text", [], "A UTF-8 text file (or a glob); repeat for more files.")
_SOURCE = flags.DEFINE_string("source", None, "The documents to tokenize into shards, instead of --text: files:GLOB, "
                              "tfds:NAME[/CONFIG][:SPLIT] or hf:NAME_OR_DIR[:CONFIG][:SPLIT] (docs/data.md).")
_TOKENIZER = flags.DEFINE_string("tokenizer", "bpe", "bpe: train a byte-level BPE on the texts; gpt2: GPT-2's "
                                 "tokenizer files; else the path of a tokenizer.json.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", None, "Ids of the trained BPE (--tokenizer=bpe), e.g. 2048.")
_VAL_FRACTION = flags.DEFINE_float("val_fraction", None, "The validation split: --text: the last fraction of the "
                                   f"ids (default {TEXT_VAL_FRACTION}); --source: of the documents (default "
                                   f"{SOURCE_VAL_FRACTION}).")
_VAL_SOURCE = flags.DEFINE_string("val_source", None, "--source: the validation documents, another source "
                                  "(instead of --val_fraction).")
_TEXT_FIELD = flags.DEFINE_string("text_field", "text", "--source: the field of a record holding its document.")
_SKIP_BAD_RECORDS = flags.DEFINE_bool("skip_bad_records", False, "--source: skip (and count) the records that give "
                                      "no document instead of stopping.")
_WORKERS = flags.DEFINE_integer("workers", None, "--source: tokenizing processes (default: all cores).")
_SHARD_TOKENS = flags.DEFINE_integer("shard_tokens", SHARD_TOKENS, "--source: a shard is closed after the document "
                                     "that brings it to this many ids.")
_OUT = define_string_once("out", "The folder to write the token files and the tokenizer into.")


def text_paths(patterns: list[str]) -> list[pathlib.Path]:
    """The files named (globs expanded, in sorted order); UserError for a missing file or an empty glob."""
    if not patterns:
        raise UserError("give the text to tokenize: --text=FILE (repeat it, or use a glob, for several files)")
    paths = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise UserError(f"--text={pattern}: no file matches")
            paths += [pathlib.Path(m) for m in matches]
        elif not pathlib.Path(pattern).is_file():
            raise UserError(f"--text={pattern}: file not found")
        else:
            paths.append(pathlib.Path(pattern))
    return paths


def read_text(path: pathlib.Path) -> str:
    try:
        text = path.read_bytes().decode("utf-8")  # as it is: no newline translation
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--text={path} cannot be read as UTF-8 text ({e})") from e
    if not text:
        raise UserError(f"--text={path} is empty")
    return text


def check_tokenizer(name: str, vocab_size: int | None) -> None:
    """UserError unless name is bpe with a --vocab_size a byte-level BPE can have, or gpt2 or the path of a
    file (a tokenizer.json) without one."""
    if name == "bpe":
        if vocab_size is None:
            raise UserError("--tokenizer=bpe needs --vocab_size, the ids to learn (e.g. 2048)")
        if vocab_size < MIN_VOCAB_SIZE:
            raise UserError(f"--vocab_size={vocab_size} is too small for a byte-level BPE: it needs at least "
                            f"{MIN_VOCAB_SIZE} (256 bytes + <|endoftext|>)")
    elif name != "gpt2" and not pathlib.Path(name).expanduser().is_file():
        raise UserError(f"--tokenizer={name}: use one of {', '.join(TOKENIZERS)} or the path of a tokenizer.json "
                        "(no such file)")
    elif vocab_size is not None:
        fixed = "GPT-2's vocabulary is fixed (50257 ids)" if name == "gpt2" else f"{name}'s vocabulary is fixed"
        raise UserError(f"--vocab_size={vocab_size}: {fixed}; drop --vocab_size")


def make_tokenizer(name: str, vocab_size: int | None, texts: Iterable[str]) -> BPETokenizer:
    """The tokenizer --tokenizer names (check_tokenizer): a BPE trained on texts (read only then), GPT-2's, or
    a tokenizer.json."""
    check_tokenizer(name, vocab_size)
    if name == "gpt2":
        return BPETokenizer.from_gpt2()
    if name == "bpe":
        return BPETokenizer.train(texts, vocab_size)
    tokenizer = BPETokenizer.load(pathlib.Path(name).expanduser())
    if tokenizer.end_of_text_id is None:
        raise UserError(f"--tokenizer={name} has no <|endoftext|> token to end each document with: give a "
                        "tokenizer.json that has one")
    return tokenizer


def tokenize(texts: list[str], tokenizer: BPETokenizer, piece_size: int = PIECE_CHARACTERS) -> np.ndarray:
    """(N,) ids of the texts, <|endoftext|> between two; each text is encoded in pieces of about
    piece_size characters (bpe.split_text: the same ids), so that a long one prints its progress."""
    pieces = [split_text(text, piece_size) for text in texts]
    progress = Progress(f"tokenizing {len(texts)} file(s)", sum(map(len, pieces)), "characters")
    ids = []  # file, <|endoftext|>, file, ...
    for i, file_pieces in enumerate(pieces):
        if i:
            ids.append(np.array([tokenizer.end_of_text_id], np.int32))
        for piece in file_pieces:
            ids.append(tokenizer.encode(piece))
            progress.advance(len(piece))
    return np.concatenate(ids)


def prepare(patterns: list[str], tokenizer_name: str, vocab_size: int | None, out: str,
            val_fraction: float = 0.1) -> dict:
    """Tokenizes the files into out/{train.bin, val.bin, tokenizer.json, meta.json}; returns the meta.
    Every argument is checked (UserError) before anything is read or written."""
    if not 0 < val_fraction < 1:
        raise UserError(f"--val_fraction={val_fraction}: must be between 0 and 1 (e.g. 0.1)")
    if not out:
        raise UserError("give the output folder: --out=DIR")
    paths = text_paths(patterns)
    texts = [read_text(path) for path in paths]
    tokenizer = make_tokenizer(tokenizer_name, vocab_size, texts)
    ids = tokenize(texts, tokenizer)
    val_count = round(len(ids) * val_fraction)
    if val_count == 0 or val_count == len(ids):
        raise UserError(f"{len(ids)} tokens cannot be split with --val_fraction={val_fraction}: use more text")
    dtype = "uint16" if tokenizer.vocab_size <= UINT16_IDS else "uint32"
    folder = pathlib.Path(out).expanduser().absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out={out} cannot be created ({e.strerror})") from e
    ids[:-val_count].astype(token_shards.little_endian(dtype)).tofile(folder / "train.bin")
    ids[-val_count:].astype(token_shards.little_endian(dtype)).tofile(folder / "val.bin")
    tokenizer.save(folder / TOKENIZER_FILE)
    meta = {"tokenizer": tokenizer_name, "vocab_size": tokenizer.vocab_size, "token_dtype": dtype,
            "train_tokens": len(ids) - val_count, "val_tokens": val_count, "texts": [str(p) for p in paths]}
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def documents(source: Source) -> Iterator[str]:
    """The texts of a source's documents, in order."""
    return (text for _, text in source)


def consume(iterator: Iterator, count: int) -> None:
    """Draws count items of iterator (fewer if it ends), doing nothing with them."""
    next(itertools.islice(iterator, count, count), None)


def source_arguments(spec: str, val_spec: str, val_fraction: float | None, tokenizer_name: str,
                     vocab_size: int | None, text_field: str, skip_bad_records: bool, shard_tokens: int) -> dict:
    """The arguments that decide the bytes of a shard folder (meta.json's "arguments"), checked: UserErrors."""
    if val_spec and val_fraction is not None:
        raise UserError(f"--val_fraction={val_fraction} and --val_source={val_spec}: give one of them (the val split: "
                        "the last documents of --source, or another source's)")
    if not val_spec:
        val_fraction = SOURCE_VAL_FRACTION if val_fraction is None else val_fraction
        if not 0 < val_fraction < 1:
            raise UserError(f"--val_fraction={val_fraction}: must be between 0 and 1 (e.g. {SOURCE_VAL_FRACTION})")
    if shard_tokens < 1:
        raise UserError(f"--shard_tokens={shard_tokens}: give the ids of a shard, e.g. {SHARD_TOKENS}")
    check_tokenizer(tokenizer_name, vocab_size)
    return {"source": spec, "val_source": val_spec, "val_fraction": val_fraction, "tokenizer": tokenizer_name,
            "vocab_size": vocab_size, "text_field": text_field, "skip_bad_records": skip_bad_records,
            "shard_tokens": shard_tokens}


def open_shard_folder(out: str, arguments: dict) -> tuple[pathlib.Path, dict | None]:
    """(folder, its meta or None for a new folder); a UserError for a folder with other files, or prepared
    with other arguments (nothing in it is touched)."""
    folder = pathlib.Path(out).expanduser().absolute()
    if not (folder / META_FILE).is_file():
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise UserError(f"--out={out} holds other files (no {META_FILE} of lm prepare --source): give a new or "
                            "empty folder")
        return folder, None
    meta = read_json(folder / META_FILE, f"delete {folder} and run this lm prepare command again")
    if meta.get("format") != token_shards.FORMAT:
        raise UserError(f"--out={out} holds the token files of lm prepare --text: give another --out")
    if meta["arguments"] != arguments:
        changed = [f"--{key}={arguments[key]}, not {value}" for key, value in meta["arguments"].items()
                   if arguments.get(key) != value]
        raise UserError(f"--out={out} was prepared with other arguments ({'; '.join(changed)}): give another --out, "
                        "or its arguments to resume it")
    return folder, meta


def start_shard_folder(folder: pathlib.Path, arguments: dict, train_source: Source) -> dict:
    """A new folder's meta.json, written: with --val_fraction the source's documents are counted first and
    the splits' sizes recorded (a UserError for a source without documents)."""
    meta = token_shards.new_meta(arguments)
    if arguments["val_fraction"] is not None:
        count = sum(1 for _ in train_source)
        if count == 0:
            raise UserError(f"{train_source.name} gives no documents (all {train_source.skipped} of its records are "
                            "bad)")
        val = max(1, int(count * arguments["val_fraction"]))
        train = 1 if count == 1 else count - val  # (a single document: its last tokens are the val split's)
        meta["source_documents"] = count
        meta["splits"]["train"]["documents"], meta["splits"]["val"]["documents"] = train, val
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out={folder} cannot be created ({e.strerror})") from e
    token_shards.save_meta(folder, meta)
    return meta


def shard_tokenizer(folder: pathlib.Path, meta: dict, named: BPETokenizer | None,
                    train_source: Source) -> BPETokenizer:
    """The folder's tokenizer: named (gpt2's or a tokenizer.json's) or a BPE trained on the train split's
    documents, saved and recorded in meta.json; or, for a folder that has one, the one it recorded (named
    must be it)."""
    arguments, path = meta["arguments"], folder / TOKENIZER_FILE
    if meta["tokenizer"] is not None:
        tokenizer = named or BPETokenizer.load(path)
        if token_shards.tokenizer_digest(tokenizer.tokenizer) != meta["tokenizer"]["sha256"]:
            changed = f"--tokenizer={arguments['tokenizer']} has changed" if named else f"{path} is damaged"
            raise UserError(f"{changed} since {folder} was begun: give another --out, or delete it and prepare "
                            "it again")
        return tokenizer
    texts = itertools.islice(documents(train_source), meta["splits"]["train"]["documents"])
    tokenizer = named or make_tokenizer(arguments["tokenizer"], arguments["vocab_size"], texts)
    partial = path.with_name(path.name + token_shards.PARTIAL)
    tokenizer.save(partial)
    partial.replace(path)
    meta["tokenizer"] = {"vocab_size": tokenizer.vocab_size, "end_of_text_id": tokenizer.end_of_text_id,
                         "sha256": token_shards.tokenizer_digest(tokenizer.tokenizer)}
    meta["token_dtype"] = token_shards.token_dtype(tokenizer.vocab_size)
    token_shards.save_meta(folder, meta)
    return tokenizer


def shard_writer(folder: pathlib.Path, meta: dict, split: str) -> token_shards.ShardWriter:
    """A writer of the split's shards after those meta.json lists, recording each there once whole."""
    record = meta["splits"][split]

    def on_shard(shard: dict) -> None:
        record["shards"].append(shard)
        token_shards.save_meta(folder, meta)

    return token_shards.ShardWriter(folder, split, len(record["shards"]), meta["arguments"]["shard_tokens"],
                                    meta["token_dtype"], on_shard)


def encoded(texts: Iterable[str], tokenizer: BPETokenizer, meta: dict,
            workers: int) -> Iterator[tuple[token_shards.Task, tuple[np.ndarray, np.ndarray]]]:
    """The texts' tasks with their ids and document ends, in order (token_shards.encode_tasks)."""
    tasks = token_shards.make_tasks(texts, splits_exactly(tokenizer.tokenizer))
    return token_shards.encode_tasks(tasks, tokenizer.tokenizer, meta["token_dtype"], workers)


def write_split(folder: pathlib.Path, meta: dict, split: str, texts: Iterable[str], tokenizer: BPETokenizer,
                workers: int) -> None:
    """Tokenizes texts, the split's documents after those meta.json lists, into its next shards, with a
    progress line (documents, MB/s)."""
    record = meta["splits"][split]
    left = None if record["documents"] is None else record["documents"] - token_shards.written_documents(meta, split)
    progress = Progress(f"tokenizing the {split} documents", left, "MB")
    writer = shard_writer(folder, meta, split)
    megabytes = 0.0  # read, but of no finished document yet
    for task, (ids, ends) in encoded(texts, tokenizer, meta, workers):
        writer.write(ids, ends)
        megabytes += task.megabytes
        for _ in ends:
            progress.advance(megabytes)
            megabytes = 0.0
    writer.finish()


def write_single_document(folder: pathlib.Path, meta: dict, text: str, tokenizer: BPETokenizer,
                          workers: int) -> None:
    """A source of one document: its last max(1, floor(n * val_fraction)) ids are the val split's one
    document, the rest the train split's (as the language model's held_out cuts it)."""
    ids = np.concatenate([ids for _, (ids, _) in encoded([text], tokenizer, meta, workers)])
    cut = len(ids) - max(1, int(len(ids) * meta["arguments"]["val_fraction"]))
    if cut < 1:
        raise UserError(f"--source={meta['arguments']['source']} has a single document of {len(ids)} token: too "
                        "few to hold some out for validation and train on the rest; give more text, or --val_source")
    for split, part in zip(token_shards.SPLITS, (ids[:cut], ids[cut:]), strict=True):
        if not token_shards.split_done(meta, split):
            writer = shard_writer(folder, meta, split)
            writer.write(part, np.array([len(part)]))
            writer.finish()


def write_splits(folder: pathlib.Path, meta: dict, train_source: Source, val_source: Source | None,
                 tokenizer: BPETokenizer, workers: int) -> None:
    """Tokenizes the documents of the splits that meta.json does not list yet into their shards: the train
    split's from train_source, then the val split's from val_source, else from train_source's last ones."""
    texts = documents(train_source)
    if meta["source_documents"] == 1:
        write_single_document(folder, meta, next(texts), tokenizer, workers)
        return
    for split in token_shards.SPLITS:
        if split == "val" and val_source is not None:
            texts = documents(val_source)
        record, done = meta["splits"][split], token_shards.written_documents(meta, split)
        if token_shards.split_done(meta, split) and val_source is not None:
            continue
        consume(texts, done)  # (those of a done train split too, where the val split follows them)
        if not token_shards.split_done(meta, split):
            left = None if record["documents"] is None else record["documents"] - done
            write_split(folder, meta, split, itertools.islice(texts, left), tokenizer, workers)
        written = token_shards.written_documents(meta, split)
        if record["documents"] is None:  # --val_source: known now
            if not written:
                source = val_source if split == "val" else train_source
                raise UserError(f"{source.name} gives no documents (all {source.skipped} of its records are bad)")
            record["documents"] = written
        elif written != record["documents"]:
            raise UserError(f"{train_source.name} gave {written} {split} documents, not the {record['documents']} "
                            f"counted first: did it change? Delete {folder} and prepare it again")


def prepare_source(spec: str, tokenizer_name: str, vocab_size: int | None, out: str, val_fraction: float | None = None,
                   val_spec: str = "", text_field: str = "text", skip_bad_records: bool = False,
                   workers: int | None = None, shard_tokens: int = SHARD_TOKENS) -> dict:
    """Tokenizes the documents of a source spec into token shards in out (module docstring,
    lm/data/token_shards.py) and returns the meta. Every argument is checked (UserError) before anything is
    written; a folder begun with the same arguments is resumed after its last whole shard."""
    if not out:
        raise UserError("give the output folder: --out=DIR")
    arguments = source_arguments(spec, val_spec, val_fraction, tokenizer_name, vocab_size, text_field,
                                 skip_bad_records, shard_tokens)
    workers = available_cores() if workers is None else workers
    if workers < 1:
        raise UserError(f"--workers={workers}: give 1 or more processes (default: all cores)")
    train_source = Source(spec, text_field, skip_bad_records, "--source")
    val_source = Source(val_spec, text_field, skip_bad_records, "--val_source") if val_spec else None
    named = None if tokenizer_name == "bpe" else make_tokenizer(tokenizer_name, vocab_size, ())
    folder, meta = open_shard_folder(out, arguments)
    if meta is None:
        meta = start_shard_folder(folder, arguments, train_source)
    elif meta["complete"]:
        return meta
    else:
        done = [f"{token_shards.written_documents(meta, split):,} {split}" for split in token_shards.SPLITS]
        print(f"resuming {folder}: {' and '.join(done)} documents were done")
    for partial in folder.glob(f"*{token_shards.PARTIAL}"):
        partial.unlink()  # what a stopped run was writing
    tokenizer = shard_tokenizer(folder, meta, named, train_source)
    write_splits(folder, meta, train_source, val_source, tokenizer, workers)
    meta["complete"] = True
    token_shards.save_meta(folder, meta)
    return meta


def shards_summary(folder: pathlib.Path, meta: dict) -> str:
    """'<documents>, <ids> and <shards> of each split (tokenizer, ids, dtype) in <folder>'."""
    splits = []
    for split in token_shards.SPLITS:
        shards = meta["splits"][split]["shards"]
        splits.append(f"{split}: {sum(s['documents'] for s in shards):,} documents, "
                      f"{sum(s['tokens'] for s in shards):,} tokens in {len(shards)} shard(s)")
    return (f"{'; '.join(splits)} ({meta['arguments']['tokenizer']}, {meta['tokenizer']['vocab_size']} ids, "
            f"{meta['token_dtype']}) in {folder}")


def source_train_command(folder: pathlib.Path, meta: dict) -> str:
    """The lm train command that trains the small BPE GPT of configs/gpt2.py on a shard folder."""
    return (f"lm train --config=configs/gpt2.py:bpe_small --workdir=runs/{folder.name} --config.data.dataset=source "
            f"--config.data.source=tokens:{folder} --config.data.tokenizer={folder / TOKENIZER_FILE} "
            f"--config.data.vocab_size={meta['tokenizer']['vocab_size']}")


def train_command(folder: pathlib.Path, meta: dict) -> str:
    """The lm train command that trains the small BPE GPT of configs/gpt2.py on a prepared folder."""
    return (f"lm train --config=configs/gpt2.py:bpe_small --workdir=runs/{folder.name} "
            f"--config.data.train_file={folder / 'train.bin'} --config.data.val_file={folder / 'val.bin'} "
            f"--config.data.tokenizer={folder / TOKENIZER_FILE} --config.data.vocab_size={meta['vocab_size']} "
            f"--config.data.token_dtype={meta['token_dtype']}")


def main(argv: list[str]) -> None:
    reject_arguments(argv)

    def run_prepare() -> None:
        if _SOURCE.value is not None:
            return run_prepare_source()
        given = [f"--{name}" for name in SOURCE_FLAGS if flags.FLAGS[name].present]
        if given:
            raise UserError(f"{', '.join(given)}: for --source, not --text")
        val_fraction = TEXT_VAL_FRACTION if _VAL_FRACTION.value is None else _VAL_FRACTION.value
        meta = prepare(_TEXT.value, _TOKENIZER.value, _VOCAB_SIZE.value, _OUT.value, val_fraction)
        folder = pathlib.Path(_OUT.value).expanduser().absolute()
        print(f"{len(meta['texts'])} file(s) -> {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens "
              f"({meta['tokenizer']}, {meta['vocab_size']} ids, {meta['token_dtype']}) in {folder}")
        print(f"train a GPT on them:\n  {train_command(folder, meta)}")

    def run_prepare_source() -> None:
        if _TEXT.value:
            raise UserError("--text and --source: give one of them (--text: files to tokenize as token files; "
                            "--source: documents to tokenize into shards)")
        try:
            meta = prepare_source(_SOURCE.value, _TOKENIZER.value, _VOCAB_SIZE.value, _OUT.value, _VAL_FRACTION.value,
                                  _VAL_SOURCE.value or "", _TEXT_FIELD.value, _SKIP_BAD_RECORDS.value, _WORKERS.value,
                                  _SHARD_TOKENS.value)
        except UserError as e:
            message = str(e)
            for option, flag in SOURCE_OPTIONS.items():
                message = message.replace(option, flag)
            raise UserError(message) from e
        except KeyboardInterrupt:
            print(f"stopped: run the same command again to go on from the last whole shard in --out={_OUT.value}",
                  file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)
        folder = pathlib.Path(_OUT.value).expanduser().absolute()
        print(shards_summary(folder, meta))
        print(f"train a GPT on them:\n  {source_train_command(folder, meta)}")

    run_user_errors(run_prepare)


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
