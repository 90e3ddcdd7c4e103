"""The one exception type for bad user input: main prints its message on one line and exits."""


class UserError(Exception):
    """Something the user can fix (config, data, workdir, checkpoint); the message says how."""
