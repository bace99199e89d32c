"""Twins of the per-sample layers of the model engine (csrc/dp_layers.h): 2x2 average
pooling, global average pooling, dropout (its counter-based draws, bit for bit) and layer
normalization. Written with NumPy's whole-array operations, not the C loops."""

import numpy as np

__all__ = [
    "avgpool2_forward",
    "avgpool2_backward",
    "gap_forward",
    "gap_backward",
    "dropout_mask",
    "dropout_forward",
    "dropout_backward",
    "layernorm_forward",
    "layernorm_backward",
    "LAYERNORM_EPS",
]

LAYERNORM_EPS = 1e-5  # DP_LAYERNORM_EPS

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_DOMAIN = np.uint64(0x64726F706F757421)  # "dropout!"


def mix64(z):
    """splitmix64's output for the state z (csrc/dp_common.h's dp_mix64: the finalizer of z +
    golden), on uint64 values or arrays, wrapping as C's."""
    with np.errstate(over="ignore"):
        z = np.asarray(z, np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def dropout_mask(seed, step, rows, n, p, layer):
    """(len(rows), n) bool: True where dropout keeps a value, for the global row indices
    `rows` of training step `step` and the layer at index `layer` of the list."""
    with np.errstate(over="ignore"):
        k = mix64(mix64(np.uint64(seed % 2**64) ^ _DOMAIN) ^ np.uint64(step))
        key = mix64(mix64(k ^ np.asarray(rows, np.int64).astype(np.uint64)) ^ np.uint64(layer))
        units = np.arange(n, dtype=np.uint64) * _GOLDEN
        bits = mix64(key[:, None] + units[None, :]) >> np.uint64(32)
    thr = 0 if p <= 0 else min(int(np.floor(p * 2.0**32)), 2**32 - 1)
    return bits >= np.uint64(thr)


def dropout_forward(x, p, mask):
    """x (B, n) -> x * mask / (1 - p), the scale rounded to x's dtype."""
    scale = x.dtype.type(1.0 / (1.0 - p))
    return np.where(mask, x * scale, x.dtype.type(0))


def dropout_backward(dy, p, mask):
    scale = dy.dtype.type(1.0 / (1.0 - p))
    return np.where(mask, dy * scale, dy.dtype.type(0))


def avgpool2_forward(x):
    """x (B, C, H, W) -> (B, C, H // 2, W // 2), the mean of each 2x2 window (an odd last row
    or column dropped)."""
    b, c, h, w = x.shape
    oh, ow = h // 2, w // 2
    v = x[:, :, : 2 * oh, : 2 * ow].reshape(b, c, oh, 2, ow, 2)
    return (
        ((v[:, :, :, 0, :, 0] + v[:, :, :, 0, :, 1]) + v[:, :, :, 1, :, 0]) + v[:, :, :, 1, :, 1]
    ) * x.dtype.type(0.25)


def avgpool2_backward(dy, shape):
    """dy (B, C, H // 2, W // 2) -> dx of `shape` (B, C, H, W)."""
    dx = np.zeros(shape, dy.dtype)
    oh, ow = dy.shape[2], dy.shape[3]
    g = dy * dy.dtype.type(0.25)
    for du in (0, 1):
        for dv in (0, 1):
            dx[:, :, du : 2 * oh : 2, dv : 2 * ow : 2] = g
    return dx


def gap_forward(x):
    """x (B, C, H, W) -> (B, C): each map's mean, summed in float64."""
    return (x.astype(np.float64).sum(axis=(2, 3)) / (x.shape[2] * x.shape[3])).astype(x.dtype)


def gap_backward(dy, shape):
    g = (dy.astype(np.float64) / (shape[2] * shape[3])).astype(dy.dtype)
    return np.broadcast_to(g[:, :, None, None], shape).copy()


def _layernorm_xhat(x):
    """(xhat rounded to x's dtype, mean, rstd) per row of x (B, n), in float64."""
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + LAYERNORM_EPS)
    return ((x64 - mean) * rstd).astype(x.dtype), mean, rstd


def layernorm_forward(x, gamma, beta):
    """x (B, n): y = xhat gamma + beta, xhat = (x - mean) / sqrt(var + eps) per row (the
    biased variance, as PyTorch's nn.LayerNorm)."""
    xhat = _layernorm_xhat(x)[0]
    return xhat * gamma + beta


def layernorm_backward(dy, x, gamma, dgamma, dbeta, want_dx=True):
    """dgamma += sum over rows of dy xhat, dbeta += sum of dy; returns dx (or None)."""
    xhat, _, rstd = _layernorm_xhat(x)
    dgamma += (dy * xhat).sum(axis=0)
    dbeta += dy.sum(axis=0)
    if not want_dx:
        return None
    g = dy.astype(np.float64) * gamma.astype(np.float64)
    h = xhat.astype(np.float64)
    a = g.mean(axis=1, keepdims=True)
    b = (g * h).mean(axis=1, keepdims=True)
    return (rstd * (g - a - h * b)).astype(dy.dtype)


BATCHNORM_EPS, BATCHNORM_MOMENTUM = 1e-5, 0.1  # DP_BATCHNORM_EPS, DP_BATCHNORM_MOMENTUM


def batchnorm_stats(x):
    """x (B, C, HW): (mean, biased variance, count) per channel over the batch, in float64."""
    x64 = x.astype(np.float64)
    n = x.shape[0] * x.shape[2]
    if n == 0:  # an empty batch: nothing to normalize (the engine does not run it)
        return np.zeros(x.shape[1]), np.ones(x.shape[1]), 0
    mean = x64.sum(axis=(0, 2)) / n
    var = np.maximum((x64**2).sum(axis=(0, 2)) / n - mean**2, 0.0)
    return mean, var, n


def batchnorm_forward(x, gamma, beta, mean, var):
    """x (B, C, HW) normalized per channel by (mean, var): xhat rounded to x's dtype, then
    times gamma plus beta (PyTorch's BatchNorm1d / 2d)."""
    rstd = 1.0 / np.sqrt(var + BATCHNORM_EPS)
    xhat = ((x.astype(np.float64) - mean[None, :, None]) * rstd[None, :, None]).astype(x.dtype)
    return xhat * gamma[None, :, None] + beta[None, :, None]


def batchnorm_backward(dy, x, gamma, mean, var, dgamma, dbeta, want_dx=True):
    """dgamma += sum of dy xhat, dbeta += sum of dy (per channel over the batch); returns dx
    (or None): gamma rstd (dy - A / N - xhat B / N), A and B those sums."""
    rstd = 1.0 / np.sqrt(var + BATCHNORM_EPS)
    xhat = ((x.astype(np.float64) - mean[None, :, None]) * rstd[None, :, None]).astype(x.dtype)
    a = dy.astype(np.float64).sum(axis=(0, 2))
    b = (dy.astype(np.float64) * xhat.astype(np.float64)).sum(axis=(0, 2))
    dgamma += b.astype(dgamma.dtype)
    dbeta += a.astype(dbeta.dtype)
    if not want_dx:
        return None
    n = x.shape[0] * x.shape[2]
    k = gamma.astype(np.float64) * rstd
    dx = k[None, :, None] * (
        dy.astype(np.float64)
        - (a / n)[None, :, None]
        - xhat.astype(np.float64) * (b / n)[None, :, None]
    )
    return dx.astype(dy.dtype)


def batchnorm_update_running(running_mean, running_var, mean, var, n):
    """PyTorch's update of the running statistics (the unbiased variance), in place."""
    m = BATCHNORM_MOMENTUM
    running_mean[...] = (1 - m) * running_mean + m * mean
    running_var[...] = (1 - m) * running_var + m * (var * n / (n - 1) if n > 1 else var)
