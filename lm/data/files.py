"""Finding data files: $LM_DATA_DIR first, then a download into a cache when a network exists."""

import hashlib
import os
import pathlib
import urllib.request

from lm.errors import UserError

DATA_DIR_ENV = "LM_DATA_DIR"
OFFLINE_ENV = "LM_OFFLINE"  # set to skip download attempts
CACHE_DIR = pathlib.Path(os.environ.get("LM_CACHE_DIR", "~/.cache/lm")).expanduser()


def find_file(
    relative_path: str, url: str | None = None, md5: str | None = None, how: str | None = None
) -> pathlib.Path:
    """Returns $LM_DATA_DIR/relative_path, else a cached download of url (unless $LM_OFFLINE is set;
    checked against md5 when given), else raises UserError naming every place it looked and how to
    provide the file (how: the end of that message; by default, see docs/data-files.md)."""
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
    if url is not None and not os.environ.get(OFFLINE_ENV):
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(cached.suffix + ".partial")
            with urllib.request.urlopen(url, timeout=60) as response:
                partial.write_bytes(response.read())
            if md5 is not None and hashlib.md5(partial.read_bytes()).hexdigest() != md5:
                partial.unlink()
                raise OSError(f"the download's md5 is not {md5}")
            partial.rename(cached)
            return cached
        except OSError as e:
            looked_at.append(f"{url} ({e})")
    raise UserError(
        f"data file {relative_path} not found (looked at: {', '.join(looked_at)}); "
        f"set {DATA_DIR_ENV} to a folder holding {relative_path} ({how or 'see docs/data-files.md'})"
    )
