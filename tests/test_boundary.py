"""Boundary hygiene of dptrain._core: what happens when the caller gets it wrong.

Every bad argument (dtype, ndim, shape, layout, writeability, aliasing, label range, non-finite
scalar, not an ndarray at all) must raise TypeError/ValueError with a message that names the
argument and the values, must never crash, and must leave every array as it was. Good calls
must not modify their inputs, and neither good nor bad calls may leak references. The kernels
release the GIL and are safe to call from several Python threads at once.

The numeric agreement with the NumPy reference lives in test_core.py.
"""
import sys
import threading
from dataclasses import dataclass, field

import numpy as np
import pytest

from dptrain import _core as core
from dptrain import reference as ref
from _core_helpers import mlp_spec

JOIN_TIMEOUT_S = 60  # a deadlocked thread fails the test instead of hanging the run


# ---------------------------------------------------------------------------------------
# a table of valid calls, one per kernel, that the tests below break one argument at a time


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
        "gemm": Call(core.gemm, dict(a=f(7, 5), b=f(5, 3), c=f(7, 3)),
                     dict(alpha=1.5, beta=0.5), ("c",)),
        "gemm_naive": Call(core.gemm_naive, dict(a=f(7, 5), b=f(5, 3), c=f(7, 3)),
                           dict(alpha=1.5, beta=0.5), ("c",)),
        "dense_forward": Call(core.dense_forward, dict(x=f(7, 5), w=f(3, 5), b=f(3), y=f(7, 3)),
                              outputs=("y",)),
        "dense_backward": Call(core.dense_backward,
                               dict(dy=f(7, 3), x=f(7, 5), w=f(3, 5), dw=f(3, 5), db=f(3),
                                    dx=f(7, 5)), outputs=("dw", "db", "dx")),
        "relu_forward": Call(core.relu_forward, dict(x=f(7, 5), y=f(7, 5)), outputs=("y",)),
        "relu_backward": Call(core.relu_backward, dict(dy=f(7, 5), y=f(7, 5), dx=f(7, 5)),
                              outputs=("dx",)),
        "softmax_xent": Call(core.softmax_xent,
                             dict(logits=f(7, 4), labels=labels4, dlogits=f(7, 4),
                                  grad_scale=0.5), outputs=("dlogits",)),
        "sigmoid_bce": Call(core.sigmoid_bce,
                            dict(logits=f(7), labels=labels2, dlogits=f(7), grad_scale=0.5),
                            outputs=("dlogits",)),
        "argmax": Call(core.argmax, dict(x=f(7, 4), out=np.zeros(7, np.int64)), outputs=("out",)),
        "count_correct": Call(core.count_correct, dict(logits=f(7, 4), labels=labels4)),
        "sgd_step": Call(core.sgd_step, dict(params=f(9), grads=f(9), velocity=f(9)),
                         dict(lr=0.1, momentum=0.9, weight_decay=0.01),
                         ("params", "velocity")),
        "sum_buffers": Call(core.sum_buffers, dict(out=f(9), inputs=[f(9), f(9)]),
                            dict(scale=0.5), ("out",)),
        "scale_": Call(core.scale_, dict(buf=f(9), alpha=0.5), outputs=("buf",)),
    }


KERNELS = list(make_calls())


def float_names(call):
    return [name for name in call.array_names() if call.get(name).dtype.kind == "f"]


def float_array_params(min_floats=1):
    """(kernel, argument) for every float array argument of kernels with >= min_floats."""
    return [pytest.param(k, name, id=f"{k}-{name}")
            for k, call in make_calls().items() if len(float_names(call)) >= min_floats
            for name in float_names(call)]


def all_array_params(min_ndim=1, required_only=False):
    """(kernel, argument) for every array argument; optionally only those with ndim >=
    min_ndim, or only those that may not be None (dx, dlogits, velocity are optional)."""
    optional = ("dx", "dlogits", "velocity")
    return [pytest.param(k, name, id=f"{k}-{name}")
            for k, call in make_calls().items() for name in call.array_names()
            if call.get(name).ndim >= min_ndim and not (required_only and name in optional)]


def output_params():
    return [pytest.param(k, name, id=f"{k}-{name}")
            for k, call in make_calls().items() for name in call.outputs]


def snapshot(call):
    return {name: arr.copy() for name, arr in call.arrays().items()
            if isinstance(arr, np.ndarray)}


def assert_unchanged(call, before, what, names=None):
    for name in before if names is None else names:
        np.testing.assert_array_equal(call.get(name), before[name],
                                      err_msg=f"{what} modified {name}")


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kernel", KERNELS)
def test_valid_call_table_works(kernel, dtype):
    """Sanity of the table the other tests break: every entry is a good call."""
    make_calls(dtype)[kernel]()


# ---------------------------------------------------------------------------------------
# dtype


@pytest.mark.parametrize("bad", [np.float16, np.int64, np.int32, np.complex128],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kernel,name", float_array_params())
def test_non_float_dtype_rejected(kernel, name, bad):
    call = make_calls()[kernel]
    call = call.replaced(name, call.get(name).astype(bad))
    assert_rejected(call, TypeError, name, np.dtype(bad).name, "dtype",
                    what=f"{kernel}({name}: {np.dtype(bad).name})")


@pytest.mark.parametrize("kernel,name", float_array_params(min_floats=2))
def test_mixed_float32_float64_rejected(kernel, name):
    """One float32 argument among float64 ones: no silent conversion, no hidden copy."""
    call = make_calls(np.float64)[kernel]
    call = call.replaced(name, call.get(name).astype(np.float32))
    assert_rejected(call, TypeError, "float32", "float64", "dtype", what=f"{kernel}({name})")


@pytest.mark.parametrize("kernel", ["softmax_xent", "sigmoid_bce", "count_correct"])
@pytest.mark.parametrize("bad", [np.int32, np.uint8, np.float64], ids=lambda d: np.dtype(d).name)
def test_labels_must_be_int64(kernel, bad):
    call = make_calls()[kernel]
    call = call.replaced("labels", call.get("labels").astype(bad))
    assert_rejected(call, TypeError, "labels", np.dtype(bad).name, "int64", what=kernel)


@pytest.mark.parametrize("bad", [np.int32, np.float64], ids=lambda d: np.dtype(d).name)
def test_argmax_out_must_be_int64(bad):
    call = make_calls()["argmax"].replaced("out", np.zeros(7, bad))
    assert_rejected(call, TypeError, "out", np.dtype(bad).name, "int64", what="argmax")


# ---------------------------------------------------------------------------------------
# ndim and shape


def shape_text(shape):
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


@pytest.mark.parametrize("kernel,name", all_array_params())
def test_wrong_ndim_rejected(kernel, name):
    """A leading axis of 2 added to one argument: no kernel accepts the result."""
    call = make_calls()[kernel]
    arr = call.get(name)
    bad = np.ascontiguousarray(np.broadcast_to(arr, (2,) + arr.shape))
    call = call.replaced(name, bad)
    msg = assert_rejected(call, ValueError, "shape", what=f"{kernel}({name}: {bad.shape})")
    # elementwise kernels blame the other operand; it must still show the offending shape
    assert name in msg or shape_text(bad.shape) in msg, msg


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
    ("softmax_xent-dlogits", "softmax_xent", "dlogits", (7, 3),
     "dlogits has shape (7, 3), expected (7, 4)"),
    ("sigmoid_bce-logits", "sigmoid_bce", "logits", (7, 2), "logits has shape (7, 2), expected"),
]


@pytest.mark.parametrize("kernel,name,shape,fragment",
                         [pytest.param(*row[1:], id=row[0]) for row in SHAPE_MESSAGES])
def test_wrong_shape_message_names_argument_and_both_shapes(kernel, name, shape, fragment):
    call = make_calls()[kernel]
    call = call.replaced(name, np.zeros(shape, call.get(name).dtype))
    assert_rejected(call, ValueError, fragment, what=f"{kernel}({name}: {shape})")


def test_gemm_transposed_shape_message():
    a, c = np.zeros((7, 5)), np.zeros((7, 3))
    with pytest.raises(ValueError, match=r"b \(transposed\) has shape \(3, 4\), expected \(3, 5\)"):
        core.gemm(a, np.zeros((3, 4)), c, trans_b=True)
    with pytest.raises(ValueError, match=r"c has shape \(7, 3\), expected \(5, 3\)"):
        core.gemm(a, np.zeros((7, 3)), c, trans_a=True)


# 1-D arguments: the message should print the shape as Python does, (3,), like the reference
SHAPE_MESSAGES_1D = [
    ("dense_forward-b", "dense_forward", "b", (4,), "b has shape (4,), expected (3,)"),
    ("dense_backward-db", "dense_backward", "db", (4,), "db has shape (4,), expected (3,)"),
    ("softmax_xent-labels", "softmax_xent", "labels", (6,), "labels has shape (6,), expected (7,)"),
    ("sigmoid_bce-dlogits", "sigmoid_bce", "dlogits", (6,),
     "dlogits has shape (6,), expected (7,)"),
    ("argmax-out", "argmax", "out", (6,), "out has shape (6,), expected (7,)"),
    ("sgd_step-grads", "sgd_step", "grads", (8,), "grads has shape (8,), expected (9,)"),
    ("sum_buffers-inputs1", "sum_buffers", "inputs[1]", (8,),
     "inputs[1] has shape (8,), expected (9,)"),
]


@pytest.mark.parametrize("kernel,name,shape,fragment",
                         [pytest.param(*row[1:], id=row[0]) for row in SHAPE_MESSAGES_1D])
def test_wrong_1d_shape_message(kernel, name, shape, fragment):
    call = make_calls()[kernel]
    call = call.replaced(name, np.zeros(shape, call.get(name).dtype))
    assert_rejected(call, ValueError, fragment, what=f"{kernel}({name}: {shape})")


# ---------------------------------------------------------------------------------------
# layout and writeability


def strided_copy(arr):
    """Same shape and values, every other element of a buffer twice as wide: not contiguous."""
    buf = np.zeros(arr.shape[:-1] + (2 * arr.shape[-1],), arr.dtype)
    view = buf[..., ::2]
    view[...] = arr
    return view


def fortran_copy(arr):
    """Same values, column-major: the layout of a.T for a C-ordered a."""
    return np.asfortranarray(arr)


@pytest.mark.parametrize("kernel,name", all_array_params())
def test_strided_rejected(kernel, name):
    check_non_contiguous_rejected(kernel, name, strided_copy, "strided")


@pytest.mark.parametrize("kernel,name", all_array_params(min_ndim=2))
def test_transposed_rejected(kernel, name):
    check_non_contiguous_rejected(kernel, name, fortran_copy, "transposed")


def check_non_contiguous_rejected(kernel, name, relayout, layout):
    call = make_calls()[kernel]
    bad = relayout(call.get(name))
    assert not bad.flags.c_contiguous
    call = call.replaced(name, bad)
    assert_rejected(call, ValueError, name, "C-contiguous", what=f"{kernel}({name} {layout})")


def test_column_slice_and_transpose_rejected():
    """The two usual ways to get a non-contiguous view; a.T must go through trans_a."""
    a = np.ones((6, 10))
    with pytest.raises(ValueError, match="a must be C-contiguous"):
        core.gemm(a[:, ::2], np.ones((5, 3)), np.empty((6, 3)))
    with pytest.raises(ValueError, match="a must be C-contiguous"):
        core.gemm(a.T, np.ones((6, 3)), np.empty((10, 3)))
    c = np.empty((10, 3))
    core.gemm(a, np.ones((6, 3)), c, trans_a=True)
    np.testing.assert_array_equal(c, np.full((10, 3), 6.0))


def test_slices_that_stay_contiguous_are_accepted():
    """A row block of a C array (x[2:5]) is C-contiguous: no reason to refuse it."""
    x = np.arange(40.0).reshape(8, 5)
    y = np.empty((3, 5))
    core.relu_forward(x[2:5], y)
    np.testing.assert_array_equal(y, x[2:5])


@pytest.mark.parametrize("kernel,name", output_params())
def test_read_only_output_rejected(kernel, name):
    call = make_calls()[kernel]
    call.get(name).flags.writeable = False
    assert_rejected(call, ValueError, name, "read-only", what=f"{kernel}({name} read-only)")


def test_read_only_inputs_are_accepted():
    call = make_calls()["dense_forward"]
    for name in ("x", "w", "b"):
        call.get(name).flags.writeable = False
    call()


# ---------------------------------------------------------------------------------------
# aliasing


def aliasing_cases():
    """(id, thunk, names the message must contain) for outputs that alias a read input."""
    sq = lambda: np.ones((5, 5))  # noqa: E731
    cases = []
    a = sq()
    cases.append(("gemm-c_is_a", lambda a=a: core.gemm(a, sq(), a), ["c", "a"]))
    b = sq()
    cases.append(("gemm-c_is_b", lambda b=b: core.gemm(sq(), b, b), ["c", "b"]))
    buf = np.ones((10, 5))
    cases.append(("gemm-c_overlaps_a", lambda buf=buf: core.gemm(buf[:5], sq(), buf[3:8]),
                  ["c", "a"]))
    cases.append(("gemm_naive-c_is_a", lambda a=a: core.gemm_naive(a, sq(), a), ["c", "a"]))
    x = np.ones((4, 4))
    cases.append(("dense_forward-y_is_x",
                  lambda x=x: core.dense_forward(x, np.ones((4, 4)), np.ones(4), x), ["y", "x"]))
    w = np.ones((4, 4))
    cases.append(("dense_forward-y_is_w",
                  lambda w=w: core.dense_forward(np.ones((4, 4)), w, np.ones(4), w), ["y", "w"]))
    w2 = np.ones((3, 5))
    cases.append(("dense_backward-dw_is_w",
                  lambda w=w2: core.dense_backward(np.ones((7, 3)), np.ones((7, 5)), w, w,
                                                   np.ones(3)), ["dw", "w"]))
    x2 = np.ones((7, 5))
    cases.append(("dense_backward-dx_is_x",
                  lambda x=x2: core.dense_backward(np.ones((7, 3)), x, np.ones((3, 5)),
                                                   np.ones((3, 5)), np.ones(3), x), ["dx", "x"]))
    dw = np.ones((3, 5))
    cases.append(("dense_backward-db_inside_dw",
                  lambda dw=dw: core.dense_backward(np.ones((7, 3)), np.ones((7, 5)),
                                                    np.ones((3, 5)), dw, dw.reshape(-1)[:3]),
                  ["db", "dw"]))
    r = np.arange(-5.0, 5.0)
    cases.append(("relu_forward-partial_overlap", lambda r=r: core.relu_forward(r[:-1], r[1:]),
                  ["y", "x"]))
    y = np.ones(6)
    cases.append(("relu_backward-dx_is_y", lambda y=y: core.relu_backward(np.ones(6), y, y),
                  ["dx", "y"]))
    p = np.ones(6)
    cases.append(("sgd_step-grads_is_params",
                  lambda p=p: core.sgd_step(p, p, None, lr=0.1), ["grads", "params"]))
    cases.append(("sgd_step-velocity_is_params",
                  lambda p=p: core.sgd_step(p, np.ones(6), p, lr=0.1, momentum=0.9),
                  ["velocity", "params"]))
    g = np.ones(6)
    cases.append(("sgd_step-velocity_is_grads",
                  lambda g=g: core.sgd_step(np.ones(6), g, g, lr=0.1, momentum=0.9),
                  ["velocity", "grads"]))
    s = np.ones(10)
    cases.append(("sum_buffers-partial_overlap",
                  lambda s=s: core.sum_buffers(s[1:], [s[:-1]]), ["out", "inputs[0]"]))
    return [pytest.param(thunk, names, id=i) for i, thunk, names in cases]


@pytest.mark.parametrize("thunk,names", aliasing_cases())
def test_output_aliasing_an_input_rejected(thunk, names):
    with pytest.raises(ValueError, match="shares memory") as info:
        thunk()
    for n in names:
        assert n in str(info.value), str(info.value)


def test_allowed_in_place_calls():
    """The contract allows y is x (relu_forward), dx is dy (relu_backward), out in inputs."""
    x = np.array([-1.0, 2.0, -3.0])
    core.relu_forward(x, x)
    np.testing.assert_array_equal(x, [0.0, 2.0, 0.0])
    dy = np.array([5.0, 6.0, 7.0])
    core.relu_backward(dy, x, dy)
    np.testing.assert_array_equal(dy, [0.0, 6.0, 0.0])
    a, b = np.ones(4), np.full(4, 2.0)
    core.sum_buffers(b, [a, b])
    np.testing.assert_array_equal(b, np.full(4, 3.0))


def test_softmax_xent_dlogits_is_logits_is_refused_or_correct():
    """dlogits may not silently alias logits: refused, or the loss and gradient are right.

    The kernel overwrites z with exp(z - max) before it reads z[label] for the loss, so an
    accepted in-place call returns a wrong loss.
    """
    rng = np.random.default_rng(0)
    z = rng.standard_normal((4, 3))
    labels = np.array([0, 1, 2, 1])
    d_ref = np.empty_like(z)
    loss_ref = ref.softmax_xent(z, labels, d_ref)
    zz = z.copy()
    try:
        loss = core.softmax_xent(zz, labels, zz)
    except ValueError as e:
        assert "dlogits" in str(e) and "logits" in str(e)
        np.testing.assert_array_equal(zz, z)
        return
    np.testing.assert_allclose(zz, d_ref, rtol=1e-12, atol=1e-15)
    assert loss == pytest.approx(loss_ref, rel=1e-12), (
        f"softmax_xent(z, labels, dlogits=z) returned loss {loss}, expected {loss_ref}")


def test_sigmoid_bce_dlogits_is_logits_is_refused_or_correct():
    rng = np.random.default_rng(1)
    z = rng.standard_normal(6)
    labels = np.array([0, 1, 1, 0, 1, 0])
    d_ref = np.empty_like(z)
    loss_ref = ref.sigmoid_bce(z, labels, d_ref)
    zz = z.copy()
    try:
        loss = core.sigmoid_bce(zz, labels, zz)
    except ValueError:
        np.testing.assert_array_equal(zz, z)
        return
    np.testing.assert_allclose(zz, d_ref, rtol=1e-12, atol=1e-15)
    assert loss == pytest.approx(loss_ref, rel=1e-12)


# ---------------------------------------------------------------------------------------
# labels


@pytest.mark.parametrize("kernel,index,value", [
    ("softmax_xent", 3, 4), ("softmax_xent", 0, -1), ("softmax_xent", 6, 1 << 40),
    ("sigmoid_bce", 2, 2), ("sigmoid_bce", 5, -1),
])
def test_labels_out_of_range_named_by_index_and_value(kernel, index, value):
    call = make_calls()[kernel]
    call.get("labels")[index] = value
    # labels are checked inside the kernel's loop: dlogits may already be partly written
    assert_rejected(call, ValueError, "labels", f"[{index}]", str(value), what=kernel,
                    unchanged=["logits", "labels"])


@pytest.mark.parametrize("logits_shape,index,value", [((7, 4), 3, 4), ((7, 4), 0, -1),
                                                      ((7,), 2, 2), ((7, 1), 6, 3)],
                         ids=["multiclass-4", "multiclass--1", "binary-2", "binary_B1-3"])
def test_count_correct_labels_out_of_range(logits_shape, index, value):
    """Like the reference (and the losses), count_correct must not count an invalid label
    as simply 'wrong': a label outside [0, C) is a caller bug and raises."""
    call = make_calls()["count_correct"]
    call = call.replaced("logits", np.zeros(logits_shape))
    call.get("labels")[:] = 0
    call.get("labels")[index] = value
    with pytest.raises(ValueError):
        ref.count_correct(call.get("logits"), call.get("labels"))
    assert_rejected(call, ValueError, "labels", str(value), what="count_correct")


# ---------------------------------------------------------------------------------------
# scalars


NONFINITE_CASES = [
    ("gemm", "alpha"), ("gemm", "beta"), ("gemm_naive", "alpha"), ("gemm_naive", "beta"),
    ("scale_", "alpha"), ("sum_buffers", "scale"), ("sgd_step", "lr"), ("sgd_step", "momentum"),
    ("sgd_step", "dampening"), ("sgd_step", "weight_decay"), ("softmax_xent", "grad_scale"),
    ("sigmoid_bce", "grad_scale"),
]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")],
                         ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("kernel,name", [pytest.param(*c, id="-".join(c)) for c in NONFINITE_CASES])
def test_non_finite_scalar_rejected(kernel, name, value):
    call = make_calls()[kernel]
    if name in call.args:
        call = call.replaced(name, value)
    else:
        call.kwargs[name] = value
    assert_rejected(call, ValueError, name, "finite", what=f"{kernel}({name}={value})")


def test_sgd_step_scalar_rules():
    p, g, v = np.ones(4), np.ones(4), np.zeros(4)
    with pytest.raises(TypeError, match="lr"):
        core.sgd_step(p, g, v)
    with pytest.raises(ValueError, match="lr"):
        core.sgd_step(p, g, v, lr=-0.1)
    with pytest.raises(ValueError, match="velocity"):
        core.sgd_step(p, g, None, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="nesterov"):
        core.sgd_step(p, g, v, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    np.testing.assert_array_equal(p, np.ones(4))


@pytest.mark.parametrize("kernel,kw", [("sum_buffers", dict(start=-1)),
                                       ("sum_buffers", dict(start=5, stop=4)),
                                       ("sum_buffers", dict(stop=10)),
                                       ("scale_", dict(start=3, stop=10))])
def test_ranges_outside_the_buffer_rejected(kernel, kw):
    call = make_calls()[kernel]
    call.kwargs.update(kw)
    assert_rejected(call, ValueError, "start", what=f"{kernel}({kw})")


def test_bad_scalar_types_rejected():
    call = make_calls()["gemm"]
    call.kwargs["alpha"] = "2"
    assert_rejected(call, TypeError, what="gemm(alpha='2')")
    with pytest.raises(TypeError):
        core.scale_(np.ones(3), None)


# ---------------------------------------------------------------------------------------
# argument parsing (mod_common.c's parse_args: the kernels take vectorcall's arguments as
# they come, without the tuple and dict of METH_KEYWORDS)


def _outputs_and_result(call):
    result = call()
    return result, {name: call.get(name).copy() for name in call.outputs}


@pytest.mark.parametrize("kernel", KERNELS)
def test_arguments_by_name_or_position_agree(kernel):
    """Every parameter can be passed by name: the same results, bit for bit, as by position."""
    positional = make_calls()[kernel]
    named = make_calls()[kernel]
    by_name = Call(named.fn, {}, {**named.args, **named.kwargs}, ())
    want_result, want = _outputs_and_result(positional)
    got_result = by_name()
    assert got_result == want_result
    for name in positional.outputs:
        np.testing.assert_array_equal(named.get(name), want[name], strict=True)


def _two():
    return np.ones((2, 2)), np.ones((2, 2)), np.zeros((2, 2))


ARGUMENT_ERRORS = {
    # id: (thunk, exception, fragments of its message)
    "too-many-positional": (lambda: core.gemm(*_two(), True), TypeError,
                            ("gemm()", "3 positional", "4 given")),
    "missing-required": (lambda: core.gemm(*_two()[:2]), TypeError, ("gemm()", "'c'", "pos 3")),
    "missing-keyword-only": (lambda: core.sgd_step(np.ones(3), np.ones(3), None), TypeError,
                             ("sgd_step()", "keyword-only", "'lr'")),
    "unknown-keyword": (lambda: core.gemm(*_two(), tranz_a=True), TypeError,
                        ("'tranz_a'", "invalid keyword", "gemm()")),
    # a keyword is the whole name: not a prefix of one, nor one and more
    "keyword-a-prefix": (lambda: core.gemm(*_two(), trans=True), TypeError,
                         ("'trans'", "invalid keyword", "gemm()")),
    "keyword-extends-one": (lambda: core.gemm(*_two(), trans_ab=True), TypeError,
                            ("'trans_ab'", "invalid keyword", "gemm()")),
    "keyword-empty": (lambda: core.gemm(*_two(), **{"": True}), TypeError,
                      ("''", "invalid keyword", "gemm()")),
    "keyword-not-ascii": (lambda: core.gemm(*_two(), **{"trans_\u00e4": True}), TypeError,
                          ("'trans_\u00e4'", "invalid keyword", "gemm()")),
    "name-and-position": (lambda: core.gemm(*_two(), a=np.ones((2, 2))), TypeError,
                          ("gemm()", "('a')", "position (1)")),
    "keyword-only-by-position": (lambda: core.dense_forward(np.ones((2, 2)), np.ones((2, 2)),
                                                            np.ones(2), np.zeros((2, 2)), None),
                                 TypeError, ("dense_forward()", "4 positional", "5 given")),
    "optional-too-many": (lambda: core.softmax_xent(np.ones((2, 2)), np.zeros(2, np.int64), None,
                                                    None, None), TypeError,
                          ("softmax_xent()", "at most 4 positional", "5 given")),
    "float-not-a-number": (lambda: core.gemm(*_two(), alpha="2"), TypeError,
                           ("gemm() argument 'alpha'", "real number", "str")),
    "int-given-a-float": (lambda: core.conv2d_forward(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)),
                                                      np.ones(1), np.zeros((1, 1, 2, 2)),
                                                      padding=1.0), TypeError,
                          ("conv2d_forward() argument 'padding'", "float")),
    "int-overflow": (lambda: core.conv2d_forward(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)),
                                                 np.ones(1), np.zeros((1, 1, 2, 2)),
                                                 padding=2 ** 40), OverflowError,
                     ("conv2d_forward() argument 'padding'", "maximum")),
    "truth-raises": (lambda: core.gemm(*_two(), trans_a=np.ones(3)), ValueError,
                     ("gemm() argument 'trans_a'", "ambiguous")),
    "method-unknown-keyword": (lambda: core.Model([("dense", 2)], (3,), "softmax_xent",
                                                  np.zeros(8), np.zeros(8)).loss_grad(
                                   np.ones((1, 3)), np.zeros(1, np.int64), scale=1.0),
                               TypeError, ("'scale'", "loss_grad()")),
}


@pytest.mark.parametrize("case", list(ARGUMENT_ERRORS))
def test_argument_errors_name_the_function_and_argument(case):
    thunk, exc, fragments = ARGUMENT_ERRORS[case]
    with pytest.raises(exc) as info:
        thunk()
    for fragment in fragments:
        assert fragment in str(info.value), f"{case}: {fragment!r} not in {str(info.value)!r}"


# ---------------------------------------------------------------------------------------
# not an ndarray


@pytest.mark.parametrize("kernel,name", all_array_params())
def test_list_instead_of_ndarray_rejected(kernel, name):
    call = make_calls()[kernel]
    call = call.replaced(name, call.get(name).tolist())
    assert_rejected(call, TypeError, name, "ndarray", what=f"{kernel}({name}: list)")


@pytest.mark.parametrize("kernel,name", all_array_params(required_only=True))
def test_none_instead_of_ndarray_rejected(kernel, name):
    call = make_calls()[kernel].replaced(name, None)
    assert_rejected(call, TypeError, name, "ndarray", what=f"{kernel}({name}: None)")


def test_context_arguments_rejected():
    with pytest.raises(ValueError, match="threads"):
        core.Context(threads=0)
    with pytest.raises(ValueError, match="threads"):
        core.Context(threads=100000)
    call = make_calls()["gemm"]
    call.kwargs["ctx"] = "not a context"
    assert_rejected(call, TypeError, "ctx", what="gemm(ctx='not a context')")


# ---------------------------------------------------------------------------------------
# good calls do not modify their inputs


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kernel", KERNELS)
def test_inputs_not_modified(kernel, dtype):
    call = make_calls(dtype)[kernel]
    before = snapshot(call)
    call()
    for name, arr in call.arrays().items():
        if name not in call.outputs:
            np.testing.assert_array_equal(arr, before[name], err_msg=f"{kernel} modified {name}")


# ---------------------------------------------------------------------------------------
# Model (on dense stacks)


def small_net(loss="softmax_xent", sizes=(6, 5, 3), dtype=np.float64, batch=9):
    params = ref.model_init_params(*mlp_spec(sizes, loss), seed=0, dtype=dtype)
    grads = np.zeros_like(params)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, sizes[0])).astype(dtype)
    labels = rng.integers(0, 2 if loss == "sigmoid_bce" else sizes[-1], batch)
    return params, grads, x, labels


def test_model_rejects_bad_construction():
    sizes = (784, 256, 10)
    layers, shape, _ = mlp_spec(sizes)
    n = core.model_plan(*mlp_spec(sizes))["n_params"]
    p, g = np.zeros(n, np.float32), np.zeros(n, np.float32)
    with pytest.raises(ValueError, match="loss"):
        core.Model(layers, shape, "hinge", p, g)
    with pytest.raises(ValueError, match="sigmoid_bce"):
        core.Model(layers, shape, "sigmoid_bce", p, g)
    with pytest.raises(ValueError, match="softmax_xent"):
        core.Model(*mlp_spec((784, 1)), np.zeros(785), np.zeros(785))
    with pytest.raises(ValueError, match="layers has 0 entries"):
        core.Model(*mlp_spec((784,)), p, g)
    with pytest.raises(ValueError, match="the output size must be"):
        core.Model(*mlp_spec((784, 0, 10)), p, g)
    with pytest.raises(ValueError, match="params has shape"):
        core.Model(layers, shape, "softmax_xent", p[:-1], g)
    with pytest.raises(ValueError, match="grads has shape"):
        core.Model(layers, shape, "softmax_xent", p, g[:-1])
    with pytest.raises(TypeError, match="grads has dtype float64"):
        core.Model(layers, shape, "softmax_xent", p, g.astype(np.float64))
    with pytest.raises(TypeError, match="params has dtype float16"):
        core.Model(layers, shape, "softmax_xent", p.astype(np.float16), g)
    with pytest.raises(ValueError, match="shares memory"):
        core.Model(layers, shape, "softmax_xent", p, p)
    with pytest.raises(ValueError, match="C-contiguous"):
        core.Model(layers, shape, "softmax_xent", np.zeros(2 * n, np.float32)[::2], g)
    with pytest.raises(TypeError, match="ndarray"):
        core.Model(layers, shape, "softmax_xent", p.tolist(), g)
    with pytest.raises(ValueError, match="threads"):
        core.Model(layers, shape, "softmax_xent", p, g, threads=0)
    g.flags.writeable = False
    with pytest.raises(ValueError, match="grads is read-only"):
        core.Model(layers, shape, "softmax_xent", p, g)


def test_model_rejects_bad_batches():
    sizes = (784, 16, 10)
    n = core.model_plan(*mlp_spec(sizes))["n_params"]
    params, grads = np.zeros(n, np.float32), np.zeros(n, np.float32)
    net = core.Model(*mlp_spec(sizes), params, grads)
    x, labels = np.zeros((64, 784), np.float32), np.zeros(64, np.int64)
    out = np.zeros((64, 10), np.float32)
    cases = [
        (lambda: net.loss_grad(np.zeros((64, 783), np.float32), labels), ValueError,
         "x has shape (64, 783), expected (64, 784)"),
        (lambda: net.evaluate(np.zeros((64, 783), np.float32), labels), ValueError,
         "x has shape (64, 783), expected (64, 784)"),
        (lambda: net.logits(x, np.zeros((64, 9), np.float32)), ValueError,
         "out has shape (64, 9), expected (64, 10)"),
        (lambda: net.loss_grad(x.astype(np.float64), labels), TypeError,
         "x has dtype float64, expected float32"),
        (lambda: net.logits(x, out.astype(np.float64)), TypeError, "out has dtype float64"),
        (lambda: net.loss_grad(x, labels.astype(np.int32)), TypeError, "labels has dtype int32"),
        (lambda: net.evaluate(x, labels.astype(np.int32)), TypeError, "labels has dtype int32"),
        (lambda: net.loss_grad(x, labels[:63]), ValueError, "labels has shape"),
        (lambda: net.loss_grad(x, None), TypeError, "labels"),
        (lambda: net.loss_grad(x.tolist(), labels), TypeError, "x must be a numpy.ndarray"),
        (lambda: net.loss_grad(np.asfortranarray(x), labels), ValueError, "C-contiguous"),
        (lambda: net.loss_grad(x, labels, float("nan")), ValueError, "grad_scale"),
        (lambda: net.loss_grad(x, labels, float("inf")), ValueError, "grad_scale"),
        (lambda: net.logits(x, out[:, :5]), ValueError, "out"),
    ]
    for thunk, exc, fragment in cases:
        with pytest.raises(exc) as info:
            thunk()
        assert fragment in str(info.value), f"{str(info.value)!r} lacks {fragment!r}"
    assert not grads.any(), "a rejected call wrote into grads"
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        net.logits(x, out)
    grads.flags.writeable = False
    with pytest.raises(ValueError, match="grads is read-only"):
        net.loss_grad(x, labels)
    buf = np.zeros(64 * 784, np.float32)
    with pytest.raises(ValueError, match="shares memory"):
        net.logits(buf.reshape(64, 784), buf[:640].reshape(64, 10))


@pytest.mark.parametrize("sizes,loss", [((6, 5, 3), "softmax_xent"), ((6, 5, 1), "sigmoid_bce"),
                                        ((6, 1), "sigmoid_bce")],
                         ids=["softmax", "bce_layers", "bce_fused"])
@pytest.mark.parametrize("index", [0, 100])
def test_model_labels_out_of_range_named_and_grads_untouched(sizes, loss, index):
    """A batch with a bad label raises, naming index and value, and adds nothing to grads.

    Index 100 lies in the second 64-row block of the fused logistic kernel.
    """
    params, grads, x, labels = small_net(loss, sizes, batch=129)
    bad_value = 7
    labels[index] = bad_value
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    for method in (net.evaluate, net.loss_grad):
        with pytest.raises(ValueError) as info:
            method(x, labels)
        msg = str(info.value)
        assert f"labels[{index}]" in msg and str(bad_value) in msg, msg
    assert not grads.any(), (
        f"loss_grad raised on labels[{index}] = {bad_value} but had already accumulated into "
        f"grads ({np.count_nonzero(grads)} of {grads.size} entries nonzero)")


@pytest.mark.parametrize("loss,sizes", [("softmax_xent", (6, 5, 3)), ("sigmoid_bce", (6, 1))])
def test_model_does_not_modify_inputs(loss, sizes):
    params, grads, x, labels = small_net(loss, sizes)
    keep = params.copy(), x.copy(), labels.copy()
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    net.loss_grad(x, labels)
    net.evaluate(x, labels)
    net.logits(x, np.empty((x.shape[0], sizes[-1])))
    for arr, before, name in zip((params, x, labels), keep, ("params", "x", "labels")):
        np.testing.assert_array_equal(arr, before, err_msg=f"Model modified {name}")


def test_model_init_twice_rejected():
    params, grads, _, _ = small_net()
    net = core.Model(*mlp_spec((6, 5, 3)), params, grads)
    with pytest.raises(RuntimeError, match="already initialized"):
        net.__init__(*mlp_spec((6, 5, 3)), params, grads)


# ---------------------------------------------------------------------------------------
# reference leaks

N_CALLS = 2000


def refcounts(objs):
    return [sys.getrefcount(o) for o in objs]


def leak_objects(call):
    objs = list(call.arrays().values())
    if "inputs" in call.args:
        objs.append(call.args["inputs"])
    return objs


@pytest.mark.parametrize("kernel", KERNELS)
def test_no_reference_leaks_on_success(kernel):
    call = make_calls()[kernel]
    if kernel == "sgd_step":
        call.kwargs["lr"] = 1e-6  # 2000 steps must stay finite
    objs = leak_objects(call)
    call()
    before = refcounts(objs)
    for _ in range(N_CALLS):
        call()
    assert refcounts(objs) == before, f"{kernel}: refcounts {before} -> {refcounts(objs)}"


def error_calls():
    """(id, Call) that fail validation at different stages of each kernel's checks."""
    out = []
    for kernel, call in make_calls().items():
        names = call.array_names()
        last = names[-1]
        arr = call.get(last)
        out.append((f"{kernel}-shape-{last}", call.replaced(last, np.zeros((1,) * arr.ndim,
                                                                          arr.dtype))))
        out.append((f"{kernel}-dtype-{last}", call.replaced(last, arr.astype(np.float16))))
        out.append((f"{kernel}-list-{last}", call.replaced(last, arr.tolist())))
    bad_label = make_calls()["softmax_xent"]
    bad_label.get("labels")[5] = 9
    out.append(("softmax_xent-label", bad_label))
    alias = make_calls()["sum_buffers"]
    alias = alias.replaced("inputs[1]", alias.get("out"))
    alias.args["out"] = alias.get("inputs[1]")[:]  # a view: the same memory, another object
    out.append(("sum_buffers-ok_alias", alias))
    return [pytest.param(c, id=i) for i, c in out]


@pytest.mark.parametrize("call", error_calls())
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


# Errors whose message formats a float: check_finite and sgd_step's checks build the float
# object for "%R"/"%S" and must release it. Each leaked float is one pymalloc block, so
# sys.getallocatedblocks() grows by about N_CALLS when it leaks and stays flat when not.
LEAKY_ERROR_CASES = {
    "gemm-alpha_nan": lambda: core.gemm(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)),
                                        alpha=float("nan")),
    "scale_-alpha_inf": lambda: core.scale_(np.ones(3), float("inf")),
    "sum_buffers-scale_nan": lambda: core.sum_buffers(np.ones(3), [np.ones(3)],
                                                      scale=float("nan")),
    "softmax_xent-grad_scale_nan": lambda: core.softmax_xent(np.ones((2, 2)),
                                                             np.zeros(2, np.int64),
                                                             None, float("nan")),
    "sgd_step-lr_nan": lambda: core.sgd_step(np.ones(3), np.ones(3), None, lr=float("nan")),
    "sgd_step-lr_negative": lambda: core.sgd_step(np.ones(3), np.ones(3), None, lr=-1.0),
    "sgd_step-momentum_negative": lambda: core.sgd_step(np.ones(3), np.ones(3), np.ones(3),
                                                        lr=0.1, momentum=-1.0),
    "sgd_step-nesterov_without_momentum": lambda: core.sgd_step(np.ones(3), np.ones(3), None,
                                                                lr=0.1, nesterov=True),
    "sgd_step-velocity_none": lambda: core.sgd_step(np.ones(3), np.ones(3), None, lr=0.1,
                                                    momentum=0.9),
    "control-shape_error": lambda: core.gemm(np.ones((2, 2)), np.ones((3, 2)), np.ones((2, 2))),
    # parse_args: a message naming the argument is built around the conversion's own
    "gemm-alpha_str": lambda: core.gemm(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)),
                                        alpha="2"),
    "gemm-unknown_keyword": lambda: core.gemm(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)),
                                              alpha_=2.0),
    "conv2d_forward-padding_float": lambda: core.conv2d_forward(
        np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)), np.ones(1), np.zeros((1, 1, 2, 2)),
        padding=1.0),
}


@pytest.mark.parametrize("case", list(LEAKY_ERROR_CASES))
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
    assert grown < N_CALLS // 4, f"{case}: {grown} memory blocks left after {N_CALLS} errors"


@pytest.mark.parametrize("loss,sizes", [("softmax_xent", (6, 5, 3)), ("sigmoid_bce", (6, 1))])
def test_model_no_reference_leaks(loss, sizes):
    params, grads, x, labels = small_net(loss, sizes)
    out = np.empty((x.shape[0], sizes[-1]))
    base = refcounts([params, grads])
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    assert refcounts([params, grads]) == [c + 1 for c in base], "Model holds one reference each"
    assert net.params is params and net.grads is grads
    objs = [params, grads, x, labels, out]
    net.loss_grad(x, labels, 1e-9)
    before = refcounts(objs)
    for _ in range(N_CALLS // 4):
        net.loss_grad(x, labels, 1e-9)
        net.evaluate(x, labels)
        net.logits(x, out)
        try:
            net.loss_grad(x[:, :-1], labels)
        except ValueError:
            pass
    assert refcounts(objs) == before
    del objs, net
    assert refcounts([params, grads]) == base, "Model not freed: params/grads still held"


def test_model_failed_init_holds_nothing():
    params, grads, _, _ = small_net()
    base = refcounts([params, grads])
    for _ in range(N_CALLS // 4):
        with pytest.raises(ValueError):
            core.Model(*mlp_spec((6, 5, 4)), params, grads)  # wrong length
        net = core.Model(*mlp_spec((6, 5, 3)), params, grads)
        with pytest.raises(RuntimeError):
            net.__init__(*mlp_spec((6, 5, 3)), params, grads)
        del net
    assert refcounts([params, grads]) == base


def test_context_objects_are_freed():
    """Context with a thread pool: create, use and drop many; the helper threads exit."""
    a, b, c = np.ones((64, 128)), np.ones((128, 128)), np.empty((64, 128))
    start_threads = threading.active_count()
    for _ in range(50):
        ctx = core.Context(threads=3)
        core.gemm(a, b, c, ctx=ctx)
        assert sys.getrefcount(ctx) == 2
        del ctx
    assert threading.active_count() == start_threads


# ---------------------------------------------------------------------------------------
# threads


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

    threads = [threading.Thread(target=body, args=(i, fn), daemon=True)
               for i, fn in enumerate(targets)]
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


NET_SIZES = (64, 48, 10)


def net_job(seed, threads=1, dtype=np.float32):
    params = ref.model_init_params(*mlp_spec(NET_SIZES), seed=seed, dtype=dtype)
    grads = np.zeros_like(params)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((129, NET_SIZES[0])).astype(dtype)
    labels = rng.integers(0, NET_SIZES[-1], 129)
    return core.Model(*mlp_spec(NET_SIZES), params, grads, threads=threads), x, labels


def run_net(job, repeats):
    net, x, labels = job
    return [net.loss_grad(x, labels) for _ in range(repeats)], net.grads.copy()


@pytest.mark.parametrize("net_threads", [1, 2])
def test_two_threads_own_arrays_match_sequential(net_threads):
    repeats = 10
    gemm_jobs = [gemm_job(s) for s in (1, 2)]
    net_jobs = [net_job(s, net_threads) for s in (1, 2)]
    net_jobs_seq = [net_job(s, net_threads) for s in (1, 2)]
    seq_gemm = [run_gemm(j, 1)[0] for j in gemm_jobs]
    seq_net = [run_net(j, repeats) for j in net_jobs_seq]

    def worker(i):
        return lambda: (run_gemm(gemm_jobs[i], repeats), run_net(net_jobs[i], repeats))

    results = run_threads([worker(0), worker(1)])
    for i, (gemm_outs, (losses, grads)) in enumerate(results):
        for c in gemm_outs:
            np.testing.assert_array_equal(c, seq_gemm[i], err_msg=f"thread {i} gemm")
        assert losses == seq_net[i][0], f"thread {i} loss_grad results"
        np.testing.assert_array_equal(grads, seq_net[i][1], err_msg=f"thread {i} grads")


def test_two_threads_sharing_one_model():
    """Calls on one Model serialize: each thread gets its own batch's (loss, correct) and
    grads hold the sum of every call's gradient, as if the calls had run one after another."""
    repeats = 8
    net, x0, labels0 = net_job(5, threads=2)
    _, x1, labels1 = net_job(6)
    solo = {}
    for key, x, labels in (("0", x0, labels0), ("1", x1, labels1)):
        g_before = net.grads.copy()
        solo[key] = net.loss_grad(x, labels)
        solo["g" + key] = net.grads - g_before
    net.grads[:] = 0

    def worker(x, labels):
        return lambda: [net.loss_grad(x, labels) for _ in range(repeats)]

    r0, r1 = run_threads([worker(x0, labels0), worker(x1, labels1)])
    assert r0 == [solo["0"]] * repeats
    assert r1 == [solo["1"]] * repeats
    want = repeats * (solo["g0"].astype(np.float64) + solo["g1"])
    np.testing.assert_allclose(net.grads, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_two_threads_sharing_one_context():
    ctx = core.Context(threads=2)
    jobs = [gemm_job(s, ctx) for s in (3, 4)]
    seq = [run_gemm(j, 1)[0] for j in jobs]
    results = run_threads([lambda j=j: run_gemm(j, 10) for j in jobs])
    for i, outs in enumerate(results):
        for c in outs:
            np.testing.assert_array_equal(c, seq[i], err_msg=f"thread {i} gemm with shared ctx")


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_fresh_thread_pool_used_at_once_does_not_deadlock(threads):
    """Regression: a helper thread that started after the first job was posted used to
    skip that job and leave the caller waiting forever. Create-and-use, many times."""
    a, b, c = np.ones((64, 256)), np.ones((256, 256)), np.empty((64, 256))
    params, grads, x, labels = small_net(sizes=(6, 64, 3), batch=256)

    def churn():
        for _ in range(100):
            core.gemm(a, b, c, ctx=core.Context(threads=threads))
            core.Model(*mlp_spec((6, 64, 3)), params, grads,
                       threads=threads).loss_grad(x, labels)
        return True

    assert run_threads([churn]) == [True]
    np.testing.assert_array_equal(c, np.full((64, 256), 256.0))


# ---------------------------------------------------------------------------------------
# the GIL


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
    return {
        "gemm": lambda: core.gemm(a, b, c),
        "gemm_naive": lambda: core.gemm_naive(a[:100], b, c[:100]),
        "dense_forward": lambda: core.dense_forward(a, b, a[0], c),
        "Model.loss_grad": lambda: net.loss_grad(x, labels),
        "Model.evaluate": lambda: net.evaluate(x, labels),
        "sum_buffers": lambda: core.sum_buffers(big[0], big[1:]),
        "softmax_xent": lambda: core.softmax_xent(z, zl),
    }


@pytest.mark.parametrize("kernel", ["gemm", "gemm_naive", "dense_forward", "Model.loss_grad",
                                    "Model.evaluate", "sum_buffers", "softmax_xent"])
def test_kernel_releases_the_gil(kernel, gil_probe):
    assert gil_probe(gil_cases()[kernel]), (
        f"{kernel}: the main thread never ran while the worker was inside the call")


def test_gil_probe_detects_a_call_that_holds_the_gil(gil_probe):
    """The probe itself can fail: a pure-Python busy loop never releases the GIL."""
    def hold():
        s = 0
        for i in range(20000):
            s += i
        return s

    assert not gil_probe(hold, max_calls=20)
