"""Token ids without a tokenizer: pre-tokenised files (memory-mapped) and synthetic ids."""

import json
import math

import numpy as np
import pytest
from test_cli import assert_user_error, main_in_process

from lm.cli import sample as sample_cli
from lm.cli.resolve import build_experiment
from lm.data import text, tokens
from lm.errors import UserError


def write(path, ids, dtype):
    path.parent.mkdir(parents=True, exist_ok=True)
    np.asarray(ids, dtype=dtype).tofile(path)
    return path


def take(dataset, n):
    it = iter(dataset)
    return [next(it) for _ in range(n)]


def stacked(batches, key="inputs"):
    return np.stack([b[key] for b in batches])


@pytest.mark.parametrize("dtype, offset", [("uint16", 0), ("uint32", 70_000)])  # uint32: ids past 65535
def test_file_windows_are_slices_of_the_file_as_int32(tmp_path, dtype, offset):
    ids = offset + np.arange(400)  # each id its position (+ offset): a window's first id says where it starts
    path = write(tmp_path / "train.bin", ids, dtype)
    memmap = tokens.open_tokens(str(path), dtype, length=8, vocab_size=offset + 400, field="data.train_file")
    assert isinstance(memmap, np.memmap) and len(memmap) == 400
    for batch in [*take(tokens.train_windows(memmap, 8, 4, 0, (0, 1), 0, offset + 400), 3),
                  *tokens.eval_windows(memmap, 8, 4, 2, offset + 400)]:
        assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
        assert batch["inputs"].shape == batch["targets"].shape == (4, 8)
        for inputs, targets in zip(batch["inputs"], batch["targets"], strict=True):
            start = inputs[0] - offset
            np.testing.assert_array_equal(inputs, ids[start : start + 8])
            np.testing.assert_array_equal(targets, ids[start + 1 : start + 9])
    # The same batches as the text pipeline over the same ids in memory.
    in_memory = text.train_windows(ids.astype(np.int32), 8, 4, seed=0)
    np.testing.assert_array_equal(stacked(take(tokens.train_windows(memmap, 8, 4, 0, (0, 1), 0, offset + 400), 5)),
                                  stacked(take(in_memory, 5)))


def test_file_batches_are_seeded_resume_and_shard_like_the_global_batch(tmp_path):
    memmap = tokens.open_tokens(str(write(tmp_path / "t.bin", np.arange(300) % 50, "uint16")), "uint16", 8, 50, "f")
    make = lambda **kw: tokens.train_windows(memmap, 8, **{"batch_size": 4, "seed": 0, "shard": (0, 1),  # noqa: E731
                                                          "start_step": 0, "vocab_size": 50, **kw})
    straight = take(make(), 12)
    np.testing.assert_array_equal(stacked(straight), stacked(take(make(), 12)))
    assert not np.array_equal(straight[0]["inputs"], take(make(seed=1), 1)[0]["inputs"])
    np.testing.assert_array_equal(stacked(straight[5:]), stacked(take(make(start_step=5), 7)))
    halves = [take(make(batch_size=2, shard=(i, 2), start_step=3), 4) for i in range(2)]
    for step, (first, second) in enumerate(zip(*halves, strict=True)):
        for key in ("inputs", "targets"):
            np.testing.assert_array_equal(np.concatenate([first[key], second[key]]), straight[3 + step][key])


def test_synthetic_ids_are_seeded_in_range_resumable_and_sharded():
    make = lambda **kw: tokens.SyntheticBatches(**{"vocab_size": 100, "length": 16, "batch_size": 4,  # noqa: E731
                                                   "seed": 0, **kw})
    straight = take(make(), 6)
    for batch in straight:
        assert batch["inputs"].shape == batch["targets"].shape == (4, 16) and batch["inputs"].dtype == np.int32
        np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    ids = stacked(straight)
    assert ids.min() >= 0 and ids.max() < 100 and len(np.unique(ids)) > 90
    np.testing.assert_array_equal(ids, stacked(take(make(), 6)))
    assert not np.array_equal(ids, stacked(take(make(seed=1), 6)))
    np.testing.assert_array_equal(ids[2:], stacked(take(make(start_step=2), 4)))
    halves = [take(make(batch_size=2, shard=(i, 2), start_step=1), 3) for i in range(2)]
    for step, (first, second) in enumerate(zip(*halves, strict=True)):
        for key in ("inputs", "targets"):
            np.testing.assert_array_equal(np.concatenate([first[key], second[key]]), straight[1 + step][key])

    evals = tokens.synthetic_eval(100, 16, 4, 3)
    assert len(evals) == 3 and evals[0]["inputs"].shape == (4, 16) and evals[0]["inputs"].dtype == np.int32
    np.testing.assert_array_equal(stacked(evals), stacked(tokens.synthetic_eval(100, 16, 4, 3)))
    assert not any(np.array_equal(e["inputs"], t["inputs"]) for e in evals for t in straight)


def test_bad_token_files_are_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    good = write(tmp_path / "corpus" / "train.bin", np.arange(100), "uint16")
    with pytest.raises(UserError, match=f"{tmp_path / 'corpus' / 'missing.bin'}.*LM_DATA_DIR.*data.val_file"):
        tokens.open_tokens("corpus/missing.bin", "uint16", 8, 100, "data.val_file")
    with pytest.raises(UserError, match=f"{tmp_path / 'nowhere.bin'} not found"):
        tokens.open_tokens(str(tmp_path / "nowhere.bin"), "uint16", 8, 100, "data.train_file")
    with pytest.raises(UserError, match=r"data.token_dtype='int8': use one of \['uint16', 'uint32'\]"):
        tokens.open_tokens("corpus/train.bin", "int8", 8, 100, "data.train_file")
    odd = write(tmp_path / "odd.bin", np.arange(101), "uint16")  # 202 bytes: uint16 ids read as uint32
    with pytest.raises(UserError, match=r"odd.bin \(data.train_file\) has 202 bytes, not a whole number of uint32"):
        tokens.open_tokens(str(odd), "uint32", 8, 200, "data.train_file")
    with pytest.raises(UserError, match="holds 100 tokens, too few for one window of data.context_length=100"):
        tokens.open_tokens(str(good), "uint16", 100, 100, "data.train_file")
    with pytest.raises(UserError, match=r"token id 99 in .*train.bin is out of the vocabulary \(data.vocab_size=99\)"):
        tokens.open_tokens(str(good), "uint16", 8, 99, "data.train_file")  # the first ids are checked at once
    monkeypatch.setattr(tokens, "CHECK_AT_OPEN", 10)  # the rest as batches are built
    memmap = tokens.open_tokens(str(good), "uint16", 8, 99, "data.train_file")
    with pytest.raises(UserError, match="token id 9[0-9] in .*train.bin is out of the vocabulary"):
        take(tokens.train_windows(memmap, 8, 50, 0, (0, 1), 0, 99), 2)  # 100 windows of 92 offsets: every id
    with pytest.raises(UserError, match="out of the vocabulary"):
        tokens.eval_windows(memmap, 8, 50, 2, 99)


def token_config(test_config, dataset, **data):
    config = test_config
    config.data.dataset = dataset
    config.data.update(data)
    config.train.update(num_steps=4, log_every=2)
    return config


def test_build_checks_the_data_options(tmp_path, test_config, monkeypatch):
    from experiments.language_model import build

    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match="data.dataset='owt': use one of tinyshakespeare, token_file, synthetic"):
        build(token_config(test_config, "owt"))
    with pytest.raises(UserError, match="needs data.vocab_size"):
        build(token_config(test_config, "synthetic"))
    with pytest.raises(UserError, match="needs data.train_file"):
        build(token_config(test_config, "token_file", vocab_size=65))
    write(tmp_path / "t.bin", np.arange(100) % 65, "uint16")
    experiment = build(token_config(test_config, "token_file", train_file="t.bin", val_file=str(tmp_path / "t.bin"),
                                    token_dtype="uint16"))
    assert experiment.tokenizer is None and experiment.vocab_size == 65 and experiment.texts(None) == {}
    experiment.save_assets(tmp_path)
    assert not (tmp_path / "tokenizer.json").exists()


@pytest.mark.slow
def test_a_prompt_the_vocabulary_cannot_encode_is_refused_before_step_1(tmp_path, capsys, monkeypatch):
    """A character vocabulary without a newline (the default sample.prompt): one line before training, not a
    traceback at sampling after the last step."""
    from test_cli import train_in_process

    monkeypatch.setattr(text, "load_text", lambda name: "To be, or not to be: that is the question. " * 200)
    result = train_in_process(capsys, tmp_path / "run")
    assert_user_error(result, "sample.prompt='\\n'", "not in the vocabulary", "--config.sample.prompt=")
    assert "step" not in result.stdout
    result = train_in_process(capsys, tmp_path / "run", "--config.sample.prompt=To be", "--config.train.num_steps=2")
    assert result.returncode == 0, result.stderr[-2000:]
    # sample.max_new_tokens=0: no sample after training, so no prompt to check either
    result = train_in_process(capsys, tmp_path / "quiet", "--config.sample.max_new_tokens=0",
                              "--config.train.num_steps=2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--- sample ---" not in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["token_file", "synthetic"])
def test_training_on_token_ids_and_sampling_refused(tmp_path, test_config, monkeypatch, capsys, dataset):
    import jax

    from lm.train.loop import train

    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    write(tmp_path / "owt" / "train.bin", rng.integers(0, 65, 2000), "uint16")
    write(tmp_path / "owt" / "val.bin", rng.integers(0, 65, 500), "uint16")
    config = token_config(test_config, dataset, train_file="owt/train.bin", val_file="owt/val.bin",
                          token_dtype="uint16", vocab_size=65)  # the Shakespeare test model's shapes
    config.eval.context_lengths = (16,)
    workdir = tmp_path / "run"
    summary = train(config, str(workdir), build_experiment, devices=jax.devices()[:1])
    assert summary["step"] == 4 and math.isfinite(summary["eval_loss"])
    assert not (workdir / "tokenizer.json").exists() and (workdir / "config.json").is_file()
    results = json.loads((workdir / "results.json").read_text())
    assert (dataset == "token_file") == ("val_cross_entropy_ctx16" in results)
    if dataset == "synthetic":
        return  # the CLI check below is the same for both
    sampled = main_in_process(capsys, sample_cli, f"--workdir={workdir}")
    assert_user_error(sampled, "trained on token ids", "no tokenizer")
