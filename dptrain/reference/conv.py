"""Twins of the convolution (csrc/dp_conv.h): dptrain._core.conv2d_forward and
conv2d_backward (and their loop twins, conv2d_*_naive). NCHW, zero padding, a stride (the
model engine's; the standalone kernels are stride 1)."""

import numpy as np

from ._common import _check_ndim, _check_shape, _common_float_dtype

__all__ = ["conv2d_forward", "conv2d_backward"]


def _conv_shapes(x, w, padding, stride=1):
    """(B, C, H, W, OC, KH, KW, OH, OW) after checking x (B, C, H, W) and w (OC, C, KH, KW)."""
    _check_ndim("x", x, (4,))
    _check_ndim("w", w, (4,))
    batch, c, h, wd = x.shape
    oc, wc, kh, kw = w.shape
    if wc != c:
        raise ValueError(
            f"w has shape {w.shape}, but x has shape {x.shape}: w.shape[1] must be "
            f"x's channel count {c}"
        )
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if h + 2 * padding < kh or wd + 2 * padding < kw:
        raise ValueError(
            f"w has shape {w.shape}: its {kh}x{kw} kernel is larger than the "
            f"{h}x{wd} input of x {x.shape} with padding {padding}"
        )
    oh = (h + 2 * padding - kh) // stride + 1
    ow = (wd + 2 * padding - kw) // stride + 1
    return batch, c, h, wd, oc, kh, kw, oh, ow


def _windows(x, kh, kw, padding, stride=1):
    """(B, C, OH, OW, KH, KW) view of x's zero-padded patches: [n, c, i, j, u, v] is
    x[n, c, i stride + u - padding, j stride + v - padding]."""
    p = padding
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p))) if p else x
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    return win[:, :, ::stride, ::stride]


def conv2d_forward(x, w, b, y, *, padding=0, stride=1, ctx=None):
    """y[:] = conv(x, w) + b, zero padding; x (B, C, H, W), w (OC, C, KH, KW), b (OC,),
    y (B, OC, OH, OW) with OH = (H + 2 padding - KH) // stride + 1 (likewise OW):
    y[n, o, i, j] = b[o] + sum_{c,u,v} w[o, c, u, v] x[n, c, i s + u - padding, j s + v -
    padding], s the stride.
    """
    _common_float_dtype(x=x, w=w, b=b, y=y)
    batch, _, _, _, oc, kh, kw, oh, ow = _conv_shapes(x, w, padding, stride)
    _check_shape("b", b, (oc,))
    _check_shape("y", y, (batch, oc, oh, ow))
    out = np.einsum("ncijuv,ocuv->noij", _windows(x, kh, kw, padding, stride), w, optimize=True)
    y[...] = out + b[None, :, None, None]


def conv2d_backward(dy, x, w, dw, db, dx=None, *, padding=0, stride=1, ctx=None):
    """dw += d/dw and db += d/db of sum(dy * conv(x, w)); if dx is given, dx[:] = d/dx.

    dy (B, OC, OH, OW), x and dx (B, C, H, W), w and dw (OC, C, KH, KW), db (OC,).
    """
    _common_float_dtype(dy=dy, x=x, w=w, dw=dw, db=db, dx=dx)
    batch, c, h, wd, oc, kh, kw, oh, ow = _conv_shapes(x, w, padding, stride)
    _check_shape("dy", dy, (batch, oc, oh, ow))
    _check_shape("dw", dw, w.shape)
    _check_shape("db", db, (oc,))
    if dx is not None:
        _check_shape("dx", dx, x.shape)
    dw += np.einsum("noij,ncijuv->ocuv", dy, _windows(x, kh, kw, padding, stride), optimize=True)
    db += dy.sum(axis=(0, 2, 3))
    if dx is not None:
        p = padding
        dxp = np.zeros((batch, c, h + 2 * p, wd + 2 * p), dtype=dx.dtype)
        s = stride
        for u in range(kh):  # x[.., i s + u, j s + v] took part in y[.., i, j] via w[.., u, v]
            for v in range(kw):
                dxp[:, :, u : u + s * (oh - 1) + 1 : s, v : v + s * (ow - 1) + 1 : s] += np.einsum(
                    "noij,oc->ncij", dy, w[:, :, u, v]
                )
        dx[...] = dxp[:, :, p : p + h, p : p + wd]
