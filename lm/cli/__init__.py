"""The command-line entry points (train, sample, translate, sweep, compare: `python -m lm.cli.<name>`, or
the shorter `python -m lm.main`, `lm.sample`, ...) and their shared plumbing: one-line errors, non-zero exits."""

import sys
from collections.abc import Callable

from absl import flags

from lm.errors import UserError

EXIT_USER_ERROR = 2


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


def fail(message: str) -> None:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


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


def run_user_errors(fn: Callable[[], object]) -> None:
    """Runs fn; a UserError becomes 'error: <message>' on stderr and exit code 2."""
    try:
        fn()
    except UserError as e:
        fail(str(e))
