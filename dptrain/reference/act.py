"""Twins of the activations (csrc/dp_act.h): ReLU (dptrain._core.relu_forward,
relu_backward), and tanh, sigmoid, GELU and the MSE loss, which have no binding of their own:
the C core runs them inside Model (model.py)."""

import math

import numpy as np

from ._common import _check_ndim, _check_shape, _common_float_dtype

__all__ = [
    "relu_forward",
    "relu_backward",
    "tanh_forward",
    "tanh_backward",
    "sigmoid_forward",
    "sigmoid_backward",
    "gelu_forward",
    "gelu_backward",
    "mse",
]


def relu_forward(x, y):
    """y[:] = maximum(x, 0); y may be x."""
    _common_float_dtype(x=x, y=y)
    _check_shape("y", y, x.shape)
    np.maximum(x, x.dtype.type(0), out=y)


def relu_backward(dy, y, dx):
    """dx[:] = dy * (y > 0); y is the forward *output*; dx may be dy."""
    _common_float_dtype(dy=dy, y=y, dx=dx)
    _check_shape("y", y, dy.shape)
    _check_shape("dx", dx, dy.shape)
    # where() rather than a multiply: a masked entry is exactly 0 even where dy is inf.
    dx[...] = np.where(y > 0, dy, dy.dtype.type(0))


def _sigmoid(z):
    """Stable logistic: exp() is only ever taken of -|z| <= 0, so it never overflows."""
    e = np.exp(-np.abs(z))
    one = z.dtype.type(1)
    return np.where(z >= 0, one / (one + e), e / (one + e))


def tanh_forward(x, y):
    """y[:] = tanh(x); y may be x."""
    _common_float_dtype(x=x, y=y)
    _check_shape("y", y, x.shape)
    np.tanh(x, out=y)


def tanh_backward(dy, y, dx):
    """dx[:] = dy * (1 - y^2); y is the forward *output* (as PyTorch's tanh_backward)."""
    dt = _common_float_dtype(dy=dy, y=y, dx=dx)
    _check_shape("y", y, dy.shape)
    _check_shape("dx", dx, dy.shape)
    dx[...] = dy * (dt.type(1) - y * y)


def sigmoid_forward(x, y):
    """y[:] = 1 / (1 + exp(-x)), taken as 1 / (1 + e) or e / (1 + e) with e = exp(-|x|) so
    that no exp overflows; y may be x."""
    _common_float_dtype(x=x, y=y)
    _check_shape("y", y, x.shape)
    y[...] = _sigmoid(x)


def sigmoid_backward(dy, y, dx):
    """dx[:] = dy * y * (1 - y); y is the forward *output*."""
    dt = _common_float_dtype(dy=dy, y=y, dx=dx)
    _check_shape("y", y, dy.shape)
    _check_shape("dx", dx, dy.shape)
    dx[...] = dy * y * (dt.type(1) - y)


_erfc = np.frompyfunc(math.erfc, 1, 1)  # libm's erfc, element by element (NumPy has none)


def _normal_cdf(x):
    """Phi(x) = 0.5 erfc(-x / sqrt 2) in float64 (the erfc form has no cancellation for
    x << 0, where 0.5 (1 + erf(x / sqrt 2)) has)."""
    return 0.5 * _erfc(-np.asarray(x, np.float64) * math.sqrt(0.5)).astype(np.float64)


def gelu_forward(x, y):
    """y[:] = x Phi(x), Phi the standard normal CDF: PyTorch's nn.GELU() (the erf form, not
    the tanh approximation). GELU(-inf) = -inf * 0 = NaN, as in IEEE arithmetic and the C
    core. Phi is taken in float64 and the product rounded once to the dtype: transcendental
    functions cannot round as a C kernel does anyway (the C core is within a few ulp)."""
    _common_float_dtype(x=x, y=y)
    _check_shape("y", y, x.shape)
    x64 = x.astype(np.float64)
    y[...] = x64 * _normal_cdf(x64)


def gelu_backward(dy, x, dx):
    """dx[:] = dy * (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi); x is the forward
    *input* (GELU's derivative cannot be had from its output). NaN at x = +-inf (inf * 0)."""
    _common_float_dtype(dy=dy, x=x, dx=dx)
    _check_shape("x", x, dy.shape)
    _check_shape("dx", dx, dy.shape)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        slope = _normal_cdf(x64) + x64 * np.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)
    dx[...] = dy * slope.astype(dx.dtype)


def mse(outputs, targets, doutputs=None, grad_scale=None):
    """Squared error summed over the rows and outputs (PyTorch's MSELoss(reduction='sum'),
    no 1/2); outputs and targets (B, OUT) of one float dtype. Returns float(sum (y - t)^2).
    If doutputs is given, writes doutputs[:] = 2 grad_scale (y - t), grad_scale defaulting to
    1/B (pass 1 / (B OUT) for the gradient of MSELoss()'s mean)."""
    dt = _common_float_dtype(outputs=outputs, targets=targets, doutputs=doutputs)
    _check_ndim("outputs", outputs, (2,))
    _check_shape("targets", targets, outputs.shape)
    if doutputs is not None:
        _check_shape("doutputs", doutputs, outputs.shape)
    batch = outputs.shape[0]
    if batch == 0:
        return 0.0
    diff = outputs - targets  # (B, OUT), in the dtype
    if doutputs is not None:
        scale = 1.0 / batch if grad_scale is None else grad_scale
        doutputs[...] = dt.type(2) * dt.type(scale) * diff
    d64 = diff.astype(np.float64)
    return float(np.sum(d64 * d64))
