"""The one exception type for bad user input (main prints its message on one line and exits), and the checks
several configs share."""


class UserError(Exception):
    """Something the user can fix (config, data, workdir, checkpoint); the message says how."""


def check_count(data, key: str, what: str) -> None:
    """A data.<key> option that keeps the first so many items (0: all) must not be negative."""
    if data[key] < 0:
        raise UserError(f"data.{key}={data[key]}: give a count of {what}, or 0 for all")
