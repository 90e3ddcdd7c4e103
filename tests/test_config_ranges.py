"""Every number a config holds has a declared range, and every enumerated key its choices (lm/layers/options.py
`option(..., bounds=...)`); a value outside them, NaN and infinities included, is one line naming the key, its
value and its range, before anything is written: from the command line (resolve_config) and from a config
handed to the trainer directly (lm.train.loop.train checks it as it resolves the schedule)."""

import math

import jax
import pytest
from conftest import REPO
from test_cli import SPEC, assert_user_error, exit_code_and_output, train_in_process

from lm.cli.overrides import _leaves, resolve_config
from lm.cli.resolve import build_experiment
from lm.errors import UserError, run_user_errors
from lm.layers.options import check_declared, description, has_type
from lm.train.loop import train
from lm.train.optim import resolve_schedule

CONFIG_FILES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "configs").glob("*.py")
                      if p.name not in ("__init__.py", "base.py"))

BAD_VALUES = [  # key, a value outside its range, the range the message gives
    ("train.keep_checkpoints", 0, "1 or more"),
    ("train.log_every", 0, "1 or more"),
    ("train.checkpoint_every", 0, "1 or more"),
    ("train.batch_size", 0, "1 or more"),
    ("train.grad_accum_steps", 0, "1 or more"),
    ("train.num_steps", -5, "0 or more"),
    ("optimizer.learning_rate", math.nan, "0 or more"),
    ("optimizer.learning_rate", -1e-3, "0 or more"),
    ("optimizer.min_learning_rate", math.inf, "0 or more"),
    ("optimizer.b2", 1.0, "at least 0 and below 1"),
    ("optimizer.grad_clip_norm", 0.0, "more than 0"),
    ("model.dropout", 1.5, "at least 0 and below 1"),
    ("model.num_layers", 0, "1 or more"),
    ("model.moe.capacity_factor", -math.inf, "more than 0"),
    ("data.train_fraction", 1.5, "from 0 to 1"),
    ("eval.every", -2, "0 or more, or -1"),
    ("mesh.fsdp", 0, "1 or more, or -1"),
    ("sample.temperature", math.nan, "0 or more"),
]


@pytest.mark.parametrize("key, value, bounds", BAD_VALUES)
def test_a_value_out_of_range_on_the_command_line_is_one_line_and_writes_nothing(tmp_path, capsys, key, value,
                                                                                  bounds):
    workdir = tmp_path / "run"
    result = train_in_process(capsys, workdir, f"--config.{key}={value}")
    assert result.stderr.strip() == f"error: {key}={value!r} is out of range: use {bounds}"
    assert_user_error(result)
    assert not workdir.exists()


@pytest.mark.parametrize("key, value, bounds", BAD_VALUES)
def test_a_value_out_of_range_in_a_config_given_to_train_is_one_line_and_writes_nothing(tmp_path, capsys, key,
                                                                                       value, bounds):
    config = resolve_config(SPEC, {})
    section, name = key.rsplit(".", 1)
    config[section][name] = value
    workdir = tmp_path / "run"
    result = exit_code_and_output(capsys, lambda: run_user_errors(
        lambda: train(config, str(workdir), build_experiment, jax.devices()[:1])))
    assert result.stderr.strip() == f"error: {key}={value!r} is out of range: use {bounds}"
    assert not workdir.exists()


def test_a_value_outside_its_choices_is_one_line_and_writes_nothing(tmp_path, capsys):
    workdir = tmp_path / "run"
    result = train_in_process(capsys, workdir, "--config.train.on_nonfinite=ignore")
    assert_user_error(result, "train.on_nonfinite='ignore': use one of ('stop', 'skip')")
    assert not workdir.exists()


def test_the_ranges_survive_the_schedules_copy():
    """resolve_schedule returns a copy of the config (build() resolves it again): the copy keeps the ranges."""
    resolved = resolve_schedule(resolve_config(SPEC, {}))
    resolved.train.keep_checkpoints = 0
    with pytest.raises(UserError, match=r"^train.keep_checkpoints=0 is out of range: use 1 or more$"):
        check_declared(resolved)


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_every_number_of_each_config_file_has_a_declared_range(path):
    """The default variant of every built-in config file: its values lie in their ranges (resolve_config
    checks them), and each declared key holding a number has a range (or choices)."""
    config = resolve_config(path, {})
    unbounded = [key for key, value, section, name in _leaves(config)
                 if has_type(value, float) and (declared := description(section, name))
                 and declared.bounds is None and declared.choices is None]
    assert unbounded == []
