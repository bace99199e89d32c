"""Arrays that start on a cache line (64 bytes): what dptrain allocates for data it owns.

NumPy's allocator aligns to 16 bytes, so a large array's rows usually start 16 bytes into a
cache line. Rows of a 64-byte multiple (or half of one) then split some vector loads across
two lines, and the kernels that stream a batch pay for it (logistic regression's fused
kernel reads a row about a tenth slower: bench/README.md, "Design measurements behind the
comments"). Data sets that dptrain builds (the synthetic ones, MNIST and
CIFAR-10 as read, conversions of the user's arrays), the batch buffers of shuffled training
and the exchange's gradient buffers start on a line; an array the user hands over as it is
keeps its own alignment (no copy is made for it).
"""

from __future__ import annotations

import math

import numpy as np

ALIGN = 64  # bytes: arrays start on a cache line (no false sharing, aligned SIMD)


def _aligned(shape, dtype, alloc) -> np.ndarray:
    dt = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimensions are not allowed: shape {shape}")
    nbytes = math.prod(shape) * dt.itemsize  # Python ints: no wrap-around
    raw = alloc(nbytes + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off : off + nbytes].view(dt).reshape(shape)


def aligned_empty(shape, dtype) -> np.ndarray:
    """np.empty(shape, dtype), C-contiguous, starting on a 64-byte boundary."""
    return _aligned(shape, dtype, np.empty)


def aligned_zeros(shape, dtype) -> np.ndarray:
    """np.zeros(shape, dtype), C-contiguous, starting on a 64-byte boundary (the pages are
    zeroed by the OS as they are first touched, as np.zeros's are)."""
    return _aligned(shape, dtype, np.zeros)
