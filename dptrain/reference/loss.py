"""Twins of the losses and of what is counted from them (csrc/dp_loss.h):
dptrain._core.softmax_xent, sigmoid_bce, argmax, count_correct.

Dimension letters: B batch, C classes. Loss sums are accumulated in float64."""

import numpy as np

from ._common import _check_labels, _check_ndim, _check_shape, _common_float_dtype
from .act import _sigmoid

__all__ = ["softmax_xent", "sigmoid_bce", "argmax", "count_correct"]


def softmax_xent(logits, labels, dlogits=None, grad_scale=None):
    """Softmax cross-entropy summed over the batch; logits (B, C), labels int64 (B,).

    Returns float(sum_i logsumexp(z_i) - z_i[y_i]). If dlogits is given, writes
    dlogits[:] = (softmax(z) - onehot(y)) * grad_scale, grad_scale defaulting to 1/B.
    Stable form: with m_i = max_j z_ij and s = z - m, logsumexp(z_i) - z_i[y] =
    log(sum_j exp(s_ij)) - s_i[y], and every exp() argument is <= 0.
    """
    dt = _common_float_dtype(logits=logits, dlogits=dlogits)
    _check_ndim("logits", logits, (2,))
    batch, n_classes = logits.shape
    if n_classes < 1:
        raise ValueError(f"logits has shape {logits.shape}, expected at least one class")
    _check_labels(labels, batch, n_classes)
    if dlogits is not None:
        _check_shape("dlogits", dlogits, logits.shape)
    if batch == 0:
        return 0.0
    rows = np.arange(batch)
    shifted = logits - logits.max(axis=1, keepdims=True)  # (B, C), each row's max is 0
    exps = np.exp(shifted)
    sum_exp = exps.sum(axis=1)  # (B,), in [1, C]
    losses = np.log(sum_exp) - shifted[rows, labels]  # (B,) per-sample losses, dtype dt
    if dlogits is not None:
        scale = dt.type(1.0 / batch if grad_scale is None else grad_scale)
        grad = exps / sum_exp[:, None]  # softmax
        grad[rows, labels] -= dt.type(1)
        grad *= scale
        dlogits[...] = grad
    return float(losses.sum(dtype=np.float64))


def sigmoid_bce(logits, labels, dlogits=None, grad_scale=None):
    """Binary cross-entropy on logits, summed over the batch.

    logits (B,) or (B, 1), labels int64 (B,) in {0, 1}. Returns
    float(sum_i softplus(z_i) - y_i z_i), computed stably as
    max(z, 0) - y z + log1p(exp(-|z|)). If dlogits (shaped like logits) is given, writes
    dlogits[:] = (sigmoid(z) - y) * grad_scale, grad_scale defaulting to 1/B.
    """
    dt = _common_float_dtype(logits=logits, dlogits=dlogits)
    _check_ndim("logits", logits, (1, 2))
    batch = logits.shape[0]
    if logits.ndim == 2:
        _check_shape("logits", logits, (batch, 1))
    _check_labels(labels, batch, 2)
    if dlogits is not None:
        _check_shape("dlogits", dlogits, logits.shape)
    if batch == 0:
        return 0.0
    z = logits.reshape(batch)
    y = labels.astype(dt)
    losses = np.maximum(z, dt.type(0)) - y * z + np.log1p(np.exp(-np.abs(z)))
    if dlogits is not None:
        scale = dt.type(1.0 / batch if grad_scale is None else grad_scale)
        dlogits[...] = ((_sigmoid(z) - y) * scale).reshape(logits.shape)
    return float(losses.sum(dtype=np.float64))


def argmax(x, out):
    """out[:] = x.argmax(1) (the first maximum); x (B, C), out int64 (B,)."""
    _check_ndim("x", x, (2,))
    batch, n_classes = x.shape
    if n_classes < 1:
        raise ValueError(f"x has shape {x.shape}, expected at least one column")
    _check_shape("out", out, (batch,))
    if out.dtype != np.int64:
        raise TypeError(f"out has dtype {out.dtype}, expected int64")
    out[...] = np.argmax(x, axis=1)


def count_correct(logits, labels):
    """Correct predictions in the batch, as an int.

    logits (B, C) with C >= 2: (argmax == labels).sum();
    logits (B,) or (B, 1) (one logit, the BCE case): ((z > 0) == labels).sum().
    """
    _check_ndim("logits", logits, (1, 2))
    batch = logits.shape[0]
    if logits.ndim == 1 or logits.shape[1] == 1:
        _check_labels(labels, batch, 2)
        predicted = (logits.reshape(batch) > 0).astype(np.int64)
    else:
        _check_labels(labels, batch, logits.shape[1])
        predicted = np.argmax(logits, axis=1)
    return int(np.count_nonzero(predicted == labels))
