"""Experiment configs, one file per model family, loaded by path (`--config=configs/bert.py:mini`).
Installed as a package so that a config can build on another (bert_finetune.py imports bert.py) from any
working directory."""
