"""Mixtures of sources (lm/data/mixture.py): the shares of the rows and tokens follow the weights, each source
goes through its rows once per epoch of its own, and global batch s is a function of the seed and s alone
(resumed or reached, one process or several). The language model on a mixture: tests/test_sources.py."""

import itertools

import numpy as np
import pytest

from lm.data import mixture, packing
from lm.errors import UserError


def test_the_block_quota_splits_the_rows_by_largest_remainder():
    np.testing.assert_array_equal(mixture.block_quota([0.5, 0.3, 0.2], 10), [5, 3, 2])
    np.testing.assert_array_equal(mixture.block_quota([1 / 3, 1 / 3, 1 / 3], 10), [4, 3, 3])  # ties: the first
    np.testing.assert_array_equal(mixture.block_quota([0.26, 0.74], 10), [3, 7])  # remainders .6 and .4: .6 wins
    assert mixture.block_quota([0.123, 0.456, 0.421]).sum() == mixture.BLOCK_ROWS


def test_a_mixture_spec_parses_and_bad_ones_are_one_line():
    assert mixture.parse_mixture("files:a/*.jsonl=3, hf:x:en:train=1") == [
        mixture.Component("files:a/*.jsonl", 0.75), mixture.Component("hf:x:en:train", 0.25)]
    for text, fragment in [("files:a", "'files:a' is not SPEC=WEIGHT"), ("files:a=0,files:b=1", "positive weight"),
                           ("files:a=x", "'files:a=x' is not"), ("=1", "'=1' is not"),
                           ("files:a=1,files:a=2", "files:a is named twice"),
                           ("files:a=1,files:b=0.00001", "files:b has a share of 1e-05, under one row in 4096")]:
        with pytest.raises(UserError, match=fr"^data.mixture={text}: .*{fragment}") as error:
            mixture.parse_mixture(text)
        assert "\n" not in str(error.value)


def test_rows_follow_the_weights_and_each_source_goes_through_its_rows_once_an_epoch():
    """Over 1,000 batches of 8 rows each source's share is its weight to 1%, and after each whole block (64
    batches) its count is exactly the block quota times the blocks; the indices a source gives, cut into its
    epochs, are each a permutation of its rows; any span of rows equals that span of the stream from row 0."""
    weights, row_counts, batch = [0.6, 0.3, 0.1], [50, 7, 300], 8
    mixed = mixture.MixedRows(row_counts, weights, seed=3, block_rows=512)  # a block spans 64 batches
    sources, indices = mixed.rows(0, 1000 * batch)
    counts = np.cumsum(sources[:, None] == np.arange(3), axis=0)[batch - 1::batch]  # (1000, K) after each batch
    block_ends = counts[512 // batch - 1::512 // batch]  # after whole blocks: exactly the quota per block
    np.testing.assert_array_equal(block_ends, np.arange(1, len(block_ends) + 1)[:, None] * [307, 154, 51])
    assert np.abs(counts[-1] / counts[-1].sum() - weights).max() < 0.01
    for source, count in enumerate(row_counts):
        given = indices[sources == source]
        for epoch in range(len(given) // count):
            assert sorted(given[epoch * count:(epoch + 1) * count]) == list(range(count))
    fresh = mixture.MixedRows(row_counts, weights, seed=3, block_rows=512)
    for start in (0, 509, 3 * 512 + 7):  # within a block, across two, from a later one
        span = fresh.rows(start, 40)
        np.testing.assert_array_equal(span[0], sources[start:start + 40])
        np.testing.assert_array_equal(span[1], indices[start:start + 40])
    other_seed = mixture.MixedRows(row_counts, weights, seed=4, block_rows=512).rows(0, 64)[0]
    assert not np.array_equal(other_seed, sources[:64])


def packed(first_id: int, count: int, length: int = 8) -> packing.PackedRows:
    """Rows of count documents of 5 ids each, first_id upward (ids tell the source apart)."""
    documents = [np.arange(5) + first_id + 5 * i for i in range(count)]
    return packing.pack_documents(documents, length)


def test_mixture_batches_are_the_same_resumed_or_reached_and_on_any_number_of_processes():
    rows = [packed(0, 40), packed(1000, 9)]
    reached = list(itertools.islice(mixture.MixtureBatches(rows, [0.7, 0.3], 4, seed=1), 1000))
    tokens = np.zeros(2)
    for batch in reached:
        assert set(batch) == {"inputs", "targets", "segment_ids", "positions", "weights", "source"}
        from_second = batch["inputs"] >= 1000
        assert np.array_equal(from_second.any(axis=1), batch["source"] == 1)  # each row from the source it names
        tokens += [(batch["segment_ids"][batch["source"] == j] > 0).sum() for j in range(2)]
    assert abs(tokens[0] / tokens.sum() - 0.7) < 0.01  # the tokens' shares over 1,000 batches
    for count in (1, 2, 4):
        shares = [next(iter(mixture.MixtureBatches(rows, [0.7, 0.3], 4 // count, 1, (index, count), start_step=29)))
                  for index in range(count)]
        for key, value in reached[29].items():
            assert np.concatenate([share[key] for share in shares]).tobytes() == value.tobytes()
