"""`python -m lm.sweep` is `python -m lm.cli.sweep` (lm/cli/sweep.py), kept for the commands in use."""

if __name__ == "__main__":
    from lm.cli import sweep

    __doc__ = sweep.__doc__  # what --help prints
    sweep.run()
