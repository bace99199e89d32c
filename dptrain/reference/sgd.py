"""Twin of the SGD step (csrc/dp_sgd.h): dptrain._core.sgd_step, PyTorch's SGD."""

from ._common import _check_shape, _common_float_dtype

__all__ = ["sgd_step"]


def sgd_step(
    params,
    grads,
    velocity,
    *,
    lr,
    momentum=0.0,
    dampening=0.0,
    weight_decay=0.0,
    nesterov=False,
    first_step=False,
):
    """One torch.optim.SGD step on flat buffers, in place on params (and velocity).

    Follows torch.optim.sgd._single_tensor_sgd (maximize=False) line by line:
        g = grad + weight_decay * p                  (only if weight_decay != 0)
        if momentum != 0:
            v = g                                    on the first step (PyTorch clones g
                                                     into the fresh buffer: no dampening)
            v = momentum * v + (1 - dampening) * g   afterwards
            g = g + momentum * v  if nesterov  else  v
        p -= lr * g
    velocity may be None when momentum == 0 (it is then neither read nor written).
    grads are not modified. PyTorch's constructor also rejects nesterov with
    momentum <= 0 or dampening != 0; the update rule itself is well defined there, so it is
    applied as written rather than refused.
    """
    dt = _common_float_dtype(params=params, grads=grads, velocity=velocity)
    _check_shape("grads", grads, params.shape)
    if momentum != 0:
        if velocity is None:
            raise ValueError(
                f"velocity is None, expected an array of shape {params.shape} "
                f"when momentum is {momentum}"
            )
        _check_shape("velocity", velocity, params.shape)
    g = grads
    if weight_decay != 0:
        g = g + dt.type(weight_decay) * params  # a new array: grads stay untouched
    if momentum != 0:
        if first_step:
            velocity[...] = g
        else:
            velocity *= dt.type(momentum)
            velocity += dt.type(1 - dampening) * g
        if nesterov:
            g = g + dt.type(momentum) * velocity
        else:
            g = velocity
    params -= dt.type(lr) * g
