"""Experiments: one module per task, each with build(config) -> an object the trainer runs (see
lm/train/experiment.py for what it provides) and from_workdir(config, workdir) for the inference
commands. config.experiment names one of NAMES; module(name) imports it on first use, so a command
loads only its own experiment's libraries (scipy for the BERT task metrics, sacrebleu for BLEU, ...)."""

import importlib
from types import ModuleType

NAMES = ("language_model", "translation", "image_classification", "masked_lm", "finetune")


def module(name: str) -> ModuleType:
    """experiments/<name>.py, imported (name must be one of NAMES)."""
    if name not in NAMES:
        raise KeyError(name)
    return importlib.import_module(f"experiments.{name}")
