"""The `lm` command: `lm <command> [flags]`, or `python -m lm <command> [flags]`, runs
lm/cli/<command>.py; `lm --help` lists the commands, `lm <command> --help` a command's flags. Also the
plumbing the commands share: flag parsing with bad config overrides reported on one line (exit 2)."""

import ast
import importlib
import os
import pathlib
import sys

from absl import flags

from lm.errors import EXIT_USER_ERROR, fail

COMMANDS = ("train", "sample", "eval", "export", "prepare", "sweep", "compare", "translate")  # lm/cli/<command>.py


def summary(command: str) -> str:
    """The first line of lm/cli/<command>.py's docstring, read without importing the module."""
    path = pathlib.Path(__file__).with_name(f"{command}.py")
    return ast.get_docstring(ast.parse(path.read_text())).splitlines()[0].removesuffix(".")


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary(name)}" for name in COMMANDS]
    return "\n".join(["usage: lm <command> [flags]   (lm <command> --help lists its flags)", "", "commands:", *lines])


def main(argv: list[str] | None = None) -> None:
    """Runs the command argv[1] names with the flags after it (argv: default sys.argv)."""
    argv = sys.argv if argv is None else argv
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0 if len(argv) >= 2 else EXIT_USER_ERROR)
    command = argv[1]
    if command not in COMMANDS:
        fail(f"unknown command {command!r}: use one of {', '.join(COMMANDS)} (lm --help says what each does)")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m lm` does: configs and experiments of the folder run in
    sys.argv = [f"lm {command}", *argv[2:]]
    importlib.import_module(f"lm.cli.{command}").run()


def define_string_once(name: str, help_text: str, required: bool = False) -> flags.FlagHolder:
    """A string flag (default None) that several CLIs have, e.g. --workdir, --out. Defined once per
    process (tests import several CLIs side by side; in a real run only one defines it, with its own
    help text)."""
    if name not in flags.FLAGS:
        flags.DEFINE_string(name, None, help_text)
        if required:
            flags.mark_flag_as_required(name)
    return flags.FlagHolder(flags.FLAGS, flags.FLAGS[name])


def define_workdir(help_text: str) -> flags.FlagHolder:
    """The required --workdir flag of a CLI."""
    return define_string_once("workdir", help_text, required=True)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with bad config overrides reported on one line instead of a traceback."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        fail(str(e))
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        # ml_collections reports unknown keys as AttributeError("'key'\nDid you mean ...").
        detail = str(e).replace("\\n", " ").replace("\\'", "'").strip("'\"")
        overrides = [a for a in argv[1:] if a.startswith("--config.")]
        fail(f"bad config override ({' '.join(overrides) or 'none'}): {detail}")
