"""Twins of the dense layer (csrc/dp_dense.h): dptrain._core.dense_forward, dense_backward.

Dimension letters: B batch, IN/OUT features."""

from ._common import _check_ndim, _check_shape, _common_float_dtype

__all__ = ["dense_forward", "dense_backward"]


def dense_forward(x, w, b, y, *, ctx=None):
    """y[:] = x @ w.T + b; x (B, IN), w (OUT, IN), b (OUT,), y (B, OUT)."""
    _common_float_dtype(x=x, w=w, b=b, y=y)
    _check_ndim("w", w, (2,))
    out_f, in_f = w.shape
    _check_ndim("x", x, (2,))
    batch = x.shape[0]
    _check_shape("x", x, (batch, in_f))
    _check_shape("b", b, (out_f,))
    _check_shape("y", y, (batch, out_f))
    y[...] = x @ w.T + b


def dense_backward(dy, x, w, dw, db, dx=None, *, ctx=None):
    """dw += dy.T @ x; db += dy.sum(0); if dx is given, dx[:] = dy @ w.

    dy (B, OUT), x (B, IN) the forward input, w (OUT, IN), dw like w, db (OUT,), dx like x.
    """
    _common_float_dtype(dy=dy, x=x, w=w, dw=dw, db=db, dx=dx)
    _check_ndim("w", w, (2,))
    out_f, in_f = w.shape
    _check_ndim("x", x, (2,))
    batch = x.shape[0]
    _check_shape("x", x, (batch, in_f))
    _check_shape("dy", dy, (batch, out_f))
    _check_shape("dw", dw, (out_f, in_f))
    _check_shape("db", db, (out_f,))
    if dx is not None:
        _check_shape("dx", dx, (batch, in_f))
    dw += dy.T @ x
    db += dy.sum(axis=0)
    if dx is not None:
        dx[...] = dy @ w
