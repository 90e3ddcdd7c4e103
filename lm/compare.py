"""`python -m lm.compare` is `python -m lm.cli.compare` (lm/cli/compare.py), kept for the commands in use."""

if __name__ == "__main__":
    from lm.cli import compare

    __doc__ = compare.__doc__  # what --help prints
    compare.run()
