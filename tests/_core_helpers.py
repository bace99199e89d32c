"""Helpers the C core's test files share (imported as ``_core_helpers``: conftest.py puts
this folder on sys.path; tests/fuzz_core.py, run as a script, finds it beside itself).

- the layer lists of the two model shapes the tests build again and again on ``_core.Model``:
  a stack of dense layers with ReLU between them (an MLP) and conv -> ReLU -> 2x2 max-pool
  blocks followed by such a stack (a CNN);
- tolerances and data: per-dtype RTOL, seeded generators, assert_close (|c - ref| <= RTOL
  sqrt(K) scale), central finite differences;
- the boundary table: one valid call per kernel (make_calls), the ways to break it, and
  family_tests, which makes a family's test file run every table-driven boundary check
  (dtype, ndim, shape, layout, writeability, aliasing, scalars, arguments by name, reference
  leaks, the GIL) on that family's kernels;
- threads: run_threads (thunks released together), run_workers and control_block (a
  shared-memory group of thread workers).
"""

import functools
import itertools
import math
import sys
import threading
import zlib
from dataclasses import dataclass, field

import numpy as np
import pytest

from dptrain import _core as core
from dptrain import reference as ref
from dptrain.models import CNN

# ---------------------------------------------------------------------------------------
# layer lists


def dense_stack(sizes):
    """The layer list of dense layers of widths sizes[1:] on sizes[0] inputs, ReLU between
    them and none after the last: [('dense', sizes[1]), 'relu', ..., ('dense', sizes[-1])]."""
    out = []
    for i, width in enumerate(sizes[1:]):
        out += (["relu"] if i else []) + [("dense", width)]
    return out


def conv_blocks(channels, dense, kernel=3, padding=0):
    """The layer list of len(channels) blocks conv(kernel x kernel, padding) -> ReLU -> 2x2
    max-pool, then flatten and dense layers of widths `dense` with ReLU between them (the
    last width is the class count)."""
    out = []
    for oc in channels:
        out += [("conv", oc, kernel, padding), "relu", "maxpool2"]
    return out + ["flatten"] + dense_stack((None, *dense))


def mlp_spec(sizes, loss="softmax_xent"):
    """(layers, input_shape, loss) of the dense stack `sizes` = (IN, H1, ..., OUT): the leading
    arguments of _core.Model, _core.model_plan and the reference's model_* twins."""
    return dense_stack(sizes), (sizes[0],), loss


def cnn_spec(input_shape, channels, dense, kernel=3, padding=0):
    """(layers, input_shape, loss) of conv_blocks on a (C, H, W) input, softmax
    cross-entropy, as mlp_spec."""
    return conv_blocks(channels, dense, kernel, padding), tuple(input_shape), "softmax_xent"


# ---------------------------------------------------------------------------------------
# tolerances and data


DTYPES = [np.float32, np.float64]


# Error per unit of scale and per sqrt(reduction length): ~170 float32 ulps, ~9000 float64
# ulps, far below the O(1) error of a wrong index and far above rounding-order differences.
RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def dname(dtype):
    return np.dtype(dtype).name


def rng_for(*key):
    """A generator seeded by the test's parameters: reproducible, different per case."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def assert_close(got, want, *, dtype, scale, k=1, what):
    """|got - want| <= RTOL[dtype] * sqrt(k) * scale, elementwise (scale: array or scalar)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    tol = RTOL[np.dtype(dtype)] * math.sqrt(max(k, 1)) * np.asarray(scale, dtype=np.float64)
    tol = np.broadcast_to(tol, want.shape)
    err = np.abs(got - want)
    bad = ~(err <= tol)  # also true where got is NaN
    if bad.any():
        ratio = np.where(bad, np.nan_to_num(err / np.maximum(tol, 1e-300), nan=np.inf), 0)
        i = np.unravel_index(int(np.argmax(ratio)), want.shape) if want.ndim else ()
        pytest.fail(
            f"{what}: {int(bad.sum())} of {bad.size} values off; worst at {i}: "
            f"got {got[i]!r}, expected {want[i]!r} (tolerance {tol[i]:.3g})"
        )


def shape_id(shape):
    return "x".join(str(s) for s in shape)


def shape_params(shapes):
    """pytest.param per shape tuple, with an id such as 128x256x784."""
    return [pytest.param(*s, id=shape_id(s)) for s in shapes]


def numeric_grad(f, arr, eps=1e-6):
    """Central differences of the scalar f() with respect to every entry of arr (in place)."""
    grad = np.empty(arr.shape)
    flat, gflat = arr.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + eps
        f_plus = f()
        flat[i] = keep - eps
        f_minus = f()
        flat[i] = keep
        gflat[i] = (f_plus - f_minus) / (2 * eps)
    return grad


# The convolution's form of the bound: scale (the sum of |terms|) positional, never 0.
def assert_close_terms(got, want, scale, *, dtype, k, what):
    """|got - want| <= RTOL[dtype] * sqrt(k) * scale elementwise (scale: sum of |terms|)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    tol = RTOL[np.dtype(dtype)] * math.sqrt(max(k, 1)) * (np.asarray(scale, np.float64) + 1e-30)
    err = np.abs(got - want)
    bad = ~(err <= tol)
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, err / tol, 0))), want.shape)
        pytest.fail(
            f"{what}: {int(bad.sum())} of {bad.size} values off; worst at {i}: got "
            f"{got[i]!r}, expected {want[i]!r} (tolerance {tol[i]:.3g})"
        )


def conv_data(shape, pad, dtype, tag=""):
    b, c, h, w, oc, kh, kw = shape
    rng = rng_for("conv", shape, pad, dname(dtype), tag)
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    x = rng.standard_normal((b, c, h, w)).astype(dtype)
    wt = rng.standard_normal((oc, c, kh, kw)).astype(dtype)
    bias = rng.standard_normal(oc).astype(dtype)
    dy = rng.standard_normal((b, oc, oh, ow)).astype(dtype)
    return x, wt, bias, dy


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def conv_args(dtype=np.float32):
    x, w, b, dy = conv_data((2, 3, 7, 6, 4, 3, 3), 0, dtype)
    return x, w, b, np.empty(dy.shape, dtype), dy


BAD_CALLS = {
    "x dtype": (
        lambda x, w, b, y, dy: core.conv2d_forward(x.astype(np.float16), w, b, y),
        TypeError,
        "x has dtype float16, expected float32 or float64",
    ),
    "w dtype": (
        lambda x, w, b, y, dy: core.conv2d_forward(x, w.astype(np.float64), b, y),
        TypeError,
        "w has dtype float64, expected float32 \\(the dtype of x\\)",
    ),
    "x ndim": (
        lambda x, w, b, y, dy: core.conv2d_forward(x[0], w, b, y),
        ValueError,
        "x has shape \\(3, 7, 6\\), expected a 4-D array",
    ),
    "channels": (
        lambda x, w, b, y, dy: core.conv2d_forward(x, w[:, :2].copy(), b, y),
        ValueError,
        "w.shape\\[1\\] must be x's channel count 3",
    ),
    "y shape": (
        lambda x, w, b, y, dy: core.conv2d_forward(x, w, b, np.empty((2, 4, 4, 4), np.float32)),
        ValueError,
        "y has shape \\(2, 4, 4, 4\\), expected \\(2, 4, 5, 4\\)",
    ),
    "b shape": (
        lambda x, w, b, y, dy: core.conv2d_forward(x, w, b[:3], y),
        ValueError,
        "b has shape \\(3,\\), expected \\(4,\\)",
    ),
    "kernel too big": (
        lambda x, w, b, y, dy: core.conv2d_forward(
            np.ascontiguousarray(x[:, :, :2]), w, b, np.empty((2, 4, 1, 4), np.float32)
        ),
        ValueError,
        "3x3 kernel is larger than the 2x6 input",
    ),
    "padding": (
        lambda x, w, b, y, dy: core.conv2d_forward(x, w, b, y, padding=-1),
        ValueError,
        "padding must be >= 0, got -1",
    ),
    "not contiguous": (
        lambda x, w, b, y, dy: core.conv2d_forward(x[:, :, :, ::-1], w, b, y),
        ValueError,
        "x must be C-contiguous",
    ),
    "read-only y": (
        lambda x, w, b, y, dy: core.conv2d_forward(x, w, b, _readonly(y)),
        ValueError,
        "y is read-only",
    ),
    "y aliases x": (
        lambda x, w, b, y, dy: core.conv2d_forward(
            x, w, b, x.reshape(-1)[: y.size].reshape(y.shape)
        ),
        ValueError,
        "y shares memory with x",
    ),
    "dy shape": (
        lambda x, w, b, y, dy: core.conv2d_backward(
            dy[:1], x, w, np.zeros_like(w), np.zeros_like(b)
        ),
        ValueError,
        "dy has shape \\(1, 4, 5, 4\\), expected \\(2, 4, 5, 4\\)",
    ),
    "dw shape": (
        lambda x, w, b, y, dy: core.conv2d_backward(
            dy, x, w, np.zeros_like(w)[:2], np.zeros_like(b)
        ),
        ValueError,
        "dw has shape \\(2, 3, 3, 3\\), expected \\(4, 3, 3, 3\\)",
    ),
    "dx aliases x": (
        lambda x, w, b, y, dy: core.conv2d_backward(dy, x, w, w.copy(), np.zeros_like(b), x),
        ValueError,
        "dx shares memory with x",
    ),
    "ctx": (
        lambda x, w, b, y, dy: core.conv2d_forward(x, w, b, y, ctx="fast"),
        TypeError,
        "ctx must be a dptrain._core.Context or None, got str",
    ),
    "pool idx dtype": (
        lambda x, w, b, y, dy: core.maxpool2_forward(
            x, np.empty((2, 3, 3, 3), np.float32), np.empty((2, 3, 3, 3), np.int64)
        ),
        TypeError,
        "idx has dtype int64, expected uint8",
    ),
    "pool y shape": (
        lambda x, w, b, y, dy: core.maxpool2_forward(
            x, np.empty((2, 3, 3, 2), np.float32), np.empty((2, 3, 3, 2), np.uint8)
        ),
        ValueError,
        "y has shape \\(2, 3, 3, 2\\), expected \\(2, 3, 3, 3\\)",
    ),
    "pool too small": (
        lambda x, w, b, y, dy: core.maxpool2_forward(
            np.ascontiguousarray(x[:, :, :1]),
            np.empty((2, 3, 0, 3), np.float32),
            np.empty((2, 3, 0, 3), np.uint8),
        ),
        ValueError,
        "2x2 pooling needs H >= 2 and W >= 2",
    ),
    "pool idx value": (
        lambda x, w, b, y, dy: core.maxpool2_backward(
            np.ones((2, 3, 3, 3), np.float32), np.full((2, 3, 3, 3), 4, np.uint8), x
        ),
        ValueError,
        "idx holds 4 at flat position 0: a window position is 0..3",
    ),
}


def check_bad_kernel_arguments_are_named(name):
    """BAD_CALLS[name] raises its exception and message and modifies no argument."""
    fn, exc, pattern = BAD_CALLS[name]
    args = conv_args()
    before = [a.copy() for a in args]
    with pytest.raises(exc, match=pattern):
        fn(*args)
    for a, b in zip(args, before):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: an argument was modified")


# (input_shape, channels, dense, kernel, padding)
NETS = [
    ((1, 12, 10), (3, 4), (6, 5), 3, 0),
    ((2, 9, 9), (4,), (7, 3), 3, 1),
    ((3, 8, 8), (2, 3), (4,), 1, 0),
    ((3, 9, 7), (2, 3), (4,), 1, 0),
    ((1, 28, 28), (32, 64), (128, 10), 3, 0),
    ((3, 32, 32), (32, 64), (128, 10), 3, 0),
]


def blocks_id(case):
    shape, ch, dense, k, p = case
    dims = "x".join(map(str, shape))
    return f"{dims}-c{'.'.join(map(str, ch))}-d{'.'.join(map(str, dense))}-k{k}p{p}"


def blocks_data(case, dtype, batch=13, tag=""):
    shape, ch, dense, k, p = case
    params = ref.model_init_params(*cnn_spec(shape, ch, dense, k, p), 1, dtype)
    rng = rng_for("net", case, dname(dtype), tag)
    x = rng.standard_normal((batch, math.prod(shape))).astype(dtype)
    labels = rng.integers(0, dense[-1], batch)
    start = rng.standard_normal(params.size).astype(dtype)
    return params, x, labels, start


def small_convnet(threads=1, dtype=np.float32):
    case = ((2, 8, 7), (3,), (5, 4), 3, 1)
    params, x, labels, _ = blocks_data(case, dtype, batch=9)
    grads = np.zeros_like(params)
    return core.Model(*cnn_spec(*case[:3], 3, 1), params, grads, threads=threads), x, labels


def small_net(loss="softmax_xent", sizes=(6, 5, 3), dtype=np.float64, batch=9):
    params = ref.model_init_params(*mlp_spec(sizes, loss), seed=0, dtype=dtype)
    grads = np.zeros_like(params)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, sizes[0])).astype(dtype)
    labels = rng.integers(0, 2 if loss == "sigmoid_bce" else sizes[-1], batch)
    return params, grads, x, labels


# ---------------------------------------------------------------------------------------
# threads


def control_block():
    raw = np.zeros(192, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off : off + 64]


def run_workers(n, fn):
    """Runs fn(rank) on n threads; returns the results, re-raising the first exception."""
    results, errors = [None] * n, []

    def wrap(r):
        try:
            results[r] = fn(r)
        except BaseException as exc:  # collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a worker thread hung"
    if errors:
        raise errors[0]
    return results


# ---------------------------------------------------------------------------------------
# the boundary table: a valid call per kernel, which the checks break one argument at a time


JOIN_TIMEOUT_S = 60  # a deadlocked thread fails the test instead of hanging the run


@dataclass
class Call:
    """fn(*args.values(), **kwargs); `outputs` names the arguments the kernel writes."""

    fn: object
    args: dict
    kwargs: dict = field(default_factory=dict)
    outputs: tuple = ()

    def __call__(self):
        return self.fn(*self.args.values(), **self.kwargs)

    def get(self, name):
        if name.startswith("inputs["):
            return self.args["inputs"][int(name[7:-1])]
        return self.args[name]

    def replaced(self, name, value):
        args = dict(self.args)
        if name.startswith("inputs["):
            inputs = list(args["inputs"])
            inputs[int(name[7:-1])] = value
            args["inputs"] = inputs
        else:
            args[name] = value
        return Call(self.fn, args, dict(self.kwargs), self.outputs)

    def array_names(self):
        names = []
        for name, value in self.args.items():
            if isinstance(value, np.ndarray):
                names.append(name)
            elif name == "inputs":
                names += [f"inputs[{i}]" for i in range(len(value))]
        return names

    def arrays(self):
        return {name: self.get(name) for name in self.array_names()}


def make_calls(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)

    def f(*shape):
        return rng.standard_normal(shape).astype(dtype)

    labels4 = rng.integers(0, 4, 7)
    labels2 = rng.integers(0, 2, 7)
    return {
        "gemm": Call(
            core.gemm, dict(a=f(7, 5), b=f(5, 3), c=f(7, 3)), dict(alpha=1.5, beta=0.5), ("c",)
        ),
        "gemm_naive": Call(
            core.gemm_naive,
            dict(a=f(7, 5), b=f(5, 3), c=f(7, 3)),
            dict(alpha=1.5, beta=0.5),
            ("c",),
        ),
        "dense_forward": Call(
            core.dense_forward, dict(x=f(7, 5), w=f(3, 5), b=f(3), y=f(7, 3)), outputs=("y",)
        ),
        "dense_backward": Call(
            core.dense_backward,
            dict(dy=f(7, 3), x=f(7, 5), w=f(3, 5), dw=f(3, 5), db=f(3), dx=f(7, 5)),
            outputs=("dw", "db", "dx"),
        ),
        "relu_forward": Call(core.relu_forward, dict(x=f(7, 5), y=f(7, 5)), outputs=("y",)),
        "relu_backward": Call(
            core.relu_backward, dict(dy=f(7, 5), y=f(7, 5), dx=f(7, 5)), outputs=("dx",)
        ),
        "softmax_xent": Call(
            core.softmax_xent,
            dict(logits=f(7, 4), labels=labels4, dlogits=f(7, 4), grad_scale=0.5),
            outputs=("dlogits",),
        ),
        "sigmoid_bce": Call(
            core.sigmoid_bce,
            dict(logits=f(7), labels=labels2, dlogits=f(7), grad_scale=0.5),
            outputs=("dlogits",),
        ),
        "argmax": Call(core.argmax, dict(x=f(7, 4), out=np.zeros(7, np.int64)), outputs=("out",)),
        "count_correct": Call(core.count_correct, dict(logits=f(7, 4), labels=labels4)),
        "sgd_step": Call(
            core.sgd_step,
            dict(params=f(9), grads=f(9), velocity=f(9)),
            dict(lr=0.1, momentum=0.9, weight_decay=0.01),
            ("params", "velocity"),
        ),
        "sum_buffers": Call(
            core.sum_buffers, dict(out=f(9), inputs=[f(9), f(9)]), dict(scale=0.5), ("out",)
        ),
        "scale_": Call(core.scale_, dict(buf=f(9), alpha=0.5), outputs=("buf",)),
        "sum_squares": Call(core.sum_squares, dict(x=f(9))),
        "augment_images": Call(
            core.augment_images,
            dict(x=f(4, 12), out=f(4, 12), ids=np.arange(4, dtype=np.int64)),
            dict(shape=(1, 3, 4), pad=1, flip=True, seed=1, epoch=0),
            ("out",),
        ),
        # (last: its draws leave the other calls' values as they were)
        "adam_step": Call(
            core.adam_step,
            dict(
                params=f(9),
                grads=f(9),
                exp_avg=f(9),
                exp_avg_sq=f(9) ** 2,
                max_exp_avg_sq=f(9) ** 2,
            ),
            dict(step=3, lr=0.01, weight_decay=0.01, amsgrad=True),
            ("params", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
        ),
        "rmsprop_step": Call(
            core.rmsprop_step,
            dict(
                params=f(9),
                grads=f(9),
                square_avg=f(9) ** 2 + 1,
                grad_avg=f(9) * 0.1,
                momentum_buffer=f(9),
            ),
            dict(lr=0.01, weight_decay=0.01, momentum=0.9, centered=True),
            ("params", "square_avg", "grad_avg", "momentum_buffer"),
        ),
    }


KERNELS = list(make_calls())


def float_names(call):
    return [name for name in call.array_names() if call.get(name).dtype.kind == "f"]


def float_array_params(min_floats=1, kernels=KERNELS):
    """(kernel, argument) for every float array argument of kernels with >= min_floats."""
    return [
        pytest.param(k, name, id=f"{k}-{name}")
        for k, call in make_calls().items()
        if len(float_names(call)) >= min_floats and k in kernels
        for name in float_names(call)
    ]


def all_array_params(min_ndim=1, required_only=False, kernels=KERNELS):
    """(kernel, argument) for every array argument; optionally only those with ndim >=
    min_ndim, or only those that may not be None (dx, dlogits, velocity, max_exp_avg_sq,
    grad_avg, momentum_buffer are optional)."""
    optional = ("dx", "dlogits", "velocity", "max_exp_avg_sq", "grad_avg", "momentum_buffer")
    return [
        pytest.param(k, name, id=f"{k}-{name}")
        for k, call in make_calls().items()
        if k in kernels
        for name in call.array_names()
        if call.get(name).ndim >= min_ndim and not (required_only and name in optional)
    ]


def output_params(kernels=KERNELS):
    return [
        pytest.param(k, name, id=f"{k}-{name}")
        for k, call in make_calls().items()
        if k in kernels
        for name in call.outputs
    ]


def snapshot(call):
    return {name: arr.copy() for name, arr in call.arrays().items() if isinstance(arr, np.ndarray)}


def assert_unchanged(call, before, what, names=None):
    for name in before if names is None else names:
        np.testing.assert_array_equal(
            call.get(name), before[name], err_msg=f"{what} modified {name}"
        )


def assert_rejected(call, exc, *fragments, what="", unchanged=None):
    """call() raises exc whose message contains every fragment; the arrays named in
    `unchanged` (default: all) are not modified."""
    before = snapshot(call)
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{what}: message {msg!r} does not mention {frag!r}"
    assert_unchanged(call, before, f"{what} (rejected)", unchanged)
    return msg


def shape_text(shape):
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


# (label, kernel, argument, replacement shape, expected message fragment); 2-D shapes
SHAPE_MESSAGES = [
    ("gemm-b", "gemm", "b", (4, 3), "b has shape (4, 3), expected (5, 3)"),
    ("gemm-c", "gemm", "c", (7, 4), "c has shape (7, 4), expected (7, 3)"),
    ("gemm_naive-c", "gemm_naive", "c", (6, 3), "c has shape (6, 3), expected (7, 3)"),
    ("dense_forward-w", "dense_forward", "w", (3, 6), "w has shape (3, 6), expected (3, 5)"),
    ("dense_forward-y", "dense_forward", "y", (7, 4), "y has shape (7, 4), expected (7, 3)"),
    ("dense_backward-x", "dense_backward", "x", (6, 5), "x has shape (6, 5), expected (7, 5)"),
    ("dense_backward-dw", "dense_backward", "dw", (3, 4), "dw has shape (3, 4), expected (3, 5)"),
    ("dense_backward-dx", "dense_backward", "dx", (7, 4), "dx has shape (7, 4), expected (7, 5)"),
    ("relu_forward-y", "relu_forward", "y", (7, 4), "y has shape (7, 4), expected (7, 5)"),
    ("relu_backward-y", "relu_backward", "y", (7, 4), "y has shape (7, 4), expected (7, 5)"),
    ("relu_backward-dx", "relu_backward", "dx", (5, 7), "dx has shape (5, 7), expected (7, 5)"),
    (
        "softmax_xent-dlogits",
        "softmax_xent",
        "dlogits",
        (7, 3),
        "dlogits has shape (7, 3), expected (7, 4)",
    ),
    ("sigmoid_bce-logits", "sigmoid_bce", "logits", (7, 2), "logits has shape (7, 2), expected"),
]


# 1-D arguments: the message should print the shape as Python does, (3,), like the reference
SHAPE_MESSAGES_1D = [
    ("dense_forward-b", "dense_forward", "b", (4,), "b has shape (4,), expected (3,)"),
    ("dense_backward-db", "dense_backward", "db", (4,), "db has shape (4,), expected (3,)"),
    ("softmax_xent-labels", "softmax_xent", "labels", (6,), "labels has shape (6,), expected (7,)"),
    (
        "sigmoid_bce-dlogits",
        "sigmoid_bce",
        "dlogits",
        (6,),
        "dlogits has shape (6,), expected (7,)",
    ),
    ("argmax-out", "argmax", "out", (6,), "out has shape (6,), expected (7,)"),
    ("sgd_step-grads", "sgd_step", "grads", (8,), "grads has shape (8,), expected (9,)"),
    (
        "adam_step-exp_avg_sq",
        "adam_step",
        "exp_avg_sq",
        (8,),
        "exp_avg_sq has shape (8,), expected (9,)",
    ),
    (
        "sum_buffers-inputs1",
        "sum_buffers",
        "inputs[1]",
        (8,),
        "inputs[1] has shape (8,), expected (9,)",
    ),
]


def strided_copy(arr):
    """Same shape and values, every other element of a buffer twice as wide: not contiguous."""
    buf = np.zeros(arr.shape[:-1] + (2 * arr.shape[-1],), arr.dtype)
    view = buf[..., ::2]
    view[...] = arr
    return view


def fortran_copy(arr):
    """Same values, column-major: the layout of a.T for a C-ordered a."""
    return np.asfortranarray(arr)


def check_non_contiguous_rejected(kernel, name, relayout, layout):
    call = make_calls()[kernel]
    bad = relayout(call.get(name))
    assert not bad.flags.c_contiguous
    call = call.replaced(name, bad)
    assert_rejected(call, ValueError, name, "C-contiguous", what=f"{kernel}({name} {layout})")


@functools.cache
def thread_owners():
    """The objects whose threads sgd_step, adam_step and zero_ may take (their ctx): None,
    Contexts of 1, 2 and 3 threads, a 2-thread model's net."""
    from dptrain import MLP

    return {
        "none": None,
        "context-1": core.Context(1),
        "context-2": core.Context(2),
        "context-3": core.Context(3),
        "model-2": MLP((784, 8, 10), threads=2)._net,
    }


def _adam_aliased(a, b):
    """adam_step with its argument b the same array as its argument a (amsgrad on: every
    buffer is read)."""
    arrays = {n: np.ones(6) for n in ("params", "grads", "exp_avg", "exp_avg_sq")}
    arrays["max_exp_avg_sq"] = np.ones(6)
    arrays[b] = arrays[a]
    return core.adam_step(*arrays.values(), step=1, lr=0.1, amsgrad=True)


def aliasing_cases(kernels=KERNELS):
    """(id, thunk, names the message must contain) for outputs that alias a read input (of
    `kernels`: the id's first part)."""
    sq = lambda: np.ones((5, 5))  # noqa: E731
    cases = []
    a = sq()
    cases.append(("gemm-c_is_a", lambda a=a: core.gemm(a, sq(), a), ["c", "a"]))
    b = sq()
    cases.append(("gemm-c_is_b", lambda b=b: core.gemm(sq(), b, b), ["c", "b"]))
    buf = np.ones((10, 5))
    cases.append(
        ("gemm-c_overlaps_a", lambda buf=buf: core.gemm(buf[:5], sq(), buf[3:8]), ["c", "a"])
    )
    cases.append(("gemm_naive-c_is_a", lambda a=a: core.gemm_naive(a, sq(), a), ["c", "a"]))
    x = np.ones((4, 4))
    cases.append(
        (
            "dense_forward-y_is_x",
            lambda x=x: core.dense_forward(x, np.ones((4, 4)), np.ones(4), x),
            ["y", "x"],
        )
    )
    w = np.ones((4, 4))
    cases.append(
        (
            "dense_forward-y_is_w",
            lambda w=w: core.dense_forward(np.ones((4, 4)), w, np.ones(4), w),
            ["y", "w"],
        )
    )
    w2 = np.ones((3, 5))
    cases.append(
        (
            "dense_backward-dw_is_w",
            lambda w=w2: core.dense_backward(np.ones((7, 3)), np.ones((7, 5)), w, w, np.ones(3)),
            ["dw", "w"],
        )
    )
    x2 = np.ones((7, 5))
    cases.append(
        (
            "dense_backward-dx_is_x",
            lambda x=x2: core.dense_backward(
                np.ones((7, 3)), x, np.ones((3, 5)), np.ones((3, 5)), np.ones(3), x
            ),
            ["dx", "x"],
        )
    )
    dw = np.ones((3, 5))
    cases.append(
        (
            "dense_backward-db_inside_dw",
            lambda dw=dw: core.dense_backward(
                np.ones((7, 3)), np.ones((7, 5)), np.ones((3, 5)), dw, dw.reshape(-1)[:3]
            ),
            ["db", "dw"],
        )
    )
    r = np.arange(-5.0, 5.0)
    cases.append(
        ("relu_forward-partial_overlap", lambda r=r: core.relu_forward(r[:-1], r[1:]), ["y", "x"])
    )
    y = np.ones(6)
    cases.append(
        ("relu_backward-dx_is_y", lambda y=y: core.relu_backward(np.ones(6), y, y), ["dx", "y"])
    )
    p = np.ones(6)
    cases.append(
        (
            "sgd_step-grads_is_params",
            lambda p=p: core.sgd_step(p, p, None, lr=0.1),
            ["grads", "params"],
        )
    )
    cases.append(
        (
            "sgd_step-velocity_is_params",
            lambda p=p: core.sgd_step(p, np.ones(6), p, lr=0.1, momentum=0.9),
            ["velocity", "params"],
        )
    )
    g = np.ones(6)
    cases.append(
        (
            "sgd_step-velocity_is_grads",
            lambda g=g: core.sgd_step(np.ones(6), g, g, lr=0.1, momentum=0.9),
            ["velocity", "grads"],
        )
    )
    for a, b in itertools.combinations(
        ("params", "grads", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), 2
    ):
        cases.append((f"adam_step-{b}_is_{a}", functools.partial(_adam_aliased, a, b), [b, a]))
    s = np.ones(10)
    cases.append(
        (
            "sum_buffers-partial_overlap",
            lambda s=s: core.sum_buffers(s[1:], [s[:-1]]),
            ["out", "inputs[0]"],
        )
    )
    return [
        pytest.param(thunk, names, id=i) for i, thunk, names in cases if i.split("-")[0] in kernels
    ]


NONFINITE_CASES = [
    ("gemm", "alpha"),
    ("gemm", "beta"),
    ("gemm_naive", "alpha"),
    ("gemm_naive", "beta"),
    ("scale_", "alpha"),
    ("sum_buffers", "scale"),
    ("sgd_step", "lr"),
    ("sgd_step", "momentum"),
    ("sgd_step", "dampening"),
    ("sgd_step", "weight_decay"),
    ("adam_step", "lr"),
    ("adam_step", "eps"),
    ("adam_step", "weight_decay"),
    ("rmsprop_step", "lr"),
    ("rmsprop_step", "alpha"),
    ("rmsprop_step", "eps"),
    ("rmsprop_step", "weight_decay"),
    ("rmsprop_step", "momentum"),
    ("softmax_xent", "grad_scale"),
    ("sigmoid_bce", "grad_scale"),
]


def _outputs_and_result(call):
    result = call()
    return result, {name: call.get(name).copy() for name in call.outputs}


N_CALLS = 2000


def refcounts(objs):
    return [sys.getrefcount(o) for o in objs]


def leak_objects(call):
    objs = list(call.arrays().values())
    if "inputs" in call.args:
        objs.append(call.args["inputs"])
    return objs


def error_calls(kernels=KERNELS):
    """(id, Call) that fail validation at different stages of each kernel's checks (of
    `kernels`: the id's first part)."""
    out = []
    for kernel, call in make_calls().items():
        names = call.array_names()
        last = names[-1]
        arr = call.get(last)
        out.append(
            (f"{kernel}-shape-{last}", call.replaced(last, np.zeros((1,) * arr.ndim, arr.dtype)))
        )
        out.append((f"{kernel}-dtype-{last}", call.replaced(last, arr.astype(np.float16))))
        out.append((f"{kernel}-list-{last}", call.replaced(last, arr.tolist())))
    bad_label = make_calls()["softmax_xent"]
    bad_label.get("labels")[5] = 9
    out.append(("softmax_xent-label", bad_label))
    alias = make_calls()["sum_buffers"]
    alias = alias.replaced("inputs[1]", alias.get("out"))
    alias.args["out"] = alias.get("inputs[1]")[:]  # a view: the same memory, another object
    out.append(("sum_buffers-ok_alias", alias))
    return [pytest.param(c, id=i) for i, c in out if i.split("-")[0] in kernels]


# Errors whose message formats a float: check_finite and sgd_step's checks build the float
# object for "%R"/"%S" and must release it. Each leaked float is one pymalloc block, so
# sys.getallocatedblocks() grows by about N_CALLS when it leaks and stays flat when not.
LEAKY_ERROR_CASES = {
    "gemm-alpha_nan": lambda: core.gemm(
        np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), alpha=float("nan")
    ),
    "scale_-alpha_inf": lambda: core.scale_(np.ones(3), float("inf")),
    "sum_buffers-scale_nan": lambda: core.sum_buffers(np.ones(3), [np.ones(3)], scale=float("nan")),
    "softmax_xent-grad_scale_nan": lambda: core.softmax_xent(
        np.ones((2, 2)), np.zeros(2, np.int64), None, float("nan")
    ),
    "sgd_step-lr_nan": lambda: core.sgd_step(np.ones(3), np.ones(3), None, lr=float("nan")),
    "sgd_step-lr_negative": lambda: core.sgd_step(np.ones(3), np.ones(3), None, lr=-1.0),
    "sgd_step-momentum_negative": lambda: core.sgd_step(
        np.ones(3), np.ones(3), np.ones(3), lr=0.1, momentum=-1.0
    ),
    "sgd_step-nesterov_without_momentum": lambda: core.sgd_step(
        np.ones(3), np.ones(3), None, lr=0.1, nesterov=True
    ),
    "sgd_step-velocity_none": lambda: core.sgd_step(
        np.ones(3), np.ones(3), None, lr=0.1, momentum=0.9
    ),
    "adam_step-beta1_nan": lambda: core.adam_step(
        np.ones(3), np.ones(3), np.ones(3), np.ones(3), None, step=1, lr=0.1, beta1=float("nan")
    ),
    "adam_step-eps_negative": lambda: core.adam_step(
        np.ones(3), np.ones(3), np.ones(3), np.ones(3), None, step=1, lr=0.1, eps=-1.0
    ),
    "gemm-control_shape_error": lambda: core.gemm(
        np.ones((2, 2)), np.ones((3, 2)), np.ones((2, 2))
    ),
    # parse_args: a message naming the argument is built around the conversion's own
    "gemm-alpha_str": lambda: core.gemm(
        np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), alpha="2"
    ),
    "gemm-unknown_keyword": lambda: core.gemm(
        np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), alpha_=2.0
    ),
    "conv2d_forward-padding_float": lambda: core.conv2d_forward(
        np.ones((1, 1, 3, 3)),
        np.ones((1, 1, 2, 2)),
        np.ones(1),
        np.zeros((1, 1, 2, 2)),
        padding=1.0,
    ),
}


def run_threads(targets):
    """Runs each thunk in its own thread, released together; re-raises the first error and
    fails (instead of hanging) if a thread does not finish."""
    barrier = threading.Barrier(len(targets))
    results, errors = [None] * len(targets), []

    def body(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [
        threading.Thread(target=body, args=(i, fn), daemon=True) for i, fn in enumerate(targets)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
        assert not t.is_alive(), f"a thread did not finish in {JOIN_TIMEOUT_S} s: deadlock?"
    if errors:
        raise errors[0]
    return results


def gemm_job(seed, ctx=None, dtype=np.float64):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((129, 200)).astype(dtype)
    b = rng.standard_normal((200, 150)).astype(dtype)
    return a, b, ctx


def run_gemm(job, repeats):
    a, b, ctx = job
    outs = []
    for _ in range(repeats):
        c = np.empty((a.shape[0], b.shape[1]), a.dtype)
        core.gemm(a, b, c, ctx=ctx)
        outs.append(c)
    return outs


def gil_cases():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((400, 400)), rng.standard_normal((400, 400))
    c = np.empty((400, 400))
    sizes = (784, 256, 10)
    params = ref.model_init_params(*mlp_spec(sizes), seed=0, dtype=np.float32)
    net = core.Model(*mlp_spec(sizes), params, np.zeros_like(params))
    x = rng.standard_normal((512, 784)).astype(np.float32)
    labels = rng.integers(0, 10, 512)
    big = [rng.standard_normal(2_000_000) for _ in range(3)]
    z = rng.standard_normal((20000, 100))
    zl = rng.integers(0, 100, 20000)
    sq = np.ones(2_000_000)
    aug = rng.standard_normal((2000, 3 * 32 * 32)).astype(np.float32)
    aug_out = np.empty_like(aug)
    return {
        "gemm": lambda: core.gemm(a, b, c),
        "gemm_naive": lambda: core.gemm_naive(a[:100], b, c[:100]),
        "dense_forward": lambda: core.dense_forward(a, b, a[0], c),
        "Model.loss_grad": lambda: net.loss_grad(x, labels),
        "Model.evaluate": lambda: net.evaluate(x, labels),
        "sum_buffers": lambda: core.sum_buffers(big[0], big[1:]),
        "softmax_xent": lambda: core.softmax_xent(z, zl),
        "adam_step": lambda: core.adam_step(big[0], big[1], big[2], sq, None, step=1, lr=1e-9),
        "sum_squares": lambda: core.sum_squares(big[0]),
        "augment_images": lambda: core.augment_images(
            aug, aug_out, np.arange(len(aug)), shape=(3, 32, 32), pad=4, flip=True, seed=0, epoch=0
        ),
        "rmsprop_step": lambda: core.rmsprop_step(
            big[0], big[1], sq, big[2], None, lr=1e-9, centered=True
        ),
    }


def conv_gil_cases():
    """The convolution's, the pooling's and a CNN's calls for the GIL probe."""
    x = np.random.default_rng(0).standard_normal((64, 16, 30, 30)).astype(np.float32)
    w = np.ones((32, 16, 3, 3), np.float32)
    b = np.zeros(32, np.float32)
    y = np.empty((64, 32, 28, 28), np.float32)
    p, idx = np.empty((64, 32, 14, 14), np.float32), np.empty((64, 32, 14, 14), np.uint8)
    core.maxpool2_forward(y, p, idx)
    m = CNN((1, 28, 28), 10)
    mx = np.random.default_rng(1).standard_normal((256, 784)).astype(np.float32)
    my = np.arange(256) % 10
    return {
        "conv2d_forward": lambda: core.conv2d_forward(x, w, b, y),
        "conv2d_backward": lambda: core.conv2d_backward(y, x, w, np.zeros_like(w), b.copy()),
        "maxpool2_forward": lambda: core.maxpool2_forward(y, p, idx),
        "maxpool2_backward": lambda: core.maxpool2_backward(p, idx, y),
        "Model.loss_grad": lambda: m.loss_grad(mx, my),
        "Model.evaluate": lambda: m.evaluate(mx, my),
    }


def family_tests(kernels, gil=(), cases=None):
    """The table-driven boundary checks, on the kernels of one family: {name: test function},
    for the family's test file to put into its namespace (globals().update(family_tests(...))),
    where pytest collects them. kernels: keys of make_calls() (and the LEAKY_ERROR_CASES'
    first part); gil: keys of cases() (gil_cases by default). A check with no case for these
    kernels is left out."""
    ks = [k for k in KERNELS if k in kernels]
    gil = list(gil)
    cases = cases or gil_cases
    tests = {}

    def register(fn):
        tests[fn.__name__] = pytest.mark.boundary(fn)  # also run under ASan
        return fn

    if ks:

        @register
        @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
        @pytest.mark.parametrize("kernel", ks)
        def test_valid_call_table_works(kernel, dtype):
            """Sanity of the table the other tests break: every entry is a good call."""
            make_calls(dtype)[kernel]()

    if float_array_params(kernels=ks):

        @register
        @pytest.mark.parametrize(
            "bad", [np.float16, np.int64, np.int32, np.complex128], ids=lambda d: np.dtype(d).name
        )
        @pytest.mark.parametrize("kernel,name", float_array_params(kernels=ks))
        def test_non_float_dtype_rejected(kernel, name, bad):
            call = make_calls()[kernel]
            call = call.replaced(name, call.get(name).astype(bad))
            assert_rejected(
                call,
                TypeError,
                name,
                np.dtype(bad).name,
                "dtype",
                what=f"{kernel}({name}: {np.dtype(bad).name})",
            )

    if float_array_params(min_floats=2, kernels=ks):

        @register
        @pytest.mark.parametrize("kernel,name", float_array_params(min_floats=2, kernels=ks))
        def test_mixed_float32_float64_rejected(kernel, name):
            """One float32 argument among float64 ones: no silent conversion, no hidden copy."""
            call = make_calls(np.float64)[kernel]
            call = call.replaced(name, call.get(name).astype(np.float32))
            assert_rejected(
                call, TypeError, "float32", "float64", "dtype", what=f"{kernel}({name})"
            )

    if all_array_params(kernels=ks):

        @register
        @pytest.mark.parametrize("kernel,name", all_array_params(kernels=ks))
        def test_wrong_ndim_rejected(kernel, name):
            """A leading axis of 2 added to one argument: no kernel accepts the result."""
            call = make_calls()[kernel]
            arr = call.get(name)
            bad = np.ascontiguousarray(np.broadcast_to(arr, (2,) + arr.shape))
            call = call.replaced(name, bad)
            msg = assert_rejected(call, ValueError, "shape", what=f"{kernel}({name}: {bad.shape})")
            # elementwise kernels blame the other operand; it must still show the offending shape
            assert name in msg or shape_text(bad.shape) in msg, msg

    if [row for row in SHAPE_MESSAGES if row[1] in ks]:

        @register
        @pytest.mark.parametrize(
            "kernel,name,shape,fragment",
            [pytest.param(*row[1:], id=row[0]) for row in SHAPE_MESSAGES if row[1] in ks],
        )
        def test_wrong_shape_message_names_argument_and_both_shapes(kernel, name, shape, fragment):
            call = make_calls()[kernel]
            call = call.replaced(name, np.zeros(shape, call.get(name).dtype))
            assert_rejected(call, ValueError, fragment, what=f"{kernel}({name}: {shape})")

    if [row for row in SHAPE_MESSAGES_1D if row[1] in ks]:

        @register
        @pytest.mark.parametrize(
            "kernel,name,shape,fragment",
            [pytest.param(*row[1:], id=row[0]) for row in SHAPE_MESSAGES_1D if row[1] in ks],
        )
        def test_wrong_1d_shape_message(kernel, name, shape, fragment):
            call = make_calls()[kernel]
            call = call.replaced(name, np.zeros(shape, call.get(name).dtype))
            assert_rejected(call, ValueError, fragment, what=f"{kernel}({name}: {shape})")

    if all_array_params(kernels=ks):

        @register
        @pytest.mark.parametrize("kernel,name", all_array_params(kernels=ks))
        def test_strided_rejected(kernel, name):
            check_non_contiguous_rejected(kernel, name, strided_copy, "strided")

    if all_array_params(min_ndim=2, kernels=ks):

        @register
        @pytest.mark.parametrize("kernel,name", all_array_params(min_ndim=2, kernels=ks))
        def test_transposed_rejected(kernel, name):
            check_non_contiguous_rejected(kernel, name, fortran_copy, "transposed")

    if output_params(kernels=ks):

        @register
        @pytest.mark.parametrize("kernel,name", output_params(kernels=ks))
        def test_read_only_output_rejected(kernel, name):
            call = make_calls()[kernel]
            call.get(name).flags.writeable = False
            assert_rejected(call, ValueError, name, "read-only", what=f"{kernel}({name} read-only)")

    if aliasing_cases(kernels=ks):

        @register
        @pytest.mark.parametrize("thunk,names", aliasing_cases(kernels=ks))
        def test_output_aliasing_an_input_rejected(thunk, names):
            with pytest.raises(ValueError, match="shares memory") as info:
                thunk()
            for n in names:
                assert n in str(info.value), str(info.value)

    if [c for c in NONFINITE_CASES if c[0] in ks]:

        @register
        @pytest.mark.parametrize(
            "value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"]
        )
        @pytest.mark.parametrize(
            "kernel,name", [pytest.param(*c, id="-".join(c)) for c in NONFINITE_CASES if c[0] in ks]
        )
        def test_non_finite_scalar_rejected(kernel, name, value):
            call = make_calls()[kernel]
            if name in call.args:
                call = call.replaced(name, value)
            else:
                call.kwargs[name] = value
            assert_rejected(call, ValueError, name, "finite", what=f"{kernel}({name}={value})")

    if ks:

        @register
        @pytest.mark.parametrize("kernel", ks)
        def test_arguments_by_name_or_position_agree(kernel):
            """Every parameter can be passed by name: the same results, bit for bit, as by
            position."""
            positional = make_calls()[kernel]
            named = make_calls()[kernel]
            by_name = Call(named.fn, {}, {**named.args, **named.kwargs}, ())
            want_result, want = _outputs_and_result(positional)
            got_result = by_name()
            assert got_result == want_result
            for name in positional.outputs:
                np.testing.assert_array_equal(named.get(name), want[name], strict=True)

    if all_array_params(kernels=ks):

        @register
        @pytest.mark.parametrize("kernel,name", all_array_params(kernels=ks))
        def test_list_instead_of_ndarray_rejected(kernel, name):
            call = make_calls()[kernel]
            call = call.replaced(name, call.get(name).tolist())
            assert_rejected(call, TypeError, name, "ndarray", what=f"{kernel}({name}: list)")

    if all_array_params(required_only=True, kernels=ks):

        @register
        @pytest.mark.parametrize("kernel,name", all_array_params(required_only=True, kernels=ks))
        def test_none_instead_of_ndarray_rejected(kernel, name):
            call = make_calls()[kernel].replaced(name, None)
            assert_rejected(call, TypeError, name, "ndarray", what=f"{kernel}({name}: None)")

    if ks:

        @register
        @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
        @pytest.mark.parametrize("kernel", ks)
        def test_inputs_not_modified(kernel, dtype):
            call = make_calls(dtype)[kernel]
            before = snapshot(call)
            call()
            for name, arr in call.arrays().items():
                if name not in call.outputs:
                    np.testing.assert_array_equal(
                        arr, before[name], err_msg=f"{kernel} modified {name}"
                    )

    if ks:

        @register
        @pytest.mark.parametrize("kernel", ks)
        def test_no_reference_leaks_on_success(kernel):
            call = make_calls()[kernel]
            if kernel in ("sgd_step", "adam_step", "rmsprop_step"):
                call.kwargs["lr"] = 1e-6  # 2000 steps must stay finite
            objs = leak_objects(call)
            call()
            before = refcounts(objs)
            for _ in range(N_CALLS):
                call()
            assert refcounts(objs) == before, f"{kernel}: refcounts {before} -> {refcounts(objs)}"

    if error_calls(kernels=ks):

        @register
        @pytest.mark.parametrize("call", error_calls(kernels=ks))
        def test_no_reference_leaks_on_error(call):
            objs = leak_objects(call)

            def attempt():
                try:
                    call()
                except (TypeError, ValueError):
                    pass

            attempt()
            before = refcounts(objs)
            for _ in range(N_CALLS):
                attempt()
            assert refcounts(objs) == before

    if [c for c in LEAKY_ERROR_CASES if c.split("-")[0] in kernels]:

        @register
        @pytest.mark.parametrize(
            "case", [c for c in LEAKY_ERROR_CASES if c.split("-")[0] in kernels]
        )
        def test_error_messages_do_not_leak_objects(case):
            thunk = LEAKY_ERROR_CASES[case]

            def attempt():
                try:
                    thunk()
                except (TypeError, ValueError):
                    return
                raise AssertionError(f"{case} did not raise")

            for _ in range(200):  # warm free lists and caches
                attempt()
            before = sys.getallocatedblocks()
            for _ in range(N_CALLS):
                attempt()
            grown = sys.getallocatedblocks() - before
            assert grown < N_CALLS // 4, (
                f"{case}: {grown} memory blocks left after {N_CALLS} errors"
            )

    if gil:

        @register
        @pytest.mark.parametrize("kernel", gil)
        def test_kernel_releases_the_gil(kernel, gil_probe):
            assert gil_probe(cases()[kernel]), (
                f"{kernel}: the main thread never ran while the worker was inside the call"
            )

    return tests
