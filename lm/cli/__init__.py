"""The `lm` command: `lm <command> [flags]`, or `python -m lm <command> [flags]`, runs
lm/cli/<command>.py; `lm --help` lists the commands, `lm <command> --help` a command's usage and flags.
Also the plumbing the commands share: flags defined once per process, and flag mistakes (an unknown or
malformed flag, a stray argument) reported on one line, exit code 2."""

import ast
import importlib
import os
import pathlib
import sys

from absl import flags

from lm.console import steady_streams
from lm.errors import EXIT_USER_ERROR, fail
from lm.xla_flags import set_default_flags

# lm/cli/<command>.py
COMMANDS = ("train", "sample", "eval", "export", "prepare", "sweep", "compare", "scaling", "translate")
HELP_FLAGS = ("-h", "-?", "--help", "--helpshort", "--helpfull")  # answered with the command's own help

# The flags the helpers below define belong to the command that calls them (its --help lists them).
flags.disclaim_key_flags()


def summary(command: str) -> str:
    """The first line of lm/cli/<command>.py's docstring, read without importing the module."""
    path = pathlib.Path(__file__).with_name(f"{command}.py")
    return ast.get_docstring(ast.parse(path.read_text())).splitlines()[0].removesuffix(".")


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary(name)}" for name in COMMANDS]
    return "\n".join(["usage: lm <command> [flags]   (lm <command> --help lists its flags)", "", "commands:", *lines])


def main(argv: list[str] | None = None) -> None:
    """Runs the command argv[1] names with the flags after it (argv: default sys.argv), with lm's XLA flags
    for the platform added to $XLA_FLAGS (lm.xla_flags). Output whose reader is gone (`lm eval --help | head -1`)
    is dropped, not a traceback (lm.console)."""
    steady_streams()
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
    set_default_flags()  # before any backend starts (XLA reads $XLA_FLAGS once)
    module = importlib.import_module(f"lm.cli.{command}")
    if set(HELP_FLAGS) & set(argv[2:]):
        print(command_help(module, full="--helpfull" in argv[2:]))
        sys.exit(0)
    module.run()


def command_help(module, full: bool = False) -> str:
    """A command's --help: its module docstring (the usage) and the flags it defines; full (--helpfull):
    then every flag of the process, absl's own too."""
    own = flags.FLAGS.module_help(module).strip().partition("\n")[2]  # without its "lm.cli.<command>:" heading
    text = f"{module.__doc__.strip()}\n\nflags:\n{own}"
    return f"{text}\n\nall flags:\n{flags.FLAGS.get_help()}" if full else text


def define_string_once(name: str, help_text: str, required: bool = False) -> flags.FlagHolder:
    """A string flag (default None) that several CLIs have, e.g. --workdir, --out. Defined once per
    process (tests import several CLIs side by side; in a real run only one defines it, with its own
    help text)."""
    if name not in flags.FLAGS:
        flags.DEFINE_string(name, None, help_text)
        if required:
            flags.mark_flag_as_required(name)
    return flags.FlagHolder(flags.FLAGS, flags.FLAGS[name])


def define_workdir(help_text: str, required: bool = True) -> flags.FlagHolder:
    """The --workdir flag of a CLI (required unless the command takes another source); an empty or blank value
    is a flag error too."""
    holder = define_string_once("workdir", help_text, required=required)
    flags.register_validator(holder, lambda value: value is None or bool(value.strip()),
                             "--workdir is empty: pass --workdir=DIR, a run folder")
    return holder


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, a mistake (an unknown flag: absl suggests the closest) reported on one line."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        fail(f"{e} ({argv[0]} --help lists its flags)")


def reject_arguments(argv: list[str]) -> None:
    """For a command that takes flags only: anything else on its command line (argv: what absl left of
    it, argv[0] the command) is a one-line error."""
    if len(argv) > 1:
        fail(f"unexpected arguments {' '.join(argv[1:])}: {argv[0]} takes flags only ({argv[0]} --help lists them)")
