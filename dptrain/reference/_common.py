"""Validation helpers every twin uses: light, but with messages that name the argument and
the values, in the words of the C boundary (docs/core_api.md)."""

import numpy as np

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _check_shape(name, arr, expected):
    if arr.shape != tuple(expected):
        raise ValueError(f"{name} has shape {arr.shape}, expected {tuple(expected)}")


def _check_ndim(name, arr, ndims):
    if arr.ndim not in ndims:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"{name} has shape {arr.shape}, expected a {want} array")


def _common_float_dtype(**arrays):
    """The one float dtype shared by all given arrays (None values are skipped)."""
    dtype = None
    first = None
    for name, arr in arrays.items():
        if arr is None:
            continue
        if arr.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {arr.dtype}, expected float32 or float64")
        if dtype is None:
            dtype, first = arr.dtype, name
        elif arr.dtype != dtype:
            raise TypeError(
                f"{name} has dtype {arr.dtype}, expected {dtype} (the dtype of {first})"
            )
    return dtype


def _check_labels(labels, batch, n_classes):
    """labels: integer (B,), every value in [0, n_classes)."""
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"labels has dtype {labels.dtype}, expected int64")
    _check_shape("labels", labels, (batch,))
    if batch:
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= n_classes:
            bad = lo if lo < 0 else hi
            raise ValueError(f"labels contains {bad}, expected values in [0, {n_classes})")


def _range(name, n, start, stop):
    """slice(start, stop) after checking 0 <= start <= stop <= n (no negative indexing)."""
    stop = n if stop is None else stop
    if not 0 <= start <= stop <= n:
        raise ValueError(f"{name} range [{start}, {stop}) is not inside [0, {n}]")
    return slice(start, stop)
