"""Finding data files: $LM_DATA_DIR first, then a download into a cache when a network exists."""

import os
import pathlib
import urllib.request

from lm.errors import UserError

DATA_DIR_ENV = "LM_DATA_DIR"
CACHE_DIR = pathlib.Path(os.environ.get("LM_CACHE_DIR", "~/.cache/lm")).expanduser()


def find_file(relative_path: str, url: str | None = None) -> pathlib.Path:
    """Returns $LM_DATA_DIR/relative_path, else a cached download of url, else raises UserError."""
    data_dir = os.environ.get(DATA_DIR_ENV)
    looked_at = []
    if data_dir:
        path = pathlib.Path(data_dir).expanduser() / relative_path
        if path.is_file():
            return path
        looked_at.append(str(path))
    cached = CACHE_DIR / relative_path
    if cached.is_file():
        return cached
    looked_at.append(str(cached))
    if url is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(cached.suffix + ".partial")
            urllib.request.urlretrieve(url, partial)
            partial.rename(cached)
            return cached
        except OSError as e:
            looked_at.append(f"{url} ({e.__class__.__name__})")
    raise UserError(
        f"data file {relative_path} not found (looked at: {', '.join(looked_at)}); "
        f"set {DATA_DIR_ENV} to a folder holding {relative_path} (see shared/data/README.md)"
    )
