"""Every file lm reads back from a run folder may be damaged or missing (issue 31, item 2): config.json,
summary.json, results.json, metrics.jsonl, the tokenizer, the data cache, the lock, a checkpoint's
checksums.json. Each is either one line naming the file and what to do, decided before anything trains
(the workdir left as it was), or handled: a damaged metrics line is skipped and counted, a damaged cache
entry is made again."""

import json

import jax
import numpy as np
import pytest
from test_cli import CONFIG, assert_user_error, exit_code_and_output, main_in_process, snapshot
from test_faults import run_copy  # noqa: F401 (the fixture)

from lm.cli import compare as compare_cli
from lm.cli import sample as sample_cli
from lm.cli import train as train_cli
from lm.cli.resolve import build_experiment
from lm.errors import run_user_errors
from lm.runs import read_records
from lm.train.loop import train
from lm.train.metrics import truncate_log

DAMAGES = {  # how a file is damaged -> its new content
    "garbage": b"\x00\xff garbage",
    "cut short": None,  # the first half of its bytes
    "not an object": b"[1, 2]",
}


def damage(path, how: str) -> None:
    content = DAMAGES[how]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2] if content is None else content)


def compare(capsys, workdir):
    """`lm compare workdir --out=<workdir>/report`, with its error handling."""
    return exit_code_and_output(capsys, lambda: run_user_errors(
        lambda: compare_cli.compare(str(workdir), out=str(workdir / "report"))))


def train_again(capsys, config, workdir, num_steps):
    """train() of the run's config to num_steps, with lm train's error handling (one line, exit 2)."""
    config = config.copy_and_resolve_references()
    config.train.num_steps = num_steps
    return exit_code_and_output(capsys, lambda: run_user_errors(
        lambda: train(config, str(workdir), build_experiment, jax.devices()[:1])))


@pytest.mark.parametrize("name, num_steps, fragments, how", [  # (each file with each damage: read_json alike)
    ("config.json", 50, ("restore it from a copy", "run lm train on this folder again"), "garbage"),
    ("config.json", 50, ("restore it from a copy", "run lm train on this folder again"), "not an object"),
    ("summary.json", 50, ("delete it", "writes it again when it ends"), "cut short"),
    ("results.json", 40, ("delete it", "final evaluation writes it again"), "cut short"),  # the finished run's check
])
def test_a_damaged_json_file_stops_the_run_before_it_trains(run_copy, capsys, name, num_steps, fragments, how):  # noqa: F811
    config, _, workdir = run_copy
    damage(workdir / name, how)
    before = snapshot(workdir)
    result = train_again(capsys, config, workdir, num_steps)
    assert_user_error(result, f"{workdir / name} is damaged", *fragments)
    assert snapshot(workdir) == before


def test_a_damaged_config_json_or_tokenizer_is_one_line_for_the_inference_commands(run_copy, capsys):  # noqa: F811
    config, _, workdir = run_copy
    tokenizer = workdir / "tokenizer.json"
    damage(tokenizer, "cut short")
    before = snapshot(workdir)
    result = train_again(capsys, config, workdir, 50)
    assert_user_error(result, f"{tokenizer} is damaged", "delete it to fit the tokenizer again")
    assert_user_error(main_in_process(capsys, sample_cli, f"--workdir={workdir}"), f"{tokenizer} is damaged",
                      "restore it from a copy")
    tokenizer.unlink()
    assert_user_error(main_in_process(capsys, sample_cli, f"--workdir={workdir}"), f"{tokenizer} is damaged or missing")
    damage(workdir / "config.json", "garbage")
    assert_user_error(main_in_process(capsys, sample_cli, f"--workdir={workdir}"), "config.json is damaged")
    assert_user_error(compare(capsys, workdir), "config.json is damaged")
    assert {path for path in snapshot(workdir) if path != tokenizer} <= set(before)


def test_a_damaged_checksums_file_is_a_damaged_checkpoint(run_copy, capsys):  # noqa: F811
    config, _, workdir = run_copy
    damage(workdir / "checkpoints" / "40" / "checksums.json", "cut short")
    result = train_again(capsys, config, workdir, 50)
    assert_user_error(result, "checkpoint at step 40", "damaged checksums.json", "restore_fallback=True")


def test_a_damaged_lock_file_is_one_line(run_copy, capsys):  # noqa: F811
    config, _, workdir = run_copy
    (workdir / ".lock.0").mkdir()
    assert_user_error(train_again(capsys, config, workdir, 50), ".lock.0, the lock of", "remove it")


def test_a_damaged_data_cache_entry_is_made_again(run_copy, capsys):  # noqa: F811
    config, original, workdir = run_copy
    (entry,) = (workdir / "data_cache").glob("tokens-*.pkl")
    damage(entry, "cut short")
    experiment = build_experiment(config, workdir)
    assert "is damaged (UnpicklingError); making tokens again" in capsys.readouterr().err
    expected = build_experiment(config, original)
    batch, expected_batch = (next(iter(e.train_data(4, 0, (0, 1), 7))) for e in (experiment, expected))
    for a, b in zip(jax.tree.leaves(batch), jax.tree.leaves(expected_batch), strict=True):
        np.testing.assert_array_equal(a, b)
    experiment.save_assets(workdir)  # what the trainer does once every check has passed
    assert build_experiment(config, workdir) is not None and "damaged" not in capsys.readouterr().err


def test_damaged_metrics_lines_are_skipped_counted_and_the_log_keeps_one_history(run_copy, capsys):  # noqa: F811
    _, _, workdir = run_copy
    log = workdir / "metrics.jsonl"
    lines = log.read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    damaged = [*lines[:2], "{not json", '{"loss": 1.0}', "[3]", *lines[2:], '{"step": 41, "lo']  # the last cut short
    log.write_text("\n".join(damaged))
    records, count = read_records(log)
    assert [r["step"] for r in records] == steps and count == 3

    result = compare(capsys, workdir)
    assert result.returncode == 0 and f"{log}: skipped 3 damaged lines" in result.stderr

    truncate_log(log, 30)  # a resume from step 30
    assert "skipped 3 damaged lines" in capsys.readouterr().err
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [s for s in steps if s <= 30]


@pytest.mark.parametrize("workdir", ["", "  "])
def test_an_empty_workdir_flag_is_one_line_and_creates_nothing(tmp_path, monkeypatch, capsys, workdir):
    monkeypatch.chdir(tmp_path)
    assert_user_error(main_in_process(capsys, train_cli, CONFIG, f"--workdir={workdir}"), "pass --workdir=DIR")
    assert_user_error(main_in_process(capsys, sample_cli, f"--workdir={workdir}"), "--workdir is empty")
    assert list(tmp_path.iterdir()) == []
