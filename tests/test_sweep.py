"""`lm sweep` (grid, checks, skip/resume) and `lm compare` (statistics, divergence, report, plots)."""

import json
import math
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import subprocess_env
from test_cli import exit_code_and_output, main_in_process

from lm.cli import compare, sweep
from lm.errors import UserError, run_user_errors

REPO = pathlib.Path(__file__).resolve().parents[1]
TEST_CONFIG = "configs/gpt_shakespeare.py:test"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def sweep_in_process(capsys, monkeypatch, *args: str) -> subprocess.CompletedProcess:
    """`lm sweep args` in this process. Its flag parser collects the --config.key=value
    overrides in a module dict: a fresh one for each call, as each process has."""
    monkeypatch.setattr(sweep, "_OVERRIDES", {})
    return main_in_process(capsys, sweep, *args, parse_flags=sweep.parse_sweep_flags)


# --- lm sweep ---------------------------------------------------------------------------------------------


def test_grid_is_the_product_of_the_axes_in_order_with_readable_names():
    grid = sweep.expand_grid({"model.norm_position": ["pre", "post"], "seed": ["0", "1", "2"]})
    assert grid == [{"model.norm_position": p, "seed": s} for p in ("pre", "post") for s in ("0", "1", "2")]
    assert sweep.arm_name(grid[0]) == "model.norm_position=pre,seed=0"
    assert sweep.arm_name({"data.path": "a/b c", "x": "1e-3"}) == "data.path=a_b_c,x=1e-3"


def test_axis_and_value_parsing():
    assert sweep.parse_axis("optimizer.learning_rate=1e-3, 3e-4") == ("optimizer.learning_rate", ["1e-3", "3e-4"])
    assert [sweep.parse_value(v) for v in ("3", "3e-4", "true", "False", "pre", "(1, 2)")] == [
        3, 3e-4, True, False, "pre", (1, 2)]
    assert [sweep.format_value(v) for v in (True, 0, 1e-3, "rms")] == ["true", "0", "0.001", "rms"]
    for bad in ("seed", "seed=", "=1,2", "seed=1,,2"):
        with pytest.raises(UserError):
            sweep.parse_axis(bad)


def test_overrides_are_resolved_with_the_config_types():
    config = sweep.resolve_config(TEST_CONFIG, {"seed": "3", "model.norm": "rms", "optimizer.learning_rate": "1e-2",
                                                "model.use_bias": "false"})
    assert (config.seed, config.model.norm, config.optimizer.learning_rate, config.model.use_bias) == (
        3, "rms", 0.01, False)


class RecordingRunner:
    """Stands in for the `lm train` subprocess: records the arms it runs and writes their results.json."""

    def __init__(self, exit_codes: dict[str, int] | None = None):
        self.calls = []
        self.exit_codes = exit_codes or {}

    def __call__(self, spec, overrides, workdir):
        self.calls.append((spec, dict(overrides), workdir.name))
        code = self.exit_codes.get(workdir.name, 0)
        if code == 0:
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "results.json").write_text(json.dumps({"step": int(overrides["train.num_steps"])}))
        return code


@pytest.mark.parametrize("axes, overrides, message", [
    ({"model.nrm": ["layer", "rms"]}, {}, "unknown config key model.nrm; did you mean model.norm"),
    ({"seed": ["0", "x"]}, {}, "--config.seed=x"),
    ({"seed": ["0"], "model.norm": []}, {}, "model.norm has no values"),
    ({"seed": ["0"]}, {"seed": "1"}, "both a sweep axis"),
    ({"seed": ["0"]}, {"train.nope": "1"}, "unknown config key train.nope"),
    ({}, {}, "no sweep axes"),
])
def test_bad_sweeps_fail_before_any_arm_runs(tmp_path, axes, overrides, message):
    runner = RecordingRunner()
    with pytest.raises(UserError, match=message):
        sweep.run_sweep(TEST_CONFIG, axes, overrides, tmp_path / "sweep", runner=runner)
    assert runner.calls == [] and not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("args, message", [
    (["--sweep=model.nrm=layer,rms"], "unknown config key model.nrm"),
    (["--sweep=seed=0,1", "--config.train.num_steps=many"], "--config.train.num_steps=many"),
    (["--sweep=seed="], "needs one or more non-empty values"),
])
def test_sweep_cli_errors_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, args, message):
    result = sweep_in_process(capsys, monkeypatch, f"--config={TEST_CONFIG}", f"--workdir={tmp_path / 'sweep'}", *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ") and message in result.stderr
    assert not (tmp_path / "sweep").exists()


def test_finished_arms_are_skipped_and_the_others_run(tmp_path):
    workdir = tmp_path / "sweep"
    arm = {s: workdir / f"seed={s}" for s in range(4)}
    for seed, step in ((0, 4), (1, 2)):  # seed 0 finished; seed 1 finished a shorter run earlier
        arm[seed].mkdir(parents=True)
        (arm[seed] / "results.json").write_text(json.dumps({"step": step}))
    arm[2].mkdir()  # seed 2 was interrupted: a folder (checkpoints) but no results.json
    runner = RecordingRunner(exit_codes={"seed=3": 1, "seed=4": 143})  # 143: SIGTERM, checkpoint saved
    arms = sweep.run_sweep(TEST_CONFIG, {"seed": ["0", "1", "2", "3", "4"]}, {"train.num_steps": "4"}, workdir,
                           runner=runner)
    assert [call[2] for call in runner.calls] == ["seed=1", "seed=2", "seed=3", "seed=4"]
    assert runner.calls[0] == (TEST_CONFIG, {"train.num_steps": "4", "seed": "1"}, "seed=1")
    assert [a.status for a in arms] == ["skipped (finished earlier)", "finished", "finished", "failed (exit 1)",
                                        "interrupted"]
    record = json.loads((workdir / "sweep.json").read_text())
    assert record["config"] == TEST_CONFIG and record["axes"] == {"seed": [0, 1, 2, 3, 4]}
    assert record["overrides"] == {"train.num_steps": 4}
    assert [(a["name"], a["status"], a["workdir"]) for a in record["arms"]] == [
        (a.name, a.status, str(a.workdir)) for a in arms]

    runner = RecordingRunner()
    sweep.run_sweep(TEST_CONFIG, {"seed": ["0", "1", "2", "3", "4"]}, {"train.num_steps": "4"}, workdir,
                    runner=runner)
    assert [call[2] for call in runner.calls] == ["seed=3", "seed=4"]  # the failed and the interrupted arm
    assert sweep.result_line(arms, workdir).startswith(f"done: 5 arms in {workdir} (3 finished, 1 failed, 1 "
                                                       "interrupted; sweep.json and a folder each); compare them")


def make_arms(tmp_path, statuses: list[str], num_steps: int = 100) -> list[sweep.Arm]:
    return [sweep.Arm(f"seed={i}", {"seed": str(i)}, tmp_path / f"seed={i}", num_steps, status)
            for i, status in enumerate(statuses)]


def test_progress_line_shows_the_running_arms_and_the_sweeps_time_left(tmp_path):
    arms = make_arms(tmp_path, ["finished", "running", "running", "pending", "pending"])
    arms[0].seconds = 200.0
    arms[1].started = arms[2].started = 1000.0
    records = {"seed=1": {"step": 40, "loss": 2.34567, "steps_per_second": 0.5}, "seed=2": None}
    # seed=1: 60 steps at 0.5/s = 120 s; seed=2: not logged yet, 200 - 50 s run = 150 s; 2 pending x 200 s;
    # (120 + 150 + 400) s over 2 slots
    assert sweep.progress_line(arms, records, now=1050.0, parallel=2) == (
        "sweep: 1 of 5 arms done | arm 2 seed=1 step 40/100 loss 2.3457 | arm 3 seed=2 starting | ETA 0:05:35")
    # nothing finished yet: the running arms' rates give an arm's time (100 steps at 0.5/s)
    arms[0].status, arms[2].status = "failed (exit 1)", "pending"
    assert sweep.remaining_seconds(arms, records, now=1050.0, parallel=1) == pytest.approx(120 + 3 * 200)
    assert sweep.remaining_seconds(arms, {"seed=1": None}, now=1050.0, parallel=1) is None
    assert sweep.progress_line(arms, {"seed=1": None}, now=1050.0, parallel=1).endswith("| ETA unknown")
    for arm in arms:
        arm.status = "finished"
    assert sweep.remaining_seconds(arms, {}, now=1050.0, parallel=1) == 0.0


def test_latest_record_is_the_last_train_record_of_the_log(tmp_path):
    assert sweep.latest_record(tmp_path) is None  # not started
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval_loss": 4.0}\n')
    assert sweep.latest_record(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval_loss": 4.0}\n{"step": 10, "loss": 3.0}\n'
                                            '{"step": 10, "eval_loss": 3.5}\n{"step": 20, "lo')  # being written
    assert sweep.latest_record(tmp_path) == {"step": 10, "loss": 3.0}


def test_a_sweep_prints_arm_i_of_n_and_progress_lines_while_arms_run(tmp_path, capsys):
    def slow_runner(spec, overrides, workdir):
        workdir.mkdir(parents=True, exist_ok=True)
        for step in (1, 2):
            with (workdir / "metrics.jsonl").open("a") as log:
                log.write(json.dumps({"step": step, "loss": 3.0 / step, "steps_per_second": 10.0}) + "\n")
            time.sleep(0.3)
        (workdir / "results.json").write_text(json.dumps({"step": 2}))
        (workdir / "summary.json").write_text(json.dumps({"step": 2, "eval_loss": 2.0 + int(overrides["seed"]) / 2}))
        return 0

    sweep.run_sweep(TEST_CONFIG, {"seed": ["0", "1"]}, {"train.num_steps": "2"}, tmp_path / "sweep",
                    runner=slow_runner, progress_every=0.05)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "start arm 1 of 2: seed=0"
    assert re.fullmatch(r"finished arm 2 of 2: seed=1 in 0:00:0\d", lines[-2])
    assert lines[-1] == (f"done: 2 arms in {tmp_path / 'sweep'} (2 finished; sweep.json and a folder each); lowest "
                         f"eval loss 2.0000 (seed=0); compare them with lm compare {tmp_path / 'sweep'}")
    progress = [line for line in lines if line.startswith("sweep: ")]
    assert re.fullmatch(r"sweep: 0 of 2 arms done \| arm 1 seed=0 step ([12])/2 loss (3\.0000|1\.5000) \| ETA 0:00:0\d",
                        progress[0])
    assert any(line.startswith("sweep: 1 of 2 arms done | arm 2 seed=1 step ") for line in progress)
    assert len(progress) == len(set(progress)) <= 4  # a line only when an arm logged


def test_sweep_file(tmp_path):
    file = tmp_path / "my_sweep.py"
    file.write_text('"""doc"""\nCONFIG = "configs/gpt_shakespeare.py:test"\n'
                    'AXES = {"model.use_bias": [True, False], "seed": [0, 1]}\nOVERRIDES = {"train.num_steps": 3}\n')
    assert sweep.load_sweep_file(str(file)) == (
        TEST_CONFIG, {"model.use_bias": ["true", "false"], "seed": ["0", "1"]}, {"train.num_steps": "3"})
    file.write_text('CONFIG = "c.py"\nAXES = {"seed": []}\n')
    with pytest.raises(UserError, match="non-empty list"):
        sweep.load_sweep_file(str(file))


SWEEP_FILES = sorted(str(path.relative_to(REPO)) for path in (REPO / "experiments" / "studies").glob("*/*.py")
                     if path.stem != "__init__" and "AXES" in path.read_text())  # a study's sweep files (not its
# scripts that collect and draw); bert_budget.py and the like sit above


@pytest.mark.parametrize("name", SWEEP_FILES)
def test_the_ablation_sweep_files_are_valid(tmp_path, name):
    spec, axes, overrides = sweep.load_sweep_file(str(REPO / name))
    arms = sweep.plan_sweep(spec, axes, overrides, tmp_path)
    seeds = axes.get("seed", ["0"])  # a search of one seed may leave the axis out
    assert seeds == [str(seed) for seed in range(len(seeds))]  # 0, 1, 2, ...: 3 to compare, 1 to search
    assert len(arms) == math.prod(len(v) for v in axes.values()) >= 3


# --- lm compare -------------------------------------------------------------------------------------------


def write_run(folder: pathlib.Path, config: dict, train_losses: list[float], eval_losses: list[float],
              steps_per_second: list[float] | None = None, num_params: int = 1000, active_params: int = 800,
              train_seconds: float | None = None):
    """A run folder as `lm train` writes it: train records at steps 10, 20, ..., eval at 0, 10, 20, ..."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    speeds = steps_per_second or [1.0] * len(train_losses)
    records = [{"step": 10 * i, "eval_loss": loss} for i, loss in enumerate(eval_losses)]
    records += [{"step": 10 * (i + 1), "loss": loss, "learning_rate": 1e-3, "steps_per_second": speed}
                for i, (loss, speed) in enumerate(zip(train_losses, speeds, strict=True))]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))  # NaN -> NaN, as json
    summary = {"num_params": num_params, "active_params": active_params}
    (folder / "summary.json").write_text(json.dumps(
        summary if train_seconds is None else {**summary, "train_seconds": train_seconds}))


def base_config(norm: str, seed: int) -> dict:
    return {"seed": seed, "model": {"norm": norm, "num_layers": 2}, "data": {"buckets": [16, 32]}}


@pytest.fixture
def synthetic_runs(tmp_path) -> pathlib.Path:
    root = tmp_path / "runs"
    for seed, (final, best) in enumerate([(2.0, 1.5), (2.2, 1.9), (2.4, 2.3)]):
        write_run(root / f"layer_{seed}", base_config("layer", seed), [3.0, 2.5, 2.0],
                  [4.0, best, final], steps_per_second=[100.0, 10.0 + seed, 20.0 + seed])
    write_run(root / "rms_0", base_config("rms", 0), [3.0, 2.0, 3.01], [4.0, 3.0, 2.5])  # a spike of 1.01
    write_run(root / "rms_1", base_config("rms", 1), [3.0, 2.0, 2.9], [4.0, 3.0, 2.0])  # a rise of 0.9
    write_run(root / "elsewhere" / "copied", base_config("rms", 2), [3.0, float("nan"), 2.0], [4.0, 3.5, 1.0])
    return root


def test_comparison_statistics(synthetic_runs, tmp_path):
    stats = compare.compare(str(synthetic_runs), out=str(tmp_path / "report"))
    assert list(stats) == ["model.norm=layer", "model.norm=rms"]
    layer, rms = stats["model.norm=layer"], stats["model.norm=rms"]
    assert layer["n"] == 3 and rms["n"] == 3
    np.testing.assert_allclose(layer["final_val_loss"], (2.2, 0.2))  # sample std of 2.0, 2.2, 2.4
    np.testing.assert_allclose(layer["best_val_loss"], (1.9, 0.4))  # of 1.5, 1.9, 2.3
    assert layer["steps_per_second"] == pytest.approx(16.0)  # (10, 20), (11, 21), (12, 22): first interval left out
    assert (layer["num_params"], layer["active_params"]) == (1000, 800)
    assert layer["diverged"] == {}
    np.testing.assert_allclose(rms["final_val_loss"], (np.mean([2.5, 2.0, 1.0]), np.std([2.5, 2.0, 1.0], ddof=1)))
    assert sorted(rms["diverged"]) == ["copied", "rms_0"]
    assert "loss nan at step 20" in rms["diverged"]["copied"]
    assert "spike" in rms["diverged"]["rms_0"] and "step 30" in rms["diverged"]["rms_0"]


def test_divergence_and_single_seed_statistics(tmp_path):
    write_run(tmp_path / "a", base_config("layer", 0), [3.0, 2.0, 2.5], [4.0, float("inf")])
    write_run(tmp_path / "b", base_config("layer", 1), [3.0, 2.0, 2.5], [4.0, 2.0], train_seconds=12.4)
    write_run(tmp_path / "c", base_config("layer", 2), [3.0], [4.0])
    a, b, c = compare.find_runs(tmp_path)
    assert compare.divergence(a) == "eval_loss inf at step 10"
    assert compare.divergence(b) == "" and "spike" in compare.divergence(b, spike=0.4)
    assert compare.steps_per_second(c) is None  # only the first (warm-up) interval was logged
    assert compare.mean_std([2.0]) == (2.0, None) and compare.mean_std([None]) == (None, None)
    assert math.isnan(compare.mean_std([2.0, float("nan")])[0])  # a diverged seed is not averaged away
    groups = compare.group_runs([b], None)
    assert list(groups) == ["all runs"]
    row = compare.table({"all runs": compare.group_stats([b])}).splitlines()[-1]
    assert row == "| all runs | 1 | 2.0000 | 2.0000 | 1.00 | 12 | 800 / 1,000 | 0/1 |"


def test_results_json_scores_get_a_column_each(tmp_path):
    """Scores after training (results.json) are averaged over seeds; a group without one shows '-'."""
    for seed, score in enumerate([1.0, 2.0]):
        write_run(tmp_path / f"rope_{seed}", base_config("rope", seed), [3.0], [2.0], train_seconds=10.0 + 10 * seed)
        (tmp_path / f"rope_{seed}" / "results.json").write_text(json.dumps({"step": 10, "val_ctx128": score}))
    write_run(tmp_path / "learned_0", base_config("learned", 0), [3.0], [2.5])
    (tmp_path / "learned_0" / "results.json").write_text(json.dumps({"step": 10}))
    groups = compare.group_runs(compare.find_runs(tmp_path))
    stats = {label: compare.group_stats(runs) for label, runs in groups.items()}
    np.testing.assert_allclose(stats["model.norm=rope"]["results"]["val_ctx128"], (1.5, np.sqrt(0.5)))
    assert stats["model.norm=learned"]["results"] == {}
    lines = compare.table(stats).splitlines()
    assert lines[0] == ("| group | n | final val loss | best val loss | val_ctx128 | steps/s | train s "
                        "| params (active / total) | diverged |")
    assert lines[2] == "| model.norm=learned | 1 | 2.5000 | 2.5000 | - | - | - | 800 / 1,000 | 0/1 |"
    assert lines[3] == ("| model.norm=rope | 2 | 2.0000 ± 0.0000 | 2.0000 ± 0.0000 | 1.5000 ± 0.7071 | - | 15 ± 7 "
                        "| 800 / 1,000 | 0/2 |")


def test_a_final_score_against_a_numeric_config_key_is_a_curve_per_group(tmp_path, capsys):
    """--against=data.max_train_examples (a learning curve): the table splits the groups by it, the plot draws each
    group's final score (results.json) against it, mean and min-max over seeds; a key that is no number is refused."""
    finals = {"pre": {250: [0.7, 0.8], 1000: [0.9, 0.9]}, "": {250: [0.5, 0.6], 1000: [0.8, 0.9]}}
    for init_from, by_count in finals.items():
        for count, scores in by_count.items():
            for seed, score in enumerate(scores):
                folder = tmp_path / "runs" / f"{init_from or 'scratch'}_{count}_{seed}"
                write_run(folder, {"seed": seed, "init_from": init_from, "data": {"max_train_examples": count}},
                          [1.0], [1.0])
                (folder / "results.json").write_text(json.dumps({"step": 10, "dev_accuracy": score}))
    out = tmp_path / "report"
    stats = compare.compare(str(tmp_path / "runs"), out=str(out), plot=["dev_accuracy"],
                            against="data.max_train_examples")
    np.testing.assert_allclose(stats["init_from=pre,data.max_train_examples=250"]["results"]["dev_accuracy"],
                               (0.75, np.std([0.7, 0.8], ddof=1)))
    assert len(stats) == 4 and (out / "dev_accuracy_by_data.max_train_examples.png").stat().st_size > 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        f"plots in {out}: train_loss.png, val_loss.png, dev_accuracy.png, dev_accuracy_by_data.max_train_examples.png")
    groups = compare.group_runs(compare.find_runs(tmp_path / "runs"), ["init_from"])
    counts, mean, low, high = compare.curve_against(groups["init_from=pre"], "dev_accuracy", "data.max_train_examples")
    np.testing.assert_allclose(np.stack([counts, mean, low, high]), [[250, 1000], [0.75, 0.9], [0.7, 0.9], [0.8, 0.9]])
    with pytest.raises(UserError, match=r"--against=init_from: the run .*pre_1000_0 has 'pre' there, not a number"):
        compare.compare(str(tmp_path / "runs"), out=str(out), plot=["dev_accuracy"], against="init_from")


def test_runs_from_several_directories_are_compared_together(synthetic_runs, tmp_path):
    """A second directory adds a group; a key its runs' configs lack reads as None."""
    extra = tmp_path / "extra"
    config = {**base_config("layer", 0), "model": {"norm": "layer", "num_layers": 2, "scale": True}}
    write_run(extra / "scaled_0", config, [3.0], [1.0])
    stats = compare.compare([str(synthetic_runs), str(extra)], out=str(tmp_path / "report"))
    assert list(stats) == ["model.norm=layer,model.scale=None", "model.norm=layer,model.scale=True",
                           "model.norm=rms,model.scale=None"]
    assert stats["model.norm=layer,model.scale=True"]["final_val_loss"] == (1.0, None)
    assert "`extra/scaled_0`" in (tmp_path / "report" / "report.md").read_text()


def test_report_and_plots_are_written(synthetic_runs, tmp_path):
    out = tmp_path / "report"
    result = run_cli("lm", "compare", str(synthetic_runs), f"--out={out}", "--group_by=model.norm")
    assert result.returncode == 0, result.stderr
    assert ("| model.norm=layer | 3 | 2.2000 ± 0.2000 | 1.9000 ± 0.4000 | 16.00 | - | 800 / 1,000 | 0/3 |"
            in result.stdout)
    assert result.stdout.splitlines()[-1] == (f"done: the report in {out / 'report.md'}; plots in {out}: "
                                              "train_loss.png, val_loss.png")
    report = (out / "report.md").read_text()
    assert "| model.norm=rms | 3 |" in report and "2/3 |" in report and "`elsewhere/copied`" in report
    from matplotlib.image import imread

    for name in ("train_loss.png", "val_loss.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert imread(out / name).shape[:2] == (500, 800)


@pytest.mark.parametrize("group_by, message", [
    (None, "no runs under"),
    (["model.nope"], "no run's config has model.nope"),
])
def test_compare_errors_are_one_line(synthetic_runs, tmp_path, capsys, group_by, message):
    """What `lm compare` runs (compare, with one-line errors), in this process; the command line's
    flag parsing is test_report_and_plots_are_written's."""
    root = tmp_path / "empty" if not group_by else synthetic_runs
    root.mkdir(exist_ok=True)
    before = sorted(root.rglob("*"))
    result = exit_code_and_output(capsys, lambda: run_user_errors(lambda: compare.compare([str(root)], None, group_by)))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr
    assert sorted(root.rglob("*")) == before


# --- end to end -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_of_the_test_config_then_compare(tmp_path, data_dir, capsys):
    """Two real `lm train` runs at a time (one device each, for speed; the grid's product and order are
    checked above without running), a rerun that resumes the arm whose results.json was deleted and
    skips the other, then `lm compare` on the sweep folder."""
    env = subprocess_env()
    workdir = tmp_path / "sweep"
    args = ["lm", "sweep", f"--config={TEST_CONFIG}", "--sweep=model.norm=layer,rms", "--sweep=seed=1",
            f"--workdir={workdir}", "--parallel=2", "--config.train.num_steps=4", "--config.train.log_every=2",
            "--config.eval.every=2", "--config.eval.num_batches=1", "--config.sample.max_new_tokens=0"]
    result = run_cli(*args, env=env)
    assert result.returncode == 0, result.stderr + result.stdout
    names = ["model.norm=layer,seed=1", "model.norm=rms,seed=1"]
    record = json.loads((workdir / "sweep.json").read_text())
    assert [(a["name"], a["status"]) for a in record["arms"]] == [(n, "finished") for n in names]
    for name in names:
        config = json.loads((workdir / name / "config.json").read_text())
        assert (config["model"]["norm"], config["seed"], config["train"]["num_steps"]) == (
            name.split(",")[0].split("=")[1], int(name[-1]), 4)

    (workdir / names[1] / "results.json").unlink()
    result = run_cli(*args, env=env)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "1 finished earlier, 1 to run" in result.stdout
    assert "resumed from step 4" in (workdir / names[1] / "train.log").read_text()
    for name in names:  # one `lm train` command line each, two for the resumed arm
        commands = [line for line in (workdir / name / "train.log").read_text().splitlines() if line.startswith("$ ")]
        assert len(commands) == (2 if name == names[1] else 1)
    assert json.loads((workdir / names[1] / "results.json").read_text())["step"] == 4

    compare.compare(str(workdir))  # what `lm compare` runs: prints the table, writes the report
    table = capsys.readouterr().out
    assert "| model.norm=layer | 1 |" in table and "| model.norm=rms | 1 |" in table
    assert {"report.md", "train_loss.png", "val_loss.png"} <= {p.name for p in workdir.iterdir()}


def test_plot_draws_any_logged_metric_as_a_mean_curve_over_seeds(tmp_path):
    """--plot=eval_mlm_accuracy: the metric's mean, min and max over seeds at the steps every seed logged
    it, in <metric>.png and report.md; a metric no run logged is one clear error."""
    for seed, accuracies in enumerate([[0.0, 0.2, 0.3], [0.0, 0.4]]):
        write_run(tmp_path / "runs" / f"s{seed}", base_config("layer", seed), [3.0], [4.0, 3.0])
        with (tmp_path / "runs" / f"s{seed}" / "metrics.jsonl").open("a") as metrics:
            for step, accuracy in enumerate(accuracies):
                metrics.write(json.dumps({"step": 10 * step, "eval_mlm_accuracy": accuracy}) + "\n")
    runs = compare.find_runs(tmp_path / "runs")
    steps, mean, low, high = compare.mean_curve(runs, "eval_mlm_accuracy")
    np.testing.assert_allclose(steps, [0, 10])  # step 20: one seed only
    np.testing.assert_allclose(mean, [0.0, 0.3])
    np.testing.assert_allclose(low, [0.0, 0.2])
    np.testing.assert_allclose(high, [0.0, 0.4])
    compare.compare(str(tmp_path / "runs"), out=str(tmp_path / "report"), plot=["eval_mlm_accuracy"])
    assert (tmp_path / "report" / "eval_mlm_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![eval_mlm_accuracy](eval_mlm_accuracy.png)" in (tmp_path / "report" / "report.md").read_text()
    with pytest.raises(UserError, match="--plot: no run logged eval_nsp_accuracy"):
        compare.compare(str(tmp_path / "runs"), out=str(tmp_path / "report"), plot=["eval_nsp_accuracy"])
