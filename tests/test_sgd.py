"""The SGD step (csrc/dp_sgd.h): dptrain._core.sgd_step against dptrain.reference.sgd_step
(PyTorch's rule) for every combination of momentum, dampening, weight decay, Nesterov and the
first step, over odd sizes, both dtypes, every kernel ISA; split over a Context's or a Model's
threads with the same bits; zero_ (zero_grad, split the same way); and the step's boundary.
"""

import itertools

import numpy as np
import pytest
from _core_helpers import (
    DTYPES,
    assert_close,
    dname,
    family_tests,
    randn,
    rng_for,
    thread_owners,
)

from dptrain import _core as core
from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests


def sgd_configs():
    """(momentum, dampening, weight_decay, nesterov, first_step on the first of 3 steps).

    Nesterov needs momentum > 0 and dampening == 0, as in torch.optim.SGD.
    """
    out = []
    for mom, damp, wd, nest, first in itertools.product(
        [0.0, 0.9], [0.0, 0.3], [0.0, 0.01], [False, True], [True, False]
    ):
        if nest and (mom == 0 or damp != 0):
            continue
        if mom == 0 and (damp != 0 or not first):  # dampening/first_step only matter with momentum
            continue
        out.append(
            pytest.param(
                mom,
                damp,
                wd,
                nest,
                first,
                id=f"mom={mom}-damp={damp}-wd={wd}-nesterov={nest}-first={first}",
            )
        )
    return out


@pytest.mark.parametrize("n", [1, 7, 33, 129, 4099])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("momentum,dampening,weight_decay,nesterov,first_step", sgd_configs())
def test_sgd_step_three_steps(
    isa, momentum, dampening, weight_decay, nesterov, first_step, dtype, n
):
    rng = rng_for("sgd", momentum, dampening, weight_decay, nesterov, first_step, dname(dtype), n)
    p = randn(rng, (n,), dtype)
    p_ref = p.copy()
    # momentum == 0: velocity is None (neither read nor written)
    v = np.zeros(n, dtype) if momentum else None
    v_ref = np.zeros(n, dtype) if momentum else None
    kw = dict(
        lr=0.05,
        momentum=momentum,
        dampening=dampening,
        weight_decay=weight_decay,
        nesterov=nesterov,
    )
    what = (
        f"sgd_step n={n} dtype={dname(dtype)} momentum={momentum} dampening={dampening} "
        f"weight_decay={weight_decay} nesterov={nesterov}"
    )
    for step in range(3):
        g = randn(rng, (n,), dtype)
        g_in = g.copy()
        first = first_step and step == 0
        core.sgd_step(p, g, v, first_step=first, **kw)
        ref.sgd_step(p_ref, g, v_ref, first_step=first, **kw)
        np.testing.assert_array_equal(g, g_in, err_msg=what + " modified grads")
        scale = 1.0 + np.abs(p_ref.astype(np.float64))
        assert_close(
            p, p_ref, dtype=dtype, scale=scale, k=8, what=f"{what} params after step {step + 1}"
        )
        if momentum:
            assert_close(
                v,
                v_ref,
                dtype=dtype,
                scale=1.0 + np.abs(v_ref),
                k=8,
                what=f"{what} velocity after step {step + 1}",
            )


# around one part of the threaded split (32,768 elements) and its 1,024-element units
SPLIT_SIZES = [32767, 65535, 65536 + 1, 100003, 3 * 32768 + 1023]


@pytest.mark.parametrize("n", SPLIT_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("momentum,dampening,weight_decay,nesterov,first_step", sgd_configs())
def test_sgd_step_split_over_threads_same_bits(
    isa, momentum, dampening, weight_decay, nesterov, first_step, dtype, n
):
    """sgd_step(ctx=...) on 1, 2, 3 threads and on a Model's threads: the same bits as the
    caller alone (the step is elementwise; a wrong part boundary skips or repeats elements)."""
    rng = rng_for(
        "sgd-split", momentum, dampening, weight_decay, nesterov, first_step, dname(dtype), n
    )
    p0, g = randn(rng, (n,), dtype), randn(rng, (n,), dtype)
    v0 = randn(rng, (n,), dtype) if momentum else None
    kw = dict(
        lr=0.05,
        momentum=momentum,
        dampening=dampening,
        weight_decay=weight_decay,
        nesterov=nesterov,
        first_step=first_step,
    )
    results = {}
    for name, owner in thread_owners().items():
        p, v = p0.copy(), None if v0 is None else v0.copy()
        core.sgd_step(p, g, v, ctx=owner, **kw)
        results[name] = (p, v)
    want_p, want_v = results.pop("none")
    for name, (p, v) in results.items():
        np.testing.assert_array_equal(
            p, want_p, strict=True, err_msg=f"sgd_step ctx={name} n={n} params"
        )
        if momentum:
            np.testing.assert_array_equal(
                v, want_v, strict=True, err_msg=f"sgd_step ctx={name} n={n} velocity"
            )


@pytest.mark.parametrize("n", [0, 1, 2 * 32768 - 3, 2 * 32768 + 1025, 100003])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_zero_split_over_threads_clears_every_element(n, dtype):
    """zero_(buf, ctx=...) clears the whole buffer on any number of threads, nothing past it."""
    for name, owner in thread_owners().items():
        buf = np.full(n + 16, np.nan, dtype)
        core.zero_(buf[:n], ctx=owner)
        assert (buf[:n] == 0).all(), f"zero_ ctx={name}: elements left of {n}"
        assert np.isnan(buf[n:]).all(), f"zero_ ctx={name}: wrote past {n} elements"


@pytest.mark.parametrize("fn", ["sgd_step", "zero_"])
def test_split_ctx_of_the_wrong_type_is_refused(fn):
    p = np.ones(8)
    call = (
        (lambda ctx: core.sgd_step(p, np.ones(8), None, lr=0.1, ctx=ctx))
        if fn == "sgd_step"
        else (lambda ctx: core.zero_(p, ctx=ctx))
    )
    with pytest.raises(TypeError, match=r"ctx must be a dptrain._core.Context, Model.*got str"):
        call("threads")
    with pytest.raises(RuntimeError, match=r"ctx: this dptrain._core.Context is not initialized"):
        call(core.Context.__new__(core.Context))
    np.testing.assert_array_equal(p, 1.0)  # untouched


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
# boundary


@pytest.mark.boundary
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


# ---------------------------------------------------------------------------------------
# behaviour fixed after review


def test_sgd_rejects_negative_weight_decay():
    p = np.zeros(3)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        core.sgd_step(p, np.zeros(3), None, lr=0.1, weight_decay=-1.0)


def test_zero_releases_the_gil_and_checks_its_arguments():
    g = np.ones(10)
    core.zero_(g)
    assert not g.any()
    with pytest.raises(ValueError, match="read-only"):
        ro = np.ones(3)
        ro.flags.writeable = False
        core.zero_(ro)


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernels (_core_helpers.family_tests)

globals().update(family_tests(("sgd_step",)))
