"""The bert_conll2003_curve study: its sweep files (README.md has the question, the commands and the result)."""
