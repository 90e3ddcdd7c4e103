"""`python -m lm <command> [flags]`: the same as the `lm` command (lm/cli/__init__.py)."""

from lm.cli import main

main()
