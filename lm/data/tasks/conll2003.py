"""CoNLL-2003 English NER: a tag per word, IOB2 (every entity starts with B-), types PER LOC ORG MISC;
train 14,041 sentences, valid 3,250, test 3,453.

Files (docs/data-files.md, conll2003/): train.txt.gz, valid.txt, test.txt; a word a line,
`word POS chunk NER`, a blank line after each sentence, `-DOCSTART-` lines between documents.

A word's tag goes on its first WordPiece; its other pieces, [CLS], [SEP] and the padding carry no tag
(tag_mask 0: no loss, no score). A sentence longer than the row keeps its first words; the words cut
off are scored as predicted O.
"""

import dataclasses

import numpy as np

from lm.data.tasks.common import Rows, choose, label_error, pad_rows, read_lines
from lm.data.wordpiece import WordPieceTokenizer

FILES = {"train": "conll2003/train.txt.gz", "valid": "conll2003/valid.txt", "test": "conll2003/test.txt"}
TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
TAG_IDS = {tag: i for i, tag in enumerate(TAGS)}


@dataclasses.dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    tags: tuple[str, ...]


def load(split: str, limit: int = 0, seed: int | None = None) -> list[Sentence]:
    """The sentences of a split (`limit` of them, common.choose: the first, or drawn with a seed; 0: all;
    documents' -DOCSTART- lines left out); a tag outside TAGS is a UserError."""
    path, lines = read_lines(FILES[split])
    sentences, words, tags = [], [], []
    for number, line in enumerate([*lines, ""], start=1):
        fields = line.split()
        if fields and fields[0] != "-DOCSTART-":
            if fields[-1] not in TAG_IDS:
                raise label_error(path, number, fields[-1], " ".join(TAGS))
            words.append(fields[0])
            tags.append(fields[-1])
        elif words:
            sentences.append(Sentence(tuple(words), tuple(tags)))
            words, tags = [], []
            if seed is None and len(sentences) == limit:
                break
    return choose(sentences, limit, seed)


def first_pieces(tokenizer: WordPieceTokenizer, words: tuple[str, ...], length: int) -> tuple[list[int], list[int]]:
    """A sentence's pieces as [CLS] pieces [SEP] (at most length) and the position of each word's first
    piece in them (words that do not fit: left out). A word with no pieces at all is [UNK]."""
    ids, starts = [tokenizer.cls_id], []
    for word_ids in tokenizer.encode_batch(list(words)):
        word_ids = word_ids or [tokenizer.unk_id]
        if len(ids) + len(word_ids) > length - 1:
            break
        starts.append(len(ids))
        ids += word_ids
    return [*ids, tokenizer.sep_id], starts


def encode(tokenizer: WordPieceTokenizer, sentences: list[Sentence], length: int) -> tuple[Rows, np.ndarray]:
    """Rows with `tags` (N, T) int32 (a tag id at each word's first piece, 0 elsewhere) and `tag_mask`
    (N, T) int32 (1 at the first pieces); and word_starts (N, W) int32, the first-piece positions of the
    words (-1 after the last one that fits; W the longest sentence)."""
    encoded = [first_pieces(tokenizer, s.words, length) for s in sentences]
    rows = pad_rows([(ids, [0] * len(ids)) for ids, _ in encoded], length, tokenizer.pad_id)
    tags = np.zeros_like(rows["tokens"])
    tag_mask = np.zeros_like(rows["tokens"])
    word_starts = np.full((len(sentences), max(len(s.words) for s in sentences)), -1, np.int32)
    for row, (sentence, (_, starts)) in enumerate(zip(sentences, encoded, strict=True)):
        tags[row, starts] = [TAG_IDS[tag] for tag in sentence.tags[: len(starts)]]
        tag_mask[row, starts] = 1
        word_starts[row, : len(starts)] = starts
    return {**rows, "tags": tags, "tag_mask": tag_mask}, word_starts


def word_tags(predicted: np.ndarray, word_starts: np.ndarray, sentences: list[Sentence]) -> list[list[str]]:
    """Predicted tag ids per piece (N, T) -> each sentence's tags per word (its first piece's; O for words
    cut off)."""
    out = []
    for row, sentence in enumerate(sentences):
        starts = word_starts[row][word_starts[row] >= 0]
        tags = [TAGS[i] for i in predicted[row, starts]]
        out.append(tags + ["O"] * (len(sentence.words) - len(tags)))
    return out
