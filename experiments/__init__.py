"""Experiments: one module per task, each with build(config) -> an object the trainer runs (see
lm/train/experiment.py for what it provides) and from_workdir(config, workdir) for the inference
commands. config.experiment names one of MODULES."""

from experiments import image_classification, language_model, masked_lm, translation

MODULES = {
    "language_model": language_model,
    "translation": translation,
    "image_classification": image_classification,
    "masked_lm": masked_lm,
}
