"""Crash safety, the short version of benchmarks/crash_resume.py (20 kills there): SIGKILL the trainer
at random moments while it trains and saves a checkpoint every 2 steps, resume each time; every
finished checkpoint restores, and the losses and final parameters equal an uninterrupted run's. The run
trains on jsonl documents packed by document (a data.source), so the batch after each resume is also the
uninterrupted run's, byte for byte (or a loss would differ)."""

import subprocess
import sys

import pytest
from conftest import REPO, packed_source_overrides, subprocess_env


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing(tmp_path, data_dir):
    overrides = packed_source_overrides(data_dir, tmp_path)
    env = subprocess_env()  # one CPU device, as a user has
    result = subprocess.run(
        [sys.executable, "benchmarks/crash_resume.py", "--kills=1", "--steps=24", "--checkpoint_every=2",
         "--window=0.4", "--seed=1", f"--workdir={tmp_path}", "--config=configs/gpt2.py:test",
         *(f"--set={key}={value}" for key, value in overrides.items())],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = result.stdout
    assert report.count("\nkill ") + report.startswith("kill ") == 1
    assert "kills after a train step was logged     1 of 1" in report
    assert "checkpoints that failed to restore       0 []" in report
    assert "losses equal the uninterrupted run's     True" in report
    assert "final params equal (bit for bit)         True" in report
