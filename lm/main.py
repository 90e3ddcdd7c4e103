"""`python -m lm.main` is `python -m lm.cli.train` (lm/cli/train.py), kept for the commands in use."""

if __name__ == "__main__":
    from lm.cli import train

    __doc__ = train.__doc__  # what --help prints
    train.run()
