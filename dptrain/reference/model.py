"""Twins of the Model contract (any layer list; docs/core_api.md, "Model", and the header
comment of csrc/dp_model.h): dptrain._core.model_plan and Model's loss_grad, evaluate and
logits, with model_unflatten (the flat layout) and model_init_params (the initialization the
Python models use).

Written layer by layer in the list's order with the twins of the kernels (dense, conv, pool,
act, loss): conv -> ReLU -> 2x2 max-pool is computed in the textbook order ReLU-then-pool,
where the C core pools first, which gives the same values and gradients. model_init_params
also *defines* the parameter initialisation the models use."""

import math
import operator

import numpy as np

from ._common import _FLOAT_DTYPES, _check_ndim, _check_shape, _common_float_dtype
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
from .conv import conv2d_backward, conv2d_forward
from .dense import dense_backward, dense_forward
from .layers import (
    avgpool2_backward,
    avgpool2_forward,
    batchnorm_backward,
    batchnorm_forward,
    batchnorm_stats,
    batchnorm_update_running,
    dropout_backward,
    dropout_forward,
    dropout_mask,
    gap_backward,
    gap_forward,
    layernorm_backward,
    layernorm_forward,
)
from .loss import count_correct, sigmoid_bce, softmax_xent
from .pool import maxpool2_backward, maxpool2_forward

__all__ = [
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


# The loss names a Model takes.
MODEL_LOSSES = ("softmax_xent", "sigmoid_bce", "mse")


# Layer kinds and how many sizes each takes: (fewest, most); conv's padding may be left out.
LAYER_SIZES = {
    "dense": (1, 1),
    "conv": (2, 4),
    "maxpool2": (0, 0),
    "relu": (0, 0),
    "tanh": (0, 0),
    "sigmoid": (0, 0),
    "gelu": (0, 0),
    "flatten": (0, 0),
    "avgpool2": (0, 0),
    "globalavgpool": (0, 0),
    "dropout": (1, 1),
    "layernorm": (0, 0),
    "batchnorm": (0, 0),
    "res_begin": (0, 0),
    "res_end": (0, 0),
}


MODEL_MAX_LAYERS = 64  # DP_MODEL_MAX_LAYERS (csrc/dp_model.h)


_INT_MAX = 2**31 - 1  # every count the C kernels index with is a C int


_PTRDIFF_MAX = 2**63 - 1  # the flat parameter offsets are ptrdiff_t


_ACTIVATIONS = {  # kind -> (forward, backward, whether backward takes the input (else output))
    "relu": (relu_forward, relu_backward, False),
    "tanh": (tanh_forward, tanh_backward, False),
    "sigmoid": (sigmoid_forward, sigmoid_backward, False),
    "gelu": (gelu_forward, gelu_backward, True),
}


def _is_sequence(obj):
    """What the C parser takes as a sequence (PySequence_Check, a __getitem__ that is not a
    dict's), and not a str."""
    return hasattr(type(obj), "__getitem__") and not isinstance(obj, (str, dict))


def _model_layer(spec, i):
    """One layer spec normalized: ('dense', out), ('conv', out_channels, kernel, padding),
    ('conv', out_channels, kernel, padding, stride) for a stride above 1, ('dropout', p) or
    (kind,); TypeError/ValueError naming layers[i]."""
    if isinstance(spec, str):
        items = (spec,)
    elif _is_sequence(spec):
        items = tuple(spec)
    else:
        raise TypeError(
            f"layers[{i}] must be a layer name or a tuple (name, sizes...), got "
            f"{type(spec).__name__}"
        )
    if not items or not isinstance(items[0], str):
        raise TypeError(f"layers[{i}] = {spec!r}: the first entry must be the layer's name")
    kind = items[0]
    if kind not in LAYER_SIZES:
        raise ValueError(f"layers[{i}]: unknown layer {kind!r} (known: {', '.join(LAYER_SIZES)})")
    fewest, most = LAYER_SIZES[kind]
    if not fewest <= len(items) - 1 <= most:
        takes = {
            "dense": "one size: ('dense', out_features)",
            "conv": "('conv', out_channels, kernel[, padding[, stride]])",
            "dropout": "one rate: ('dropout', p)",
        }.get(kind, "no sizes")
        raise ValueError(f"layers[{i}] = {spec!r}: {kind!r} takes {takes}")
    if kind == "dropout":
        rate = items[1]
        if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)):
            raise TypeError(
                f"layers[{i}] = {spec!r}: dropout's rate must be a number, got "
                f"{type(rate).__name__}"
            )
        if not 0 <= float(rate) < 1:
            raise ValueError(f"layers[{i}] = {spec!r}: dropout's rate must be in [0, 1)")
        return ("dropout", float(rate))
    sizes = []
    for j, v in enumerate(items[1:], start=1):
        try:
            v = operator.index(v)  # int, bool, NumPy integers; not float
        except TypeError:
            raise TypeError(
                f"layers[{i}] = {spec!r}: sizes must be ints, got {type(v).__name__}"
            ) from None
        lowest = 0 if (kind, j) == ("conv", 3) else 1
        if not lowest <= v <= _INT_MAX:
            what = ("the output size", "the kernel size", "padding", "the stride")[j - 1]
            raise ValueError(f"layers[{i}] = {spec!r}: {what} must be {lowest}..{_INT_MAX}")
        sizes.append(int(v))
    if kind == "conv" and len(sizes) == 2:
        sizes.append(0)
    if kind == "conv" and len(sizes) == 4 and sizes[3] == 1:
        sizes.pop()  # stride 1: the spec of a conv without one
    return (kind, *sizes)


def _stride(sizes):
    """A conv spec's stride (1 where the spec leaves it out)."""
    return sizes[3] if len(sizes) > 3 else 1


def _model_input_shape(input_shape):
    if not _is_sequence(input_shape):
        raise TypeError(
            f"input_shape must be a tuple (F,) or (C, H, W), got {type(input_shape).__name__}"
        )
    shape = tuple(input_shape)
    if len(shape) not in (1, 3):
        raise ValueError(
            f"input_shape {input_shape!r} has {len(shape)} entries, expected (F,) or (C, H, W)"
        )
    try:
        shape = tuple(operator.index(v) for v in shape)
    except TypeError:
        raise TypeError(f"input_shape {input_shape!r}: sizes must be ints") from None
    if not all(1 <= v <= _INT_MAX for v in shape):
        raise ValueError(f"input_shape {input_shape!r}: sizes must be positive ints")
    if math.prod(shape) > _INT_MAX:
        raise ValueError(f"input_shape {input_shape!r}: the input size does not fit an int")
    return tuple(int(v) for v in shape)


def _layer_output(kind, sizes, shape):
    """(output shape, weight shape or None), or the reason the layer refuses its input
    shape as a str (the words of csrc/dp_model.c)."""
    if kind == "dense":
        return (sizes[0],), (sizes[0], math.prod(shape))
    if kind == "conv":
        if len(shape) != 3:
            return "conv needs a (C, H, W) input"
        (oc, k, pad), (c, h, w), st = sizes[:3], shape, _stride(sizes)
        if 2 * pad + max(h, w) > _INT_MAX:
            return "conv padding does not fit an int"
        if min(h, w) + 2 * pad < k:
            return "conv kernel larger than the padded input"
        oh, ow = (h + 2 * pad - k) // st + 1, (w + 2 * pad - k) // st + 1
        if max(oh, ow, c * k * k, oh * ow, oc * oh * ow) > _INT_MAX:
            return "conv sizes do not fit an int"
        return (oc, oh, ow), (oc, c, k, k)
    if kind == "maxpool2":
        if len(shape) != 3:
            return "max-pooling needs a (C, H, W) input"
        if min(shape[1:]) < 2:
            return "max-pooling needs a map of at least 2x2"
        return (shape[0], shape[1] // 2, shape[2] // 2), None
    if kind == "avgpool2":
        if len(shape) != 3:
            return "average pooling needs a (C, H, W) input"
        if min(shape[1:]) < 2:
            return "average pooling needs a map of at least 2x2"
        return (shape[0], shape[1] // 2, shape[2] // 2), None
    if kind == "globalavgpool":
        if len(shape) != 3:
            return "global average pooling needs a (C, H, W) input"
        return (shape[0],), None
    if kind == "layernorm":  # gamma and beta, one per feature
        return shape, (math.prod(shape),)
    if kind == "batchnorm":  # gamma and beta, one per channel (per feature on (F,))
        return shape, (shape[0],)
    if kind == "flatten":
        return (math.prod(shape),), None
    return shape, None  # an activation, dropout


def _projection_stride(h, w, oh, ow):
    """The stride of a 1x1 projection from (h, w) onto (oh, ow), or 0 (csrc/dp_model.c's)."""
    for s in range(1, max(h, w) + 1):
        if (h - 1) // s + 1 == oh and (w - 1) // s + 1 == ow:
            return s
    return 0


def _residual_output(begin, shape):
    """(shape, projection weight shape or None) of a res_end whose block took `begin` to
    `shape`, or the reason it cannot add them."""
    if begin == shape:
        return shape, None
    if len(begin) != 3 or len(shape) != 3:
        return (
            "a residual block on features must keep their number (its input is added to its output)"
        )
    if not _projection_stride(begin[1], begin[2], shape[1], shape[2]):
        return (
            "no 1x1 projection with a stride takes the residual block's input to its output's size"
        )
    return shape, (shape[0], begin[0], 1, 1)


def _residuals(plan):
    """{res_end index: (res_begin index, the projection's stride or 0)}."""
    out, opened = {}, []
    shapes = [tuple(plan["input_shape"])] + [tuple(s) for s in plan["shapes"]]
    for i, (kind, *_) in enumerate(plan["layers"]):
        if kind == "res_begin":
            opened.append(i)
        elif kind == "res_end":
            b = opened.pop()
            src, dst = shapes[b], shapes[i + 1]
            out[i] = (b, 0 if src == dst else _projection_stride(src[1], src[2], dst[1], dst[2]))
    return out


def model_plan(layers, input_shape, loss="softmax_xent"):
    """_core.model_plan: what Model(layers, input_shape, loss, ...) builds, without the C
    engine's fused 'stages' (its own business): a dict of
      'layers'       the specs normalized: ('dense', out), ('conv', OC, K, padding), (kind,);
      'input_shape'  (F,) or (C, H, W);
      'shapes'       each layer's output shape ((C, H, W) or (F,); flatten and dense give F);
      'n_params'     the length of the flat parameter array;
      'params'       per dense/conv layer, in list order: {'layer': its index, 'weight': the
                     offset of W, 'weight_shape': dense (OUT, IN) / conv (OC, C, K, K),
                     'bias': the offset of b, 'bias_shape': (OUT,)}; W then b, layer by layer;
      'loss'         the loss name.
    TypeError/ValueError naming the layer at fault (the C core's words), the input shape or
    the loss: a dense layer flattens its input, conv and maxpool2 need a (C, H, W) one, the
    kernel must fit the padded input, pooling a map of at least 2x2; at least one dense or
    conv layer; softmax_xent needs >= 2 outputs, sigmoid_bce exactly 1.
    """
    if not isinstance(loss, str):
        raise TypeError(f"loss must be a str, got {type(loss).__name__}")
    if loss not in MODEL_LOSSES:
        raise ValueError(f"loss must be one of {MODEL_LOSSES}, got {loss!r}")
    shape = in_shape = _model_input_shape(input_shape)
    if not _is_sequence(layers):
        raise TypeError(f"layers must be a list of layer specs, got {type(layers).__name__}")
    specs = list(layers)
    if not 1 <= len(specs) <= MODEL_MAX_LAYERS:
        raise ValueError(f"layers has {len(specs)} entries, expected 1 to {MODEL_MAX_LAYERS}")
    specs = [_model_layer(spec, i) for i, spec in enumerate(specs)]
    shapes, params, offset = [], [], 0
    opened = []  # the residual blocks open: (res_begin's index, its input shape)
    for i, (kind, *sizes) in enumerate(specs):
        if kind == "res_begin":
            if len(opened) == 8:
                raise ValueError(
                    f"layers[{i}] ('res_begin') gets a {shape} input: more than 8 residual "
                    f"blocks nested"
                )
            opened.append((i, shape))
        if kind == "res_end":
            if not opened:
                raise ValueError(
                    f"layers[{i}] ('res_end') gets a {shape} input: res_end without its res_begin"
                )
            out = _residual_output(opened.pop()[1], shape)
        else:
            out = _layer_output(kind, sizes, shape)
        if not isinstance(out, str) and out[1] is not None:
            n_weights = math.prod(out[1])
            if offset + n_weights + n_weights * (kind == "layernorm") + out[1][0] > _PTRDIFF_MAX:
                out = "parameter count overflows"
        if isinstance(out, str):
            raise ValueError(f"layers[{i}] ('{kind}') gets a {shape} input: {out}")
        shape, weight_shape = out
        if weight_shape is not None:  # W, then b (a layer norm's gamma, then beta)
            n_bias = n_weights if kind == "layernorm" else weight_shape[0]
            params.append(
                {
                    "layer": i,
                    "weight": offset,
                    "weight_shape": weight_shape,
                    "bias": offset + n_weights,
                    "bias_shape": (n_bias,),
                }
            )
            offset += n_weights + n_bias
        shapes.append(shape)
    if opened:
        b, s = opened[-1]
        raise ValueError(
            f"layers[{b}] ('res_begin') gets a {s} input: a residual block is not closed "
            f"(res_begin without res_end)"
        )
    if not params:
        raise ValueError(
            "layers has no dense, conv, layernorm or batchnorm layer: nothing to train"
        )
    n_out = math.prod(shape)
    need = {
        "softmax_xent": (n_out >= 2, "softmax cross-entropy needs >= 2 outputs"),
        "sigmoid_bce": (n_out == 1, "sigmoid BCE needs exactly 1 output"),
        "mse": (True, ""),
    }[loss]
    if not need[0]:
        last = len(specs) - 1
        raise ValueError(
            f"loss '{loss}' on this model: {need[1]}, but layers[{last}] "
            f"('{specs[last][0]}') gives {shape}"
        )
    return {
        "layers": specs,
        "input_shape": in_shape,
        "shapes": shapes,
        "n_params": offset,
        "params": params,
        "loss": loss,
    }


def _model_check(plan, params, x):
    """The rows of x (B, in_width), after checking params (n_params,) and x of one dtype."""
    _common_float_dtype(params=params, x=x)
    _check_shape("params", params, (plan["n_params"],))
    _check_ndim("x", x, (2,))
    in_width = math.prod(plan["input_shape"])
    _check_shape("x", x, (x.shape[0], in_width))
    return x.shape[0]


def _model_param_views(plan, flat):
    """{layer index: (W, b)}: views into the flat buffer, in model_plan's layout."""
    views = {}
    for e in plan["params"]:
        w = flat[e["weight"] : e["weight"] + math.prod(e["weight_shape"])]
        views[e["layer"]] = (
            w.reshape(e["weight_shape"]),
            flat[e["bias"] : e["bias"] + e["bias_shape"][0]],
        )
    return views


def model_unflatten(layers, input_shape, loss, flat):
    """[(W, b), ...] per dense/conv layer, in list order: views (not copies) into the 1-D
    flat buffer in model_plan's layout, dense W (OUT, IN) row-major, conv W (OC, C, K, K)."""
    plan = model_plan(layers, input_shape, loss)
    _check_shape("flat", flat, (plan["n_params"],))
    views = _model_param_views(plan, flat)
    return [views[e["layer"]] for e in plan["params"]]


def model_init_params(layers, input_shape, loss, seed, dtype=np.float32):
    """PyTorch's default init of nn.Linear and nn.Conv2d in the flat layout (the one
    dptrain.models uses); returns a new 1-D array.

    kaiming_uniform_(a=sqrt(5)) for W is the bound gain * sqrt(3 / fan_in) with gain =
    sqrt(2 / (1 + 5)), which is 1 / sqrt(fan_in), and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
    b; fan_in = IN for a dense layer, C K K for a conv; a layer norm's scale is 1 and its
    shift 0 (nn.LayerNorm's), drawing nothing. Draws come from
    np.random.default_rng(seed), layer by layer, W (in row-major order) then b, in float64,
    then are rounded to dtype.
    """
    dtype = np.dtype(dtype)
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"dtype is {dtype}, expected float32 or float64")
    rng = np.random.default_rng(seed)
    plan = model_plan(layers, input_shape, loss)
    flat = np.empty(plan["n_params"], dtype=dtype)
    for e, (w, b) in zip(plan["params"], model_unflatten(layers, input_shape, loss, flat)):
        if plan["layers"][e["layer"]][0] in ("layernorm", "batchnorm"):  # torch's: no draw
            w[...] = 1
            b[...] = 0
            continue
        bound = 1.0 / math.sqrt(math.prod(w.shape[1:]))
        w[...] = rng.uniform(-bound, bound, size=w.shape)
        b[...] = rng.uniform(-bound, bound, size=b.shape)
    return flat


def _rows(a):
    """a (B, ...) as (B, features): reshape(B, -1) cannot tell the width of an empty batch."""
    return a.reshape(len(a), math.prod(a.shape[1:]))


def model_state_size(plan):
    """The length of a model's running statistics (Model.state): 2 C per batch norm."""
    shapes = [tuple(plan["input_shape"])] + [tuple(s) for s in plan["shapes"]]
    return sum(2 * shapes[i][0] for i, spec in enumerate(plan["layers"]) if spec[0] == "batchnorm")


def _bn_views(plan, state):
    """{layer index: (running mean, running variance)}: views into state."""
    shapes = [tuple(plan["input_shape"])] + [tuple(s) for s in plan["shapes"]]
    out, off = {}, 0
    for i, spec in enumerate(plan["layers"]):
        if spec[0] == "batchnorm":
            c = shapes[i][0]
            out[i] = (state[off : off + c], state[off + c : off + 2 * c])
            off += 2 * c
    return out


def _channels(h):
    """h (B, C, H, W) or (B, F) as (B, C, HW) (F channels of 1 value)."""
    return h.reshape(h.shape[0], h.shape[1], math.prod(h.shape[2:]))


def _model_forward(plan, params, x, rng=None, state=None, batch_stats=None):
    """(acts, codes): acts[l] is layer l's input and acts[l + 1] its output, each
    (B, *shape); codes[l] a maxpool2 layer's argmax codes, a dropout layer's mask. Written
    layer by layer, in the list's order (the C core fuses some, with the same values; see
    csrc/dp_model.h). rng = (seed, step, row0) trains (dropout draws its masks, batch norm
    uses the batch's statistics, recorded in batch_stats[i] = (mean, var, n)); None evaluates
    (dropout passes its input on, batch norm uses the running statistics in state)."""
    batch, dt = x.shape[0], params.dtype
    weights = _model_param_views(plan, params)
    residuals = _residuals(plan)
    acts, codes = [x.reshape((batch, *plan["input_shape"]))], {}
    for i, (kind, *sizes) in enumerate(plan["layers"]):
        h = acts[-1]
        y = np.empty((batch, *plan["shapes"][i]), dt)
        if kind == "res_begin":
            y = h.copy()
        elif kind == "res_end":  # the block's output plus its input (projected)
            b, stride = residuals[i]
            src = acts[b + 1]
            if stride:
                proj = np.empty_like(y)
                conv2d_forward(src, *weights[i], proj, stride=stride)
                y = h + proj
            else:
                y = h + src
        elif kind == "dense":
            dense_forward(_rows(h), *weights[i], y)
        elif kind == "conv":
            conv2d_forward(h, *weights[i], y, padding=sizes[2], stride=_stride(sizes))
        elif kind == "maxpool2":
            codes[i] = np.empty(y.shape, np.uint8)
            maxpool2_forward(h, y, codes[i])
        elif kind == "flatten":
            y = h.reshape(y.shape)
        elif kind == "avgpool2":
            y = avgpool2_forward(h)
        elif kind == "globalavgpool":
            y = gap_forward(h)
        elif kind == "dropout":
            if rng is None:
                y = h.copy()
            else:
                seed, step, row0 = rng
                rows = np.arange(row0, row0 + batch, dtype=np.int64)
                codes[i] = dropout_mask(seed, step, rows, math.prod(h.shape[1:]), sizes[0], i)
                y = dropout_forward(_rows(h), sizes[0], codes[i]).reshape(h.shape)
        elif kind == "layernorm":
            gamma, beta = weights[i]
            y = layernorm_forward(_rows(h), gamma, beta).reshape(h.shape)
        elif kind == "batchnorm":
            gamma, beta = weights[i]
            if rng is None:
                rm, rv = _bn_views(plan, state)[i] if state is not None else (None, None)
                c = h.shape[1]
                mean = np.zeros(c) if rm is None else rm
                var = np.ones(c) if rv is None else rv
            else:
                mean, var, n = batchnorm_stats(_channels(h))
                if n == 1:  # the engine's DP_EBNSINGLE
                    raise ValueError(
                        "a batch norm in training got one value per channel: its variance is 0"
                    )
                if batch_stats is not None:
                    batch_stats[i] = (mean, var, n)
            y = batchnorm_forward(_channels(h), gamma, beta, mean, var).reshape(h.shape)
        else:
            _ACTIVATIONS[kind][0](h, y)
        acts.append(y)
    return acts, codes


def _model_backward(plan, params, grads, acts, codes, dout, batch_stats=None):
    """ACCUMULATES d(loss)/d(params) into grads from dout = d(loss)/d(outputs), last layer
    first, down to the first dense/conv layer (nothing below it has a parameter)."""
    weights, grad_views = _model_param_views(plan, params), _model_param_views(plan, grads)
    residuals, skip_grads = _residuals(plan), {}
    first = plan["params"][0]["layer"]
    d = dout
    for i in range(len(plan["layers"]) - 1, first - 1, -1):
        kind, *sizes = plan["layers"][i]
        h, y = acts[i], acts[i + 1]
        d = d.reshape(y.shape)
        dx = np.empty_like(h) if i > first else None
        if kind == "res_end":  # d to the block as it is, and to the skip connection
            b, stride = residuals[i]
            src = acts[b + 1]
            if stride:
                dsrc = np.empty_like(src)
                conv2d_backward(d, src, weights[i][0], *grad_views[i], dsrc, stride=stride)
                skip_grads[b] = dsrc
            else:
                skip_grads[b] = d.copy()
            dx = d
        elif kind == "res_begin":
            dx = d + skip_grads.pop(i)
        elif kind == "dense":
            dense_backward(
                d, _rows(h), weights[i][0], *grad_views[i], None if dx is None else _rows(dx)
            )
        elif kind == "conv":
            conv2d_backward(
                d, h, weights[i][0], *grad_views[i], dx, padding=sizes[2], stride=_stride(sizes)
            )
        elif kind == "maxpool2":
            maxpool2_backward(d, codes[i], dx)
        elif kind == "avgpool2":
            dx = avgpool2_backward(d, h.shape)
        elif kind == "globalavgpool":
            dx = gap_backward(d, h.shape)
        elif kind == "dropout":
            dx = dropout_backward(_rows(d), sizes[0], codes[i]).reshape(h.shape)
        elif kind == "layernorm":
            dg, db = grad_views[i]
            dxr = layernorm_backward(_rows(d), _rows(h), weights[i][0], dg, db, dx is not None)
            dx = None if dxr is None else dxr.reshape(h.shape)
        elif kind == "batchnorm":
            dg, db = grad_views[i]
            mean, var, _ = batch_stats[i]
            dxr = batchnorm_backward(
                _channels(d), _channels(h), weights[i][0], mean, var, dg, db, dx is not None
            )
            dx = None if dxr is None else dxr.reshape(h.shape)
        elif kind == "flatten":
            dx = d.reshape(h.shape)
        else:
            forward, backward, from_input = _ACTIVATIONS[kind]
            backward(d, h if from_input else y, dx)
        d = dx


def _model_loss(plan, outputs, labels, doutputs=None, grad_scale=None):
    """(loss_sum, n_correct) of the (B, OUT) outputs; labels are int64 class labels, or the
    (B, OUT) targets for 'mse' (n_correct is then 0)."""
    if plan["loss"] == "mse":
        return mse(outputs, labels, doutputs, grad_scale), 0
    fn = softmax_xent if plan["loss"] == "softmax_xent" else sigmoid_bce
    return fn(outputs, labels, doutputs, grad_scale), count_correct(outputs, labels)


def model_loss_grad(
    layers, input_shape, loss, params, grads, x, labels, grad_scale=None, rng=(0, 0, 0), state=None
):
    """Model.loss_grad: forward and backward on one batch -> (loss_sum, n_correct).

    x is (B, in_width) flat rows (a (C, H, W) input in C, H, W order); labels are int64 (B,)
    class labels for softmax_xent / sigmoid_bce, or the (B, OUT) float targets of the
    params' dtype for mse (loss_sum = sum of squared errors, n_correct = 0). The gradient of
    grad_scale * loss_sum is ACCUMULATED into grads (grad_scale defaults to 1/B). An empty
    batch gives (0.0, 0) and leaves grads as they are. rng = (seed, step, row0): dropout's key
    (Model.set_rng's). state: the batch norms' running statistics (Model.state), updated in
    place from the batch's when the call succeeds (None: not kept).
    """
    plan = model_plan(layers, input_shape, loss)
    batch = _model_check(plan, params, x)
    _common_float_dtype(params=params, grads=grads)
    _check_shape("grads", grads, params.shape)
    batch_stats = {}
    acts, codes = _model_forward(plan, params, x, rng, batch_stats=batch_stats)
    outputs = _rows(acts[-1])
    dout = np.empty_like(outputs)
    result = _model_loss(plan, outputs, labels, dout, grad_scale)
    if batch:
        _model_backward(plan, params, grads, acts, codes, dout, batch_stats)
        if state is not None:
            for i, (rm, rv) in _bn_views(plan, state).items():
                batchnorm_update_running(rm, rv, *batch_stats[i])
    return result


def model_evaluate(layers, input_shape, loss, params, x, labels, state=None):
    """Model.evaluate: forward only -> (loss_sum, n_correct) (labels as in model_loss_grad);
    batch norm by the running statistics in state (None: PyTorch's initial 0 and 1)."""
    plan = model_plan(layers, input_shape, loss)
    _model_check(plan, params, x)
    return _model_loss(plan, _rows(_model_forward(plan, params, x, state=state)[0][-1]), labels)


def model_logits(layers, input_shape, loss, params, x, out, state=None):
    """Model.logits: forward only, writes the (B, OUT) outputs into out (state: as
    model_evaluate's)."""
    plan = model_plan(layers, input_shape, loss)
    batch = _model_check(plan, params, x)
    _common_float_dtype(params=params, out=out)
    _check_shape("out", out, (batch, math.prod(plan["shapes"][-1])))
    out[...] = _rows(_model_forward(plan, params, x, state=state)[0][-1])
