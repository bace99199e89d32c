"""Arrays that are views of memory-mapped files: where one lies in its file, so that another
process maps the same bytes by name instead of being sent a copy (pickling an np.memmap copies
its data). The data sets use it to keep a user's .npy a memory map; ``launch`` to hand such an
array to worker processes (a data set larger than RAM stays on disk, its pages shared through
the page cache)."""

from __future__ import annotations

import mmap
import os

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
