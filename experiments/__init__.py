"""Experiments: one module per task, each with build(config) -> an object the trainer runs
(see lm/train/experiment.py for what it provides)."""
