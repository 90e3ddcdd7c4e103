"""A run folder: the files `lm train` writes there (lm/cli/resolve.py reopens a run for the inference
commands), and how a run's saved config differs from another config (the errors of a resume or an
init_from of another model name those fields)."""

import json
import pathlib
from typing import Any

import ml_collections

from lm.errors import UserError

CONFIG_FILE = "config.json"  # the resolved config
CHECKPOINTS_DIR = "checkpoints"  # where the checkpoints go unless train.checkpoint_dir says otherwise
METRICS_FILE = "metrics.jsonl"  # one JSON object per logged step: train or eval scalars
SUMMARY_FILE = "summary.json"  # the last eval metrics and run facts (parameters, compile and train time)
RESULTS_FILE = "results.json"  # the experiment's held-out results, written once training is done
DATA_CACHE_DIR = "data_cache"  # the tokenised corpus, for a resumed run (lm/data/run_cache.py)

Field = tuple[str, Any, Any]  # (dotted config key, its value in a saved run, its value in this config)


def saved_config(location: str | pathlib.Path) -> dict | None:
    """The config.json lm train wrote for the run at location (a local path): a run folder, or the run's
    checkpoints folder or one step's folder in it (where train.checkpoint_dir left them); None where there is
    none (a URL; checkpoints that train.checkpoint_dir put elsewhere)."""
    if "://" in str(location):
        return None
    place = pathlib.Path(location).expanduser().absolute()
    if (place / CONFIG_FILE).is_file():
        return json.loads((place / CONFIG_FILE).read_text())
    for workdir in place.parents[:2]:
        if (workdir / CONFIG_FILE).is_file() and place.is_relative_to(workdir / CHECKPOINTS_DIR):
            config = json.loads((workdir / CONFIG_FILE).read_text())
            if not config.get("train", {}).get("checkpoint_dir"):
                return config
    return None


def flattened(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A config's nested sections as dotted keys: {'model.moe.top_k': 2, ...}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flattened(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differing_fields(saved: dict, config: ml_collections.ConfigDict, sections: tuple[str, ...]) -> list[Field]:
    """The fields of sections (nested ones too) whose values differ between a saved config.json and config,
    compared as JSON; a field one of them lacks is left out (a run saved before the option existed)."""
    current = json.loads(config.to_json_best_effort())
    there = flattened({section: saved.get(section) or {} for section in sections})
    here = flattened({section: current.get(section) or {} for section in sections})
    return [(key, there[key], value) for key, value in here.items() if key in there and there[key] != value]


def settings(fields: list[Field], saved: bool) -> str:
    """'model.embed_dim=128, model.num_heads=4': the fields' values in the saved run, or in this config."""
    return ", ".join(f"{key}={there if saved else here}" for key, there, here in fields)


def override_flags(fields: list[Field]) -> str:
    """'--config.model.embed_dim=128 --config.model.num_heads=4': the flags that give this config the saved
    run's values."""
    return " ".join(f"--config.{key}={there}" for key, there, _ in fields)


def init_from_not_found(location: str) -> UserError:
    """The error for an init_from that names nothing."""
    return UserError(f"init_from={location} not found: give a run folder written by lm train, its "
                     f"{CHECKPOINTS_DIR} folder, or one step's folder")
