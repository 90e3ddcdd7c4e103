"""The scores of the BERT fine-tuning tasks, in numpy, on predictions gathered on the host. Every score
is a fraction in [0, 1] (the papers print percentages: x 100), or a correlation in [-1, 1].

  accuracy(predictions, labels)               SST-2
  entity_spans(tags), entity_scores(gold, predicted)
                                              CoNLL-2003: entity-level precision, recall, F1 with exact
                                              span and type match, chunked as conlleval chunks IOB tags
  normalize_answer, answer_exact_match, answer_f1, squad_scores
                                              SQuAD v1.1, as its official evaluate-v1.1.py: max over all
                                              reference answers, mean over questions
  best_span(start_logits, end_logits, allowed, max_answer_length, n_best)
                                              the best valid answer span of a question over its windows
  correlations(predictions, targets)          STS-B: Pearson and Spearman (average ranks for ties)
  mean_stderr(values)                         the standard error of a mean, as lm-evaluation-harness gives it
                                              (the zero-shot tasks, passkey retrieval)
"""

import collections
import math
import re
import string
from collections.abc import Sequence

import numpy as np
import scipy.stats


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of equal entries: (N,), (N,) -> float (0 for N = 0)."""
    return float(np.mean(np.asarray(predictions) == np.asarray(labels))) if len(labels) else 0.0


def entity_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """IOB tags of one sentence -> its entities as (type, first word, last word + 1), as conlleval
    chunks them: an entity starts at B-X, or at I-X after O or after a tag of another type (IOB1, or a
    model's stray I-), and goes on over the I-X of the same type that follow it."""
    spans, start, kind = [], None, None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, tag_type = tag.partition("-")
        continues = prefix == "I" and start is not None and tag_type == kind
        if start is not None and not continues:
            spans.append((kind, start, i))
            start = None
        if prefix in ("B", "I") and not continues:
            start, kind = i, tag_type
    return spans


def precision_recall_f1(correct: int, predicted: int, gold: int) -> dict[str, float]:
    """Counts -> precision correct/predicted, recall correct/gold and their harmonic mean (0 where
    undefined)."""
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """Per-sentence gold and predicted IOB tags -> entity-level precision, recall and F1 (conlleval's
    overall line): an entity counts as correct when its type, first and last word all match."""
    correct = predicted_count = gold_count = 0
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        if len(gold_tags) != len(predicted_tags):
            raise ValueError(f"a sentence of {len(gold_tags)} gold tags has {len(predicted_tags)} predicted")
        gold_spans, predicted_spans = set(entity_spans(gold_tags)), set(entity_spans(predicted_tags))
        correct += len(gold_spans & predicted_spans)
        predicted_count += len(predicted_spans)
        gold_count += len(gold_spans)
    return precision_recall_f1(correct, predicted_count, gold_count)


PUNCTUATION = set(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, drop punctuation, then the articles a/an/the, then collapse
    whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def answer_exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def answer_f1(prediction: str, reference: str) -> float:
    """The F1 of the normalised answers' bags of words."""
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((collections.Counter(predicted) & collections.Counter(gold)).values())
    return precision_recall_f1(common, len(predicted), len(gold))["f1"]


def squad_scores(predictions: dict[str, str], references: dict[str, Sequence[str]]) -> dict[str, float]:
    """predictions {question id: answer text}, references {question id: every reference answer} ->
    exact_match and f1, each the max over a question's references, averaged over every question of
    references. A question without a prediction scores 0, as in evaluate-v1.1.py (not as the empty
    answer, which matches a reference like "." that normalises to "")."""
    exact, f1 = [], []
    for question, answers in references.items():
        if question not in predictions:
            exact.append(0.0)
            f1.append(0.0)
            continue
        prediction = predictions[question]
        exact.append(max(answer_exact_match(prediction, a) for a in answers))
        f1.append(max(answer_f1(prediction, a) for a in answers))
    return {"exact_match": float(np.mean(exact)), "f1": float(np.mean(f1))}


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray, max_answer_length: int,
              n_best: int = 20) -> tuple[int, int, int]:
    """The answer span of one question over its W windows, as BERT's run_squad picks it: in each window
    the n_best highest start and end logits, of which the pairs with both positions allowed (context
    tokens), end >= start and end - start < max_answer_length; the pair of the highest start + end
    logit across all windows. start_logits, end_logits, allowed: (W, T) -> (window, start, end),
    positions inclusive; (-1, -1, -1) when no window has a valid pair."""
    best, best_score = (-1, -1, -1), -np.inf
    for window, (starts, ends, ok) in enumerate(zip(start_logits, end_logits, allowed, strict=True)):
        top_starts = np.argsort(-starts, kind="stable")[:n_best]
        top_ends = np.argsort(-ends, kind="stable")[:n_best]
        for s in top_starts:
            for e in top_ends:
                if ok[s] and ok[e] and s <= e < s + max_answer_length and starts[s] + ends[e] > best_score:
                    best, best_score = (window, int(s), int(e)), starts[s] + ends[e]
    return best


def correlations(predictions: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    """Pearson's r and Spearman's rho (Pearson's r of the ranks, ties given their average rank)."""
    predictions, targets = np.asarray(predictions, np.float64), np.asarray(targets, np.float64)
    return {"pearson": float(scipy.stats.pearsonr(predictions, targets)[0]),
            "spearman": float(scipy.stats.spearmanr(predictions, targets)[0])}


def mean_stderr(values: list[float]) -> float | None:
    """The harness's standard error of a mean: the sample standard deviation (n - 1) / sqrt(n); None for n < 2."""
    if len(values) < 2:
        return None
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))
