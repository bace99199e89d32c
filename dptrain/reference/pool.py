"""Twins of 2x2 max-pooling, stride 2 (csrc/dp_pool.h): dptrain._core.maxpool2_forward,
maxpool2_backward."""

import numpy as np

from ._common import _check_ndim, _check_shape, _common_float_dtype

__all__ = ["maxpool2_forward", "maxpool2_backward"]


def _pool_windows(x):
    """(B, C, OH, OW, 4) copy of the 2x2 windows, positions in the order 2 du + dv."""
    batch, c, h, wd = x.shape
    oh, ow = h // 2, wd // 2
    win = x[:, :, : 2 * oh, : 2 * ow].reshape(batch, c, oh, 2, ow, 2)
    return win.transpose(0, 1, 2, 4, 3, 5).reshape(batch, c, oh, ow, 4)


def _pooled_shape(name, a):
    _check_ndim(name, a, (4,))
    if a.shape[2] < 2 or a.shape[3] < 2:
        raise ValueError(f"{name} has shape {a.shape}: 2x2 pooling needs H >= 2 and W >= 2")
    return a.shape[0], a.shape[1], a.shape[2] // 2, a.shape[3] // 2


def maxpool2_forward(x, y, idx):
    """2x2 max-pooling, stride 2: y[n, c, i, j] = max of x[n, c, 2i:2i+2, 2j:2j+2] (an odd
    last row/column is dropped); idx (uint8) = the maximum's window position 2 du + dv, the
    first maximum as np.argmax picks it (a NaN counts as the maximum)."""
    _common_float_dtype(x=x, y=y)
    shape = _pooled_shape("x", x)
    _check_shape("y", y, shape)
    _check_shape("idx", idx, shape)
    if idx.dtype != np.uint8:
        raise TypeError(f"idx has dtype {idx.dtype}, expected uint8")
    win = _pool_windows(x)
    k = np.argmax(win, axis=-1)
    y[...] = np.take_along_axis(win, k[..., None], axis=-1)[..., 0]
    idx[...] = k


def maxpool2_backward(dy, idx, dx):
    """dx[:] = 0, then dy[n, c, i, j] at the window position idx[n, c, i, j] of each window."""
    _common_float_dtype(dy=dy, dx=dx)
    shape = _pooled_shape("dx", dx)
    _check_shape("dy", dy, shape)
    _check_shape("idx", idx, shape)
    if idx.dtype != np.uint8:
        raise TypeError(f"idx has dtype {idx.dtype}, expected uint8")
    if idx.size and int(idx.max()) > 3:
        raise ValueError(f"idx holds {int(idx.max())}: a window position is 0..3")
    batch, c, oh, ow = shape
    win = np.zeros((batch, c, oh, ow, 4), dtype=dx.dtype)
    np.put_along_axis(win, idx[..., None].astype(np.intp), dy[..., None], axis=-1)
    dx[...] = 0
    dx[:, :, : 2 * oh, : 2 * ow] = (
        win.reshape(batch, c, oh, ow, 2, 2)
        .transpose(0, 1, 2, 4, 3, 5)
        .reshape(batch, c, 2 * oh, 2 * ow)
    )
