"""The command line: bad input gets one line on stderr, exit code 2, and an untouched workdir.

The config checks run in this process, on lm train's path after flag parsing (train_in_process); a few
tests run the real commands in subprocesses, for what only a process shows: flag parsing and app.run's
wiring, exit codes of signals, a fresh process's devices and compilation cache."""

import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from absl import flags
from conftest import REPO, subprocess_env

from lm.cli import parse_flags
from lm.cli import sample as sample_cli
from lm.cli.overrides import resolve_config
from lm.cli.resolve import build_experiment
from lm.errors import run_user_errors
from lm.train.loop import train

SPEC = "configs/gpt_shakespeare.py:test"
CONFIG = f"--config={SPEC}"


def run(*args, env=None):
    """`python -m lm args` in a subprocess; env adds variables to this one's (None: leaves it out)."""
    env = subprocess_env(**{"JAX_PLATFORMS": "cpu", **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "lm", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def exit_code_and_output(capsys, fn) -> subprocess.CompletedProcess:
    """fn() in this process as a command's main: its exit code (0, or SystemExit's), stdout and stderr."""
    try:
        fn()
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(fn, code, out, err)


def train_in_process(capsys, workdir, *overrides, num_devices=1) -> subprocess.CompletedProcess:
    """`python -m lm train --config=SPEC --workdir=workdir overrides` after its flags are parsed, in this
    process on num_devices devices (one, as a user's CPU has): the config resolved from the
    --config.key=value overrides as lm train resolves them, then train with lm train's error handling."""
    def command():
        config = resolve_config(SPEC, dict(o.removeprefix("--config.").split("=", 1) for o in overrides))
        return train(config, str(workdir), build_experiment, jax.devices()[:num_devices])

    return exit_code_and_output(capsys, lambda: run_user_errors(command))


def main_in_process(capsys, module, *args, parse_flags=parse_flags) -> subprocess.CompletedProcess:
    """`python -m <module> args` in this process, as app.run runs it: the flags parsed from their defaults
    by parse_flags (the module's own parser), then module.main."""
    flags.FLAGS.unparse_flags()  # no flag value left over from an earlier call
    return exit_code_and_output(capsys, lambda: module.main(parse_flags([module.__name__, *args])))


def assert_user_error(result, *fragments):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def snapshot(folder):
    return {p: p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("--config.model.num_layerz=3", ["num_layerz", "num_layers"]),
        ("--config.model.num_layers=abc", ["num_layers", "abc"]),
        ("--config.optimizer.learning_rate=fast", ["learning_rate"]),
    ],
)
def test_bad_override_is_one_line_and_writes_nothing(tmp_path, override, fragments):
    """The command line's own parsing of --config.key=value (a subprocess: app.run's flag parser)."""
    workdir = tmp_path / "run"
    assert_user_error(run("train", CONFIG, f"--workdir={workdir}", override), *fragments)
    assert not workdir.exists() or not any(workdir.iterdir())


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("--config.model.norm_position=middle", ["norm_position", "middle"]),
        ("--config.train.batch_size=7 --config.train.grad_accum_steps=2", ["grad_accum_steps"]),
        ("--config.model.num_heads=3", ["embed_dim=32 is not divisible by model.num_heads=3"]),
        ("--config.model.moe.num_experts=2 --config.model.moe.top_k=3", ["top_k <= num_experts", "top_k=3"]),
        ("--config.mesh.data=16", ["needs 16 devices but 1 are available", "device_count=16 before the command"]),
        ("--config.train.on_nonfinite=ignore", ["on_nonfinite", "one of ('stop', 'skip')"]),
    ],
)
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, data_dir, capsys, override, fragments):
    workdir = tmp_path / "run"
    assert_user_error(train_in_process(capsys, workdir, *override.split()), *fragments)
    assert not workdir.exists() or not any(workdir.iterdir())


def test_unknown_variant(tmp_path):
    result = run("train", "--config=configs/gpt_shakespeare.py:huge", f"--workdir={tmp_path}")
    assert_user_error(result, "huge")


def test_batch_that_the_data_axes_do_not_divide(tmp_path, data_dir, capsys):
    result = train_in_process(capsys, tmp_path, "--config.train.batch_size=6", num_devices=4)
    assert_user_error(result, "batch", "4 batch shards")


def test_missing_data_names_the_path(tmp_path, capsys, monkeypatch):
    from lm.data import files

    empty = tmp_path / "nodata"
    empty.mkdir()
    monkeypatch.setenv("LM_DATA_DIR", str(empty))
    monkeypatch.setattr(files, "CACHE_DIR", empty / "cache")
    result = train_in_process(capsys, tmp_path / "run")
    assert_user_error(result, str(empty / "tinyshakespeare" / "input.txt"), "LM_DATA_DIR")


def test_unwritable_workdir(tmp_path, data_dir, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert_user_error(train_in_process(capsys, blocker / "run"), "not writable", str(blocker))


def test_checkpoint_of_another_model_shape_is_refused_untouched(trained_run, capsys):
    """The error names the config field in which the run's config.json differs, with both values."""
    _, workdir, _ = trained_run
    before = snapshot(workdir)
    result = train_in_process(capsys, workdir, "--config.model.embed_dim=64")
    assert_user_error(result, f"{workdir} holds a run with model.embed_dim=32 (config.json), this config has "
                      "model.embed_dim=64: drop the override (or resume with --config.model.embed_dim=32) or use "
                      "another --workdir")
    assert snapshot(workdir) == before


def test_checkpoints_kept_elsewhere_are_compared_through_the_workdirs_config(trained_run, tmp_path, capsys):
    """With train.checkpoint_dir elsewhere, the workdir's config.json names the fields; a workdir without
    one (nothing to compare) gets the first array of another shape."""
    _, source, _ = trained_run
    shutil.copytree(source / "checkpoints", tmp_path / "elsewhere")  # (the shared run stays untouched)
    workdir = tmp_path / "run"
    overrides = [f"--config.train.checkpoint_dir={tmp_path / 'elsewhere'}", "--config.model.num_heads=4",
                 "--config.model.num_kv_heads=4"]
    assert_user_error(train_in_process(capsys, workdir, *overrides),
                      "does not fit this model: params/decoder/block_0/attention/key/bias is (2, 16) there but (4, 8) "
                      "here")
    workdir.mkdir()
    (workdir / "config.json").write_text((source / "config.json").read_text())
    assert_user_error(train_in_process(capsys, workdir, *overrides),
                      f"{workdir} holds a run with model.num_heads=2, model.num_kv_heads=2 (config.json), this "
                      "config has model.num_heads=4, model.num_kv_heads=4: drop the overrides (or resume with "
                      "--config.model.num_heads=2 --config.model.num_kv_heads=2)")


@pytest.mark.slow
def test_sampling_from_a_checkpoint(trained_run, capsys):
    _, workdir, _ = trained_run
    relative = os.path.relpath(workdir, REPO)  # as a user types it (run() starts in the repository)
    result = run("sample", f"--workdir={relative}", "--prompt=ROMEO:", "--max_new_tokens=40", "--top_k=5")
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout.rstrip("\n")
    assert text.startswith("ROMEO:") and len(text) >= len("ROMEO:") + 30  # a trailing newline may be sampled
    greedy = [f"--workdir={workdir}", "--prompt=A", "--max_new_tokens=30", "--temperature=0"]
    first, again = (main_in_process(capsys, sample_cli, *greedy) for _ in range(2))
    assert first.stdout == again.stdout and first.returncode == again.returncode == 0 and first.stdout.startswith("A")
    assert_user_error(main_in_process(capsys, sample_cli, *greedy, "--chat"), "--chat: this run has no chat template")


def test_sampling_from_an_empty_workdir(tmp_path, capsys):
    assert_user_error(main_in_process(capsys, sample_cli, f"--workdir={tmp_path}"), "config.json")


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_rerun_resumes(tmp_path, data_dir):
    workdir = tmp_path / "run"
    args = [sys.executable, "-m", "lm", "train", CONFIG, f"--workdir={workdir}", "--config.train.num_steps=100000",
            "--config.train.log_every=1", "--config.eval.every=100000", "--config.train.checkpoint_every=100000"]
    process = subprocess.Popen(args, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    for line in process.stdout:
        if line.startswith("step     20 | loss"):
            process.send_signal(signal.SIGTERM)
            break
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "SIGTERM: saved a checkpoint at step" in err
    saved = int(err.split("saved a checkpoint at step ")[1].split(";")[0])
    assert 20 <= saved < 100000
    assert [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()] == [saved]
    result = run("train", CONFIG, f"--workdir={workdir}", f"--config.train.num_steps={saved + 2}",
                 "--config.train.log_every=1", "--config.eval.every=100000")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"resumed from step {saved}" in result.stdout
    assert f"step {saved + 2:>6} | loss" in result.stdout


@pytest.mark.slow
def test_dry_run_compiles_for_the_mesh_and_writes_nothing(tmp_path, data_dir):
    """--dry_run on 8 fake devices: the report's lines, exit 0, and no workdir created. The compiled
    step goes to train.compilation_cache_dir (the suite's own cache, from the environment, left out)."""
    workdir, cache = tmp_path / "never", tmp_path / "cache"
    result = run("train", CONFIG, f"--workdir={workdir}", "--dry_run", "--config.mesh.data=2",
                 "--config.mesh.fsdp=4", f"--config.train.compilation_cache_dir={cache}",
                 env={"XLA_FLAGS": subprocess_env(devices=8)["XLA_FLAGS"], "JAX_COMPILATION_CACHE_DIR": None,
                      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    mesh = "{'data': 2, 'fsdp': 4, 'expert': 1, 'context': 1, 'tensor': 1}"
    assert any(line.startswith(f"dry run: mesh {mesh} of 8 x cpu") for line in lines), result.stdout
    for prefix in ("parameters        30,080 (30,080 active)", "memory per device arguments", "FLOPs per step",
                   "compile"):
        assert any(line.startswith(prefix) for line in lines), (prefix, result.stdout)
    assert not workdir.exists()
    assert any(p.name.startswith("jit_") for p in cache.iterdir()), sorted(cache.iterdir())


@pytest.mark.slow
def test_dry_run_memory_shrinks_when_the_state_is_sharded(data_dir, test_config):
    """The compiled step's per-device arguments: the replicated state (params + two Adam moments) on a
    data-parallel mesh; an eighth of it when FSDP shards it 8 ways. FLOPs: the 8 devices' programs add
    up to about the model estimate."""
    from lm.train.dry_run import dry_run

    replicated = dry_run(test_config, build_experiment)  # mesh data = all 8 devices
    test_config.mesh.update(data=1, fsdp=8)
    sharded = dry_run(test_config, build_experiment)
    state_bytes = 3 * 4 * replicated["num_params"]  # float32 params, mu and nu
    assert state_bytes <= replicated["argument_bytes"] < 1.1 * state_bytes
    assert sharded["argument_bytes"] < replicated["argument_bytes"] / 4
    for report in (replicated, sharded):
        assert 0.5 < 8 * report["xla_flops_per_device"] / report["model_flops_per_step"] < 3


def test_lm_help_lists_every_command_and_an_unknown_one_is_one_line():
    """`python -m lm --help`: exit 0, one line per command (its module's first docstring line); every
    module of lm/cli but the shared ones is a command; an unknown command is one line, exit 2."""
    from lm.cli import COMMANDS, summary

    modules = {p.stem for p in (REPO / "lm/cli").glob("*.py")} - {"__init__", "resolve", "overrides"}
    assert set(COMMANDS) == modules
    result = run("--help")
    assert result.returncode == 0, result.stderr
    for command in COMMANDS:
        assert f"  {command:<9}  {summary(command)}" in result.stdout.splitlines(), (command, result.stdout)
        assert len(summary(command)) > 20
    unknown = run("trian", CONFIG)
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == ["error: unknown command 'trian': use one of train, sample, eval, export, "
                                           "prepare, sweep, compare, scaling, translate (lm --help says what each "
                                           "does)"]


@pytest.mark.parametrize("args", [("eval", "--help"), ("--help",)], ids=["eval --help", "--help"])
def test_output_into_a_pipe_nobody_reads_is_dropped_without_a_traceback(args):
    """`lm eval --help | head -1`: head has gone when the rest of the help is written (here the pipe has no reader
    from the start). The command ends as it would have, exit 0, nothing on stderr."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        result = subprocess.run([sys.executable, "-m", "lm", *args], cwd=REPO, env=subprocess_env(), stdout=writer,
                                stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(writer)
    assert (result.returncode, result.stderr) == (0, "")


def test_a_steady_stream_drops_what_a_gone_reader_cannot_take():
    """lm.console's wrapper of sys.stdout and sys.stderr, around a stream without a file descriptor (a notebook's,
    say) whose reader has gone: its writes and flushes succeed from then on, and go nowhere."""
    import io

    from lm.console import SteadyStream, steady

    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    stream = steady(Gone())
    assert isinstance(stream, SteadyStream) and steady(stream) is stream
    assert stream.write("lost") == 4
    print("also lost", file=stream, flush=True)
    assert stream.closed is False  # (the rest of the stream as it is)


def test_train_help_says_the_compilation_cache_is_on():
    """The persistent compilation cache is on unless a config turns it off: lm train --help says so, with its
    folder and how to turn it off."""
    from lm.cli import command_help
    from lm.cli import train as train_cli
    from lm.train.options import train_options

    assert train_options().compilation_cache_dir == "auto"
    text = " ".join(command_help(train_cli).split())
    assert "The persistent compilation cache is on by default (--config.train.compilation_cache_dir=auto" in text
    assert "~/.cache/lm/jax_compilation_cache" in text and "=none: off" in text


def test_what_the_commands_write_into_the_repository_is_ignored_by_git():
    """The folders the documented commands write into a checkout (runs/ by lm train, data/ by lm prepare,
    exported/ by lm export) are ignored by git; the library's own lm/data and the studies' reports are not."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    written = ["runs/baby/config.json", "data/bpe/train.bin", "exported/gpt2_finetune/model.safetensors"]
    tracked = ["lm/data/text.py", "experiments/studies/README.md"]
    result = subprocess.run(["git", "check-ignore", "--no-index", *written, *tracked], cwd=REPO, capture_output=True,
                            text=True)
    assert result.stdout.split() == written, result.stderr


def test_eval_scores_a_checkpoint_as_the_trainer_did(trained_run, tmp_path, capsys):
    """`lm eval` on the shared 40-step run: the eval loss its trainer logged at step 40 and the held-out
    results it wrote, again, in <out>/eval.json; a step without a checkpoint is one line."""
    from lm.cli import eval as eval_cli

    _, workdir, summary = trained_run
    result = main_in_process(capsys, eval_cli, f"--workdir={workdir}", f"--out={tmp_path}")
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "eval.json").read_text())
    trained = json.loads((workdir / "results.json").read_text())
    assert written["step"] == trained["step"] == 40
    np.testing.assert_allclose(written["eval_loss"], summary["eval_loss"], rtol=1e-5)
    assert result.stdout.splitlines()[-1] == \
        f"done: eval loss {written['eval_loss']:.4f} at step 40; written: {tmp_path / 'eval.json'}"
    assert trained.keys() - {"step"} and trained.keys() <= written.keys()
    for key in trained.keys() - {"step"}:
        np.testing.assert_allclose(written[key], trained[key], rtol=1e-5)
    missing = main_in_process(capsys, eval_cli, f"--workdir={workdir}", "--step=7", f"--out={tmp_path / 'x'}")
    assert_user_error(missing, "--step=7: ", "holds the checkpoints of steps")
    assert not (tmp_path / "x").exists()
