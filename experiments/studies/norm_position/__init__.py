"""The norm_position study: its sweep files (README.md has the question, the commands and the result)."""
