"""One training run per workdir: a second one stops at once with a line naming the holder; a killed
holder's lock does not block; the processes of one multi-process run do not block each other (their
shared workdir is exercised by test_multihost.py)."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from conftest import REPO, subprocess_env
from test_cli import CONFIG, assert_user_error, run

from lm.errors import UserError
from lm.train.lock import lock_path, still_named, workdir_lock


def test_a_held_lock_stops_a_second_holder_but_not_another_process_index(tmp_path):
    with workdir_lock(tmp_path, 0):
        with pytest.raises(UserError, match=f"^{tmp_path} is in use by another training run \\(host "
                                            f"{socket.gethostname()}, pid {os.getpid()}, started 20"):
            with workdir_lock(tmp_path, 0):
                pass
        with workdir_lock(tmp_path, 1):  # process 1 of the same multi-process run
            pass
    with workdir_lock(tmp_path, 0):  # released on leaving the block
        assert f"pid {os.getpid()}" in lock_path(tmp_path, 0).read_text()
    assert not any(tmp_path.iterdir())  # and the lock files removed


def test_a_lock_file_removed_after_it_was_opened_is_told_apart(tmp_path):
    """What take_lock checks after flock: a holder that ends removes the file, so a process that had
    opened it before must open the path again (else two processes would hold two different files)."""
    path = tmp_path / "lock"
    path.write_text("")
    descriptor = os.open(path, os.O_RDWR)
    try:
        assert still_named(path, descriptor)
        path.unlink()
        assert not still_named(path, descriptor)
        path.write_text("")  # a new file under the same name
        assert not still_named(path, descriptor)
    finally:
        os.close(descriptor)


def training_process(workdir) -> subprocess.Popen:
    """`lm train` on the test config for (practically) ever, one CPU device, a log line per step."""
    args = [sys.executable, "-m", "lm", "train", CONFIG, f"--workdir={workdir}", "--config.train.num_steps=100000",
            "--config.train.log_every=1", "--config.eval.every=100000", "--config.train.checkpoint_every=100000"]
    return subprocess.Popen(args, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.slow
def test_a_second_run_on_the_workdir_stops_at_once_and_the_first_goes_on(tmp_path, data_dir):
    workdir = tmp_path / "run"
    first = training_process(workdir)
    for line in first.stdout:
        if line.startswith("step      5 | loss"):
            break
    written = {p: p.stat().st_mtime_ns for p in workdir.glob("*.json")}  # config.json, tokenizer.json
    second = run("train", CONFIG, f"--workdir={workdir}", "--config.train.num_steps=3")
    assert_user_error(second, f"{workdir} is in use by another training run (host {socket.gethostname()}, "
                              f"pid {first.pid}, started ", "pass another --workdir")
    assert first.poll() is None  # still training
    assert {p: p.stat().st_mtime_ns for p in workdir.glob("*.json")} == written
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM, err[-2000:]
    saved = int(err.split("saved a checkpoint at step ")[1].split(";")[0])
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(saved + 1))  # the step-0 eval, then one line per step: the first run's alone


def test_the_lock_of_a_killed_holder_does_not_block(tmp_path):
    """A process holding the lock as `lm train` does (test above) is SIGKILLed: the next one takes it."""
    hold = "import pathlib, sys, time; from lm.train.lock import workdir_lock\n" \
           "with workdir_lock(pathlib.Path(sys.argv[1]), 0):\n    print('held', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(UserError, match=f"pid {holder.pid}, started"):
        with workdir_lock(tmp_path, 0):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert f"pid {holder.pid}" in lock_path(tmp_path, 0).read_text()  # the file stays; the lock went with it
    with workdir_lock(tmp_path, 0):
        assert f"pid {os.getpid()}" in lock_path(tmp_path, 0).read_text()
