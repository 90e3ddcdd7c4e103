"""Corpus BLEU, two ways: the standard sacreBLEU score and a tokenised, lowercased one that matches
the numbers the PyTorch seq2seq tutorials report.

- corpus_bleu: sacreBLEU's default BLEU (cased, its own 13a tokenisation of detokenised text,
  'exp' smoothing, one reference): the number to publish.
- tokenized_bleu: lowercase, split with translation.word_tokenize (the WordTokenizer's regex, a
  stand-in for the tutorials' spaCy tokens), then corpus BLEU-4 on the space-joined tokens with no
  further tokenisation (tokenize="none") and no smoothing. That is the formula of torchtext's
  data.metrics.bleu_score with one reference (clipped n-gram counts summed over the corpus,
  geometric mean of the 1- to 4-gram precisions, brevity penalty from the summed lengths, 0 if any
  precision is 0), times 100.
Both take one hypothesis and one reference string per sentence and return a score in [0, 100].
"""

from collections.abc import Sequence

import sacrebleu

from lm.data.translation import word_tokenize


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacreBLEU standard score (BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp)."""
    _check(hypotheses, references)
    return sacrebleu.metrics.BLEU().corpus_score(list(hypotheses), [list(references)]).score


def tokenize_for_bleu(text: str) -> str:
    """'A man's T-shirt.' -> "a man 's t - shirt ." (lowercased word_tokenize, space-joined)."""
    return " ".join(word_tokenize(text, lowercase=True))


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Lowercased, word-tokenised BLEU-4 without smoothing (torchtext bleu_score x 100)."""
    _check(hypotheses, references)
    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    hyps = [tokenize_for_bleu(h) for h in hypotheses]
    refs = [tokenize_for_bleu(r) for r in references]
    return bleu.corpus_score(hyps, [refs]).score
