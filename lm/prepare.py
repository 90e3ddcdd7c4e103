"""`python -m lm.prepare` is `python -m lm.cli.prepare` (lm/cli/prepare.py), like the other commands' short names."""

if __name__ == "__main__":
    from lm.cli import prepare

    __doc__ = prepare.__doc__  # what --help prints
    prepare.run()
