"""The mutransfer study: its sweep files (README.md has the question, the commands and the result)."""
