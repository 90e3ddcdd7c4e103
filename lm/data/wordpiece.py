"""WordPiece tokenization as BERT uncased does it, through the Hugging Face `tokenizers` library.

  normalizer     BertNormalizer: clean text (control characters out, whitespace to spaces), spaces
                 around CJK characters, strip accents, lowercase
  pre-tokenizer  BertPreTokenizer: split on whitespace and punctuation
  model          WordPiece: greedy longest-match-first pieces, '##' marks a word's continuation, a word
                 with no match is [UNK]
  decoder        WordPiece: '##' pieces glued back onto their word

A tokenizer comes from a vocab.txt (one piece a line, the line number its id: Google's and Hugging
Face's BERT vocabularies, e.g. data.vocab="bert-base-uncased"), from training on texts (WordPieceTrainer),
or from a saved tokenizer.json (a run's folder). Every vocabulary must hold the five special tokens
[PAD] [UNK] [CLS] [SEP] [MASK].

Ids come without special tokens from `encode`; `encode_pair` puts a pair together as BERT reads it:
[CLS] A [SEP] B [SEP] with segment ids 0 for [CLS] A [SEP] and 1 for B [SEP].
"""

import pathlib
import sys
from collections.abc import Iterable, Sequence

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from lm.data.files import find_file
from lm.errors import UserError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)  # a trained vocabulary's ids 0..4, in this order
CONTINUATION = "##"  # marks a piece that continues a word
TOKENIZER_FILE = "tokenizer.json"  # what save writes into a directory
VOCABS = {"bert-base-uncased": "vocab/bert-base-uncased-vocab.txt"}  # names for data.vocab, under $LM_DATA_DIR
VOCAB_HOW = ("a vocab.txt of one WordPiece a line, e.g. bert-base-uncased's from the Hugging Face hub "
             "(see docs/data-files.md, vocab/)")


def bert_pipeline(model: models.WordPiece) -> tokenizers.Tokenizer:
    """A tokenizer with BERT uncased's normalizer, pre-tokenizer and decoder around a WordPiece model."""
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                      strip_accents=True, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def find_vocab(name_or_path: str) -> pathlib.Path:
    """A vocab.txt: a name of VOCABS, an existing path, or a path relative to $LM_DATA_DIR (a missing
    one is a UserError naming where it looked and how to provide it)."""
    if name_or_path in VOCABS:
        return find_file(VOCABS[name_or_path], how=VOCAB_HOW)
    path = pathlib.Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.is_absolute():
        raise UserError(f"vocabulary file {path} not found; give {VOCAB_HOW}, or one of the names {sorted(VOCABS)}")
    return find_file(name_or_path, how=VOCAB_HOW)


class WordPieceTokenizer:
    """A BERT uncased WordPiece tokenizer (a tokenizers.Tokenizer, `.tokenizer`, for anything not
    wrapped here). `source` says where its vocabulary came from, for messages."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, source: str):
        missing = [token for token in SPECIAL_TOKENS if tokenizer.token_to_id(token) is None]
        if missing:
            raise UserError(f"the vocabulary of {source} lacks the special tokens {' '.join(missing)}: BERT needs "
                            f"all of {' '.join(SPECIAL_TOKENS)}; add them to the vocabulary or use another one")
        tokenizer.add_special_tokens(list(SPECIAL_TOKENS))  # (ids kept) never split, skipped by decode
        self.tokenizer, self.source = tokenizer, source
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = map(tokenizer.token_to_id, SPECIAL_TOKENS)

    @classmethod
    def from_vocab(cls, name_or_path: str) -> "WordPieceTokenizer":
        """From a vocab.txt (see find_vocab), e.g. "bert-base-uncased"."""
        path = find_vocab(name_or_path)
        return cls(bert_pipeline(models.WordPiece.from_file(str(path), unk_token=UNK)), str(path))

    @classmethod
    def named(cls, vocab: str) -> "WordPieceTokenizer":
        """A folder holding a tokenizer.json (a run's tokenizer/, which save writes): that tokenizer; else a
        vocab.txt name or path (from_vocab)."""
        folder = pathlib.Path(vocab).expanduser()
        return cls.load(folder) if (folder / TOKENIZER_FILE).is_file() else cls.from_vocab(vocab)

    @classmethod
    def train(cls, texts_or_files: Iterable[str] | Sequence[pathlib.Path], vocab_size: int) -> "WordPieceTokenizer":
        """A vocabulary of at most vocab_size pieces learnt from texts (strings) or plain-text files
        (pathlib.Path), the specials first (ids 0-4 in SPECIAL_TOKENS' order), then every character that
        continues a word as a '##' piece, in code point order.

        The same texts give the same vocabulary and ids in every process. The library's trainer alone does
        not (tokenizers issue #1794): it numbers the '##' characters in hash-map order, and those numbers
        break ties between merges of equal count. Numbered in advance here, they leave it nothing to break."""
        if isinstance(texts_or_files, Sequence) and texts_or_files and isinstance(texts_or_files[0], pathlib.Path):
            texts = [line for path in texts_or_files for line in path.read_text(encoding="utf-8").splitlines()]
        else:
            texts = list(texts_or_files)
        tokenizer = bert_pipeline(models.WordPiece(unk_token=UNK))
        continuations = sorted({char for text in texts
                                for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(
                                    tokenizer.normalizer.normalize_str(text))
                                for char in word[1:]})
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, show_progress=sys.stderr.isatty(),  # the library's bars, on a terminal only
            special_tokens=[*SPECIAL_TOKENS, *(CONTINUATION + char for char in continuations)])
        tokenizer.train_from_iterator(texts, trainer)
        # The '##' characters went in as the trainer's special tokens, which the tokenizer now treats as
        # whole, unsplittable tokens: keep only the vocabulary, in a fresh BERT pipeline.
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        return cls(bert_pipeline(models.WordPiece(vocab, unk_token=UNK)),
                   f"a WordPiece vocabulary trained to {vocab_size} pieces")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """The piece ids of text, no special tokens."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """encode of each text, in parallel (the library's threads)."""
        return [e.ids for e in self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The piece ids of text and each piece's character span [start, end) in text (as given, before
        normalisation): what span extraction (SQuAD) maps answers with."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def encode_pair(self, a_ids: Sequence[int], b_ids: Sequence[int] = ()) -> tuple[list[int], list[int]]:
        """[CLS] A [SEP] B [SEP] (or [CLS] A [SEP] with no B) and its segment ids: 0 up to the first
        [SEP], 1 after it."""
        ids = [self.cls_id, *a_ids, self.sep_id]
        segments = [0] * len(ids)
        if b_ids:
            ids += [*b_ids, self.sep_id]
            segments += [1] * (len(b_ids) + 1)
        return ids, segments

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, special tokens left out, '##' pieces joined to their words."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def id_pieces(self, ids: Sequence[int]) -> list[str]:
        """The piece of every id, specials included: [101, 7592] -> ['[CLS]', 'hello']."""
        return [self.tokenizer.id_to_token(int(i)) for i in ids]

    def save(self, directory: pathlib.Path) -> None:
        """Writes directory/tokenizer.json (the whole pipeline, as Hugging Face saves it)."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(directory / TOKENIZER_FILE))

    @classmethod
    def load(cls, directory: pathlib.Path) -> "WordPieceTokenizer":
        path = pathlib.Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise UserError(f"{path} not found: the tokenizer is saved there by the run that trained the model")
        return cls(tokenizers.Tokenizer.from_file(str(path)), str(path))
