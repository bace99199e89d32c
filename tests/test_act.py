"""The activations (csrc/dp_act.h): dptrain._core.relu_forward and relu_backward against
dptrain.reference.relu_forward / relu_backward, exactly (zeros and -0, inf in dy, in place),
central finite differences, and their boundary. (tanh, sigmoid, GELU and the MSE have no
binding of their own: test_model_core.py runs them inside Model, csrc/tests/test_model.c
against libm.)
"""

import numpy as np
import pytest
from _core_helpers import DTYPES, dname, family_tests, numeric_grad, randn, rng_for, shape_id

from dptrain import _core as core
from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

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
    np.testing.assert_array_equal(
        y, want, err_msg=f"relu_forward shape={shape} dtype={dname(dtype)} in_place={in_place}"
    )
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
    np.testing.assert_array_equal(
        dx, want, err_msg=f"relu_backward shape={shape} dtype={dname(dtype)} in_place={in_place}"
    )


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
# boundary


@pytest.mark.boundary
def test_slices_that_stay_contiguous_are_accepted():
    """A row block of a C array (x[2:5]) is C-contiguous: no reason to refuse it."""
    x = np.arange(40.0).reshape(8, 5)
    y = np.empty((3, 5))
    core.relu_forward(x[2:5], y)
    np.testing.assert_array_equal(y, x[2:5])


@pytest.mark.boundary
def test_allowed_in_place_calls():
    """The contract allows y is x (relu_forward), dx is dy (relu_backward)."""
    x = np.array([-1.0, 2.0, -3.0])
    core.relu_forward(x, x)
    np.testing.assert_array_equal(x, [0.0, 2.0, 0.0])
    dy = np.array([5.0, 6.0, 7.0])
    core.relu_backward(dy, x, dy)
    np.testing.assert_array_equal(dy, [0.0, 6.0, 0.0])


# ---------------------------------------------------------------------------------------
# behaviour fixed after review


def test_relu_propagates_nan_like_numpy():
    x = np.array([[np.nan, 1.0, -1.0]])
    y = np.empty_like(x)
    core.relu_forward(x, y)
    assert np.isnan(y[0, 0]) and y[0, 1] == 1.0 and y[0, 2] == 0.0


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernels (_core_helpers.family_tests)

globals().update(family_tests(("relu_forward", "relu_backward")))
