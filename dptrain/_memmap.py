"""Arrays that are views of memory-mapped files: where one lies in its file, so that another
process maps the same bytes by name instead of being sent a copy (pickling an np.memmap copies
its data). The data sets use it to keep a user's .npy a memory map; ``launch`` to hand such an
array to worker processes (a data set larger than RAM stays on disk, its pages shared through
the page cache)."""

from __future__ import annotations

import mmap
import os
from contextlib import contextmanager

import numpy as np


def memmap_region(x: np.ndarray) -> tuple[str, int] | None:
    """Where x lies in its file: (path, byte offset of x's first element), else None.

    With it, another process maps the same bytes instead of being sent a copy (pickling an
    np.memmap copies its data): np.memmap(path, x.dtype, "r", offset, x.shape) equals x.
    None when x is not a C-contiguous view of a memory-mapped file that is still found under
    its name: an array in memory, or the temporary file of a conversion (unlinked at once;
    a forked worker inherits its mapping).
    """
    if not (isinstance(x, np.memmap) and x.flags.c_contiguous and x.filename):
        return None
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not (isinstance(root, np.memmap) and isinstance(root.base, mmap.mmap)):
        return None
    if not os.path.isfile(x.filename):
        return None
    return str(x.filename), root.offset + (x.ctypes.data - root.ctypes.data)


def open_region(path: str, offset: int, shape, dtype) -> np.memmap:
    """The read-only memory map that ``memmap_region`` located: equal to the original array."""
    return np.memmap(path, np.dtype(dtype), "r", int(offset), tuple(shape))


TRUNCATED_EXIT = 74  # a process ended by a mapped input file's truncation (csrc/mod_guard.c)


@contextmanager
def truncation_named(arrays, say: bool = True):
    """While it lasts, a read of one of ``arrays`` that are views of memory-mapped files
    (``memmap_region``) past the end of its file, truncated under the run, prints one line
    naming the file (say=False: none, where the launcher names it: ``truncated_file``) and
    ends the process with TRUNCATED_EXIT, instead of a bare SIGBUS (on the thread transport
    every worker dies with it)."""
    from . import _core

    entries = []
    try:
        for a in arrays:
            region = memmap_region(a) if a is not None else None
            if region is None:
                continue
            path = region[0]
            text = (
                f"dptrain: error: {path} was truncated while the run read it: a memory-mapped "
                f"input must keep its {os.path.getsize(path)} bytes until the run ends\n"
            )
            entry = _core.watch_mapping(
                a, text.encode()[:700].decode(errors="ignore") if say else ""
            )
            if entry is not None:
                entries.append(entry)
        yield
    finally:
        for entry in entries:
            _core.unwatch_mapping(entry)


def truncated_file(regions) -> str | None:
    """The first of ``regions`` ((path, offset, shape, dtype), as ``memmap_region`` and
    launch's mapped extras give them) whose file is now shorter than the region, said as a
    cause; None when none is."""
    for path, offset, shape, dtype in regions:
        need = int(offset) + int(np.prod(shape)) * np.dtype(dtype).itemsize
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        if size < need:
            return (
                f"{path} was truncated while the run read it ({size} bytes left): a "
                f"memory-mapped input must keep its {need} bytes until the run ends"
            )
    return None
