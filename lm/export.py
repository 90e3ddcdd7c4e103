"""`python -m lm.export` is `python -m lm.cli.export` (lm/cli/export.py), as lm.main and lm.sample are."""

if __name__ == "__main__":
    from lm.cli import export

    __doc__ = export.__doc__  # what --help prints
    export.run()
