"""Faults and bad input beyond the config (test_cli.py has those): damaged checkpoints, a full disk,
a read-only filesystem or a removed workdir at each place lm train writes, empty or undecodable data.
Each gives one line on stderr, exit code 2, and loses nothing."""

import errno
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import REPO, subprocess_env
from tensorboardX.event_file_writer import EventsWriter
from test_cli import CONFIG, assert_user_error, main_in_process, snapshot, train_in_process

from lm.cli import eval as eval_cli
from lm.cli import sample as sample_cli
from lm.cli.resolve import build_experiment
from lm.data.text import CharTokenizer
from lm.errors import UserError
from lm.train.checkpoint import finished_steps
from lm.train.loop import Stopped, Trainer, train
from lm.train.setup import restore_params


@pytest.fixture
def run_copy(trained_run, tmp_path):
    """A copy of the shared 40-step run (checkpoints at steps 30 and 40) that a test may damage."""
    config, workdir, _ = trained_run
    copy = tmp_path / "run"
    shutil.copytree(workdir, copy)
    return config, workdir, copy


@pytest.mark.slow
def test_damaged_checkpoint_names_its_step_and_falls_back_only_when_asked(run_copy, capsys):
    config, original, workdir = run_copy
    (workdir / "checkpoints" / "40" / "state" / "_METADATA").write_text("garbage")
    before = snapshot(workdir)
    result = train_in_process(capsys, workdir, "--config.train.num_steps=50")
    assert_user_error(result, "checkpoint at step 40", "cannot be read", "restore_fallback=True")
    assert snapshot(workdir) == before
    sampled = main_in_process(capsys, sample_cli, f"--workdir={workdir}")
    assert_user_error(sampled, "checkpoint at step 40", "cannot be read")

    config = config.copy_and_resolve_references()  # (the shared run's config stays as it is for other tests)
    config.train.update(num_steps=45, restore_fallback=True)
    summary = train(config, str(workdir), build_experiment, devices=jax.devices()[:1])
    assert summary["step"] == 45
    assert (workdir / "checkpoints" / "40.corrupt").is_dir()  # kept for inspection, out of the way
    # Resumed from step 30: the steps 31-40 were retrained exactly as before.
    np.testing.assert_array_equal(
        jax.tree.leaves(restore_params(config, build_experiment(config), workdir, step=40))[0],
        jax.tree.leaves(restore_params(config, build_experiment(config), original, step=40))[0],
    )


def damage_an_array(config, workdir, step):
    """Flips a byte in the largest data file of the checkpoint at step, one where the file still
    decodes but an array's values change: its chunks are zstd-compressed, without checksums, and
    where the writes put them varies, so a flip may make it unreadable (the test above covers that)
    or change nothing restored; tries the next byte until one is caught by the checksums."""
    data = max((workdir / "checkpoints" / str(step) / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    original = data.read_bytes()
    experiment = build_experiment(config)
    for position in range(len(original) // 2, len(original), 97):
        content = bytearray(original)
        content[position] ^= 0xFF
        data.write_bytes(bytes(content))
        try:
            restore_params(config, experiment, workdir, step=step)
        except UserError as error:
            if "does not match the checksum" in str(error):
                return
    raise AssertionError(f"no byte of {data} that decodes")


@pytest.mark.slow
def test_checksums_catch_a_flipped_byte_and_fall_back_only_to_a_verified_checkpoint(run_copy, capsys):
    config, _, workdir = run_copy
    checkpoints = workdir / "checkpoints"
    damage_an_array(config, workdir, 40)
    capsys.readouterr()  # (what the tries printed)
    before = snapshot(workdir)
    result = train_in_process(capsys, workdir, "--config.train.num_steps=50")
    assert_user_error(result, "checkpoint at step 40", "the array ", "does not match the checksum", "restore_fallback")
    assert snapshot(workdir) == before
    evaluated = main_in_process(capsys, eval_cli, f"--workdir={workdir}", "--step=40")  # one step asked for
    assert_user_error(evaluated, "checkpoint at step 40", "does not match the checksum")

    # num_steps=30: the run restored from step 30 has nothing left to train (and trains nothing here)
    result = train_in_process(capsys, workdir, "--config.train.num_steps=30", "--config.train.restore_fallback=True")
    assert result.returncode == 0 and "resumed from step 30" in result.stdout
    (warning,) = result.stderr.strip().splitlines()
    assert "step 40" in warning and "does not match the checksum" in warning and "resuming from step 30" in warning

    damage_an_array(config, workdir, 30)
    capsys.readouterr()
    metrics = snapshot(workdir / "metrics.jsonl")
    result = train_in_process(capsys, workdir, "--config.train.num_steps=50", "--config.train.restore_fallback=True")
    assert_user_error(result, "no checkpoint in", "30.corrupt, 40.corrupt", "to train from step 0, delete")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["30.corrupt", "40.corrupt"]  # nothing trained
    assert snapshot(workdir / "metrics.jsonl") == metrics
    # and so it stays: a rerun does not start from step 0 by itself
    assert_user_error(train_in_process(capsys, workdir, "--config.train.restore_fallback=True"), "no checkpoint in")


def test_a_fallback_keeps_a_checkpoint_an_earlier_fallback_set_aside(run_copy, capsys):
    """An earlier fallback set the step-40 checkpoint aside, the run trained to step 40 again, and that one is
    damaged too: it goes beside the first (40.corrupt.1), and both are named when nothing is left to restore."""
    config, _, workdir = run_copy
    checkpoints = workdir / "checkpoints"
    shutil.copytree(checkpoints / "40", checkpoints / "40.corrupt")
    (checkpoints / "40" / "state" / "_METADATA").write_text("garbage")
    # num_steps=30: the run restored from step 30 has nothing left to train (and trains nothing here)
    result = train_in_process(capsys, workdir, "--config.train.num_steps=30", "--config.train.restore_fallback=True")
    assert result.returncode == 0 and "resumed from step 30" in result.stdout, result.stderr[-2000:]
    assert f"moved it to {checkpoints / '40.corrupt.1'}; resuming from step 30" in result.stderr
    assert sorted(p.name for p in checkpoints.iterdir()) == ["30", "40.corrupt", "40.corrupt.1"]

    (checkpoints / "30" / "state" / "_METADATA").write_text("garbage")
    result = train_in_process(capsys, workdir, "--config.train.num_steps=50", "--config.train.restore_fallback=True")
    assert_user_error(result, "no checkpoint in", "set aside: 30.corrupt, 40.corrupt, 40.corrupt.1")


@pytest.mark.slow
def test_a_checkpoint_without_checksums_restores_unverified(run_copy):
    """Checkpoints saved before checksums were recorded have no checksums.json."""
    config, original, workdir = run_copy
    (workdir / "checkpoints" / "40" / "checksums.json").unlink()
    restored = restore_params(config, build_experiment(config), workdir)
    expected = restore_params(config, build_experiment(config), original)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_nan_stop_names_the_newest_checkpoint_with_finite_parameters(tmp_path):
    """An update with finite gradients can make parameters Inf (the NaN loss comes a step later): the
    checkpoint saved in between is not the one to resume from."""
    from lm.train.checkpoint import Checkpointer
    from lm.train.loop import count_nonfinite

    checkpointer = Checkpointer(str(tmp_path / "checkpoints"), keep=3)
    try:
        checkpointer.save(2, {"params": {"w": jax.numpy.ones(3)}})
        checkpointer.save(4, {"params": {"w": jax.numpy.array([1.0, np.inf, 0.0])}})
        flags = [(5, jax.numpy.array([1]))]
        with pytest.raises(UserError, match="NaN/Inf at step 5 .*the checkpoint at step 2 is the newest whose"):
            count_nonfinite(flags, "stop", checkpointer.last_finite_step)
    finally:
        checkpointer.close()
    assert (tmp_path / "checkpoints" / "4" / "checksums.json").is_file()
    with pytest.raises(UserError, match="no checkpoint with finite parameters and optimizer state yet"):
        count_nonfinite(flags, "stop", lambda: None)


@pytest.mark.slow
def test_full_disk_during_a_save_keeps_the_previous_checkpoint(run_copy, capsys):
    """`ulimit -f`: no file may grow past 50 KiB, so the checkpoint write fails with 'File too large'
    as on a full disk (SIGXFSZ, which would kill the process, is ignored)."""
    config, _, workdir = run_copy
    env = subprocess_env(JAX_COMPILATION_CACHE_DIR=None)
    # (no compilation cache: its entries cut at 50 KiB would warn as they are read, here and later)
    command = f"ulimit -f 50; trap '' XFSZ; exec {sys.executable} -m lm train {CONFIG} --workdir={workdir} " \
              "--config.train.num_steps=50 --config.train.compilation_cache_dir=none"
    result = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    # One line: not the tracebacks that Orbax's writer threads log, nor those of TensorStore's callbacks
    # into the closed event loop of the failed save. (stderr is a pipe here: redirected to a file, the
    # size limit would stop that file too.)
    assert_user_error(result, f"writing a checkpoint in {workdir / 'checkpoints'} failed (File too large)",
                      "the checkpoint at step 40 is intact", "ulimit -f", "rerun the same command to resume")
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["30", "40"]
    params = restore_params(config, build_experiment(config), workdir)  # the latest readable one: step 40
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(params))
    resumed = train_in_process(capsys, workdir, "--config.train.num_steps=42")
    assert resumed.returncode == 0 and "resumed from step 40" in resumed.stdout


@pytest.mark.slow
def test_a_failed_run_exits_while_a_checkpoint_write_hangs(run_copy):
    """A checkpoint write that never ends (a hung filesystem) while the run fails for another reason:
    the run waits for the write a bounded time (checkpoint.WAIT_AFTER_FAILURE_SECONDS, 1 s here), then
    reports its own error and exits, where Python would wait for Orbax's thread for ever."""
    _, _, workdir = run_copy
    script = f"""if True:
        import errno, threading
        import orbax.checkpoint as ocp
        from lm.cli import main
        from lm.train import checkpoint, loop
        checkpoint.WAIT_AFTER_FAILURE_SECONDS = 1
        ocp.CheckpointManager._finalize = lambda *args: threading.Event().wait()  # every save hangs at its end
        def finish(self, state, step):  # the run fails after its last save
            raise OSError(errno.ENOSPC, "No space left on device", "{workdir}/samples.txt")
        loop.Trainer.finish = finish
        main(["lm", "train", "{CONFIG}", "--workdir={workdir}", "--config.train.num_steps=50"])
    """
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=subprocess_env(), capture_output=True,
                            text=True, timeout=60)
    step = finished_steps(workdir / "checkpoints")[-1]
    assert_user_error(result, f"writing {workdir}/samples.txt failed (No space left on device)",
                      f"the checkpoint at step {step} is intact")


def full(name):
    """A fault: the file `name` of the workdir is on a full disk (replaced by a link to /dev/full, into
    which every write fails with ENOSPC, as on a full disk)."""
    def fault(patch, workdir):
        (workdir / name).unlink(missing_ok=True)
        (workdir / name).symlink_to("/dev/full")
    return fault


def raising(owner, attribute, error):
    """A fault: owner.attribute raises error, as a write that failed."""
    def fault(patch, workdir):
        def fail(*args, **kwargs):
            raise error
        patch.setattr(owner, attribute, fail)
    return fault


def removed_at(step):
    """A fault: the workdir is removed (with its checkpoints) during the step after `step`."""
    def fault(patch, workdir):
        evaluate = Trainer.evaluate

        def evaluate_then_remove(self, at, *args):
            if at == step:
                shutil.rmtree(workdir)
            return evaluate(self, at, *args)
        patch.setattr(Trainer, "evaluate", evaluate_then_remove)
    return fault


ENOSPC = "No space left on device"


# Each place lm train writes to, when the write fails: (the fault, the step of the newest checkpoint left
# (None: removed), fragments of the message; {w} is the workdir). The run resumes from step 40 to 50.
# (results.json and summary.json are written as config.json is, lm.runs.write_json; the log truncated on
# resume through the same lm.runs.writing as samples.txt and metrics.jsonl.)
WRITE_FAULTS = {
    "config.json": (full("config.json.partial"), 40, [f"writing {{w}}/config.json failed ({ENOSPC})",
                                                      "free some space on the disk of {w}"]),
    "tokenizer (a library's error)": (raising(CharTokenizer, "save", Exception(f"{ENOSPC} (os error 28)")), 40,
                                      [f"writing in {{w}} failed ({ENOSPC})"]),
    "tensorboard (read-only)": (raising(EventsWriter, "flush", OSError(errno.EROFS, os.strerror(errno.EROFS))), 40,
                                ["writing {w}/tensorboard failed (Read-only file system)", "make {w} writable"]),
    "checkpoint": (raising(ocp.CheckpointManager, "save", OSError(errno.ENOSPC, ENOSPC)), 40,
                   [f"writing a checkpoint in {{w}}/checkpoints failed ({ENOSPC})"]),
    # after the last save: the error waits for it to finish and names it
    "samples.txt": (full("samples.txt"), 50, [f"writing {{w}}/samples.txt failed ({ENOSPC})"]),
    "workdir removed": (removed_at(45), None, ["{w} was removed during the run: writing {w}/metrics.jsonl failed",
                                               "no checkpoint is left in {w}/checkpoints: restore {w}"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault, step, fragments", WRITE_FAULTS.values(), ids=WRITE_FAULTS)
def test_a_failed_write_is_one_line_naming_the_intact_checkpoint(run_copy, capsys, monkeypatch, fault, step,
                                                                 fragments):
    """A full disk, a read-only filesystem or a removed workdir at each place lm train writes: one line
    (the file, the reason, the checkpoint left intact, what to do), exit code 2, the checkpoint restores."""
    config, _, workdir = run_copy
    with monkeypatch.context() as patch:
        fault(patch, workdir)
        result = train_in_process(capsys, workdir, "--config.train.num_steps=50")
    then = f"the checkpoint at step {step} is intact" if step else "rerun the same command"
    assert_user_error(result, *[fragment.format(w=workdir) for fragment in fragments], then)
    if step:
        assert finished_steps(workdir / "checkpoints")[-1] == step
        params = restore_params(config, build_experiment(config, workdir), workdir, step=step)  # (its data cache)
        assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(params))


def test_a_resume_on_a_full_disk_leaves_the_workdir_as_it_was(run_copy, capsys, monkeypatch):
    """The disk is full before the rerun starts: a file lm train writes is made, but none of its bytes fit. The
    one line, and the workdir as it was (no partial file left behind, no lock file)."""
    _, _, workdir = run_copy
    write_text = pathlib.Path.write_text

    def no_space(path, text, *args, **kwargs):
        if workdir not in path.parents:
            return write_text(path, text, *args, **kwargs)
        path.touch()  # (the file is made; its bytes do not fit)
        if text:
            raise OSError(errno.ENOSPC, ENOSPC)
        return 0

    before = snapshot(workdir)
    with monkeypatch.context() as patch:
        patch.setattr(pathlib.Path, "write_text", no_space)
        result = train_in_process(capsys, workdir, "--config.train.num_steps=50")
    assert_user_error(result, f"writing {workdir}/config.json failed ({ENOSPC})", "the checkpoint at step 40 is intact")
    assert snapshot(workdir) == before


def interrupt_after_leaving(reader: int, first_line: str) -> threading.Thread:
    """A thread that reads the lines of the pipe whose read end is reader up to one starting with first_line,
    closes the pipe (the reader is gone, as tee when Ctrl-C ends it) and sends this process SIGINT."""
    def leave_and_interrupt():
        with open(reader) as lines:
            next(line for line in lines if line.startswith(first_line))
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=leave_and_interrupt, daemon=True)
    thread.start()
    return thread


def test_a_stdout_whose_reader_is_gone_costs_no_checkpoint(tmp_path, data_dir, test_config, monkeypatch):
    """`lm train ... | tee log`, then Ctrl-C: the SIGINT ends tee too, and the run's next progress line goes into
    a pipe nobody reads (BrokenPipeError). The run still finishes the step, saves its checkpoint and stops."""
    test_config.train.update(num_steps=100_000, log_every=1, checkpoint_every=100_000)
    test_config.eval.every = 100_000
    workdir = tmp_path / "run"
    reader, writer = os.pipe()
    stdout = open(writer, "w", buffering=1)  # (closed below)
    monkeypatch.setattr(sys, "stdout", stdout)
    interrupt_after_leaving(reader, "step      5 |")
    try:
        with pytest.raises(Stopped, match="SIGINT: saved a checkpoint at step") as stopped:
            train(test_config, str(workdir), build_experiment, devices=jax.devices()[:1])
    finally:
        monkeypatch.undo()
        stdout.close()
    assert stopped.value.step >= 5
    assert finished_steps(workdir / "checkpoints") == [stopped.value.step]


@pytest.mark.slow
def test_ctrl_c_on_lm_train_into_a_pipe_saves_and_the_rerun_resumes(tmp_path, data_dir):
    """`lm train ... 2>&1 | tee log` and Ctrl-C, as the terminal sends it: SIGINT to lm train and to tee, which
    ends. The run saves a checkpoint and exits 130, saying so to nobody; the rerun resumes from that step."""
    workdir = tmp_path / "run"
    args = [sys.executable, "-m", "lm", "train", CONFIG, f"--workdir={workdir}", "--config.train.num_steps=100000",
            "--config.train.log_every=1", "--config.eval.every=100000", "--config.train.checkpoint_every=100000"]
    process = subprocess.Popen(args, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    next(line for line in process.stdout if line.startswith("step     20 |"))
    process.stdout.close()  # tee has gone
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 128 + signal.SIGINT
    (saved,) = finished_steps(workdir / "checkpoints")
    assert 20 <= saved < 100000
    rerun = [*args[:6], f"--config.train.num_steps={saved + 2}", "--config.eval.every=100000"]  # (its workdir)
    result = subprocess.run(rerun, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"resumed from step {saved}" in result.stdout


@pytest.mark.parametrize("content, fragment", [(b"", "is empty"), (b"\xff\xfe\x00bad", "is not UTF-8 text")])
def test_empty_or_undecodable_data(tmp_path, capsys, monkeypatch, content, fragment):
    data = tmp_path / "data"
    (data / "tinyshakespeare").mkdir(parents=True)
    (data / "tinyshakespeare" / "input.txt").write_bytes(content)
    workdir = tmp_path / "run"
    monkeypatch.setenv("LM_DATA_DIR", str(data))
    result = train_in_process(capsys, workdir)
    assert_user_error(result, str(data / "tinyshakespeare" / "input.txt"), fragment)
    assert not workdir.exists() or not any(workdir.iterdir())


def test_damaged_translation_and_image_files_are_named(tmp_path, monkeypatch):
    import gzip

    from lm.data import images, translation
    from lm.errors import UserError

    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    (tmp_path / "multi30k").mkdir()
    (tmp_path / "multi30k" / "val.de.gz").write_bytes(b"not gzip at all")
    (tmp_path / "multi30k" / "val.en.gz").write_bytes(gzip.compress(b"A dog.\n"))
    with pytest.raises(UserError, match=r"val.de.gz cannot be read as gzipped UTF-8 text \(BadGzipFile"):
        translation.load_pairs("val")
    (tmp_path / "multi30k" / "val.de.gz").write_bytes(gzip.compress(b""))
    with pytest.raises(UserError, match=r"val.de.gz is empty"):
        translation.load_pairs("val")

    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "test.npz").write_bytes(b"PK\x03\x04 truncated")
    images.load_cifar10.cache_clear()
    try:
        with pytest.raises(UserError, match=r"test.npz cannot be read as a CIFAR-10 .npz"):
            images.load_cifar10("test")
    finally:
        images.load_cifar10.cache_clear()


@pytest.mark.parametrize("override, fragment", [
    ("--config.model.num_heads=3", "not divisible by model.num_heads=3"),  # a config check, before the lock
    ("--config.init_from=/nowhere/run", "init_from=/nowhere/run not found"),  # after the checkpoints folder is opened
])
def test_a_run_stopped_by_a_check_leaves_the_filesystem_as_it_was(tmp_path, data_dir, capsys, override, fragment):
    elsewhere = f"--config.train.checkpoint_dir={tmp_path / 'elsewhere' / 'checkpoints'}"
    assert_user_error(train_in_process(capsys, tmp_path / "new" / "run", override, elsewhere), fragment)
    assert not (tmp_path / "new").exists() and not (tmp_path / "elsewhere").exists()  # no folder, no parent
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    before = snapshot(existing)
    assert_user_error(train_in_process(capsys, existing, override), fragment)
    assert snapshot(existing) == before  # no checkpoints/ folder, no lock file


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_starts_one_history_again(tmp_path, data_dir, capsys, monkeypatch):
    import json

    from lm.train.checkpoint import Checkpointer

    def killed(self, step, state):
        raise RuntimeError("killed")

    workdir = tmp_path / "run"
    overrides = ("--config.train.num_steps=4", "--config.train.log_every=1", "--config.train.checkpoint_every=100")
    with monkeypatch.context() as patch:  # killed at its first save: steps 0-4 logged, no checkpoint
        patch.setattr(Checkpointer, "save", killed)
        with pytest.raises(RuntimeError, match="killed"):
            train_in_process(capsys, workdir, *overrides)
    assert not (workdir / "checkpoints").exists()
    assert train_in_process(capsys, workdir, *overrides).returncode == 0  # starts again at step 0
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps[0] == 0 and steps[-1] == 4 and steps == sorted(steps), steps  # once, not 0..4 then 0..4 again
    assert len(list((workdir / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_a_whole_file_write_that_fails_or_is_interrupted_leaves_the_old_file_and_no_partial(tmp_path):
    """lm.runs.write_file_whole (config.json, results.json, a run's .npz files): an error or a Ctrl-C in the middle
    of the write leaves the file as it was and removes the partial one; a write that ends replaces it."""
    from lm import runs

    path = tmp_path / "reference.npz"
    runs.write_arrays(path, {"a": np.arange(3)})

    def half_then(error):
        def write(partial):
            partial.write_bytes(b"half")
            raise error
        return write

    for error in (OSError(errno.ENOSPC, "full"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            runs.write_file_whole(path, half_then(error))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["reference.npz"]
        with np.load(path) as saved:
            np.testing.assert_array_equal(saved["a"], np.arange(3))
    runs.write_arrays(path, {"a": np.arange(5)})
    with np.load(path) as saved:
        np.testing.assert_array_equal(saved["a"], np.arange(5))
