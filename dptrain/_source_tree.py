"""Why ``import dptrain`` failed when the package found is a source tree without its built C
extension: the clone's root on sys.path (``python -m`` puts the current directory first)
shadows the installed dptrain. Python's own message then blames a circular import.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path


def unbuilt_core_error() -> ImportError | None:
    """An ImportError saying what happened and what to run, or None if ``_core`` is built here
    (the failure then has another cause, and its own message is the one to show)."""
    package = Path(__file__).resolve().parent
    if any((package / f"_core{s}").is_file() for s in importlib.machinery.EXTENSION_SUFFIXES):
        return None
    expected = f"_core{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    others = sorted(p.name for p in package.glob("_core.*") if p.suffix in (".so", ".pyd"))
    found = f"; {', '.join(others)} there is built for another Python" if others else ""
    return ImportError(
        f"dptrain is being imported from the source tree {package}, whose C extension "
        f"dptrain._core is not built (no {expected} there{found}): run `pip install -e .` in "
        f"{package.parent} to build it in place, or run Python from another directory to use "
        f"an installed dptrain",
        name="dptrain._core",
    )
