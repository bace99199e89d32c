"""The dense layer (csrc/dp_dense.h): dptrain._core.dense_forward and dense_backward against
dptrain.reference.dense_forward / dense_backward over odd shapes, both dtypes, every kernel ISA,
with and without a Context; the backward accumulates into dw and db and writes dx, and equals
central finite differences; and the layer's boundary.
"""

import numpy as np
import pytest
from _core_helpers import (
    DTYPES,
    assert_close,
    dname,
    family_tests,
    make_calls,
    numeric_grad,
    randn,
    rng_for,
    shape_params,
)

from dptrain import _core as core
from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

DENSE_SHAPES = [  # (B, IN, OUT)
    (1, 1, 1),
    (7, 33, 1),
    (1, 7, 33),
    (33, 1, 7),
    (129, 33, 7),
    (7, 129, 33),
    (33, 7, 129),
    (128, 784, 256),
]


def dense_data(b_rows, n_in, n_out, dtype, tag):
    rng = rng_for(tag, b_rows, n_in, n_out, dname(dtype))
    return (
        randn(rng, (b_rows, n_in), dtype),
        randn(rng, (n_out, n_in), dtype),
        randn(rng, (n_out,), dtype),
        randn(rng, (b_rows, n_out), dtype),
        rng,
    )


@pytest.fixture(scope="module")
def ctx2():
    return core.Context(threads=2)


@pytest.mark.parametrize("use_ctx", [False, True], ids=["ctx=None", "ctx=Context(2)"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("b_rows,n_in,n_out", shape_params(DENSE_SHAPES))
def test_dense_forward(isa, b_rows, n_in, n_out, dtype, use_ctx, ctx2):
    x, w, b, _, _ = dense_data(b_rows, n_in, n_out, dtype, "dense_forward")
    kw = {"ctx": ctx2} if use_ctx else {}
    y = np.full((b_rows, n_out), np.nan, dtype)  # y is fully overwritten
    want = np.empty_like(y)
    core.dense_forward(x, w, b, y, **kw)
    ref.dense_forward(x, w, b, want)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T + np.abs(b)
    assert_close(
        y,
        want,
        dtype=dtype,
        scale=scale,
        k=n_in + 1,
        what=f"dense_forward[{isa}] B,IN,OUT={b_rows, n_in, n_out} "
        f"dtype={dname(dtype)} ctx={use_ctx}",
    )


@pytest.mark.parametrize("with_dx", [False, True], ids=["no_dx", "dx"])
@pytest.mark.parametrize("use_ctx", [False, True], ids=["ctx=None", "ctx=Context(2)"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("b_rows,n_in,n_out", shape_params(DENSE_SHAPES))
def test_dense_backward(isa, b_rows, n_in, n_out, dtype, use_ctx, with_dx, ctx2):
    x, w, _, dy, rng = dense_data(b_rows, n_in, n_out, dtype, "dense_backward")
    dw0, db0 = randn(rng, w.shape, dtype), randn(rng, (n_out,), dtype)  # accumulated into
    dw, db, dw_ref, db_ref = dw0.copy(), db0.copy(), dw0.copy(), db0.copy()
    dx = np.full(x.shape, np.nan, dtype) if with_dx else None
    dx_ref = np.empty_like(x) if with_dx else None
    kw = {"ctx": ctx2} if use_ctx else {}
    core.dense_backward(dy, x, w, dw, db, dx, **kw)
    ref.dense_backward(dy, x, w, dw_ref, db_ref, dx_ref)
    what = (
        f"dense_backward[{isa}] B,IN,OUT={b_rows, n_in, n_out} dtype={dname(dtype)} ctx={use_ctx}"
    )
    ady, ax = np.abs(dy).astype(np.float64), np.abs(x).astype(np.float64)
    assert_close(
        dw, dw_ref, dtype=dtype, scale=ady.T @ ax + np.abs(dw0), k=b_rows + 1, what=what + " dw"
    )
    assert_close(
        db, db_ref, dtype=dtype, scale=ady.sum(0) + np.abs(db0), k=b_rows + 1, what=what + " db"
    )
    if with_dx:
        assert_close(dx, dx_ref, dtype=dtype, scale=ady @ np.abs(w), k=n_out, what=what + " dx")


def test_dense_backward_accumulates_and_dx_is_overwritten():
    x = np.array([[1.0, 2.0]])
    w = np.array([[3.0, 4.0]])
    dy = np.array([[0.5]])
    dw, db, dx = np.ones((1, 2)), np.ones(1), np.full((1, 2), 7.0)
    core.dense_backward(dy, x, w, dw, db, dx)
    core.dense_backward(dy, x, w, dw, db, dx)
    np.testing.assert_array_equal(dw, [[2.0, 3.0]])
    np.testing.assert_array_equal(db, [2.0])
    np.testing.assert_array_equal(dx, [[1.5, 2.0]])


@pytest.mark.parametrize("b_rows,n_in,n_out", shape_params([(5, 4, 3), (1, 7, 2)]))
def test_dense_gradients_finite_differences(b_rows, n_in, n_out):
    """L = sum(R * dense_forward(x)): dense_backward(dy=R) must give dL/dw, dL/db, dL/dx."""
    rng = rng_for("dense_fd", b_rows, n_in, n_out)
    x, w, b, r = (
        rng.standard_normal(s) for s in [(b_rows, n_in), (n_out, n_in), (n_out,), (b_rows, n_out)]
    )
    y = np.empty((b_rows, n_out))

    def loss():
        core.dense_forward(x, w, b, y)
        return float(np.sum(r * y))

    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.empty_like(x)
    core.dense_backward(r, x, w, dw, db, dx)
    for name, arr, grad in [("w", w, dw), ("b", b, db), ("x", x, dx)]:
        np.testing.assert_allclose(
            numeric_grad(loss, arr),
            grad,
            rtol=1e-6,
            atol=1e-8,
            err_msg=f"dense_backward d{name} vs finite differences B,IN,OUT={b_rows, n_in, n_out}",
        )


# ---------------------------------------------------------------------------------------
# boundary


@pytest.mark.boundary
def test_read_only_inputs_are_accepted():
    call = make_calls()["dense_forward"]
    for name in ("x", "w", "b"):
        call.get(name).flags.writeable = False
    call()


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernels (_core_helpers.family_tests)

globals().update(family_tests(("dense_forward", "dense_backward"), gil=("dense_forward",)))
