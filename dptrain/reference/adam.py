"""Twins of the adaptive steps (csrc/dp_adam.h): dptrain._core.adam_step (PyTorch's Adam and
AdamW) and dptrain._core.rmsprop_step (PyTorch's RMSprop)."""

import numpy as np

from ._common import _check_shape, _common_float_dtype

__all__ = ["adam_step", "rmsprop_step"]


def adam_step(
    params,
    grads,
    exp_avg,
    exp_avg_sq,
    max_exp_avg_sq,
    *,
    step,
    lr,
    beta1=0.9,
    beta2=0.999,
    eps=1e-8,
    weight_decay=0.0,
    amsgrad=False,
    decoupled=False,
):
    """Step number ``step`` (1-based) of torch.optim.Adam (``decoupled``: AdamW) on flat
    buffers, in place on params, exp_avg, exp_avg_sq (and max_exp_avg_sq with amsgrad).

    Follows torch.optim.adam._single_tensor_adam (maximize=False, capturable=False):
        if weight_decay != 0:
            p = p * (1 - lr * weight_decay)         AdamW (decoupled)
            g = grad + weight_decay * p             Adam (L2)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        step_size = lr / (1 - beta1 ** step)         in Python floats, as PyTorch
        bias2_sqrt = (1 - beta2 ** step) ** 0.5
        vmax = maximum(vmax, v); v' = vmax  with amsgrad, else v' = v
        p = p - step_size * (m / (sqrt(v') / bias2_sqrt + eps))
    The scalars are rounded once to the buffers' dtype. (PyTorch writes the first moment as
    exp_avg.lerp_(grad, 1 - beta1), m + (1 - beta1) (g - m): the same value, rounded in
    another order.) max_exp_avg_sq may be None without
    amsgrad (it is then neither read nor written). grads are not modified.
    """
    dt = _common_float_dtype(
        params=params,
        grads=grads,
        exp_avg=exp_avg,
        exp_avg_sq=exp_avg_sq,
        max_exp_avg_sq=max_exp_avg_sq if amsgrad else None,
    )
    if step < 1:
        raise ValueError(f"step must be >= 1 (the first step is 1), got {step}")
    for name, arr in (("grads", grads), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        _check_shape(name, arr, params.shape)
    if amsgrad:
        if max_exp_avg_sq is None:
            raise ValueError("max_exp_avg_sq is None, but amsgrad=True needs it")
        _check_shape("max_exp_avg_sq", max_exp_avg_sq, params.shape)
    # the derived scalars in Python floats, as PyTorch's (a NumPy float32 lr would make
    # 1 - lr * weight_decay a float32 under NumPy 2's promotion rules)
    lr, beta1, beta2, eps, weight_decay = map(float, (lr, beta1, beta2, eps, weight_decay))
    T = dt.type
    g = grads
    if weight_decay != 0:
        if decoupled:
            params *= T(1 - lr * weight_decay)
        else:
            g = g + T(weight_decay) * params  # a new array: grads stay untouched
    exp_avg *= T(beta1)
    exp_avg += T(1 - beta1) * g
    exp_avg_sq *= T(beta2)
    exp_avg_sq += T(1 - beta2) * g * g
    v = exp_avg_sq
    if amsgrad:
        np.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        v = max_exp_avg_sq
    step_size = lr / (1 - beta1**step)
    bias2_sqrt = (1 - beta2**step) ** 0.5
    params -= T(step_size) * (exp_avg / (np.sqrt(v) / T(bias2_sqrt) + T(eps)))


def rmsprop_step(
    params,
    grads,
    square_avg,
    grad_avg,
    momentum_buffer,
    *,
    lr,
    alpha=0.99,
    eps=1e-8,
    weight_decay=0.0,
    momentum=0.0,
    centered=False,
):
    """One step of torch.optim.RMSprop on flat buffers, in place on params, square_avg (and
    grad_avg when centered, momentum_buffer with momentum > 0; either may be None otherwise).

    Follows torch.optim.rmsprop._single_tensor_rmsprop (maximize=False):
        g = grad + weight_decay * p                  if weight_decay != 0
        sq = alpha * sq + (1 - alpha) * g * g
        centered: gavg = gavg + (1 - alpha) * (g - gavg)   (lerp)
                  avg = sqrt(max(sq - gavg * gavg, 0)) + eps   (torch: NaN below 0)
        else:     avg = sqrt(sq) + eps
        momentum > 0: buf = momentum * buf + g / avg; p = p - lr * buf
        else:         p = p - lr * (g / avg)
    The scalars are rounded once to the buffers' dtype. grads are not modified.
    """
    dt = _common_float_dtype(
        params=params,
        grads=grads,
        square_avg=square_avg,
        grad_avg=grad_avg if centered else None,
        momentum_buffer=momentum_buffer if momentum > 0 else None,
    )
    _check_shape("grads", grads, params.shape)
    _check_shape("square_avg", square_avg, params.shape)
    for name, arr, used, why in (
        ("grad_avg", grad_avg, centered, "centered=True"),
        ("momentum_buffer", momentum_buffer, momentum > 0, "momentum > 0"),
    ):
        if used:
            if arr is None:
                raise ValueError(f"{name} is None, but {why} needs it")
            _check_shape(name, arr, params.shape)
    T = dt.type
    g = grads + T(weight_decay) * params if weight_decay != 0 else grads
    square_avg *= T(alpha)
    square_avg += T(1 - alpha) * g * g
    if centered:
        grad_avg += T(1 - alpha) * (g - grad_avg)
        # the variance can round below 0 where it is about 0: taken as 0 (torch: NaN)
        avg = np.sqrt(np.maximum(square_avg - grad_avg * grad_avg, T(0))) + T(eps)
    else:
        avg = np.sqrt(square_avg) + T(eps)
    if momentum > 0:
        momentum_buffer *= T(momentum)
        momentum_buffer += g / avg
        params -= T(lr) * momentum_buffer
    else:
        params -= T(lr) * (g / avg)
