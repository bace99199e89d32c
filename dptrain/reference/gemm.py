"""Twin of the GEMM (csrc/dp_gemm.h): dptrain._core.gemm and its triple-loop twin gemm_naive.

Dimension letters: M/N/K of a GEMM."""

import numpy as np

from ._common import _check_ndim, _check_shape, _common_float_dtype

__all__ = ["gemm"]


def gemm(a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, ctx=None):
    """c[:] = alpha * op(a) @ op(b) + beta * c; op(a) (M, K), op(b) (K, N), c (M, N).

    beta == 0 never reads c, so NaN/Inf garbage in an uninitialised c does not leak
    into the result (BLAS convention).
    """
    dt = _common_float_dtype(a=a, b=b, c=c)
    _check_ndim("a", a, (2,))
    _check_ndim("b", b, (2,))
    op_a = a.T if trans_a else a
    op_b = b.T if trans_b else b
    (m, k), (k_b, n) = op_a.shape, op_b.shape
    if k_b != k:
        raise ValueError(
            f"b has shape {b.shape} (op(b) {op_b.shape}), expected op(b) to have "
            f"{k} rows to match op(a) {op_a.shape}"
        )
    _check_shape("c", c, (m, n))
    prod = np.matmul(op_a, op_b)  # computed before c is written: c may alias a or b
    prod *= dt.type(alpha)
    if beta != 0:
        prod += dt.type(beta) * c
    c[...] = prod
