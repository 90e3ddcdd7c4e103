"""GLUE STS-B: sentence-pair similarity, a score from 0 to 5; train 5,749, dev 1,500, test 1,379.

Files (docs/data-files.md, stsb/): train.tsv and dev.tsv (GLUE: a header, then tab-separated
`index genre filename year old_index source1 source2 sentence1 sentence2 score`); GLUE's test.tsv has no
scores, so the test split is read from original/sts-test.tsv (no header; `genre filename year old_index
score sentence1 sentence2 [source license]`), row for row the same pairs.
"""

import numpy as np

from lm.data.tasks.common import Rows, choose, encode_sentences, label_error, read_lines
from lm.data.wordpiece import WordPieceTokenizer

FILES = {"train": "stsb/train.tsv", "dev": "stsb/dev.tsv", "test": "stsb/original/sts-test.tsv"}
MAX_SCORE = 5.0


def parse_score(text: str, path, number: int) -> float:
    try:
        score = float(text)
    except ValueError:
        score = float("nan")
    if not 0.0 <= score <= MAX_SCORE:
        raise label_error(path, number, text, f"a similarity from 0 to {MAX_SCORE:g}")
    return score


def load(split: str, limit: int = 0, seed: int | None = None) -> tuple[list[str], list[str], np.ndarray]:
    """(first sentences, second sentences, scores (N,) float32) of a split (`limit` of them, common.choose: the
    first, or drawn with a seed; 0: all); a score outside [0, 5] is a UserError."""
    path, lines = read_lines(FILES[split])
    firsts, seconds, scores = [], [], []
    original = split == "test"
    header = 0 if original else 1
    for number, line in choose(list(enumerate(lines[header:], start=header + 1)), limit, seed):
        fields = line.split("\t")
        score, first, second = (fields[4], fields[5], fields[6]) if original else (fields[9], fields[7], fields[8])
        firsts.append(first.strip())
        seconds.append(second.strip())
        scores.append(parse_score(score, path, number))
    return firsts, seconds, np.asarray(scores, np.float32)


def encode(tokenizer: WordPieceTokenizer, split: str, length: int, limit: int = 0, seed: int | None = None) -> Rows:
    """Rows [CLS] first [SEP] second [SEP] with `score` (N,) float32 (of load(split, limit, seed))."""
    firsts, seconds, scores = load(split, limit, seed)
    return {**encode_sentences(tokenizer, firsts, seconds, length), "score": scores}
