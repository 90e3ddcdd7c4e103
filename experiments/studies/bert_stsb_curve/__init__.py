"""The bert_stsb_curve study: its sweep files (README.md has the question, the commands and the result)."""
