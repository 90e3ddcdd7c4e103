"""Crash safety, the short version of benchmarks/crash_resume.py (20 kills there): SIGKILL the trainer
at random moments while it trains and saves a checkpoint every 2 steps, resume each time; every
finished checkpoint restores, and the losses and final parameters equal an uninterrupted run's."""

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from crash_resume import crash_trial  # noqa: E402


def test_sigkill_at_random_moments_loses_nothing(tmp_path, data_dir, monkeypatch):
    monkeypatch.delenv("XLA_FLAGS")  # the trainer processes get one CPU device, as a user has
    outcome = crash_trial("configs/gpt_shakespeare.py:test", tmp_path, kills=2, steps=40, checkpoint_every=2,
                          window=0.4, seed=1)
    assert len(outcome["kills"]) == 2
    assert any(line.startswith("step ") for _, line, _, _ in outcome["kills"])  # killed while training
    assert outcome["restore_failures"] == []
    assert outcome["losses_equal"] and outcome["params_equal"]
