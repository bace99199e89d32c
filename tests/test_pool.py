"""2x2 max-pooling (csrc/dp_pool.h): dptrain._core.maxpool2_forward / maxpool2_backward against
dptrain.reference.maxpool2_forward / maxpool2_backward exactly (ties, NaN and -inf: the first
maximum, NumPy's argmax), every kernel ISA; central finite differences; and their boundary.
"""

import numpy as np
import pytest
from _core_helpers import (
    BAD_CALLS,
    DTYPES,
    check_bad_kernel_arguments_are_named,
    conv_gil_cases,
    dname,
    family_tests,
    numeric_grad,
    rng_for,
)

from dptrain import _core as core
from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

POOL_SHAPES = [
    (1, 1, 2, 2),
    (3, 1, 7, 7),
    (1, 3, 7, 3),
    (7, 3, 3, 7),
    (2, 7, 30, 30),
    (2, 3, 13, 13),
    (1, 2, 2, 41),
    (3, 2, 33, 18),
]


def pool_input(shape, dtype, tag=""):
    """Random values with ties (a coarse grid), NaNs and -inf, so that the argmax rule shows."""
    rng = rng_for("pool", shape, dname(dtype), tag)
    x = np.round(rng.standard_normal(shape) * 2) / 2
    x[rng.random(shape) < 0.03] = np.nan
    x[rng.random(shape) < 0.03] = -np.inf
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", POOL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_maxpool2_matches_reference_exactly(isa, shape, dtype):
    x = pool_input(shape, dtype)
    x_in = x.copy()
    out_shape = (shape[0], shape[1], shape[2] // 2, shape[3] // 2)
    y, idx = np.full(out_shape, 7, dtype), np.full(out_shape, 9, np.uint8)
    y_ref, idx_ref = np.empty(out_shape, dtype), np.empty(out_shape, np.uint8)
    core.maxpool2_forward(x, y, idx)
    ref.maxpool2_forward(x, y_ref, idx_ref)
    what = f"maxpool2 shape={shape} dtype={dname(dtype)}"
    np.testing.assert_array_equal(idx, idx_ref, err_msg=f"{what}: idx")
    np.testing.assert_array_equal(y, y_ref, err_msg=f"{what}: y")  # NaN == NaN here
    np.testing.assert_array_equal(x, x_in, err_msg=f"{what}: x modified")

    dy = rng_for("pool dy", shape).standard_normal(out_shape).astype(dtype)
    dx, dx_ref = np.full(shape, np.nan, dtype), np.empty(shape, dtype)
    core.maxpool2_backward(dy, idx, dx)
    ref.maxpool2_backward(dy, idx, dx_ref)
    np.testing.assert_array_equal(dx, dx_ref, err_msg=f"{what}: dx")
    assert np.isfinite(dx).all(), f"{what}: dx not fully written"


def test_maxpool2_picks_the_first_maximum_and_nan(isa):
    x = np.array(
        [[[[1, 3, 0, 5, 2, 2, 7], [3, 2, 5, 5, 2, 2, 7], [np.nan, 1, 0, 0, 9, 9, 9]]]],
        dtype=np.float32,
    )
    y, idx = np.empty((1, 1, 1, 3), np.float32), np.empty((1, 1, 1, 3), np.uint8)
    core.maxpool2_forward(x, y, idx)
    assert idx.ravel().tolist() == [1, 1, 0]  # ties: the first in (0,0),(0,1),(1,0),(1,1)
    assert y.ravel().tolist() == [3, 5, 2]
    x[0, 0, 1, 0] = np.nan
    core.maxpool2_forward(x, y, idx)
    assert idx[0, 0, 0, 0] == 2 and np.isnan(y[0, 0, 0, 0])


def test_maxpool2_backward_matches_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6) / 10.0  # distinct: no ties
    out_shape = (2, 3, 3, 3)
    g = rng.standard_normal(out_shape)
    y, idx = np.empty(out_shape), np.empty(out_shape, np.uint8)

    def loss():
        core.maxpool2_forward(x, y, idx)
        return float((g * y).sum())

    loss()
    dx = np.empty_like(x)
    core.maxpool2_backward(g, idx, dx)
    numeric = numeric_grad(loss, x, eps=1e-4)
    np.testing.assert_allclose(dx, numeric, atol=1e-9)


# ---------------------------------------------------------------------------------------
# boundary


@pytest.mark.parametrize("name", [n for n in BAD_CALLS if n.startswith("pool")])
def test_bad_kernel_arguments_are_named(name):
    check_bad_kernel_arguments_are_named(name)


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernels (_core_helpers.family_tests)

globals().update(
    family_tests(
        ("maxpool2_forward", "maxpool2_backward"),
        gil=("maxpool2_forward", "maxpool2_backward"),
        cases=conv_gil_cases,
    )
)
