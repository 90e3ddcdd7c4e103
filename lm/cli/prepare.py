r"""Tokenize text files for a GPT: token files (nanoGPT's train.bin / val.bin) and the tokenizer.

  lm prepare --text=input.txt [--text=more.txt ...] --tokenizer=bpe --vocab_size=2048 \
      --out=/data/shakespeare_bpe [--val_fraction=0.1]
  lm prepare --text='books/*.txt' --tokenizer=gpt2 --out=/data/books_gpt2

--tokenizer=bpe trains a byte-level BPE of --vocab_size ids on the texts; --tokenizer=gpt2 is GPT-2's own
(50,257 ids, from $LM_DATA_DIR/vocab). The files are read as UTF-8 (a --text with * or ? is a glob) and
tokenized one after another, <|endoftext|> between two files; the last --val_fraction of the ids is the
validation split. It writes into --out:

  train.bin, val.bin  little-endian token ids, uint16 when the vocabulary fits (else uint32)
  tokenizer.json      the tokenizer (Hugging Face's format; lm.data.bpe.BPETokenizer.load reads it)
  meta.json           tokenizer, vocab_size, token_dtype, train_tokens, val_tokens, texts

and prints the lm train command that trains configs/gpt2.py on them (data.tokenizer makes the tokenizer
part of the run, so that `lm sample --workdir=RUN --prompt=...` prints text).
"""

import glob
import json
import pathlib

import numpy as np
from absl import app, flags

from lm.cli import define_string_once, parse_flags, reject_arguments
from lm.data.bpe import BPETokenizer, split_text
from lm.data.tokens import TOKEN_DTYPES
from lm.errors import UserError, run_user_errors
from lm.progress import Progress

TOKENIZERS = ("bpe", "gpt2")
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
UINT16_IDS = 1 << 16
PIECE_CHARACTERS = 1 << 22  # tokenized a piece at a time, with a progress line now and then

_TEXT = flags.DEFINE_multi_string("text", [], "A UTF-8 text file (or a glob); repeat for more files.")
_TOKENIZER = flags.DEFINE_enum("tokenizer", "bpe", TOKENIZERS, "bpe: train a byte-level BPE on the texts; "
                               "gpt2: GPT-2's tokenizer files.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", None, "Ids of the trained BPE (--tokenizer=bpe), e.g. 2048.")
_VAL_FRACTION = flags.DEFINE_float("val_fraction", 0.1, "The last fraction of the ids that is the validation split.")
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


def make_tokenizer(name: str, vocab_size: int | None, texts: list[str]) -> BPETokenizer:
    if name not in TOKENIZERS:
        raise UserError(f"--tokenizer={name}: use one of {', '.join(TOKENIZERS)}")
    if name == "gpt2":
        if vocab_size is not None:
            raise UserError(f"--vocab_size={vocab_size}: GPT-2's vocabulary is fixed (50257 ids); drop --vocab_size")
        return BPETokenizer.from_gpt2()
    if vocab_size is None:
        raise UserError("--tokenizer=bpe needs --vocab_size, the ids to learn (e.g. 2048)")
    return BPETokenizer.train(texts, vocab_size)


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
    ids[:-val_count].astype(TOKEN_DTYPES[dtype]).tofile(folder / "train.bin")
    ids[-val_count:].astype(TOKEN_DTYPES[dtype]).tofile(folder / "val.bin")
    tokenizer.save(folder / TOKENIZER_FILE)
    meta = {"tokenizer": tokenizer_name, "vocab_size": tokenizer.vocab_size, "token_dtype": dtype,
            "train_tokens": len(ids) - val_count, "val_tokens": val_count, "texts": [str(p) for p in paths]}
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def train_command(folder: pathlib.Path, meta: dict) -> str:
    """The lm train command that trains the small BPE GPT of configs/gpt2.py on a prepared folder."""
    return (f"lm train --config=configs/gpt2.py:bpe_small --workdir=runs/{folder.name} "
            f"--config.data.train_file={folder / 'train.bin'} --config.data.val_file={folder / 'val.bin'} "
            f"--config.data.tokenizer={folder / TOKENIZER_FILE} --config.data.vocab_size={meta['vocab_size']} "
            f"--config.data.token_dtype={meta['token_dtype']}")


def main(argv: list[str]) -> None:
    reject_arguments(argv)

    def run_prepare() -> None:
        meta = prepare(_TEXT.value, _TOKENIZER.value, _VOCAB_SIZE.value, _OUT.value, _VAL_FRACTION.value)
        folder = pathlib.Path(_OUT.value).expanduser().absolute()
        print(f"{len(meta['texts'])} file(s) -> {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens "
              f"({meta['tokenizer']}, {meta['vocab_size']} ids, {meta['token_dtype']}) in {folder}")
        print(f"train a GPT on them:\n  {train_command(folder, meta)}")

    run_user_errors(run_prepare)


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
