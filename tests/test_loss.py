"""The losses and what is counted from them (csrc/dp_loss.h): dptrain._core.softmax_xent,
sigmoid_bce, argmax and count_correct against dptrain.reference.softmax_xent, sigmoid_bce,
argmax, count_correct over odd shapes, both dtypes, every kernel ISA, with and without the
gradient and its scale; stable for huge logits; central finite differences; ties and NaN as
NumPy's argmax; and their boundary (labels int64 and in range, named by index and value;
dlogits aliasing logits).
"""

import numpy as np
import pytest
from _core_helpers import (
    DTYPES,
    assert_close,
    assert_rejected,
    dname,
    family_tests,
    make_calls,
    numeric_grad,
    rng_for,
    shape_id,
    shape_params,
)

from dptrain import _core as core
from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

SOFTMAX_SHAPES = [(b, c) for b in (1, 7, 33, 129) for c in (2, 7, 33, 129)] + [(7, 1)]


GRAD_MODES = ["loss_only", "default_scale", "scale=0.37", "scale=-2.5"]


def grad_mode_args(mode, batch):
    """(pass dlogits?, grad_scale argument, effective grad_scale) for a GRAD_MODES entry."""
    if mode == "loss_only":
        return False, None, None
    if mode == "default_scale":
        return True, None, 1.0 / batch
    gs = float(mode.split("=")[1])
    return True, gs, gs


@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("b_rows,n_classes", shape_params(SOFTMAX_SHAPES))
def test_softmax_xent(isa, b_rows, n_classes, dtype, mode):
    rng = rng_for("softmax", b_rows, n_classes, dname(dtype))
    z = (3 * rng.standard_normal((b_rows, n_classes))).astype(dtype)
    labels = rng.integers(0, n_classes, b_rows)
    with_grad, gs_arg, gs = grad_mode_args(mode, b_rows)
    d = np.full_like(z, np.nan) if with_grad else None
    d_ref = np.empty_like(z) if with_grad else None
    z_in, labels_in = z.copy(), labels.copy()
    loss = core.softmax_xent(z, labels, d, gs_arg)
    loss_ref = ref.softmax_xent(z, labels, d_ref, gs_arg)
    what = f"softmax_xent B,C={b_rows, n_classes} dtype={dname(dtype)} {mode}"
    assert isinstance(loss, float), what
    loss_scale = float(np.sum(1 + 2 * np.abs(z).max(1).astype(np.float64))) + abs(loss_ref)
    assert_close(loss, loss_ref, dtype=dtype, scale=loss_scale, k=n_classes, what=what + " loss")
    if with_grad:
        assert_close(d, d_ref, dtype=dtype, scale=abs(gs), k=n_classes, what=what + " dlogits")
    np.testing.assert_array_equal(z, z_in, err_msg=what + " modified logits")
    np.testing.assert_array_equal(labels, labels_in, err_msg=what + " modified labels")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_softmax_xent_is_stable_for_huge_logits(dtype):
    z = np.array([[1000.0, -1000.0, 0.0], [-500.0, -400.0, -450.0]], dtype)
    labels = np.array([1, 1])
    d, d_ref = np.empty_like(z), np.empty_like(z)
    loss = core.softmax_xent(z, labels, d)
    loss_ref = ref.softmax_xent(z, labels, d_ref)
    assert np.isfinite(loss) and np.all(np.isfinite(d))
    assert_close(loss, loss_ref, dtype=dtype, scale=2000.0, k=3, what="softmax_xent huge logits")
    assert_close(d, d_ref, dtype=dtype, scale=0.5, k=3, what="softmax_xent huge logits dlogits")


BCE_SHAPES = [(1,), (7,), (33,), (129,), (1, 1), (7, 1), (129, 1)]


@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", BCE_SHAPES, ids=shape_id)
def test_sigmoid_bce(isa, shape, dtype, mode):
    rng = rng_for("bce", shape, dname(dtype))
    z = (4 * rng.standard_normal(shape)).astype(dtype)
    z.reshape(-1)[::4] = 0.0
    z.reshape(-1)[1::9] = 80.0  # exp(-|z|) underflows in float32: still finite
    z.reshape(-1)[2::9] = -80.0
    b_rows = shape[0]
    labels = rng.integers(0, 2, b_rows)
    with_grad, gs_arg, gs = grad_mode_args(mode, b_rows)
    d = np.full_like(z, np.nan) if with_grad else None
    d_ref = np.empty_like(z) if with_grad else None
    z_in = z.copy()
    loss = core.sigmoid_bce(z, labels, d, gs_arg)
    loss_ref = ref.sigmoid_bce(z, labels, d_ref, gs_arg)
    what = f"sigmoid_bce shape={shape} dtype={dname(dtype)} {mode}"
    assert isinstance(loss, float), what
    loss_scale = float(np.sum(1 + np.abs(z.astype(np.float64))))
    assert_close(loss, loss_ref, dtype=dtype, scale=loss_scale, what=what + " loss")
    if with_grad:
        assert d.shape == z.shape
        assert_close(d, d_ref, dtype=dtype, scale=abs(gs), what=what + " dlogits")
    np.testing.assert_array_equal(z, z_in, err_msg=what + " modified logits")


@pytest.mark.parametrize("fn", ["softmax_xent", "sigmoid_bce"])
def test_loss_gradients_finite_differences(fn):
    """dlogits with grad_scale = g is the gradient of g * loss_sum."""
    rng = rng_for("loss_fd", fn)
    shape = (6, 4) if fn == "softmax_xent" else (6,)
    z = 2 * rng.standard_normal(shape)
    labels = rng.integers(0, shape[1] if len(shape) == 2 else 2, shape[0])
    kernel = getattr(core, fn)
    d = np.empty_like(z)
    kernel(z, labels, d, 0.7)
    num = numeric_grad(lambda: 0.7 * kernel(z, labels), z)
    np.testing.assert_allclose(num, d, rtol=1e-6, atol=1e-8, err_msg=f"{fn} dlogits")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize(
    "b_rows,n_classes", shape_params([(1, 1), (7, 2), (33, 7), (129, 33), (7, 129)])
)
def test_argmax_first_maximum_wins(b_rows, n_classes, dtype):
    rng = rng_for("argmax", b_rows, n_classes, dname(dtype))
    x = rng.integers(0, 3, (b_rows, n_classes)).astype(dtype)  # ties in almost every row
    x[0] = 1.0  # a row that is all one tie
    if b_rows > 2:
        x[1] = -np.inf
        x[2, -1] = np.inf
    out = np.full(b_rows, -1, np.int64)
    want = np.empty(b_rows, np.int64)
    core.argmax(x, out)
    ref.argmax(x, want)
    np.testing.assert_array_equal(
        out, want, err_msg=f"argmax B,C={b_rows, n_classes} dtype={dname(dtype)}"
    )
    np.testing.assert_array_equal(out, np.argmax(x, axis=1))


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", [(1, 2), (7, 3), (33, 7), (129, 10), (129, 129)], ids=shape_id)
def test_count_correct_multiclass(shape, dtype):
    rng = rng_for("count_multi", shape, dname(dtype))
    z = rng.integers(0, 3, shape).astype(dtype)  # ties: the first maximum is the prediction
    labels = rng.integers(0, shape[1], shape[0])
    labels[: shape[0] // 2] = np.argmax(z[: shape[0] // 2], axis=1)  # about half right
    n = core.count_correct(z, labels)
    assert isinstance(n, int)
    assert n == ref.count_correct(z, labels), f"count_correct shape={shape} dtype={dname(dtype)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", [(1,), (7,), (129,), (1, 1), (33, 1), (129, 1)], ids=shape_id)
def test_count_correct_binary(shape, dtype):
    rng = rng_for("count_binary", shape, dname(dtype))
    z = rng.standard_normal(shape).astype(dtype)
    z.reshape(-1)[::3] = 0.0  # z == 0 predicts 0
    labels = rng.integers(0, 2, shape[0])
    n = core.count_correct(z, labels)
    assert n == ref.count_correct(z, labels), f"count_correct shape={shape} dtype={dname(dtype)}"
    assert n == int(np.sum((z.reshape(-1) > 0) == (labels == 1)))


# ---------------------------------------------------------------------------------------
# boundary


@pytest.mark.boundary
@pytest.mark.parametrize("kernel", ["softmax_xent", "sigmoid_bce", "count_correct"])
@pytest.mark.parametrize("bad", [np.int32, np.uint8, np.float64], ids=lambda d: np.dtype(d).name)
def test_labels_must_be_int64(kernel, bad):
    call = make_calls()[kernel]
    call = call.replaced("labels", call.get("labels").astype(bad))
    assert_rejected(call, TypeError, "labels", np.dtype(bad).name, "int64", what=kernel)


@pytest.mark.boundary
@pytest.mark.parametrize("bad", [np.int32, np.float64], ids=lambda d: np.dtype(d).name)
def test_argmax_out_must_be_int64(bad):
    call = make_calls()["argmax"].replaced("out", np.zeros(7, bad))
    assert_rejected(call, TypeError, "out", np.dtype(bad).name, "int64", what="argmax")


@pytest.mark.boundary
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
        f"softmax_xent(z, labels, dlogits=z) returned loss {loss}, expected {loss_ref}"
    )


@pytest.mark.boundary
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


@pytest.mark.boundary
@pytest.mark.parametrize(
    "kernel,index,value",
    [
        ("softmax_xent", 3, 4),
        ("softmax_xent", 0, -1),
        ("softmax_xent", 6, 1 << 40),
        ("sigmoid_bce", 2, 2),
        ("sigmoid_bce", 5, -1),
    ],
)
def test_labels_out_of_range_named_by_index_and_value(kernel, index, value):
    call = make_calls()[kernel]
    call.get("labels")[index] = value
    # labels are checked inside the kernel's loop: dlogits may already be partly written
    assert_rejected(
        call,
        ValueError,
        "labels",
        f"[{index}]",
        str(value),
        what=kernel,
        unchanged=["logits", "labels"],
    )


@pytest.mark.boundary
@pytest.mark.parametrize(
    "logits_shape,index,value",
    [((7, 4), 3, 4), ((7, 4), 0, -1), ((7,), 2, 2), ((7, 1), 6, 3)],
    ids=["multiclass-4", "multiclass--1", "binary-2", "binary_B1-3"],
)
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
# behaviour fixed after review


@pytest.mark.parametrize("row", [[1.0, np.nan, 3.0], [np.nan, np.nan, 1.0], [5.0, 5.0, 1.0]])
def test_argmax_follows_numpy_with_nan_and_ties(row):
    x = np.array([row])
    out = np.empty(1, np.int64)
    core.argmax(x, out)
    assert out[0] == np.argmax(x, axis=1)[0]


@pytest.mark.parametrize("scale", [1e308, -1e308, 3e38, 0.5])
def test_softmax_xent_grad_scale_past_float32_gives_the_twins_infinities(scale):
    """grad_scale 1e308 is inf in float32: the label's gradient (p - 1) * inf is -inf (as
    the NumPy twin computes it), not p * inf - inf = NaN (the fuzzer's 503k-call campaign)."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal((6, 5)).astype(np.float32)
    z[0, 2] = 200.0  # a row whose softmax is exactly one-hot
    labels = np.array([2, 0, 4, 1, 3, 2])
    got, want = np.empty_like(z), np.empty_like(z)
    with np.errstate(over="ignore", invalid="ignore"):
        loss = core.softmax_xent(z, labels, got, grad_scale=scale)
        ref_loss = ref.softmax_xent(z, labels, want, grad_scale=scale)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=0)


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernels (_core_helpers.family_tests)

globals().update(
    family_tests(("softmax_xent", "sigmoid_bce", "argmax", "count_correct"), gil=("softmax_xent",))
)
