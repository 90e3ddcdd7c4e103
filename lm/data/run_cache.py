"""What an experiment's build() derives from its data, kept in the run's workdir so that a resumed run
reads it back instead of deriving it again:

  saved_or_fitted  the tokenizer: the one an earlier run of the workdir saved there (its config.json has
                   the same experiment and data options, so fitting again would give it, and its
                   checkpoints were trained with it), else a freshly fitted one
  DataCache        the tokenised corpus: <workdir>/data_cache/<name>-<key>.pkl, the key a digest of all it
                   is made from (config.data, the tokenizer, ...), so that a changed data option or
                   tokenizer misses the cache and replaces the entry (written once the run's checks pass)

build(config, workdir=None) without a workdir (tests, benchmarks, the dry run) fits and tokenises every
time. The cache files are pickles that this code wrote into the run's own folder, read back only from there.
"""

import hashlib
import json
import os
import pathlib
import pickle
import sys
import tempfile
from collections.abc import Callable
from typing import TypeVar

import ml_collections

from lm.distributed import is_primary
from lm.errors import UserError
from lm.runs import CONFIG_FILE, CONFIG_REMEDY, DATA_CACHE_DIR, read_json, writing

T = TypeVar("T")


def same_data(workdir: pathlib.Path | None, config: ml_collections.ConfigDict) -> bool:
    """Whether workdir holds an earlier run of config.experiment with the same data options (its
    config.json's data section equals config.data)."""
    path = pathlib.Path(workdir) / CONFIG_FILE if workdir else None
    if path is None or not path.is_file():
        return False
    saved = read_json(path, CONFIG_REMEDY)
    return (saved.get("experiment") == config.experiment
            and saved.get("data") == json.loads(config.data.to_json_best_effort()))


def saved_or_fitted(workdir: pathlib.Path | None, config: ml_collections.ConfigDict, saved: str,
                    load: Callable[[pathlib.Path], T], fit: Callable[[], T]) -> T:
    """load(workdir / saved), the tokenizer an earlier run of workdir saved there, if that run had
    config's data options (same_data); else fit(). A saved one that cannot be loaded is a UserError
    (load_saved): the run's checkpoints were trained with it."""
    path = pathlib.Path(workdir) / saved if workdir else None
    if path is not None and path.exists() and same_data(workdir, config):
        print(f"tokenizer: {path}, saved by the earlier run of this workdir (the same data options)")
        return load_saved(path, load, "restore it from a copy, or delete it to fit the tokenizer again from "
                                      "the data (the same data options give the same one)")
    return fit()


def load_saved(path: pathlib.Path, load: Callable[[pathlib.Path], T],
               remedy: str = "restore it from a copy (lm train saved it there)") -> T:
    """load(path) of a file or folder lm train saved into a run folder (a tokenizer); a UserError naming
    it, why it cannot be loaded and remedy (what to do) when it is damaged or missing."""
    try:
        return load(path)
    except Exception as e:  # noqa: BLE001 (each tokenizer library raises its own kinds for a damaged file)
        reason = " ".join(str(e).split())[:120]
        raise UserError(f"{path} is damaged or missing ({type(e).__name__}: {reason}): {remedy}") from e


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


class DataCache:
    """What build() derives from the data (token ids, pairs, encoded splits), by name, each with a key (a
    digest of all it is made from): read from <workdir>/data_cache/<name>-<key>.pkl when an earlier run of
    the workdir wrote it, made otherwise. save(workdir) writes what was made; the trainer calls it (through
    Experiment.save_assets) once every check has passed, so that a run a check stops leaves the workdir as
    it was. Without a workdir everything is made."""

    def __init__(self, workdir: pathlib.Path | None):
        self.folder = pathlib.Path(workdir) / DATA_CACHE_DIR if workdir else None
        self.made: dict[str, tuple[str, object]] = {}  # name -> (key, value) of what get() made

    def get(self, name: str, key: str, make: Callable[[], T]) -> T:
        """The cached value of name under key, else make() (kept for save)."""
        path = self.folder / f"{name}-{key}.pkl" if self.folder else None
        if path is not None and path.is_file():
            try:
                with path.open("rb") as f:
                    value = pickle.load(f)
                print(f"{name}: {path}, cached by an earlier run of this workdir")
                return value
            except Exception as e:  # noqa: BLE001 (a damaged pickle raises many kinds)
                print(f"warning: {path} is damaged ({type(e).__name__}); making {name} again", file=sys.stderr)
        value = make()
        self.made[name] = (key, value)
        return value

    def save(self, workdir: pathlib.Path) -> None:
        """Writes what get() made into <workdir>/data_cache (process 0 only), each entry replacing its
        name's entries of other keys; whole files or none, for a run stopped while writing (a write that
        fails, on a full disk say, removes its partial file and raises an OSError naming the entry)."""
        if is_primary():
            folder = pathlib.Path(workdir) / DATA_CACHE_DIR
            for name, (key, value) in self.made.items():
                folder.mkdir(parents=True, exist_ok=True)
                for stale in folder.glob(f"{name}-*.pkl"):
                    stale.unlink()
                path = folder / f"{name}-{key}.pkl"
                partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
                try:
                    with writing(path), partial.open("wb") as f:
                        pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
                except BaseException:
                    partial.unlink(missing_ok=True)
                    raise
                partial.replace(path)
        self.made = {}
