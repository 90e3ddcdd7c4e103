"""The character tokenizer, the split and the resumable random-window pipeline."""

import numpy as np
import pytest

from lm.data import text


def test_tokenizer_round_trip_and_vocab(data_dir):
    corpus = text.load_text("tinyshakespeare")
    tokenizer = text.CharTokenizer.fit(corpus)
    assert tokenizer.vocab_size == 65
    sample = corpus[:500]
    assert tokenizer.decode(tokenizer.encode(sample)) == sample
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tokenizer.encode("café")


def test_split_is_first_90_percent_then_the_rest():
    tokens = np.arange(1000, dtype=np.int32)
    train, val = text.split_tokens(tokens, 0.9)
    np.testing.assert_array_equal(train, tokens[:900])
    np.testing.assert_array_equal(val, tokens[900:])


def batches(dataset_iter, n):
    return [next(dataset_iter) for _ in range(n)]


def test_windows_are_inputs_and_next_token_targets():
    tokens = np.arange(500, dtype=np.int32)
    batch = next(iter(text.train_windows(tokens, length=8, batch_size=4, seed=0)))
    assert batch["inputs"].shape == batch["targets"].shape == (4, 8)
    # With tokens = arange, a window is consecutive integers and targets are inputs + 1.
    np.testing.assert_array_equal(batch["targets"], batch["inputs"] + 1)
    np.testing.assert_array_equal(np.diff(batch["inputs"], axis=1), 1)


def test_pipeline_is_seeded_and_resumes_at_any_step():
    tokens = np.arange(300, dtype=np.int32)
    make = lambda seed: iter(text.train_windows(tokens, length=8, batch_size=4, seed=seed))  # noqa: E731
    first, same = make(0), make(0)
    straight = batches(first, 100)  # 400 windows: more than one epoch of 292 offsets
    np.testing.assert_array_equal(np.stack([b["inputs"] for b in straight]),
                                  np.stack([b["inputs"] for b in batches(same, 100)]))
    assert not np.array_equal(straight[0]["inputs"], next(make(1))["inputs"])

    resumed = iter(text.train_windows(tokens, length=8, batch_size=4, seed=0, start_step=40))
    for expected, got in zip(straight[40:], batches(resumed, 60), strict=True):
        np.testing.assert_array_equal(expected["inputs"], got["inputs"])


def test_each_epoch_visits_every_offset_once_in_a_new_order():
    tokens = np.arange(100, dtype=np.int32)
    it = iter(text.train_windows(tokens, length=4, batch_size=8, seed=3))  # 96 offsets = 12 batches
    epochs = [np.concatenate([b["inputs"][:, 0] for b in batches(it, 12)]) for _ in range(2)]
    for starts in epochs:
        np.testing.assert_array_equal(np.sort(starts), np.arange(96))
    assert not np.array_equal(epochs[0], epochs[1])


def test_process_shards_split_each_global_batch():
    """Two processes' batches are the two halves of one process's: the same global batches whatever
    the number of processes (what makes multi-host losses equal single-host ones)."""
    tokens = np.arange(100, dtype=np.int32)
    whole = batches(iter(text.train_windows(tokens, 4, 8, 0, start_step=5)), 12)
    halves = [batches(iter(text.train_windows(tokens, 4, 4, 0, (i, 2), start_step=5)), 12) for i in range(2)]
    for batch, first, second in zip(whole, *halves, strict=True):
        np.testing.assert_array_equal(batch["inputs"], np.concatenate([first["inputs"], second["inputs"]]))
