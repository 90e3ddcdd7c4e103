"""The one exception type for bad user input, how a command reports it (one line on stderr, exit code
2), and the checks several configs share."""

import sys
from collections.abc import Callable
from typing import TypeVar

EXIT_USER_ERROR = 2
T = TypeVar("T")


class UserError(Exception):
    """Something the user can fix (config, data, workdir, checkpoint); the message says how."""


def fail(message: str) -> None:
    """'error: <message>' on one line on stderr, then exit code 2."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def run_user_errors(fn: Callable[[], T]) -> T:
    """fn(); a UserError becomes 'error: <message>' on stderr and exit code 2."""
    try:
        return fn()
    except UserError as e:
        fail(str(e))


def check_count(data, key: str, what: str) -> None:
    """A data.<key> option that keeps the first so many items (0: all) must not be negative."""
    if data[key] < 0:
        raise UserError(f"data.{key}={data[key]}: give a count of {what}, or 0 for all")
