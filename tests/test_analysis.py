"""The analyses the results docs cite (experiments/analysis) against direct computations."""

import numpy as np

from experiments.analysis.token_table import band_rows, mean_pairwise_cosine


def test_mean_pairwise_cosine_is_the_mean_over_distinct_pairs():
    rows = np.random.default_rng(0).normal(size=(7, 5))
    direct = [a @ b / np.linalg.norm(a) / np.linalg.norm(b) for i, a in enumerate(rows)
              for j, b in enumerate(rows) if i != j]
    assert np.isclose(mean_pairwise_cosine(rows), np.mean(direct))
    assert np.isclose(mean_pairwise_cosine(np.array([[1.0, 2.0]] * 3) * [[1], [2], [3]]), 1.0)  # one direction
    assert np.isnan(mean_pairwise_cosine(rows[:1]))


def test_a_band_counts_its_pieces_and_the_task_pieces_it_holds():
    corpus_counts = np.array([0, 0, 5, 9, 500, 2000])
    task_counts = np.array([1, 0, 2, 3, 4, 10])
    table = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 0.0], [0.0, 4.0], [1.0, 1.0], [2.0, 2.0]])
    rng = np.random.default_rng(0)
    never = band_rows(corpus_counts, task_counts, table, 0, 0, rng)
    assert (never["pieces"], never["task_pieces"], never["task_share"]) == (2, 1, 1 / 20)
    rare = band_rows(corpus_counts, task_counts, table, 1, 9, rng)
    assert (rare["pieces"], rare["task_pieces"], rare["task_share"]) == (2, 2, 5 / 20)
    assert (rare["cosine"], rare["norm"]) == (0.0, 3.5)  # orthogonal rows of norms 3 and 4
    frequent = band_rows(corpus_counts, task_counts, table, 100, None, rng)
    assert (frequent["pieces"], frequent["task_share"]) == (2, 14 / 20)
    assert np.isclose(frequent["cosine"], 1.0)
