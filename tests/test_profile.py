"""The profiler window (train.profile=START:STOP: a trace that TensorBoard and Perfetto open, its folder
printed), its one-line errors, and the device memory in the logged metrics where the backend reports it."""

import json

import jax
import jax.numpy as jnp
import pytest
from test_cli import assert_user_error, train_in_process

from lm.errors import UserError
from lm.train import loop
from lm.train.metrics import device_memory, memory_text
from lm.train.profile import PERFETTO_FILE, ProfileWindow, profile_window


class FakeDevice:
    """A device whose memory_stats() is the given dict (or None, as a CPU's)."""

    def __init__(self, stats: dict | None):
        self.stats = stats

    def memory_stats(self) -> dict | None:
        return self.stats


@pytest.mark.slow
def test_a_profile_window_writes_a_trace_for_tensorboard_and_perfetto_and_prints_its_folder(tmp_path, data_dir,
                                                                                             capsys, monkeypatch):
    """The test config's 20 steps (its programs are the ones other tests compile: the suite's compilation
    cache holds them) with train.profile=2:4: steps 3 and 4 traced into workdir/profile/process_0 (the
    xplane.pb TensorBoard's profile plugin reads, the Perfetto json.gz, both non-empty), the printed line
    naming the folder and the Perfetto file; device memory reported by (fake) devices is logged and printed
    with the metrics."""
    def fake_memory(devices):
        return device_memory([FakeDevice({"bytes_in_use": 3 << 20, "peak_bytes_in_use": 5 << 20})] * len(devices))

    monkeypatch.setattr(loop, "device_memory", fake_memory)
    workdir = tmp_path / "run"
    result = train_in_process(capsys, workdir, "--config.train.profile=2:4", "--config.train.checkpoint_every=20",
                              "--config.sample.max_new_tokens=0")
    assert result.returncode == 0, result.stderr[-2000:]
    folder = workdir / "profile" / "process_0"
    [perfetto] = folder.glob(f"plugins/profile/*/{PERFETTO_FILE}")
    [xplane] = folder.glob("plugins/profile/*/*.xplane.pb")
    assert perfetto.stat().st_size > 0 and xplane.stat().st_size > 0
    lines = [line for line in result.stdout.splitlines() if line.startswith("profile of")]
    assert lines == [f"profile of steps 3 to 4: {folder} (tensorboard --logdir {folder.parent}; Perfetto: open "
                     f"{perfetto} at ui.perfetto.dev)"]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "loss" in r]
    assert [r["step"] for r in logged] == [5, 10, 15, 20]
    assert all((r["memory_in_use_bytes"], r["memory_peak_bytes"]) == (3 << 20, 5 << 20) for r in logged)
    assert "| memory 3.0 MiB (peak 5.0 MiB) |" in result.stdout


@pytest.mark.parametrize("window, message", [
    ("2-4", "train.profile='2-4': write START:STOP, two step numbers"),
    ("a:b", "train.profile='a:b': write START:STOP"),
    ("2.5:4", "train.profile='2.5:4': write START:STOP"),
    ("4:2", "train.profile='4:2': START must be below STOP"),
    ("3:3", "train.profile='3:3': START must be below STOP"),
    ("-1:3", "train.profile='-1:3' lies outside the run's steps 0 to 20 (train.num_steps): use 0 <= START < STOP "
             "<= 20"),
    ("10:21", "train.profile='10:21' lies outside the run's steps 0 to 20"),
])
def test_a_bad_profile_window_is_one_line_and_writes_nothing(tmp_path, data_dir, capsys, window, message):
    workdir = tmp_path / "run"
    result = train_in_process(capsys, workdir, "--config.train.num_steps=20", f"--config.train.profile={window}")
    assert_user_error(result, message)
    assert not workdir.exists()


def test_the_window_parses_and_empty_is_off():
    assert profile_window("", 10) is None
    assert profile_window("0:10", 10) == (0, 10)
    assert profile_window(" 2 : 4 ", 10) == (2, 4)
    with pytest.raises(UserError, match="START must be below STOP"):
        profile_window("5:1", 10)


def trace_dispatches(window, dispatches, tmp_path, start_step=0):
    """Drives a ProfileWindow as the loop does over dispatches of the given step counts from start_step."""
    step, state = start_step, jnp.zeros(())
    with ProfileWindow(window, tmp_path / "profile", start_step) as profile:
        for count in dispatches:
            profile.before(step, count, state)
            state = state + count
            step += count
            profile.after(step, state)


def test_with_several_steps_per_dispatch_the_window_widens_to_whole_dispatches(tmp_path, capsys):
    trace_dispatches((2, 4), [3, 3, 3], tmp_path)
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("profile of")]
    assert line.startswith(f"profile of steps 1 to 6: {tmp_path / 'profile'} ")


def test_a_run_stopped_inside_the_window_still_writes_its_trace(tmp_path, capsys):
    with pytest.raises(KeyboardInterrupt):
        with ProfileWindow((2, 8), tmp_path / "profile", 0) as profile:
            for step in range(4):
                profile.before(step, 1, jnp.zeros(()))
                profile.after(step + 1, jnp.zeros(()))
            raise KeyboardInterrupt
    assert "profile of steps 3 to 4 (the run stopped inside the window): " in capsys.readouterr().out
    assert list((tmp_path / "profile").glob(f"plugins/profile/*/{PERFETTO_FILE}"))
    jax.profiler.start_trace(tmp_path / "again")  # the trace was stopped: a new one can start
    jax.profiler.stop_trace()


def test_a_run_resumed_after_the_window_says_so_and_traces_nothing(tmp_path, capsys):
    trace_dispatches((2, 4), [1, 1], tmp_path, start_step=5)
    assert capsys.readouterr().out == "train.profile=2:4: this run resumes at step 5, after the window: no trace\n"
    assert not (tmp_path / "profile").exists()


def test_a_run_resumed_inside_the_window_traces_the_rest_of_it(tmp_path, capsys):
    trace_dispatches((2, 6), [1, 1, 1, 1], tmp_path, start_step=3)
    assert f"profile of steps 4 to 6: {tmp_path / 'profile'} " in capsys.readouterr().out


def test_device_memory_is_the_largest_over_the_devices_and_nothing_where_none_is_reported():
    reported = [FakeDevice({"bytes_in_use": 10, "peak_bytes_in_use": 40, "bytes_limit": 99}),
                FakeDevice({"bytes_in_use": 30, "peak_bytes_in_use": 35})]
    assert device_memory(reported) == {"memory_in_use_bytes": 30.0, "memory_peak_bytes": 40.0}
    assert device_memory([FakeDevice(None), FakeDevice(None)]) == {}  # a CPU
    assert device_memory([FakeDevice({"bytes_in_use": 10})]) == {"memory_in_use_bytes": 10.0}
    assert device_memory(jax.devices()[:1]) == {}  # this CPU backend's memory_stats() is None
    assert memory_text({"loss": 1.0}) == ""
    assert memory_text(device_memory(reported)) == "memory 30 B (peak 40 B) | "
