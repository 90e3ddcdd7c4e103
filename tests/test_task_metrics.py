"""The fine-tuning scores (lm/task_metrics.py) against hand-computed cases."""

import numpy as np
import pytest

from lm import task_metrics as tm


def test_entity_spans_follow_conlleval_chunking():
    # B-I of one type is one entity; adjacent B-PER B-PER are two; an I- after O starts one (conlleval);
    # an I- of another type starts a new one.
    tags = ["B-PER", "I-PER", "B-PER", "O", "I-LOC", "I-LOC", "I-ORG", "B-MISC"]
    assert tm.entity_spans(tags) == [("PER", 0, 2), ("PER", 2, 3), ("LOC", 4, 6), ("ORG", 6, 7), ("MISC", 7, 8)]
    assert tm.entity_spans(["O", "O"]) == []


def test_entity_scores_count_exact_spans_only():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "B-ORG"]]
    predicted = [["B-PER", "O", "O", "B-LOC"],  # PER cut short: wrong; LOC right
                 ["B-ORG", "I-ORG"]]  # two adjacent ORGs merged into one: wrong
    # gold entities: PER(0,2), LOC(3,4), ORG(0,1), ORG(1,2) = 4; predicted: PER(0,1), LOC, ORG(0,2) = 3; correct 1
    scores = tm.entity_scores(gold, predicted)
    assert scores["precision"] == pytest.approx(1 / 3)
    assert scores["recall"] == pytest.approx(1 / 4)
    assert scores["f1"] == pytest.approx(2 * (1 / 3) * (1 / 4) / (1 / 3 + 1 / 4))
    assert tm.entity_scores([["B-PER", "I-PER"]], [["B-PER", "I-PER"]])["f1"] == 1.0
    assert tm.entity_scores([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_squad_normalisation_drops_punctuation_articles_and_case():
    assert tm.normalize_answer("The  (Eiffel) Tower, in   Paris!") == "eiffel tower in paris"
    assert tm.normalize_answer("an 'apple' a day") == "apple day"
    assert tm.normalize_answer("theater") == "theater"  # articles only as whole words
    assert tm.normalize_answer("\"the\"") == ""  # quotes go first, so the article is then removed


def test_squad_scores_take_the_best_reference():
    references = {"q1": ["the Eiffel Tower", "Eiffel Tower in Paris"], "q2": ["Denver Broncos"], "q3": ["1990"]}
    predictions = {"q1": "Eiffel tower.", "q2": "the Broncos of Denver"}  # q3 unanswered: 0
    # q1: exact with the first reference. q2: tokens {broncos, of, denver} vs {denver, broncos}:
    # precision 2/3, recall 1, F1 0.8.
    scores = tm.squad_scores(predictions, references)
    assert scores["exact_match"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx((1 + 0.8 + 0) / 3)
    assert tm.answer_f1("Paris", "Eiffel Tower in Paris") == pytest.approx(2 * 1 * 0.25 / 1.25)


def test_an_unanswered_squad_question_scores_0_as_in_the_official_script():
    """Three SQuAD dev questions have "." as a reference, which normalises to "": the empty answer matches
    it exactly, but a question absent from the predictions scores 0 (evaluate-v1.1.py)."""
    references = {"q1": ["."], "q2": ["1990"]}
    assert tm.squad_scores({"q2": "1990"}, references) == {"exact_match": 0.5, "f1": 0.5}
    assert tm.squad_scores({"q1": "", "q2": "1990"}, references) == {"exact_match": 1.0, "f1": 0.5}


def test_spearman_with_ties_uses_average_ranks():
    predictions = np.array([1.0, 2.0, 2.0, 3.0])  # ranks 1, 2.5, 2.5, 4
    targets = np.array([1.0, 3.0, 2.0, 4.0])  # ranks 1, 3, 2, 4
    ranks_p, ranks_t = np.array([1, 2.5, 2.5, 4]), np.array([1.0, 3, 2, 4])
    expected = np.sum((ranks_p - 2.5) * (ranks_t - 2.5)) / np.sqrt(
        np.sum((ranks_p - 2.5) ** 2) * np.sum((ranks_t - 2.5) ** 2))  # 4.5 / sqrt(4.5 * 5)
    scores = tm.correlations(predictions, targets)
    assert scores["spearman"] == pytest.approx(expected)
    assert scores["spearman"] == pytest.approx(4.5 / np.sqrt(22.5))
    assert scores["pearson"] == pytest.approx(np.corrcoef(predictions, targets)[0, 1])


def test_best_span_across_overlapping_windows():
    # Two windows of one question (positions 0-1 are [CLS] and the question, not allowed).
    allowed = np.array([[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], bool)
    start = np.full((2, 6), -10.0)
    end = np.full((2, 6), -10.0)
    start[0, 0], end[0, 0] = 50.0, 50.0  # [CLS]: the highest, but not allowed
    start[0, 5], end[0, 2] = 9.0, 9.0  # the highest allowed ones, but end before start: invalid
    start[0, 3], end[0, 4] = 3.0, 3.0  # valid, 6: the first window's best
    start[1, 3], end[1, 5] = 6.0, 5.0  # valid, 11: the best, in the second window
    assert tm.best_span(start, end, allowed, max_answer_length=30) == (1, 3, 5)
    # the second window's span is too long for max_answer_length 2 (3 tokens): the first window's wins
    assert tm.best_span(start, end, allowed, max_answer_length=2) == (0, 3, 4)
    assert tm.best_span(start, end, np.zeros_like(allowed), max_answer_length=30) == (-1, -1, -1)


def test_accuracy():
    assert tm.accuracy(np.array([1, 0, 1, 1]), np.array([1, 1, 1, 0])) == 0.5
