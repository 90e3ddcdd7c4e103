"""A run folder: the files lm.main writes there, and reopening a run for inference (lm.sample, lm.translate)."""

import json
import pathlib

import ml_collections

from lm.errors import UserError

# The files lm.main writes into a run folder.
CONFIG_FILE = "config.json"  # the resolved config
METRICS_FILE = "metrics.jsonl"  # one JSON object per logged step: train or eval scalars
SUMMARY_FILE = "summary.json"  # the last eval metrics and run facts (parameters, compile and train time)
RESULTS_FILE = "results.json"  # the experiment's held-out results, written once training is done


def load_run(workdir: pathlib.Path, experiment: str):
    """(experiment, params) from a run folder written by lm.main: its saved config, the assets
    (tokenizers) the experiment's from_workdir reads, and the latest checkpoint's params."""
    from lm.train.setup import restore_params

    config_path = workdir / CONFIG_FILE
    if not config_path.is_file():
        raise UserError(f"{config_path} not found: --workdir must be a folder written by lm.main")
    config = ml_collections.ConfigDict(json.loads(config_path.read_text()))
    if config.experiment != experiment:
        raise UserError(f"{workdir} holds a {config.experiment!r} run, not a {experiment!r} one")
    import experiments

    loaded = experiments.module(experiment).from_workdir(config, workdir)
    return loaded, restore_params(config, loaded, workdir)
