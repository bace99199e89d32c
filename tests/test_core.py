"""The C core (dptrain._core) against the NumPy reference (dptrain.reference).

Every kernel is called with the same arrays as its reference twin over odd shapes (1, 7, 33,
129 and a 128x784x256 layer) and both dtypes; results must agree to a per-dtype tolerance
that is relative to the magnitude of the terms being summed:

    |c - ref| <= RTOL[dtype] * sqrt(K) * scale

where K is the length of the reduction and `scale` the size of the summands (for a GEMM,
|alpha| |op(a)| @ |op(b)| + |beta| |c|), so a cancellation in the result cannot make the test
flaky, and a wrong transpose, stride or blocking edge (an O(1) relative error) cannot pass.

The GEMM-based tests and the vector kernels' (csrc/dp_vec.h: ReLU, the losses, SGD, the buffer
sums) run on every kernel ISA this CPU has (conftest.isa: _core.set_isa forces each; an ISA the
CPU lacks is a skip that names it). Backward kernels and Model.loss_grad on dense stacks are
also checked against central finite differences in float64.

Boundary hygiene (bad arguments, leaks, threads, the GIL) lives in test_boundary.py.
"""
import functools
import itertools
import math
import zlib

import numpy as np
import pytest

from dptrain import MLP
from dptrain import _core as core
from dptrain import reference as ref
from _core_helpers import mlp_spec

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
        pytest.fail(f"{what}: {int(bad.sum())} of {bad.size} values off; worst at {i}: "
                    f"got {got[i]!r}, expected {want[i]!r} (tolerance {tol[i]:.3g})")


@pytest.fixture(scope="module")
def ctx2():
    return core.Context(threads=2)


def test_context_threads_attribute():
    assert core.Context().threads == 1
    assert core.Context(threads=3).threads == 3


# ---------------------------------------------------------------------------------------
# gemm and gemm_naive

# (M, N, K): odd sizes around the 6 x 8/16 micro-tile, and shapes that cross the blocking
# (K > KC = 320/256 gives several K slices, M > MC = 120/96 several row blocks, N > NC = 3072
# two column panels in float32).
GEMM_SHAPES = [
    (1, 1, 1), (1, 7, 33), (7, 1, 33), (33, 7, 1), (7, 33, 129), (129, 33, 7),
    (33, 129, 7), (129, 129, 129), (128, 256, 784), (250, 5, 641), (6, 3100, 9),
    (100, 64, 27),      # K = 27 (a 3x3 conv of 3 channels): the small-K kernel in two passes
]
# (alpha, beta); beta == 0 runs with c full of NaN: the contract says c is then never read.
# (1, 0) and (1, 1) are the engines' products (the small-K kernel takes them).
ALPHA_BETA = [(1.0, 0.0), (1.0, 1.0), (0.5, 0.0), (-2.0, 1.0), (1.5, -0.25), (0.0, 0.5),
              (0.0, 0.0)]


def shape_id(shape):
    return "x".join(str(s) for s in shape)


def shape_params(shapes):
    """pytest.param per shape tuple, with an id such as 128x256x784."""
    return [pytest.param(*s, id=shape_id(s)) for s in shapes]


def check_gemm(fn, name, m, n, k, trans_a, trans_b, dtype, ctx=None):
    rng = rng_for(name, m, n, k, trans_a, trans_b, dname(dtype))
    a = randn(rng, (k, m) if trans_a else (m, k), dtype)
    b = randn(rng, (n, k) if trans_b else (k, n), dtype)
    c0 = randn(rng, (m, n), dtype)
    a_in, b_in = a.copy(), b.copy()
    op_a = np.abs(a.T if trans_a else a).astype(np.float64)
    op_b = np.abs(b.T if trans_b else b).astype(np.float64)
    magnitude = op_a @ op_b  # (M, N): the sum of |terms| of each dot product
    kw = {} if ctx is None else {"ctx": ctx}
    for alpha, beta in ALPHA_BETA:
        start = np.full((m, n), np.nan, dtype) if beta == 0 else c0
        c, want = start.copy(), start.copy()
        fn(a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, **kw)
        ref.gemm(a, b, want, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        scale = abs(alpha) * magnitude + (abs(beta) * np.abs(c0) if beta else 0.0)
        assert_close(c, want, dtype=dtype, scale=scale, k=k + 1,
                     what=f"{name} M,N,K={m, n, k} trans_a={trans_a} trans_b={trans_b} "
                          f"alpha={alpha} beta={beta} dtype={dname(dtype)}")
    np.testing.assert_array_equal(a, a_in, err_msg=f"{name} modified a")
    np.testing.assert_array_equal(b, b_in, err_msg=f"{name} modified b")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)),
                         ids=lambda t: "T" if t else "N")
@pytest.mark.parametrize("m,n,k", shape_params(GEMM_SHAPES))
def test_gemm(isa, m, n, k, trans_a, trans_b, dtype):
    check_gemm(core.gemm, f"gemm[{isa}]", m, n, k, trans_a, trans_b, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)),
                         ids=lambda t: "T" if t else "N")
@pytest.mark.parametrize("m,n,k", shape_params(GEMM_SHAPES))
def test_gemm_naive(m, n, k, trans_a, trans_b, dtype):
    check_gemm(core.gemm_naive, "gemm_naive", m, n, k, trans_a, trans_b, dtype)


# Big enough that the pool really splits the work: along N, and along M when N is narrower
# than the thread count's worth of NR micro-panels (250 x 5).
CTX_SHAPES = [(128, 256, 784), (250, 5, 641), (6, 3100, 9), (33, 129, 129), (129, 17, 200)]


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)),
                         ids=lambda t: "T" if t else "N")
@pytest.mark.parametrize("m,n,k", shape_params(CTX_SHAPES))
def test_gemm_with_context(isa, m, n, k, trans_a, trans_b, dtype, threads):
    ctx = core.Context(threads=threads)
    check_gemm(core.gemm, f"gemm[{isa}, Context(threads={threads})]", m, n, k,
               trans_a, trans_b, dtype, ctx=ctx)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("m,n,k,trans_a,trans_b", [
    (8192, 1, 520, False, True),     # x w^T: rows of x, split by rows
    (8192, 1, 520, True, True),      # x^T stored: columns, split by columns
    (1, 520, 8192, True, False),     # dz^T x: columns, split by columns (8 units + 8 columns)
    (1, 8192, 520, False, True),     # rows of w^T
], ids=["N1-rows", "N1-cols", "M1-cols", "M1-rows"])
def test_gemv_has_the_same_bits_on_any_threads(isa, m, n, k, trans_a, trans_b, dtype):
    """A matrix-vector GEMM (dp_gemm_drv.h's gemv), big enough for several threads: the same
    bits on 1, 2 and 3 threads, and within the bound of np.matmul."""
    rng = rng_for("gemv-threads", m, n, k)
    a = randn(rng, (k, m) if trans_a else (m, k), dtype)
    b = randn(rng, (n, k) if trans_b else (k, n), dtype)
    outs = []
    for threads in (1, 2, 3):
        c = np.full((m, n), np.nan, dtype)
        core.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, ctx=core.Context(threads=threads))
        outs.append(c)
    for threads, c in zip((2, 3), outs[1:]):
        np.testing.assert_array_equal(c, outs[0], err_msg=f"gemv[{isa}] {m}x{n}x{k} on {threads} "
                                                          f"threads against 1")
    op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
    assert_close(outs[0], op_a @ op_b, dtype=dtype, scale=np.abs(op_a) @ np.abs(op_b), k=k,
                 what=f"gemv[{isa}] {m}x{n}x{k} vs np.matmul")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_gemm_matches_its_naive_twin(isa, dtype):
    for m, n, k in GEMM_SHAPES:
        rng = rng_for("twin", m, n, k)
        a, b = randn(rng, (m, k), dtype), randn(rng, (k, n), dtype)
        c1, c2 = np.empty((m, n), dtype), np.empty((m, n), dtype)
        core.gemm(a, b, c1)
        core.gemm_naive(a, b, c2)
        assert_close(c1, c2, dtype=dtype, scale=np.abs(a) @ np.abs(b), k=k,
                     what=f"gemm[{isa}] vs gemm_naive M,N,K={m, n, k} dtype={dname(dtype)}")


@pytest.mark.parametrize("fn", [core.gemm, core.gemm_naive], ids=["gemm", "gemm_naive"])
def test_gemm_beta_zero_ignores_inf_and_nan_in_c(isa, fn):
    a = np.ones((7, 5))
    b = np.ones((5, 9))
    c = np.full((7, 9), np.nan)
    c[::2] = np.inf
    fn(a, b, c, alpha=2.0, beta=0.0)
    np.testing.assert_array_equal(c, np.full((7, 9), 10.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_gemm_empty_dimensions(dtype):
    """K == 0: op(a) @ op(b) is all zeros, so c = beta * c; M or N == 0: nothing to do."""
    c = np.full((3, 4), 2.0, dtype)
    core.gemm(np.empty((3, 0), dtype), np.empty((0, 4), dtype), c, beta=0.5)
    np.testing.assert_array_equal(c, np.full((3, 4), 1.0, dtype))
    core.gemm(np.empty((3, 0), dtype), np.empty((0, 4), dtype), c, beta=0.0)
    np.testing.assert_array_equal(c, np.zeros((3, 4), dtype))
    core.gemm(np.empty((0, 5), dtype), np.ones((5, 4), dtype), np.empty((0, 4), dtype))


# ---------------------------------------------------------------------------------------
# dense layer

DENSE_SHAPES = [  # (B, IN, OUT)
    (1, 1, 1), (7, 33, 1), (1, 7, 33), (33, 1, 7), (129, 33, 7), (7, 129, 33), (33, 7, 129),
    (128, 784, 256),
]


def dense_data(b_rows, n_in, n_out, dtype, tag):
    rng = rng_for(tag, b_rows, n_in, n_out, dname(dtype))
    return (randn(rng, (b_rows, n_in), dtype), randn(rng, (n_out, n_in), dtype),
            randn(rng, (n_out,), dtype), randn(rng, (b_rows, n_out), dtype), rng)


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
    assert_close(y, want, dtype=dtype, scale=scale, k=n_in + 1,
                 what=f"dense_forward[{isa}] B,IN,OUT={b_rows, n_in, n_out} "
                      f"dtype={dname(dtype)} ctx={use_ctx}")


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
    what = (f"dense_backward[{isa}] B,IN,OUT={b_rows, n_in, n_out} "
            f"dtype={dname(dtype)} ctx={use_ctx}")
    ady, ax = np.abs(dy).astype(np.float64), np.abs(x).astype(np.float64)
    assert_close(dw, dw_ref, dtype=dtype, scale=ady.T @ ax + np.abs(dw0), k=b_rows + 1,
                 what=what + " dw")
    assert_close(db, db_ref, dtype=dtype, scale=ady.sum(0) + np.abs(db0), k=b_rows + 1,
                 what=what + " db")
    if with_dx:
        assert_close(dx, dx_ref, dtype=dtype, scale=ady @ np.abs(w), k=n_out,
                     what=what + " dx")


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
    x, w, b, r = (rng.standard_normal(s) for s in
                  [(b_rows, n_in), (n_out, n_in), (n_out,), (b_rows, n_out)])
    y = np.empty((b_rows, n_out))

    def loss():
        core.dense_forward(x, w, b, y)
        return float(np.sum(r * y))

    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.empty_like(x)
    core.dense_backward(r, x, w, dw, db, dx)
    for name, arr, grad in [("w", w, dw), ("b", b, db), ("x", x, dx)]:
        np.testing.assert_allclose(numeric_grad(loss, arr), grad, rtol=1e-6, atol=1e-8,
                                   err_msg=f"dense_backward d{name} vs finite differences "
                                           f"B,IN,OUT={b_rows, n_in, n_out}")


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


# ---------------------------------------------------------------------------------------
# relu

RELU_SHAPES = [(1,), (7,), (33, 7), (129, 33), (2, 3, 5)]


def relu_input(shape, dtype, tag):
    x = randn(rng_for(tag, shape, dname(dtype)), shape, dtype)
    flat = x.reshape(-1)
    flat[::5] = 0.0  # exact zeros: relu(0) = 0 and relu'(0) = 0
    flat[1::7] = -0.0
    return x


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", RELU_SHAPES, ids=shape_id)
def test_relu_forward(isa, shape, dtype, in_place):
    x = relu_input(shape, dtype, "relu_forward")
    want = np.empty_like(x)
    ref.relu_forward(x, want)
    if in_place:
        y = x
    else:
        y = np.full_like(x, np.nan)
    core.relu_forward(x, y)
    np.testing.assert_array_equal(y, want, err_msg=f"relu_forward shape={shape} "
                                                   f"dtype={dname(dtype)} in_place={in_place}")
    assert y.dtype == dtype


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "dx_is_dy"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", RELU_SHAPES, ids=shape_id)
def test_relu_backward(isa, shape, dtype, in_place):
    y = np.maximum(relu_input(shape, dtype, "relu_backward_y"), 0)
    dy = randn(rng_for("relu_backward_dy", shape, dname(dtype)), shape, dtype)
    dy.reshape(-1)[::3] = np.inf  # masked entries are exactly 0 even where dy is inf
    want = np.empty_like(dy)
    ref.relu_backward(dy, y, want)
    dx = dy if in_place else np.full_like(dy, np.nan)
    core.relu_backward(dy, y, dx)
    np.testing.assert_array_equal(dx, want, err_msg=f"relu_backward shape={shape} "
                                                    f"dtype={dname(dtype)} in_place={in_place}")


def test_relu_gradient_finite_differences():
    rng = rng_for("relu_fd")
    x = rng.standard_normal((6, 5))
    x[np.abs(x) < 1e-3] = 0.5  # keep away from the kink
    r = rng.standard_normal(x.shape)
    y = np.empty_like(x)

    def loss():
        core.relu_forward(x, y)
        return float(np.sum(r * y))

    loss()
    dx = np.empty_like(x)
    core.relu_backward(r, y, dx)
    np.testing.assert_allclose(numeric_grad(loss, x), dx, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------
# losses

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


# ---------------------------------------------------------------------------------------
# argmax and count_correct


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("b_rows,n_classes",
                         shape_params([(1, 1), (7, 2), (33, 7), (129, 33), (7, 129)]))
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
    np.testing.assert_array_equal(out, want, err_msg=f"argmax B,C={b_rows, n_classes} "
                                                     f"dtype={dname(dtype)}")
    np.testing.assert_array_equal(out, np.argmax(x, axis=1))


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", [(1, 2), (7, 3), (33, 7), (129, 10), (129, 129)],
                         ids=shape_id)
def test_count_correct_multiclass(shape, dtype):
    rng = rng_for("count_multi", shape, dname(dtype))
    z = rng.integers(0, 3, shape).astype(dtype)  # ties: the first maximum is the prediction
    labels = rng.integers(0, shape[1], shape[0])
    labels[: shape[0] // 2] = np.argmax(z[: shape[0] // 2], axis=1)  # about half right
    n = core.count_correct(z, labels)
    assert isinstance(n, int)
    assert n == ref.count_correct(z, labels), f"count_correct shape={shape} dtype={dname(dtype)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", [(1,), (7,), (129,), (1, 1), (33, 1), (129, 1)],
                         ids=shape_id)
def test_count_correct_binary(shape, dtype):
    rng = rng_for("count_binary", shape, dname(dtype))
    z = rng.standard_normal(shape).astype(dtype)
    z.reshape(-1)[::3] = 0.0  # z == 0 predicts 0
    labels = rng.integers(0, 2, shape[0])
    n = core.count_correct(z, labels)
    assert n == ref.count_correct(z, labels), f"count_correct shape={shape} dtype={dname(dtype)}"
    assert n == int(np.sum((z.reshape(-1) > 0) == (labels == 1)))


# ---------------------------------------------------------------------------------------
# sgd_step


def sgd_configs():
    """(momentum, dampening, weight_decay, nesterov, first_step on the first of 3 steps).

    Nesterov needs momentum > 0 and dampening == 0, as in torch.optim.SGD.
    """
    out = []
    for mom, damp, wd, nest, first in itertools.product(
            [0.0, 0.9], [0.0, 0.3], [0.0, 0.01], [False, True], [True, False]):
        if nest and (mom == 0 or damp != 0):
            continue
        if mom == 0 and (damp != 0 or not first):  # dampening/first_step only matter with momentum
            continue
        out.append(pytest.param(mom, damp, wd, nest, first,
                                id=f"mom={mom}-damp={damp}-wd={wd}-nesterov={nest}-first={first}"))
    return out


@pytest.mark.parametrize("n", [1, 7, 33, 129, 4099])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("momentum,dampening,weight_decay,nesterov,first_step", sgd_configs())
def test_sgd_step_three_steps(isa, momentum, dampening, weight_decay, nesterov, first_step, dtype, n):
    rng = rng_for("sgd", momentum, dampening, weight_decay, nesterov, first_step, dname(dtype), n)
    p = randn(rng, (n,), dtype)
    p_ref = p.copy()
    # momentum == 0: velocity is None (neither read nor written)
    v = np.zeros(n, dtype) if momentum else None
    v_ref = np.zeros(n, dtype) if momentum else None
    kw = dict(lr=0.05, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
              nesterov=nesterov)
    what = (f"sgd_step n={n} dtype={dname(dtype)} momentum={momentum} dampening={dampening} "
            f"weight_decay={weight_decay} nesterov={nesterov}")
    for step in range(3):
        g = randn(rng, (n,), dtype)
        g_in = g.copy()
        first = first_step and step == 0
        core.sgd_step(p, g, v, first_step=first, **kw)
        ref.sgd_step(p_ref, g, v_ref, first_step=first, **kw)
        np.testing.assert_array_equal(g, g_in, err_msg=what + " modified grads")
        scale = 1.0 + np.abs(p_ref.astype(np.float64))
        assert_close(p, p_ref, dtype=dtype, scale=scale, k=8,
                     what=f"{what} params after step {step + 1}")
        if momentum:
            assert_close(v, v_ref, dtype=dtype, scale=1.0 + np.abs(v_ref), k=8,
                         what=f"{what} velocity after step {step + 1}")


# around one part of the threaded split (32,768 elements) and its 1,024-element units
SPLIT_SIZES = [32767, 65535, 65536 + 1, 100003, 3 * 32768 + 1023]


@functools.cache
def _split_owners():
    """The objects whose threads sgd_step / zero_ may take: None, Contexts, a model's net."""
    return {"none": None, "context-1": core.Context(1), "context-2": core.Context(2),
            "context-3": core.Context(3), "model-2": MLP((784, 8, 10), threads=2)._net}


@pytest.mark.parametrize("n", SPLIT_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("momentum,dampening,weight_decay,nesterov,first_step", sgd_configs())
def test_sgd_step_split_over_threads_same_bits(isa, momentum, dampening, weight_decay, nesterov,
                                                first_step, dtype, n):
    """sgd_step(ctx=...) on 1, 2, 3 threads and on a Model's threads: the same bits as the
    caller alone (the step is elementwise; a wrong part boundary skips or repeats elements)."""
    rng = rng_for("sgd-split", momentum, dampening, weight_decay, nesterov, first_step,
                  dname(dtype), n)
    p0, g = randn(rng, (n,), dtype), randn(rng, (n,), dtype)
    v0 = randn(rng, (n,), dtype) if momentum else None
    kw = dict(lr=0.05, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
              nesterov=nesterov, first_step=first_step)
    results = {}
    for name, owner in _split_owners().items():
        p, v = p0.copy(), None if v0 is None else v0.copy()
        core.sgd_step(p, g, v, ctx=owner, **kw)
        results[name] = (p, v)
    want_p, want_v = results.pop("none")
    for name, (p, v) in results.items():
        np.testing.assert_array_equal(p, want_p, strict=True,
                                      err_msg=f"sgd_step ctx={name} n={n} params")
        if momentum:
            np.testing.assert_array_equal(v, want_v, strict=True,
                                          err_msg=f"sgd_step ctx={name} n={n} velocity")


@pytest.mark.parametrize("n", [0, 1, 2 * 32768 - 3, 2 * 32768 + 1025, 100003])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_zero_split_over_threads_clears_every_element(n, dtype):
    """zero_(buf, ctx=...) clears the whole buffer on any number of threads, nothing past it."""
    for name, owner in _split_owners().items():
        buf = np.full(n + 16, np.nan, dtype)
        core.zero_(buf[:n], ctx=owner)
        assert (buf[:n] == 0).all(), f"zero_ ctx={name}: elements left of {n}"
        assert np.isnan(buf[n:]).all(), f"zero_ ctx={name}: wrote past {n} elements"


@pytest.mark.parametrize("fn", ["sgd_step", "zero_"])
def test_split_ctx_of_the_wrong_type_is_refused(fn):
    p = np.ones(8)
    call = (lambda ctx: core.sgd_step(p, np.ones(8), None, lr=0.1, ctx=ctx)) \
        if fn == "sgd_step" else (lambda ctx: core.zero_(p, ctx=ctx))
    with pytest.raises(TypeError, match=r"ctx must be a dptrain._core.Context, Model.*got str"):
        call("threads")
    with pytest.raises(RuntimeError, match=r"ctx: this dptrain._core.Context is not initialized"):
        call(core.Context.__new__(core.Context))
    np.testing.assert_array_equal(p, 1.0)   # untouched


def test_sgd_step_by_hand():
    """The PyTorch rule on one element, written out: catches a rule shared by C and reference."""
    p, g, v = np.array([1.0]), np.array([0.5]), np.array([0.0])
    kw = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.1, nesterov=True)
    core.sgd_step(p, g, v, first_step=True, **kw)
    d = 0.5 + 0.1 * 1.0  # 0.6; v = d on the first step; nesterov: d + 0.9 v
    np.testing.assert_allclose(v, [d], rtol=1e-15)
    np.testing.assert_allclose(p, [1.0 - 0.1 * (d + 0.9 * d)], rtol=1e-15)
    p1 = p[0]
    core.sgd_step(p, g, v, first_step=False, **kw)
    d2 = 0.5 + 0.1 * p1
    v2 = 0.9 * d + d2
    np.testing.assert_allclose(v, [v2], rtol=1e-15)
    np.testing.assert_allclose(p, [p1 - 0.1 * (d2 + 0.9 * v2)], rtol=1e-15)


# ---------------------------------------------------------------------------------------
# sum_buffers and scale_

SUM_SLICES = [(0, None), (3, None), (0, 5), (2, 2), ("half", None)]


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("n", [7, 33, 129, 5000])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("scale", [1.0, 0.25])
@pytest.mark.parametrize("start,stop", SUM_SLICES, ids=lambda v: str(v))
@pytest.mark.parametrize("out_is", ["separate", "first_input", "last_input"])
def test_sum_buffers(isa, out_is, start, stop, scale, k, n, dtype):
    rng = rng_for("sum", out_is, start, stop, scale, k, n, dname(dtype))
    if start == "half":
        start, stop = n // 2, n - 1
    inputs = [randn(rng, (n,), dtype) for _ in range(k)]
    inputs_ref = [a.copy() for a in inputs]
    if out_is == "separate":
        out = np.full(n, np.nan, dtype)
        out_ref = out.copy()
    else:  # out is one of the inputs, in both calls
        i = 0 if out_is == "first_input" else -1
        out, out_ref = inputs[i], inputs_ref[i]
    core.sum_buffers(out, inputs, scale=scale, start=start, stop=stop)
    ref.sum_buffers(out_ref, inputs_ref, scale=scale, start=start, stop=stop)
    # The order of the additions is part of the contract, so the result is exact.
    np.testing.assert_array_equal(
        out, out_ref, err_msg=f"sum_buffers n={n} k={k} scale={scale} [{start}:{stop}] "
                              f"out={out_is} dtype={dname(dtype)}")
    for i, (a, a_ref) in enumerate(zip(inputs, inputs_ref)):
        if a is not out:
            np.testing.assert_array_equal(a, a_ref, err_msg=f"sum_buffers modified inputs[{i}]")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_sum_buffers_slices_compose(dtype):
    """Summing [0, m) and [m, n) separately gives the whole sum: how the all-reduce uses it."""
    rng = rng_for("sum_compose", dname(dtype))
    inputs = [randn(rng, (6001,), dtype) for _ in range(3)]
    whole, parts = np.empty(6001, dtype), np.empty(6001, dtype)
    core.sum_buffers(whole, inputs, scale=1 / 3)
    for lo, hi in [(0, 1), (1, 2049), (2049, 4000), (4000, 6001)]:
        core.sum_buffers(parts, inputs, scale=1 / 3, start=lo, stop=hi)
    np.testing.assert_array_equal(parts, whole)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("n", [1, 7, 33, 129, 5000])
@pytest.mark.parametrize("start,stop", [(0, None), (1, None), (0, 1), ("half", None), (0, 0)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("alpha", [0.5, -3.0, 0.0])
def test_scale_(isa, alpha, start, stop, n, dtype):
    if start == "half":
        start, stop = n // 2, None
    buf = randn(rng_for("scale", alpha, start, stop, n, dname(dtype)), (n,), dtype)
    want = buf.copy()
    core.scale_(buf, alpha, start=start, stop=stop)
    ref.scale_(want, alpha, start=start, stop=stop)
    np.testing.assert_array_equal(buf, want, err_msg=f"scale_ n={n} alpha={alpha} "
                                                     f"[{start}:{stop}] dtype={dname(dtype)}")


# ---------------------------------------------------------------------------------------
# Model on dense stacks: dense layers with ReLU between them, none after the last

NET_CASES = [  # (sizes, loss, B)
    ((784, 256, 128, 10), "softmax_xent", 64),
    ((7, 33, 3), "softmax_xent", 129),
    ((7, 33, 3), "softmax_xent", 1),
    ((1, 2), "softmax_xent", 33),
    ((5, 1), "sigmoid_bce", 33),      # one layer, one output: the fused logistic kernel
    ((20, 1), "sigmoid_bce", 129),    # fused, more than one 64-row block
    ((20, 1), "sigmoid_bce", 1),
    ((20, 7, 1), "sigmoid_bce", 33),  # BCE through the general layer path
]


def net_id(case):
    sizes, loss, batch = case
    return f"{'-'.join(map(str, sizes))}-{loss}-B{batch}"


def net_data(sizes, loss, batch, dtype, tag="net"):
    rng = rng_for(tag, sizes, loss, batch, dname(dtype))
    params = ref.model_init_params(*mlp_spec(sizes, loss),
                                   seed=zlib.crc32(repr((tag, sizes)).encode()), dtype=dtype)
    x = randn(rng, (batch, sizes[0]), dtype)
    n_classes = 2 if loss == "sigmoid_bce" else sizes[-1]
    labels = rng.integers(0, n_classes, batch)
    return params, x, labels, rng


def ambiguous_rows(logits, loss, dtype, k):
    """Rows whose prediction could flip under rounding: top-2 gap (or |z|) within tolerance."""
    logits = np.asarray(logits, np.float64)
    tol = 100 * RTOL[np.dtype(dtype)] * math.sqrt(k) * (1 + np.abs(logits).max())
    if loss == "sigmoid_bce":
        return int(np.sum(np.abs(logits.reshape(-1)) <= tol))
    top2 = np.sort(logits, axis=1)[:, -2:]
    return int(np.sum(top2[:, 1] - top2[:, 0] <= tol))


def net_k(sizes, batch):
    """Reduction length that bounds the rounding of a forward/backward pass."""
    return max(sizes) + batch


def assert_grads_close(sizes, loss, grads, grads_ref, grads0, dtype, k, what):
    """Per-block (W_l, b_l) comparison, relative to the largest entry of the block."""
    blocks = zip(*(ref.model_unflatten(*mlp_spec(sizes, loss), flat)
                   for flat in (grads, grads_ref, grads0)))
    for layer, ((w, b), (w_ref, b_ref), (w0, b0)) in enumerate(blocks):
        for name, got, want, start in [("W", w, w_ref, w0), ("b", b, b_ref, b0)]:
            scale = np.abs(want - start).max() + np.abs(start).max()
            assert_close(got, want, dtype=dtype, scale=scale, k=k,
                         what=f"{what} grads {name}_{layer}")


def check_loss_and_correct(got, want, logits_ref, loss, dtype, k, batch, what):
    loss_sum, n_correct = got
    loss_ref, correct_ref = want
    assert isinstance(loss_sum, float) and isinstance(n_correct, int), what
    scale = abs(loss_ref) + batch * (1 + float(np.abs(logits_ref).max()))
    assert_close(loss_sum, loss_ref, dtype=dtype, scale=scale, k=k, what=what + " loss_sum")
    slack = 0 if np.dtype(dtype) == np.float64 else ambiguous_rows(logits_ref, loss, dtype, k)
    assert abs(n_correct - correct_ref) <= slack, (
        f"{what}: n_correct {n_correct}, expected {correct_ref} (+-{slack} near-ties)")


def reference_logits(sizes, loss, params, x):
    out = np.empty((x.shape[0], sizes[-1]), x.dtype)
    ref.model_logits(*mlp_spec(sizes, loss), params, x, out)
    return out


@pytest.mark.parametrize("grad_scale", [None, 0.25], ids=["default_scale", "scale=0.25"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("case", NET_CASES, ids=net_id)
def test_dense_stack_loss_grad(isa, case, dtype, grad_scale):
    sizes, loss, batch = case
    params, x, labels, rng = net_data(sizes, loss, batch, dtype)
    grads0 = randn(rng, params.shape, dtype)  # loss_grad accumulates into whatever is there
    grads, grads_ref = grads0.copy(), grads0.copy()
    params_in, x_in, labels_in = params.copy(), x.copy(), labels.copy()
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    got = net.loss_grad(x, labels) if grad_scale is None else net.loss_grad(x, labels, grad_scale)
    want = ref.model_loss_grad(*mlp_spec(sizes, loss), params, grads_ref, x, labels, grad_scale)
    what = f"Model.loss_grad[{isa}] {net_id(case)} dtype={dname(dtype)} gs={grad_scale}"
    k = net_k(sizes, batch)
    check_loss_and_correct(got, want, reference_logits(sizes, loss, params, x), loss, dtype, k,
                           batch, what)
    assert_grads_close(sizes, loss, grads, grads_ref, grads0, dtype, k, what)
    np.testing.assert_array_equal(params, params_in, err_msg=what + " modified params")
    np.testing.assert_array_equal(x, x_in, err_msg=what + " modified x")
    np.testing.assert_array_equal(labels, labels_in, err_msg=what + " modified labels")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("case", NET_CASES, ids=net_id)
def test_dense_stack_loss_grad_accumulates(case, dtype):
    """Two calls on the same batch from zero grads give twice the gradient of one call."""
    sizes, loss, batch = case
    params, x, labels, _ = net_data(sizes, loss, batch, dtype, tag="accumulate")
    grads = np.zeros_like(params)
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    first = net.loss_grad(x, labels)
    once = grads.copy()
    second = net.loss_grad(x, labels)
    assert first == second
    assert np.any(once != 0)
    assert_close(grads, 2 * once, dtype=dtype, scale=2 * np.abs(once).max(), k=batch,
                 what=f"Model.loss_grad accumulation {net_id(case)} dtype={dname(dtype)}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("sizes,loss", [((784, 256, 128, 10), "softmax_xent"),
                                        ((7, 33, 3), "softmax_xent"),
                                        ((20, 1), "sigmoid_bce"),
                                        ((20, 7, 1), "sigmoid_bce")],
                         ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else v)
def test_dense_stack_evaluate_and_logits_chunked(sizes, loss, dtype):
    """B = 2500 is evaluated in 1024-row chunks: 1024 + 1024 + 452."""
    batch = 2500
    params, x, labels, _ = net_data(sizes, loss, batch, dtype, tag="evaluate")
    grads = np.full_like(params, 3.0)
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    what = f"Model.evaluate {'-'.join(map(str, sizes))} B={batch} dtype={dname(dtype)}"
    k = net_k(sizes, 1)
    logits_ref = reference_logits(sizes, loss, params, x)
    got = net.evaluate(x, labels)
    want = ref.model_evaluate(*mlp_spec(sizes, loss), params, x, labels)
    check_loss_and_correct(got, want, logits_ref, loss, dtype, k, batch, what)
    logits = np.full((batch, sizes[-1]), np.nan, dtype)
    net.logits(x, logits)
    scale = 1 + np.abs(logits_ref).max()
    assert_close(logits, logits_ref, dtype=dtype, scale=scale, k=k, what=what + " logits")
    np.testing.assert_array_equal(grads, np.full_like(params, 3.0),
                                  err_msg="evaluate/logits must not touch grads")
    # evaluate is the forward of loss_grad: the same loss and count on the same batch
    small = slice(0, 100)
    lg = core.Model(*mlp_spec(sizes, loss), params, np.zeros_like(params)).loss_grad(
        x[small], labels[small])
    ev = net.evaluate(x[small], labels[small])
    assert_close(lg[0], ev[0], dtype=dtype, scale=abs(ev[0]) + 100, k=k,
                 what=what + " evaluate vs loss_grad loss")
    assert lg[1] == ev[1]


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("case", [((784, 256, 128, 10), "softmax_xent", 129),
                                  ((7, 33, 3), "softmax_xent", 7),
                                  ((20, 7, 1), "sigmoid_bce", 33),
                                  ((20, 1), "sigmoid_bce", 129)], ids=net_id)
def test_dense_stack_threads_match_one_thread(isa, case, threads, dtype):
    sizes, loss, batch = case
    params, x, labels, _ = net_data(sizes, loss, batch, dtype, tag="threads")
    g1, gt = np.zeros_like(params), np.zeros_like(params)
    net1 = core.Model(*mlp_spec(sizes, loss), params, g1, threads=1)
    nett = core.Model(*mlp_spec(sizes, loss), params, gt, threads=threads)
    assert nett.threads == threads
    what = f"Model threads={threads} vs 1 {net_id(case)} dtype={dname(dtype)}"
    k = net_k(sizes, batch)
    r1, rt = net1.loss_grad(x, labels), nett.loss_grad(x, labels)
    logits1 = np.empty((batch, sizes[-1]), dtype)
    net1.logits(x, logits1)
    check_loss_and_correct(rt, r1, logits1, loss, dtype, k, batch, what)
    assert_grads_close(sizes, loss, gt, g1, np.zeros_like(params), dtype, k, what)
    logits_t = np.empty_like(logits1)
    nett.logits(x, logits_t)
    assert_close(logits_t, logits1, dtype=dtype, scale=1 + np.abs(logits1).max(), k=k,
                 what=what + " logits")
    check_loss_and_correct(nett.evaluate(x, labels), net1.evaluate(x, labels), logits1, loss,
                           dtype, k, batch, what + " evaluate")


@pytest.mark.parametrize("sizes,loss,grad_scale", [
    ((4, 5, 3), "softmax_xent", None),
    ((3, 4, 5, 2), "softmax_xent", 0.3),
    ((4, 5, 1), "sigmoid_bce", None),
    ((4, 1), "sigmoid_bce", 0.3),  # the fused logistic kernel
], ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_dense_stack_gradient_finite_differences(sizes, loss, grad_scale):
    """loss_grad's gradient equals central differences of grad_scale * evaluate()'s loss.

    The Model holds params by reference, so perturbing the array in place is seen by
    evaluate: this also checks that the held buffer is the caller's, not a copy.
    """
    batch = 7
    params, x, labels, _ = net_data(sizes, loss, batch, np.float64, tag="fd")
    grads = np.zeros_like(params)
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    net.loss_grad(x, labels, grad_scale)
    gs = 1.0 / batch if grad_scale is None else grad_scale
    num = numeric_grad(lambda: gs * net.evaluate(x, labels)[0], params)
    np.testing.assert_allclose(grads, num, rtol=1e-5, atol=1e-8,
                               err_msg=f"Model {sizes} {loss} gradient vs finite differences")


def test_dense_stack_params_can_be_a_view_into_a_larger_buffer():
    sizes = (7, 5, 3)
    n = core.model_plan(*mlp_spec(sizes))["n_params"]
    assert n == ref.model_plan(*mlp_spec(sizes))["n_params"]
    shared = np.zeros(3 * n + 10)
    params, grads = shared[5:5 + n], shared[5 + n:5 + 2 * n]
    params[...] = ref.model_init_params(*mlp_spec(sizes), seed=1, dtype=np.float64)
    rng = rng_for("view")
    x, labels = rng.standard_normal((9, 7)), rng.integers(0, 3, 9)
    net = core.Model(*mlp_spec(sizes), params, grads)
    assert net.params is params and net.grads is grads
    assert net.sizes == (7, 5, 5, 3) and net.loss == "softmax_xent"   # input, dense, relu, dense
    got = net.loss_grad(x, labels)
    grads_ref = np.zeros(n)
    want = ref.model_loss_grad(*mlp_spec(sizes), params, grads_ref, x, labels)
    assert_close(got[0], want[0], dtype=np.float64, scale=abs(want[0]) + 9, k=16,
                 what="Model on views loss")
    assert_close(grads, grads_ref, dtype=np.float64, scale=np.abs(grads_ref).max(), k=16,
                 what="Model on views grads")
    assert np.all(shared[:5] == 0) and np.all(shared[5 + 2 * n:] == 0), "wrote outside the views"


@pytest.mark.parametrize("loss,sizes", [("softmax_xent", (5, 4, 3)), ("sigmoid_bce", (5, 1)),
                                        ("sigmoid_bce", (5, 3, 1))])
def test_dense_stack_empty_batch(loss, sizes):
    params = ref.model_init_params(*mlp_spec(sizes, loss), seed=0, dtype=np.float64)
    grads = np.ones_like(params)
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    x, labels = np.empty((0, sizes[0])), np.empty(0, np.int64)
    assert net.loss_grad(x, labels) == (0.0, 0)
    assert net.evaluate(x, labels) == (0.0, 0)
    net.logits(x, np.empty((0, sizes[-1])))
    np.testing.assert_array_equal(grads, np.ones_like(params))
