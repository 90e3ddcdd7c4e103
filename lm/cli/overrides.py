"""Configs on the command line: loading a config spec (file:variant), checking and applying its
--config.key=value overrides exactly as lm train does (shared by lm sweep and the benchmarks), parsing
sweep axes, and listing a config's keys with their descriptions (lm train --print_config)."""

import ast
import difflib
import functools
import importlib.util
import pathlib
import re
import sys
import sysconfig
import traceback

import ml_collections
from absl import flags
from ml_collections import config_flags

from lm.errors import UserError, fail


def parse_value(text: str):
    """A command-line value as ml_collections reads an override of unknown type: a Python literal
    (1, 3e-4, True, 'a', (1, 2)), true/false as booleans, anything else a string."""
    if text in ("true", "false"):
        text = text.capitalize()
    try:
        return ast.literal_eval(text)
    except (SyntaxError, ValueError):
        return text


def format_value(value) -> str:
    """A Python value (from a sweep file) as the command-line string lm train parses back to it."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def parse_axis(text: str, flag: str = "--sweep") -> tuple[str, list[str]]:
    """'model.norm=layer,rms' -> ('model.norm', ['layer', 'rms']). Values may not contain commas. flag:
    the command-line flag the text came from, for the error messages."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"{flag}={text}: write {flag}=key=value1,value2,...")
    parsed = [v.strip() for v in values.split(",")]
    if not values.strip() or not all(parsed):
        raise UserError(f"{flag}={text}: the axis {key} needs one or more non-empty values")
    return key, parsed


def resolve_config(spec: str, overrides: dict[str, str]) -> ml_collections.ConfigDict:
    """The config `--config=spec --config.k=v ...` names, as lm train hands it to the trainer (and lm sweep
    and the benchmarks resolve it; the trainer then fills in the schedule's derived lengths,
    lm.train.optim.resolve_schedule): the file's config (load_config), each override key checked against its keys,
    then the values parsed by the ml_collections flag machinery, with the types of the config's values;
    the result is locked. Every mistake, a value outside its declared choices or range included
    (check_declared), is a one-line UserError; nothing is trained."""
    config = load_config(spec)
    for key in overrides:
        check_key(config, key, spec)
    argv = ["lm", *(f"--config.{k}={v}" for k, v in overrides.items())]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_dict("config", config, flag_values=flag_values, lock_config=True, sys_argv=argv)
    try:
        flag_values(argv)
    except (flags.Error, TypeError, ValueError) as e:
        raise UserError(_bad_value(e, config)) from e
    from lm.layers.options import check_declared  # lm.layers imports jax: not on the way to --help

    check_declared(config)
    return config


def load_config(spec: str) -> ml_collections.ConfigDict:
    """The config of spec, "path/to/file.py:variant" (get_config(variant)) or "path/to/file.py"
    (get_config()). A missing file (the closest file beside it suggested), a variant the file rejects
    (its get_config raises ValueError, the message naming the variants) or any other exception while the
    file runs (named with the line it came from) is a one-line UserError."""
    path, has_variant, variant = spec.partition(":")
    file = pathlib.Path(path)
    if not file.is_file():
        raise UserError(f"--config={spec}: there is no file {path}{_closest_file(file)}")
    try:
        loader = importlib.util.spec_from_file_location(f"lm_config_{file.stem}", file)
        module = sys.modules[loader.name] = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return module.get_config(*([variant] if has_variant else []))
    except Exception as e:
        frame = _innermost_frame(e)
        if isinstance(e, ValueError) and frame and pathlib.Path(frame.filename).resolve() == file.resolve():
            raise UserError(str(e)) from e  # the file's own get_config rejects the variant
        what = e.msg if isinstance(e, SyntaxError) else e  # (a SyntaxError's str names the line too)
        where = f" ({frame.filename}:{frame.lineno})" if frame else ""
        raise UserError(f"--config={spec}: {type(e).__name__}: {what}{where}") from e


def _closest_file(file: pathlib.Path) -> str:
    """'; did you mean <the .py file beside it with the closest name>?' ('' where none is close)."""
    if not file.parent.is_dir():
        return f" (looked from {pathlib.Path.cwd()})"
    names = [p.name for p in file.parent.glob("*.py")]
    close = difflib.get_close_matches(file.name, names, 1, 0.6)
    return f"; did you mean {file.parent / close[0]}?" if close else ""


def _innermost_frame(error: Exception) -> traceback.FrameSummary | None:
    """Where error came from in the config code: the innermost frame of its traceback outside Python
    itself and the installed packages (a SyntaxError: the line whose syntax is wrong); None if none is."""
    if isinstance(error, SyntaxError):
        return traceback.FrameSummary(error.filename, error.lineno, "<module>")
    python = ("<", sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"])
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(python)]
    return frames[-1] if frames else None


def config_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    """Every dotted key of config, sections and their keys at any depth: 'model', 'model.moe.top_k', ..."""
    keys = []
    for key, value in config.items():
        keys.append(prefix + key)
        if isinstance(value, ml_collections.ConfigDict):
            keys.extend(config_keys(value, f"{prefix}{key}."))
    return keys


def check_key(config: ml_collections.ConfigDict, key: str, spec: str) -> None:
    """A UserError for an override key that config lacks, with the closest of its keys at any depth."""
    keys = config_keys(config)
    if key not in keys:
        closest = closest_key(key, keys)
        hint = f"; did you mean {closest}?" if closest else ""
        raise UserError(f"--config.{key}: unknown config key {key}{hint} (lm train --config={spec} --print_config "
                        "lists the keys)")


def closest_key(key: str, keys: list[str]) -> str | None:
    """The key of keys most like key, by its whole name or by its last part at any depth (train.init_from ->
    init_from, model.num_layerz -> model.num_layers, optimizer.num_steps -> train.num_steps); None if
    none is close."""
    def likeness(candidate: str) -> tuple[float, float]:
        whole = difflib.SequenceMatcher(None, key, candidate).ratio()
        last = difflib.SequenceMatcher(None, key.rsplit(".", 1)[-1], candidate.rsplit(".", 1)[-1]).ratio()
        return max(whole, last - 0.05), whole

    best = max(keys, key=likeness, default=None)
    return best if best is not None and likeness(best)[0] >= 0.7 else None


def _bad_value(error: Exception, config: ml_collections.ConfigDict) -> str:
    """A bad override value as absl or ml_collections reports it ("flag --config.key=value: why"), on one
    line, with the type the key takes."""
    text = " ".join(str(error).replace("\\n", " ").split()).removeprefix("flag ")
    named = re.match(r"--config\.([\w.]+)=", text)
    value = functools.reduce(getattr, named[1].split("."), config) if named else None
    if named and not isinstance(value, ml_collections.ConfigDict):
        text += f" ({named[1]} takes {type(value).__name__} values, e.g. --config.{named[1]}={format_value(value)})"
    return text


def config_listing(config: ml_collections.ConfigDict) -> str:
    """Every key of config with a value, one a line: key, value, type, and what the key's section declared
    (lm/layers/options.py declare): its description and its allowed values."""
    from lm.layers.options import description  # lm.layers imports jax: not on the way to --help

    rows = [(key, repr(value), type(value).__name__, _explain(description(section, name)))
            for key, value, section, name in _leaves(config)]
    width = [min(max(len(row[i]) for row in rows), limit) for i, limit in enumerate((40, 24, 5))]
    return "\n".join(f"{k:<{width[0]}}  {v:<{width[1]}}  {t:<{width[2]}}  {text}" for k, v, t, text in rows)


def _leaves(config: ml_collections.ConfigDict, prefix: str = "") -> list[tuple]:
    """(dotted key, value, the section holding it, its name there) of every key of config with a value."""
    leaves = []
    for name, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            leaves.extend(_leaves(value, f"{prefix}{name}."))
        else:
            leaves.append((prefix + name, value, config, name))
    return leaves


def _explain(declared) -> str:
    """A key's description and allowed values (declared: its lm.layers.options.Description, or None)."""
    if declared is None:
        return "no description"
    choices = f" (one of {', '.join(map(str, declared.choices))})" if declared.choices else ""
    bounds = f" (range: {declared.bounds})" if declared.bounds else ""
    return declared.doc + choices + bounds


def split_config_overrides(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Separates the --config.key=value arguments (passed through to every arm) from lm sweep's flags."""
    rest, overrides = [], {}
    for arg in argv:
        if arg.startswith(("--config.", "-config.")):
            key, sep, value = arg.lstrip("-").removeprefix("config.").partition("=")
            if not sep:
                fail(f"{arg}: write config overrides as --config.key=value")
            overrides[key] = value
        else:
            rest.append(arg)
    return rest, overrides
