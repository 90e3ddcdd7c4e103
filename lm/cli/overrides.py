"""Config overrides as command-line strings: parsing axis and override arguments, and resolving a
config spec plus overrides exactly as lm train would (shared by lm sweep and the benchmarks)."""

import ast
import re

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


def resolve_config(spec: str, overrides: dict[str, str]):
    """The config lm train would train with `--config=spec --config.k=v ...`, parsed by the same
    ml_collections flag machinery (unknown keys and bad values are UserErrors); nothing is trained."""
    argv = ["lm", f"--config={spec}", *(f"--config.{k}={v}" for k, v in overrides.items())]
    flag_values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", flag_values=flag_values, lock_config=True, sys_argv=argv)
    try:
        flag_values(argv)
        config = holder.value
        config.get("seed")  # a config file that failed to load raises here
        return config
    except (flags.Error, OSError, AttributeError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"bad config or override ({' '.join(argv[1:])}): {_one_line(e)}") from e


def _one_line(error: Exception) -> str:
    """The gist of a config parsing error: its last line when it holds a traceback, unknown keys named."""
    lines = [line for line in str(error).replace("\\n", "\n").splitlines() if line.strip()]
    text = lines[-1] if "Traceback" in str(error) else " ".join(lines)
    text = re.sub(r"^'([^']*)'", r"\1", text.replace("\\'", "'")).strip("'\" ")
    if isinstance(error, AttributeError | KeyError):
        key, _, hint = text.replace("'", "").partition(" ")
        return f"unknown key {key}" + (f" ({hint})" if hint else "")
    return text


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
