"""`python -m lm.sample` is `python -m lm.cli.sample` (lm/cli/sample.py), kept for the commands in use."""

if __name__ == "__main__":
    from lm.cli import sample

    __doc__ = sample.__doc__  # what --help prints
    sample.run()
