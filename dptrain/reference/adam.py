"""Twin of the Adam step (csrc/dp_adam.h): dptrain._core.adam_step, PyTorch's Adam and AdamW."""

import numpy as np

from ._common import _check_shape, _common_float_dtype

__all__ = ["adam_step"]


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
