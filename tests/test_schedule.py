"""The learning-rate schedule follows the run: warmup and decay lengths derived from train.num_steps unless
set, resolved once (lm/train/optim.py resolve_schedule) for the trainer, the dry run and config.json; a
schedule that does not end with the run is printed; a resumed run keeps the schedule its config.json records."""

import json

import jax
import ml_collections
import pytest

from lm.cli.overrides import resolve_config
from lm.cli.resolve import build_experiment
from lm.errors import UserError
from lm.train.loop import train
from lm.train.optim import learning_rate_schedule, resolve_schedule, schedule_warning
from lm.train.options import DERIVED, derived_eval_every

BABY = "configs/gpt_shakespeare.py:baby"


def resolved(overrides: dict[str, str]):
    """The baby config with command-line overrides, its schedule resolved as the trainer resolves it."""
    return resolve_schedule(resolve_config(BABY, overrides))


def test_a_shortened_run_decays_over_its_own_steps():
    """--config.train.num_steps=200: warmup and decay shrink with the run, and the learning rate reaches
    min_learning_rate at its last step (the 2000-step schedule was still at its peak there)."""
    full = resolved({}).optimizer
    assert (full.warmup_steps, full.decay_steps) == (100, 2000)  # the full run's, as before
    short = resolved({"train.num_steps": "200"}).optimizer
    assert (short.warmup_steps, short.decay_steps) == (10, 200)
    schedule = learning_rate_schedule(short)
    assert float(schedule(10)) == pytest.approx(short.learning_rate)
    assert float(schedule(199)) == pytest.approx(short.min_learning_rate, rel=1e-3)  # the last update's
    assert float(schedule(200)) == pytest.approx(short.min_learning_rate)
    assert schedule_warning(short, 200) is None


def test_explicit_lengths_are_kept_and_a_schedule_off_the_run_is_one_line():
    late = resolved({"train.num_steps": "1000", "optimizer.decay_steps": "2500"}).optimizer
    assert (late.warmup_steps, late.decay_steps) == (125, 2500)  # warmup: warmup_fraction of the decay
    last = float(learning_rate_schedule(late)(999))
    assert schedule_warning(late, 1000) == (
        f"warning: optimizer.decay_steps=2500 ends after train.num_steps=1000: the run stops at learning rate "
        f"{last:.2e}, above min_learning_rate=1.00e-04; --config.optimizer.decay_steps=1000 decays over the whole run")
    early = resolved({"optimizer.decay_steps": "500", "optimizer.warmup_steps": "0"}).optimizer
    assert (early.warmup_steps, early.decay_steps) == (0, 500)
    assert schedule_warning(early, 2000) == (
        "warning: optimizer.decay_steps=500 ends before train.num_steps=2000: the learning rate holds at "
        "min_learning_rate=1.00e-04 for the last 1500 steps; --config.optimizer.decay_steps=2000 decays over the "
        "whole run")
    warming = resolved({"train.num_steps": "200", "optimizer.warmup_steps": "300"})
    assert schedule_warning(warming.optimizer, 200).startswith(
        "warning: optimizer.warmup_steps=300 does not end by train.num_steps=200: the run stops still warming up")
    assert resolve_schedule(warming).to_dict() == warming.to_dict()  # resolving again changes nothing
    older = resolved({}).to_dict()  # the config.json of a run saved before warmup_fraction existed
    del older["optimizer"]["warmup_fraction"]
    assert resolve_schedule(ml_collections.ConfigDict(older)).to_dict() == older  # (lm sample, eval, export)


def test_the_eval_interval_follows_the_run_unless_set():
    """eval.every left at -1 is about an eighth of train.num_steps, rounded down to a readable interval: a
    120-step run evaluates every 10 steps (13 points on its val curve, not 2), the baby's 2000 steps every 250."""
    assert resolved({}).eval.every == 250
    assert resolved({"train.num_steps": "120"}).eval.every == 10
    assert resolved({"train.num_steps": "120", "eval.every": "50"}).eval.every == 50  # set: kept
    assert resolved({"train.num_steps": "120", "eval.every": "0"}).eval.every == 0  # none while training
    assert [derived_eval_every(n) for n in (0, 7, 20, 120, 600, 1000, 2500, 19073, 100_000)] == \
        [1, 1, 2, 10, 50, 100, 250, 2000, 10_000]


@pytest.mark.parametrize("override, message", [
    ({"optimizer.decay_steps": "0"}, "optimizer.decay_steps=0 is out of range: use 1 or more, or -1"),
    ({"optimizer.warmup_steps": "-2"}, "optimizer.warmup_steps=-2 is out of range: use 0 or more, or -1"),
    ({"optimizer.warmup_fraction": "1.0"}, "optimizer.warmup_fraction=1.0 is out of range: use at least 0 and below 1"),
])
def test_a_length_that_is_no_number_of_steps_is_a_user_error(override, message):
    with pytest.raises(UserError, match=message):
        resolved(override)


@pytest.mark.slow
def test_config_json_records_the_schedule_a_rerun_is_finished_and_a_resumed_run_keeps_it(
        tmp_path, data_dir, test_config, capsys):
    def learning_rates():
        records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["learning_rate"] for r in records if "learning_rate" in r}

    def saved_schedule():
        saved = json.loads((tmp_path / "config.json").read_text())
        return saved["optimizer"]["warmup_steps"], saved["optimizer"]["decay_steps"], saved["eval"]["every"]

    test_config.train.update(num_steps=10, log_every=1, checkpoint_every=10)
    test_config.eval.every = DERIVED
    device = jax.devices()[:1]
    train(test_config, str(tmp_path), build_experiment, devices=device)
    assert saved_schedule() == (1, 10, 1)  # warmup_fraction 0.1 of a decay over the run; an eval every step
    evaluated = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
                 if "eval_loss" in line]
    assert evaluated == list(range(11))
    capsys.readouterr()
    assert train(test_config, str(tmp_path), build_experiment, devices=device) == {"step": 10}
    assert "already trained to step 10 (train.num_steps=10); nothing to do" in capsys.readouterr().out

    test_config.train.num_steps = 12  # go on: the run keeps the schedule it was trained with, and says so
    train(test_config, str(tmp_path), build_experiment, devices=device)
    assert "warning: optimizer.decay_steps=10 ends before train.num_steps=12: the learning rate holds at " \
           "min_learning_rate=3.00e-04 for the last 2 steps" in capsys.readouterr().out
    assert saved_schedule() == (1, 10, 1)
    rates = learning_rates()
    assert rates[11] == rates[12] == pytest.approx(test_config.optimizer.min_learning_rate)
