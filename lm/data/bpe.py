"""Byte-level BPE (GPT-2's tokenization) through the Hugging Face `tokenizers` library.

  pre-tokenizer  ByteLevel: GPT-2's regex split (contractions, letters, numbers, other symbols,
                 whitespace runs), then every UTF-8 byte mapped to a printable character ('Ġ' is a space)
  model          BPE over those byte characters: merges applied by priority; no unknown token, since
                 every byte is in the base vocabulary
  decoder        ByteLevel: the characters back to bytes, the bytes to UTF-8 text

A tokenizer comes from OpenAI's GPT-2 files (vocab.json + merges.txt: `from_gpt2`, ids equal to Hugging Face's
GPT-2 tokenizer), from training on texts (`train`: 256 byte tokens, <|endoftext|> and learnt merges), with no
merges at all (`bytes_only`: an id a byte), or from a saved tokenizer.json (`load`). Any text round-trips:
decode(encode(x)) == x. The interface is text.CharTokenizer's (vocab_size, encode, decode, save, load), so the
language model holds either.
"""

import gzip
import json
import pathlib
import re
import sys
from collections.abc import Iterable

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from lm.data.files import find_file
from lm.errors import UserError

END_OF_TEXT = "<|endoftext|>"  # GPT-2's document separator: id 50256 in GPT-2's files, 0 in a trained vocabulary
GPT2_VOCAB = "vocab/gpt2-vocab.json.gz"  # under $LM_DATA_DIR: OpenAI's encoder.json, gzipped
GPT2_MERGES = "vocab/gpt2-merges.txt"  # OpenAI's vocab.bpe: '#version: 0.2', then one merge 'a b' a line
GPT2_HOW = ("GPT-2's vocab.json (gzipped) and merges.txt, e.g. from the Hugging Face hub's openai-community/gpt2 "
            "(see docs/data-files.md, vocab/)")
MIN_VOCAB_SIZE = 256 + 1  # every byte, and <|endoftext|>
PIECE_BOUNDARY = re.compile(r"(?<=\S)\n")  # where split_text cuts: before a newline after a non-space


def byte_level_pipeline(model: models.BPE) -> tokenizers.Tokenizer:
    """GPT-2's pipeline around a BPE model: ByteLevel pre-tokenizer (no prefix space) and decoder, and
    <|endoftext|> matched as one special token wherever it appears in a text."""
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([END_OF_TEXT])
    return tokenizer


def split_text(text: str, size: int) -> list[str]:
    """text in pieces of at least size characters (the last one may be shorter), each cut before a
    newline that follows a non-whitespace character. byte_level_pipeline's pre-tokenizer (GPT-2's
    regex, which looks only forward) splits the text there anyway, since none of its pre-tokens holds
    a non-whitespace character and a newline: the ids of the pieces, joined, are the ids of the whole
    text. (A cut after a newline would not do: a piece's trailing whitespace is one pre-token, which
    the whole text splits before the next word.)"""
    pieces, start = [], 0
    while (cut := PIECE_BOUNDARY.search(text, start + size)) is not None:
        pieces.append(text[start : cut.start()])
        start = cut.start()
    return [*pieces, text[start:]]


def splits_exactly(tokenizer: tokenizers.Tokenizer) -> bool:
    """Whether split_text's pieces of any text encode, joined, to the text's own ids with this tokenizer:
    byte_level_pipeline's pre-tokenizer (GPT-2's regex, no prefix space), no normalizer, and no added token
    holding a newline. Other tokenizers (a normalizer, another pre-tokenizer's regex) may join a newline to
    the character before it."""
    pre_tokenizer = tokenizer.pre_tokenizer
    return (tokenizer.normalizer is None and isinstance(pre_tokenizer, pre_tokenizers.ByteLevel)
            and pre_tokenizer.use_regex and not pre_tokenizer.add_prefix_space
            and not any("\n" in token.content for token in tokenizer.get_added_tokens_decoder().values()))


def read_gpt2_files(vocab_path: pathlib.Path, merges_path: pathlib.Path) -> tuple[dict[str, int], list[tuple]]:
    """(vocabulary {token: id}, merges [(a, b)] by priority) from GPT-2's vocab.json (gzipped or not)
    and merges.txt; an unreadable file is a UserError naming it."""
    try:
        opener = gzip.open if vocab_path.suffix == ".gz" else open
        with opener(vocab_path, "rt", encoding="utf-8") as f:
            vocab = json.load(f)
        lines = merges_path.read_text(encoding="utf-8").splitlines()
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"cannot read GPT-2's tokenizer files {vocab_path}, {merges_path} ({e}); replace them "
                        f"with {GPT2_HOW}") from e
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    return vocab, merges


class BPETokenizer:
    """A byte-level BPE tokenizer (a tokenizers.Tokenizer, `.tokenizer`, for anything not wrapped here)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer):
        self.tokenizer = tokenizer
        self.end_of_text_id = tokenizer.token_to_id(END_OF_TEXT)

    @classmethod
    def from_gpt2(cls) -> "BPETokenizer":
        """GPT-2's tokenizer (50,257 ids) from $LM_DATA_DIR/vocab/gpt2-vocab.json.gz and gpt2-merges.txt."""
        vocab, merges = read_gpt2_files(find_file(GPT2_VOCAB, how=GPT2_HOW), find_file(GPT2_MERGES, how=GPT2_HOW))
        return cls(byte_level_pipeline(models.BPE(vocab, merges)))

    @classmethod
    def bytes_only(cls) -> "BPETokenizer":
        """The byte-level BPE with no merges (data.tokenizer=bytes): <|endoftext|> (id 0) and the 256 bytes, 257
        ids, each as train([], 257) numbers them; every text is its UTF-8 bytes, one id each."""
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # (train's order: the byte characters sorted)
        vocab = {END_OF_TEXT: 0} | {character: i for i, character in enumerate(alphabet, 1)}
        return cls(byte_level_pipeline(models.BPE(vocab, [])))

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BPETokenizer":
        """A vocabulary of at most vocab_size ids learnt from texts: <|endoftext|> (id 0), the 256 bytes,
        then merges by frequency (fewer when the texts run out of pairs)."""
        if vocab_size < MIN_VOCAB_SIZE:
            raise UserError(f"vocab_size={vocab_size} is too small for a byte-level BPE: it needs at least "
                            f"{MIN_VOCAB_SIZE} (256 bytes + {END_OF_TEXT}); GPT-2 has 50257")
        tokenizer = byte_level_pipeline(models.BPE())
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
                                      show_progress=sys.stderr.isatty(),  # the library's bars, on a terminal only
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        """(N,) int32 ids of text; <|endoftext|> in the text is its one special id."""
        return np.array(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """The (N_i,) int32 ids of each text, as encode gives them, encoded in parallel on all cores (the
        library's encode_batch_fast: no offsets kept)."""
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [np.array(encoding.ids, dtype=np.int32) for encoding in encodings]

    def decode(self, ids) -> str:
        """The text of ids, <|endoftext|> included (bytes that are not whole UTF-8 characters become U+FFFD)."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: pathlib.Path) -> None:
        """Writes the whole pipeline as Hugging Face's tokenizer.json."""
        self.tokenizer.save(str(path))

    @classmethod
    def load(cls, path: pathlib.Path) -> "BPETokenizer":
        try:
            return cls(tokenizers.Tokenizer.from_file(str(path)))
        except Exception as e:  # the library raises plain Exception for a missing or malformed file
            raise UserError(f"cannot load the tokenizer {path} ({e}): give a tokenizer.json written by "
                            "lm prepare") from e
