"""Where data sets are looked for: a directory the user names, $DPTRAIN_DATA, the cache.

An explicit directory is the only place searched; without one, $DPTRAIN_DATA (and its
per-data-set subdirectory), then `default_cache_dir(name)`. A $DPTRAIN_DATA that names no
directory is an error (a typo), never a reason to fall back to synthetic data.
"""

from __future__ import annotations

import os
from pathlib import Path

from .dataset import DataNotFound

ENV_DATA_DIR = "DPTRAIN_DATA"


def default_cache_dir(dataset: str = "mnist") -> Path:
    """$XDG_CACHE_HOME/dptrain/<dataset>, or ~/.cache/dptrain/<dataset> ("mnist", "cifar10")."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "dptrain" / dataset


def search_dirs(data_dir, dataset: str) -> list[Path]:
    """Where to look for `dataset` ("mnist", "cifar10"), in order. An explicit data_dir is the
    only place searched."""
    if data_dir is not None:
        d = Path(data_dir).expanduser()
        return [d, d / dataset]
    dirs = []
    env = os.environ.get(ENV_DATA_DIR, "")
    if env:
        d = Path(env).expanduser()
        dirs += [d, d / dataset]
    dirs.append(default_cache_dir(dataset))
    return dirs


def check_env_data_dir() -> None:
    """$DPTRAIN_DATA names a directory: when it is set but there is no such directory (a
    typo), that is an error, never a reason to fall back to synthetic data."""
    env = os.environ.get(ENV_DATA_DIR, "")
    if env and not Path(env).expanduser().is_dir():
        raise DataNotFound(
            f"${ENV_DATA_DIR} is {env!r}, but there is no such directory", searched=[env]
        )
