"""Pure-NumPy reference of the C core (dptrain._core): the readable spec and the test oracle.

Every function here has the name, argument order, keywords and in-place semantics of its C
twin in docs/core_api.md, so a test can hand both the same arrays and compare the outputs:
results are written into the output arrays the contract names, gradients are accumulated
(``+=``) where it says so, and the same value is returned. ``ctx`` arguments (the C core's
scratch context) are accepted and ignored.

Dimension letters: B batch, IN/OUT features of a dense layer, C classes, M/N/K of a GEMM.

Arithmetic is done in the arrays' own dtype (float32 or float64), so the reference rounds
the way a straightforward C kernel would; only the returned loss sums are accumulated in
float64. Scalars (alpha, lr, ...) are converted to that dtype first, so NumPy's promotion
rules (which changed in NumPy 2, NEP 50) never silently widen a float32 computation. uint16
arrays hold bfloat16 values (to_bf16, from_bf16, sum_buffers), computed in float32.

Left out on purpose: speed (this is the spec, not a fallback), and the C boundary's full
validation (C-contiguity, writeability). Shapes, float dtypes and label ranges are checked,
raising ValueError/TypeError in the contract's words, because a wrong-shaped oracle call
that NumPy broadcasts into "agreement" would be a test that cannot fail.

One module per family of the C core, named as its csrc/dp_*.h, so that a kernel, its twin
and its tests (tests/test_<family>.py) are one name apart:

    gemm       gemm                                   csrc/dp_gemm.h
    dense      dense_forward, dense_backward          csrc/dp_dense.h
    act        relu_*, tanh_*, sigmoid_*, gelu_*, mse csrc/dp_act.h
    loss       softmax_xent, sigmoid_bce, argmax, count_correct    csrc/dp_loss.h
    sgd        sgd_step                               csrc/dp_sgd.h
    adam       adam_step, rmsprop_step                csrc/dp_adam.h
    buffers    sum_buffers, scale_, to_bf16, from_bf16, sum_squares  csrc/dp_buffers.h
    allreduce  allreduce, allreduce_slice             csrc/dp_allreduce.h
    conv       conv2d_forward, conv2d_backward        csrc/dp_conv.h
    pool       maxpool2_forward, maxpool2_backward    csrc/dp_pool.h
    layers     avgpool2_*, gap_*, dropout_*, layernorm_*   csrc/dp_layers.h
    model      model_plan, model_loss_grad, ... (the Model contract)    csrc/dp_model.h

This package re-exports every twin: ``reference.softmax_xent`` is
``reference.loss.softmax_xent``. ``reference.gemm`` and ``reference.allreduce`` are the
functions, which shadow their modules as attributes of the package (their other names come
with ``from dptrain.reference.allreduce import allreduce_slice``).
"""

from .act import (
    gelu_backward,
    gelu_forward,
    mse,
    relu_backward,
    relu_forward,
    sigmoid_backward,
    sigmoid_forward,
    tanh_backward,
    tanh_forward,
)
from .adam import adam_step, rmsprop_step
from .allreduce import ALLREDUCE_ALGORITHMS, allreduce, allreduce_slice
from .buffers import augment_images, from_bf16, scale_, sum_buffers, sum_squares, to_bf16
from .conv import conv2d_backward, conv2d_forward
from .dense import dense_backward, dense_forward
from .gemm import gemm
from .layers import (
    LAYERNORM_EPS,
    avgpool2_backward,
    avgpool2_forward,
    dropout_backward,
    dropout_forward,
    dropout_mask,
    gap_backward,
    gap_forward,
    layernorm_backward,
    layernorm_forward,
)
from .loss import argmax, count_correct, sigmoid_bce, softmax_xent
from .model import (
    LAYER_SIZES,
    MODEL_LOSSES,
    MODEL_MAX_LAYERS,
    model_evaluate,
    model_init_params,
    model_logits,
    model_loss_grad,
    model_plan,
    model_unflatten,
)
from .pool import maxpool2_backward, maxpool2_forward
from .sgd import sgd_step

__all__ = [
    "gemm",
    "dense_forward",
    "dense_backward",
    "relu_forward",
    "relu_backward",
    "softmax_xent",
    "sigmoid_bce",
    "argmax",
    "count_correct",
    "sgd_step",
    "adam_step",
    "rmsprop_step",
    "sum_buffers",
    "to_bf16",
    "from_bf16",
    "scale_",
    "sum_squares",
    "augment_images",
    "allreduce",
    "allreduce_slice",
    "ALLREDUCE_ALGORITHMS",
    "conv2d_forward",
    "conv2d_backward",
    "maxpool2_forward",
    "maxpool2_backward",
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
    "tanh_forward",
    "tanh_backward",
    "sigmoid_forward",
    "sigmoid_backward",
    "gelu_forward",
    "gelu_backward",
    "mse",
    "model_plan",
    "model_unflatten",
    "model_init_params",
    "model_loss_grad",
    "model_evaluate",
    "model_logits",
    "MODEL_LOSSES",
    "LAYER_SIZES",
    "MODEL_MAX_LAYERS",
]
