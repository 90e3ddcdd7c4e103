"""A run folder: the files `lm train` writes there (lm/cli/resolve.py reopens a run for the inference
commands), and how a run's saved config differs from another config (the errors of a resume or an
init_from of another model name those fields)."""

import contextlib
import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import ml_collections
import numpy as np

from lm.errors import UserError

CONFIG_FILE = "config.json"  # the resolved config
CHECKPOINTS_DIR = "checkpoints"  # where the checkpoints go unless train.checkpoint_dir says otherwise
METRICS_FILE = "metrics.jsonl"  # one JSON object per logged step: train or eval scalars
SUMMARY_FILE = "summary.json"  # the last eval metrics and run facts (parameters, compile and train time)
RESULTS_FILE = "results.json"  # the experiment's held-out results, written once training is done
DATA_CACHE_DIR = "data_cache"  # the tokenised corpus, for a resumed run (lm/data/run_cache.py)
SWEEP_FILE = "sweep.json"  # in a sweep's folder (lm sweep): its config, axes, overrides and arms

Field = tuple[str, Any, Any]  # (dotted config key, its value in a saved run, its value in this config)


# What to do about a damaged config.json: it records the config the run trained with.
CONFIG_REMEDY = ("restore it from a copy, or delete it and run lm train on this folder again with the run's "
                 "--config flags (it writes the file again as it resumes)")

RESULTS_REMEDY = "delete it: the run's final evaluation writes it again (lm train on this folder resumes to it)"
SUMMARY_REMEDY = ("delete it: the run writes it again when it ends (without what earlier segments of the run "
                  "measured: compile and train times)")


@contextlib.contextmanager
def writing(path: pathlib.Path) -> Iterator[None]:
    """An OSError of the block (a full disk, a read-only or removed folder) names path: a failed write
    into an open file does not name the file (lm.train.loop.train reports it: the file, the reason, the
    checkpoint that is intact)."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e


def write_whole(path: pathlib.Path, text: str) -> None:
    """Writes text into path, whole or not at all (write_file_whole)."""
    write_file_whole(path, lambda partial: partial.write_text(text))


def write_file_whole(path: pathlib.Path, write: Callable[[pathlib.Path], Any]) -> None:
    """Makes path with write(a temporary path), whole or not at all (the temporary file renamed over path): a run
    killed meanwhile, or a failed write, leaves the old file; a write that fails or is interrupted (a full disk,
    Ctrl-C) removes its partial file too, so that it leaves the folder as it was."""
    partial = path.with_name(f"{path.name}.partial")
    try:
        with writing(path):
            write(partial)
        partial.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise


def write_arrays(path: pathlib.Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes arrays into path as an .npz file (np.savez, names as given), whole or not at all (write_file_whole)."""

    def save(partial: pathlib.Path) -> None:
        with partial.open("wb") as f:  # (np.savez would give a path without .npz one)
            np.savez(f, **arrays)

    write_file_whole(path, save)


def write_json(path: pathlib.Path, value: dict) -> None:
    """Writes value as JSON into path, whole or not at all (write_whole)."""
    write_whole(path, json.dumps(value, indent=2))


def read_json(path: pathlib.Path, remedy: str) -> dict:
    """The JSON object in a file lm wrote into a run folder; a UserError naming the file, what is wrong
    with it and remedy (what to do) when it cannot be read, is not JSON or holds no JSON object."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        raise UserError(f"{path} is damaged ({type(e).__name__}: {' '.join(str(e).split())[:120]}): {remedy}") from e
    if not isinstance(value, dict):
        raise UserError(f"{path} is damaged (it holds a JSON {type(value).__name__}, not an object): {remedy}")
    return value


def read_records(path: pathlib.Path) -> tuple[list[dict], int]:
    """The records of a metrics.jsonl (none where there is no file) and how many of its lines are damaged
    (not a JSON object with an integer step): those are skipped. A last line without its newline is one
    a run killed while writing cut short: skipped, not counted."""
    if not path.is_file():
        return [], 0
    text = path.read_bytes().decode("utf-8", errors="replace")
    records, damaged = [], 0
    for line in filter(str.strip, text.split("\n")[:-1]):  # (after the last newline: '' or a line cut short)
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        else:
            damaged += 1
    return records, damaged


def saved_config(location: str | pathlib.Path) -> dict | None:
    """The config.json lm train wrote for the run at location (a local path): a run folder, or the run's
    checkpoints folder or one step's folder in it (where train.checkpoint_dir left them); None where there is
    none (a URL; checkpoints that train.checkpoint_dir put elsewhere). A damaged one is a UserError."""
    folder = run_folder(location)
    return None if folder is None else read_json(folder / CONFIG_FILE, CONFIG_REMEDY)


def run_folder(location: str | pathlib.Path) -> pathlib.Path | None:
    """The run folder of location, as saved_config finds it (the folder holding its config.json and assets); None
    where there is none."""
    if "://" in str(location):
        return None
    place = pathlib.Path(location).expanduser().absolute()
    if (place / CONFIG_FILE).is_file():
        return place
    for workdir in place.parents[:2]:
        if (workdir / CONFIG_FILE).is_file() and place.is_relative_to(workdir / CHECKPOINTS_DIR):
            config = read_json(workdir / CONFIG_FILE, CONFIG_REMEDY)
            if not config.get("train", {}).get("checkpoint_dir"):
                return workdir
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
