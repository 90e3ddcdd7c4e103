"""The bert_sst2_curve study: its sweep files (README.md has the question, the commands and the result)."""
