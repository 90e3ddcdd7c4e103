"""`python -m lm.translate` is `python -m lm.cli.translate` (lm/cli/translate.py), kept for the commands in use."""

if __name__ == "__main__":
    from lm.cli import translate

    __doc__ = translate.__doc__  # what --help prints
    translate.run()
