"""The config on the command line: `lm train --print_config` lists every key with its value, type, allowed
values and description (declared where each section is built, lm/layers/options.py `declare`); every
command's --help lists its flags and exits 0; a mistake in the config file, its path, its variant, an
override key (the closest key at any depth suggested) or a flag is one line, exit code 2, and nothing is
written."""

import re

import pytest
from conftest import REPO
from test_cli import assert_user_error, main_in_process, run

from lm.cli import COMMANDS, summary
from lm.cli import train as train_cli
from lm.cli.overrides import closest_key, config_keys, config_listing, load_config, resolve_config

SPEC = "configs/gpt_shakespeare.py:test"
CONFIG_FILES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "configs").glob("*.py")
                      if p.name not in ("__init__.py", "base.py"))


def listing(spec: str, overrides: dict[str, str] | None = None) -> dict[str, list[str]]:
    """--print_config's lines of spec with overrides, by key: [key, value, type, description]."""
    lines = config_listing(resolve_config(spec, overrides or {})).splitlines()
    return {line.split()[0]: line.split(None, 3) for line in lines}


def test_print_config_lists_value_type_choices_and_description():
    keys = listing(SPEC, {"model.norm": "rms", "optimizer.learning_rate": "0.01"})
    assert keys["model.norm"] == ["model.norm", "'rms'", "str",
                                  "LayerNorm or RMSNorm (lm/layers/norms.py) (one of layer, rms)"]
    assert keys["model.compute_dtype"][1:3] == ["'float32'", "str"]
    assert keys["model.compute_dtype"][3].endswith("(one of float32, bfloat16)")
    assert keys["model.moe.top_k"] == ["model.moe.top_k", "2", "int",
                                       "experts per token: 1 (Switch) or 2 (GShard) (range: 1 or more)"]
    assert keys["optimizer.learning_rate"] == ["optimizer.learning_rate", "0.01", "float",
                                               "the peak learning rate, reached at the end of warmup "
                                               "(range: 0 or more)"]
    assert keys["model.dropout"][3].endswith("(range: at least 0 and below 1)")
    assert keys["mesh.data"][3].endswith("(range: 1 or more, or -1)")
    assert keys["train.on_nonfinite"][3].endswith("(one of stop, skip)")
    assert keys["mesh.data"][1:3] == ["-1", "int"] and keys["data.context_length"][1] == "16"


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_every_key_of_each_config_file_has_a_description(path):
    """The default variant of every built-in config file: each key that holds a value is described."""
    lines = config_listing(load_config(path)).splitlines()
    assert len(lines) > 40
    assert [line.split()[0] for line in lines if line.endswith("  no description")] == []


def test_a_key_nobody_declared_is_listed_without_a_description():
    config = load_config(SPEC)
    config.extra = 3
    extra = [line.split() for line in config_listing(config).splitlines() if line.startswith("extra ")]
    assert extra == [["extra", "3", "int", "no", "description"]]


def test_print_config_runs_as_a_command_and_trains_nothing():
    """The real command (no --workdir needed): exit 0, the keys with the overrides applied, no step."""
    result = run("train", f"--config={SPEC}", "--print_config", "--config.model.norm=rms")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^model\.norm +'rms' +str +LayerNorm or RMSNorm", result.stdout, re.M), result.stdout
    assert not re.search(r"^step +\d", result.stdout, re.M) and result.stderr == ""


def declared_flags(command: str) -> set[str]:
    """The flags lm/cli/<command>.py defines, read from its source."""
    source = (REPO / f"lm/cli/{command}.py").read_text()
    names = set(re.findall(r"(?:DEFINE_\w+|define_string_once)\(\s*\"(\w+)\"", source))
    return names | ({"workdir"} if "define_workdir(" in source else set())


def test_every_command_help_lists_its_flags():
    for command in COMMANDS:
        result = run(command, "--help")
        assert result.returncode == 0, (command, result.stderr)
        assert result.stdout.startswith(summary(command)), result.stdout[:200]  # the usage, then the flags
        listed = set(re.findall(r"^  --(?:\[no\])?(\w+)", result.stdout, re.M))
        assert declared_flags(command) and listed == declared_flags(command), (command, result.stdout)


def test_override_keys_are_suggested_across_depths():
    keys = config_keys(load_config(SPEC))
    assert {"init_from", "model", "model.moe", "model.moe.top_k", "train.num_steps"} <= set(keys)
    assert closest_key("train.init_from", keys) == "init_from"  # a top-level key under a section
    assert closest_key("model.num_layerz", keys) == "model.num_layers"
    assert closest_key("optimizer.num_steps", keys) == "train.num_steps"
    assert closest_key("model.moe.topk", keys) == "model.moe.top_k"
    assert closest_key("completely_else", keys) is None


BUGGY_CONFIG = '''
def get_config(variant="a"):
    return undefined_name
'''


@pytest.mark.parametrize("args, fragment", [
    ([f"--config={SPEC.replace(':test', ':huge')}"],
     "error: unknown variant 'huge' of configs/gpt_shakespeare.py: use baby, small or test"),
    (["--config=configs/gpt_shakespere.py:baby"],
     "there is no file configs/gpt_shakespere.py; did you mean configs/gpt_shakespeare.py?"),
    (["--config=configs/bert_finetune.py:sst3"], "unknown variant 'sst3' of configs/bert_finetune.py: use TASK"),
    ([f"--config={SPEC}", "--config.train.init_from=runs/x"],
     "--config.train.init_from: unknown config key train.init_from; did you mean init_from?"),
    ([f"--config={SPEC}", "--config.model.num_layerz=3"], "unknown config key model.num_layerz; did you mean "
                                                          "model.num_layers?"),
    ([f"--config={SPEC}", "--config.model.num_layers=abc"], "model.num_layers takes int values, e.g. "
                                                            "--config.model.num_layers=2"),
    ([f"--config={SPEC}", "--config.model.norm"], "--config.model.norm: write config overrides as --config.key=value"),
    ([f"--config={SPEC}", "--workdri=x"], "Unknown command line flag 'workdri'. Did you mean: workdir ?"),
    ([f"--config={SPEC}", "again"], "unexpected arguments again: lm.cli.train takes flags only"),
    (["--config.model.norm=rms"], "pass --config=FILE:VARIANT"),
])
def test_a_mistake_is_one_line_before_anything_is_written(tmp_path, capsys, args, fragment):
    workdir = tmp_path / "run"
    result = main_in_process(capsys, train_cli, *args, f"--workdir={workdir}", parse_flags=train_cli.parse_train_flags)
    assert_user_error(result, fragment)
    assert not workdir.exists()


def test_a_mistake_in_the_config_file_is_one_line_naming_its_line(tmp_path, capsys):
    path = tmp_path / "buggy.py"
    path.write_text(BUGGY_CONFIG)
    workdir = tmp_path / "run"
    result = main_in_process(capsys, train_cli, f"--config={path}:a", f"--workdir={workdir}",
                             parse_flags=train_cli.parse_train_flags)
    assert_user_error(result, f"--config={path}:a: NameError: name 'undefined_name' is not defined ({path}:3)")
    assert not workdir.exists()
