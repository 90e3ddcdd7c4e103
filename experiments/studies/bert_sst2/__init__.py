"""The bert_sst2 study: its sweep files (README.md has the question, the commands and the result)."""
