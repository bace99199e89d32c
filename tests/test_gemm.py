"""The GEMM (csrc/dp_gemm.h, its matrix-vector path dp_gemm_gemv_tmpl.h): dptrain._core.gemm and
its triple-loop twin gemm_naive against dptrain.reference.gemm, and their boundary.

Over odd shapes (1, 7, 33, 129 and a 128x784x256 layer) and both dtypes, on every kernel ISA
this CPU has (conftest.isa), the result must agree to a per-dtype tolerance relative to the
magnitude of the terms summed: |c - ref| <= RTOL[dtype] sqrt(K) (|alpha| |op(a)| @ |op(b)| +
|beta| |c|), so a cancellation cannot make the test flaky and a wrong transpose, stride or
blocking edge (an O(1) relative error) cannot pass. The matrix-vector path gives the same bits
on any number of threads; beta == 0 never reads c.
"""

import itertools

import numpy as np
import pytest
from _core_helpers import (
    DTYPES,
    assert_close,
    assert_rejected,
    dname,
    family_tests,
    make_calls,
    randn,
    rng_for,
    shape_params,
)

from dptrain import _core as core
from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

# (M, N, K): odd sizes around the 6 x 8/16 micro-tile, and shapes that cross the blocking
# (K > KC = 320/256 gives several K slices, M > MC = 120/96 several row blocks, N > NC = 3072
# two column panels in float32).
GEMM_SHAPES = [
    (1, 1, 1),
    (1, 7, 33),
    (7, 1, 33),
    (33, 7, 1),
    (7, 33, 129),
    (129, 33, 7),
    (33, 129, 7),
    (129, 129, 129),
    (128, 256, 784),
    (250, 5, 641),
    (6, 3100, 9),
    (100, 64, 27),  # K = 27 (a 3x3 conv of 3 channels): the small-K kernel in two passes
]


# (alpha, beta); beta == 0 runs with c full of NaN: the contract says c is then never read.
# (1, 0) and (1, 1) are the engines' products (the small-K kernel takes them).
ALPHA_BETA = [(1.0, 0.0), (1.0, 1.0), (0.5, 0.0), (-2.0, 1.0), (1.5, -0.25), (0.0, 0.5), (0.0, 0.0)]


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
        assert_close(
            c,
            want,
            dtype=dtype,
            scale=scale,
            k=k + 1,
            what=f"{name} M,N,K={m, n, k} trans_a={trans_a} trans_b={trans_b} "
            f"alpha={alpha} beta={beta} dtype={dname(dtype)}",
        )
    np.testing.assert_array_equal(a, a_in, err_msg=f"{name} modified a")
    np.testing.assert_array_equal(b, b_in, err_msg=f"{name} modified b")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize(
    "trans_a,trans_b",
    list(itertools.product([False, True], repeat=2)),
    ids=lambda t: "T" if t else "N",
)
@pytest.mark.parametrize("m,n,k", shape_params(GEMM_SHAPES))
def test_gemm(isa, m, n, k, trans_a, trans_b, dtype):
    check_gemm(core.gemm, f"gemm[{isa}]", m, n, k, trans_a, trans_b, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize(
    "trans_a,trans_b",
    list(itertools.product([False, True], repeat=2)),
    ids=lambda t: "T" if t else "N",
)
@pytest.mark.parametrize("m,n,k", shape_params(GEMM_SHAPES))
def test_gemm_naive(m, n, k, trans_a, trans_b, dtype):
    check_gemm(core.gemm_naive, "gemm_naive", m, n, k, trans_a, trans_b, dtype)


# Big enough that the pool really splits the work: along N, and along M when N is narrower
# than the thread count's worth of NR micro-panels (250 x 5).
CTX_SHAPES = [(128, 256, 784), (250, 5, 641), (6, 3100, 9), (33, 129, 129), (129, 17, 200)]


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize(
    "trans_a,trans_b",
    list(itertools.product([False, True], repeat=2)),
    ids=lambda t: "T" if t else "N",
)
@pytest.mark.parametrize("m,n,k", shape_params(CTX_SHAPES))
def test_gemm_with_context(isa, m, n, k, trans_a, trans_b, dtype, threads):
    ctx = core.Context(threads=threads)
    check_gemm(
        core.gemm,
        f"gemm[{isa}, Context(threads={threads})]",
        m,
        n,
        k,
        trans_a,
        trans_b,
        dtype,
        ctx=ctx,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize(
    "m,n,k,trans_a,trans_b",
    [
        (8192, 1, 520, False, True),  # x w^T: rows of x, split by rows
        (8192, 1, 520, True, True),  # x^T stored: columns, split by columns
        (1, 520, 8192, True, False),  # dz^T x: columns, split by columns (8 units + 8 columns)
        (1, 8192, 520, False, True),  # rows of w^T
    ],
    ids=["N1-rows", "N1-cols", "M1-cols", "M1-rows"],
)
def test_gemv_has_the_same_bits_on_any_threads(isa, m, n, k, trans_a, trans_b, dtype):
    """A matrix-vector GEMM, big enough for several threads: the same bits on 1, 2 and 3
    threads, and within the bound of np.matmul (one column of outputs takes dp_gemm_drv.h's
    gemv; one row of them the blocked path, as any batch does: batch invariance)."""
    rng = rng_for("gemv-threads", m, n, k)
    a = randn(rng, (k, m) if trans_a else (m, k), dtype)
    b = randn(rng, (n, k) if trans_b else (k, n), dtype)
    outs = []
    for threads in (1, 2, 3):
        c = np.full((m, n), np.nan, dtype)
        core.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, ctx=core.Context(threads=threads))
        outs.append(c)
    for threads, c in zip((2, 3), outs[1:]):
        np.testing.assert_array_equal(
            c, outs[0], err_msg=f"gemv[{isa}] {m}x{n}x{k} on {threads} threads against 1"
        )
    op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
    assert_close(
        outs[0],
        op_a @ op_b,
        dtype=dtype,
        scale=np.abs(op_a) @ np.abs(op_b),
        k=k,
        what=f"gemv[{isa}] {m}x{n}x{k} vs np.matmul",
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("n,k", [(1, 45), (10, 64), (37, 45), (200, 700)])
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(isa, n, k, dtype):
    """Batch invariance (a dense layer's forward is x w^T + b: beta 1 over the bias): rows
    i..i+m of op(a) op(b) are the same bits computed alone (m = 1, the one-sample prediction),
    in a few rows or in the whole batch, at any offset, in the forward's layout: A's rows
    (samples) row-major, B transposed (a dense layer's weight, OUT x IN). The other layouts
    with one row or one column (X^T v: a one-output layer's weight gradient) keep the
    matrix-vector path's own order and are not held to this."""
    rng = rng_for("row-invariance", n, k)
    rows = 41
    a_rows = randn(rng, (rows, k), dtype)
    b = randn(rng, (n, k), dtype)
    bias = randn(rng, (1, n), dtype)

    def product(x):
        c = np.repeat(bias, len(x), axis=0)
        core.gemm(x, b, c, trans_b=True, beta=1.0)
        return c

    full = product(a_rows)
    for m in (1, 2, 5, 13):
        for i in (0, 6, rows - m):
            np.testing.assert_array_equal(
                product(a_rows[i : i + m]),
                full[i : i + m],
                err_msg=f"[{isa}] rows {i}..{i + m} of {rows}, n={n}, k={k}",
            )


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_gemm_matches_its_naive_twin(isa, dtype):
    for m, n, k in GEMM_SHAPES:
        rng = rng_for("twin", m, n, k)
        a, b = randn(rng, (m, k), dtype), randn(rng, (k, n), dtype)
        c1, c2 = np.empty((m, n), dtype), np.empty((m, n), dtype)
        core.gemm(a, b, c1)
        core.gemm_naive(a, b, c2)
        assert_close(
            c1,
            c2,
            dtype=dtype,
            scale=np.abs(a) @ np.abs(b),
            k=k,
            what=f"gemm[{isa}] vs gemm_naive M,N,K={m, n, k} dtype={dname(dtype)}",
        )


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
# boundary


@pytest.mark.boundary
def test_gemm_transposed_shape_message():
    a, c = np.zeros((7, 5)), np.zeros((7, 3))
    with pytest.raises(ValueError, match=r"b \(transposed\) has shape \(3, 4\), expected \(3, 5\)"):
        core.gemm(a, np.zeros((3, 4)), c, trans_b=True)
    with pytest.raises(ValueError, match=r"c has shape \(7, 3\), expected \(5, 3\)"):
        core.gemm(a, np.zeros((7, 3)), c, trans_a=True)


@pytest.mark.boundary
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


@pytest.mark.boundary
def test_bad_scalar_types_rejected():
    call = make_calls()["gemm"]
    call.kwargs["alpha"] = "2"
    assert_rejected(call, TypeError, what="gemm(alpha='2')")


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernels (_core_helpers.family_tests)

globals().update(family_tests(("gemm", "gemm_naive"), gil=("gemm", "gemm_naive")))
