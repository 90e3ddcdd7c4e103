"""What an experiment's build() derives from its data, kept in the run's workdir so that a resumed run
reads it back instead of deriving it again:

  saved_or_fitted  the tokenizer: the one an earlier run of the workdir saved there (its config.json has
                   the same experiment and data options, so fitting again would give it, and its
                   checkpoints were trained with it), else a freshly fitted one
  cached           the tokenised corpus: <workdir>/data_cache/<name>-<key>.pkl, the key a digest of all it
                   is made from (config.data, the tokenizer, ...), so that a changed data option or
                   tokenizer misses the cache and replaces the entry

build(config, workdir=None) without a workdir (tests, benchmarks, the dry run) fits and tokenises every
time. The cache files are pickles that this code wrote into the run's own folder, read back only from there.
"""

import hashlib
import json
import os
import pathlib
import pickle
import tempfile
from collections.abc import Callable
from typing import TypeVar

import ml_collections

from lm.distributed import is_primary
from lm.runs import CONFIG_FILE, DATA_CACHE_DIR

T = TypeVar("T")


def same_data(workdir: pathlib.Path | None, config: ml_collections.ConfigDict) -> bool:
    """Whether workdir holds an earlier run of config.experiment with the same data options (its
    config.json's data section equals config.data)."""
    path = pathlib.Path(workdir) / CONFIG_FILE if workdir else None
    if path is None or not path.is_file():
        return False
    saved = json.loads(path.read_text())
    return (saved.get("experiment") == config.experiment
            and saved.get("data") == json.loads(config.data.to_json_best_effort()))


def saved_or_fitted(workdir: pathlib.Path | None, config: ml_collections.ConfigDict, saved: str,
                    load: Callable[[pathlib.Path], T], fit: Callable[[], T]) -> T:
    """load(workdir / saved), the tokenizer an earlier run of workdir saved there, if that run had
    config's data options (same_data); else fit()."""
    path = pathlib.Path(workdir) / saved if workdir else None
    if path is not None and path.exists() and same_data(workdir, config):
        print(f"tokenizer: {path}, saved by the earlier run of this workdir (the same data options)")
        return load(path)
    return fit()


def digest(*parts) -> str:
    """A short hex digest of parts: bytes, or values json writes (a ConfigDict: its dict)."""
    hasher = hashlib.sha256()
    for part in parts:
        if isinstance(part, ml_collections.ConfigDict):
            part = part.to_dict()
        data = part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=repr).encode()
        hasher.update(len(data).to_bytes(8, "little") + data)
    return hasher.hexdigest()[:16]


def saved_digest(save: Callable[[pathlib.Path], None]) -> str:
    """The digest of the files save(folder) writes into an empty folder: a tokenizer's identity, whatever
    its kind (e.g. saved_digest(tokenizer.save))."""
    with tempfile.TemporaryDirectory() as folder:
        save(pathlib.Path(folder))
        files = sorted(path for path in pathlib.Path(folder).rglob("*") if path.is_file())
        return digest(*[part for path in files for part in (str(path.relative_to(folder)), path.read_bytes())])


def cached(workdir: pathlib.Path | None, name: str, key: str, make: Callable[[], T]) -> T:
    """make(), or what it returned to an earlier build in workdir with the same key (a digest of all it
    depends on). Kept in <workdir>/data_cache/<name>-<key>.pkl, written by process 0, which deletes the
    entries of other keys; every process reads it. Without a workdir: make()."""
    if not workdir:
        return make()
    folder = pathlib.Path(workdir) / DATA_CACHE_DIR
    path = folder / f"{name}-{key}.pkl"
    if path.is_file():
        print(f"{name}: {path}, cached by an earlier run of this workdir")
        with path.open("rb") as f:
            return pickle.load(f)
    value = make()
    if is_primary():
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(f"{name}-*.pkl"):
            stale.unlink()
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        with partial.open("wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        partial.replace(path)  # whole or not at all, for a run stopped while writing
    return value
