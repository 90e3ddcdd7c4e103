"""GLUE SST-2: single-sentence sentiment, 0 negative / 1 positive; train 67,349, dev 872 (test has no labels).

Files (docs/data-files.md, sst2/): train.tsv.gz and dev.tsv, a header line then `sentence<TAB>label`.
"""

import numpy as np

from lm.data.tasks.common import Rows, choose, encode_sentences, label_error, read_lines
from lm.data.wordpiece import WordPieceTokenizer

FILES = {"train": "sst2/train.tsv.gz", "dev": "sst2/dev.tsv"}
LABELS = ("negative", "positive")


def load(split: str, limit: int = 0, seed: int | None = None) -> tuple[list[str], np.ndarray]:
    """(sentences, labels (N,) int32) of a split (`limit` of them, common.choose: the first, or drawn with a
    seed; 0: all); a label other than 0 or 1 is a UserError."""
    path, lines = read_lines(FILES[split])
    sentences, labels = [], []
    for number, line in choose(list(enumerate(lines[1:], start=2)), limit, seed):
        sentence, _, label = line.rpartition("\t")
        if label not in ("0", "1"):
            raise label_error(path, number, label, "0 or 1")
        sentences.append(sentence.strip())
        labels.append(int(label))
    return sentences, np.asarray(labels, np.int32)


def encode(tokenizer: WordPieceTokenizer, split: str, length: int, limit: int = 0, seed: int | None = None) -> Rows:
    """Rows [CLS] sentence [SEP] with `label` (N,) int32 (of load(split, limit, seed))."""
    sentences, labels = load(split, limit, seed)
    return {**encode_sentences(tokenizer, sentences, None, length), "label": labels}
