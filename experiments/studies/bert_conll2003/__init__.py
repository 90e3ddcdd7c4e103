"""The bert_conll2003 study: its sweep files (README.md has the question, the commands and the result)."""
