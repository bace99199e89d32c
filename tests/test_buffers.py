"""The flat-buffer arithmetic (csrc/dp_buffers.h): dptrain._core.sum_buffers and scale_ against
dptrain.reference.sum_buffers / scale_, exactly (the order of the additions is the contract),
over sizes, ranges, scales and outputs that are one of the inputs, every kernel ISA; and their
boundary. (The bfloat16 buffers, to_bf16, from_bf16 and sum_buffers on uint16: test_bf16.py.)
"""

import numpy as np
import pytest
from _core_helpers import DTYPES, assert_rejected, dname, family_tests, make_calls, randn, rng_for

from dptrain import _core as core
from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

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
        out,
        out_ref,
        err_msg=f"sum_buffers n={n} k={k} scale={scale} [{start}:{stop}] "
        f"out={out_is} dtype={dname(dtype)}",
    )
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
@pytest.mark.parametrize(
    "start,stop", [(0, None), (1, None), (0, 1), ("half", None), (0, 0)], ids=lambda v: str(v)
)
@pytest.mark.parametrize("alpha", [0.5, -3.0, 0.0])
def test_scale_(isa, alpha, start, stop, n, dtype):
    if start == "half":
        start, stop = n // 2, None
    buf = randn(rng_for("scale", alpha, start, stop, n, dname(dtype)), (n,), dtype)
    want = buf.copy()
    core.scale_(buf, alpha, start=start, stop=stop)
    ref.scale_(want, alpha, start=start, stop=stop)
    np.testing.assert_array_equal(
        buf, want, err_msg=f"scale_ n={n} alpha={alpha} [{start}:{stop}] dtype={dname(dtype)}"
    )


# ---------------------------------------------------------------------------------------
# boundary


@pytest.mark.boundary
@pytest.mark.parametrize(
    "kernel,kw",
    [
        ("sum_buffers", dict(start=-1)),
        ("sum_buffers", dict(start=5, stop=4)),
        ("sum_buffers", dict(stop=10)),
        ("scale_", dict(start=3, stop=10)),
    ],
)
def test_ranges_outside_the_buffer_rejected(kernel, kw):
    call = make_calls()[kernel]
    call.kwargs.update(kw)
    assert_rejected(call, ValueError, "start", what=f"{kernel}({kw})")


@pytest.mark.boundary
def test_allowed_in_place_calls():
    """The contract allows out in inputs (sum_buffers)."""
    a, b = np.ones(4), np.full(4, 2.0)
    core.sum_buffers(b, [a, b])
    np.testing.assert_array_equal(b, np.full(4, 3.0))


@pytest.mark.boundary
def test_bad_scalar_types_rejected():
    with pytest.raises(TypeError):
        core.scale_(np.ones(3), None)


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernels (_core_helpers.family_tests)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1000, 100003])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_sum_squares_is_the_references_lanes_on_every_isa(isa, n, dtype):
    """Gradient clipping's norm: the same lanes and order as the reference, so the same bits
    for float32 on every ISA (each square exact in float64); float64 within an ulp."""
    x = randn(rng_for("sum-squares", n, dname(dtype)), (n,), dtype)
    got, want = core.sum_squares(x), ref.sum_squares(x)
    if dtype == np.float32:
        assert got == want
    else:
        assert got == pytest.approx(want, rel=4e-16, abs=0)
    assert core.sum_squares(x[::-1].copy()) == pytest.approx(want, rel=1e-12)


globals().update(
    family_tests(("sum_buffers", "scale_", "sum_squares"), gil=("sum_buffers", "sum_squares"))
)
