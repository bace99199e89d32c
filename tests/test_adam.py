"""The Adam step (csrc/dp_adam.h): dptrain._core.adam_step against dptrain.reference.adam_step
(PyTorch's Adam and AdamW rules) with and without AMSGrad and weight decay, over odd sizes,
both dtypes, every kernel ISA; split over a Context's or a Model's threads with the same bits;
the rule written out by hand; and the step's boundary.
"""

import itertools
import math

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


def adam_configs():
    """(amsgrad, decoupled, weight_decay): Adam and AdamW, each with and without AMSGrad and
    weight decay."""
    return [
        pytest.param(ams, dec, wd, id=f"{'adamw' if dec else 'adam'}-amsgrad={ams}-wd={wd}")
        for ams, dec, wd in itertools.product([False, True], [False, True], [0.0, 0.05])
    ]


def _buffers(rng, n, dtype):
    """params, exp_avg, exp_avg_sq, max_exp_avg_sq as after some steps (v >= 0, vmax >= v)."""
    v = randn(rng, (n,), dtype) ** 2
    return [randn(rng, (n,), dtype), randn(rng, (n,), dtype) * 0.1, v, v * 1.5]


@pytest.mark.parametrize("n", [1, 7, 33, 129, 1000, 4099])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("amsgrad,decoupled,weight_decay", adam_configs())
def test_adam_step_four_steps(isa, amsgrad, decoupled, weight_decay, dtype, n):
    """Steps 1 to 4 from zero moments (step 1 is where the bias corrections matter most),
    then steps 1000 and 1001 from moments that have history."""
    rng = rng_for("adam", amsgrad, decoupled, weight_decay, dname(dtype), n)
    kw = dict(lr=0.01, weight_decay=weight_decay, amsgrad=amsgrad, decoupled=decoupled)
    what = (
        f"adam_step n={n} dtype={dname(dtype)} amsgrad={amsgrad} decoupled={decoupled} "
        f"weight_decay={weight_decay}"
    )
    zero = [randn(rng, (n,), dtype)] + [np.zeros(n, dtype) for _ in range(3)]
    for start, bufs in ((1, zero), (1000, _buffers(rng, n, dtype))):
        mine, theirs = [b.copy() for b in bufs], [b.copy() for b in bufs]
        for step in range(start, start + (4 if start == 1 else 2)):
            g = randn(rng, (n,), dtype)
            g_in = g.copy()
            core.adam_step(mine[0], g, *mine[1:], step=step, **kw)
            ref.adam_step(theirs[0], g, *theirs[1:], step=step, **kw)
            np.testing.assert_array_equal(g, g_in, err_msg=what + " modified grads")
            for name, got, want in zip(
                ("params", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), mine, theirs
            ):
                if name == "max_exp_avg_sq" and not amsgrad:
                    np.testing.assert_array_equal(got, want, err_msg=f"{what}: wrote {name}")
                    continue
                assert_close(
                    got,
                    want,
                    dtype=dtype,
                    scale=1.0 + np.abs(want.astype(np.float64)),
                    k=8,
                    what=f"{what} {name} after step {step}",
                )


@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
def test_adam_step_by_hand(decoupled):
    """PyTorch's rule on one element, written out (catches a rule that C and the reference
    share): two steps with weight decay and AMSGrad, float64."""
    lr, b1, b2, eps, wd = 0.1, 0.8, 0.9, 1e-3, 0.5
    p, m, v, vmax = np.array([1.0]), np.zeros(1), np.zeros(1), np.zeros(1)
    want_p, want_m, want_v, want_vmax = 1.0, 0.0, 0.0, 0.0
    for step, g in ((1, 2.0), (2, 0.1)):
        core.adam_step(
            p,
            np.array([g]),
            m,
            v,
            vmax,
            step=step,
            lr=lr,
            beta1=b1,
            beta2=b2,
            eps=eps,
            weight_decay=wd,
            amsgrad=True,
            decoupled=decoupled,
        )
        if decoupled:
            want_p *= 1 - lr * wd
        else:
            g = g + wd * want_p
        want_m = b1 * want_m + (1 - b1) * g
        want_v = b2 * want_v + (1 - b2) * g * g
        want_vmax = max(want_vmax, want_v)
        denom = math.sqrt(want_vmax) / math.sqrt(1 - b2**step) + eps
        want_p -= lr / (1 - b1**step) * want_m / denom
        np.testing.assert_allclose(m, [want_m], rtol=1e-14, err_msg=f"exp_avg, step {step}")
        np.testing.assert_allclose(v, [want_v], rtol=1e-14, err_msg=f"exp_avg_sq, step {step}")
        np.testing.assert_allclose(vmax, [want_vmax], rtol=1e-14, err_msg=f"max, step {step}")
        np.testing.assert_allclose(p, [want_p], rtol=1e-14, err_msg=f"params, step {step}")
    # step 2's g^2 (0.01-ish) is below step 1's: AMSGrad kept the maximum, not v
    assert vmax[0] > v[0]


def test_adam_step_first_step_moves_each_weight_by_about_lr():
    """Adam's signature: on step 1 the bias-corrected update is lr * sign(g) (|g| >> eps),
    whatever the gradient's scale."""
    for dtype in DTYPES:
        g = np.array([1e-3, -5.0, 300.0], dtype)
        p = np.zeros(3, dtype)
        core.adam_step(p, g, np.zeros(3, dtype), np.zeros(3, dtype), None, step=1, lr=0.01)
        np.testing.assert_allclose(p, -0.01 * np.sign(g), rtol=1e-4)


def test_adam_step_weight_decay_zero_keeps_an_infinite_weight():
    """As PyTorch (which skips the term when weight_decay is 0): no 0 * inf = NaN."""
    for decoupled in (False, True):
        p = np.array([np.inf, 1.0])
        core.adam_step(
            p, np.ones(2), np.zeros(2), np.zeros(2), None, step=1, lr=0.1, decoupled=decoupled
        )
        assert p[0] == np.inf and np.isfinite(p[1])


def test_adam_step_amsgrad_max_keeps_a_nan():
    """torch.maximum propagates NaN: a diverged second moment stays visible in the max."""
    vmax = np.array([np.nan, 1.0])
    core.adam_step(
        np.ones(2), np.ones(2), np.zeros(2), np.zeros(2), vmax, step=2, lr=0.1, amsgrad=True
    )
    assert np.isnan(vmax[0]) and vmax[1] == 1.0


# around one part of the threaded split (32,768 elements) and its 1,024-element units
SPLIT_SIZES = [32767, 65536 + 1, 100003, 3 * 32768 + 1023]


@pytest.mark.parametrize("n", SPLIT_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("amsgrad,decoupled,weight_decay", adam_configs())
def test_adam_step_split_over_threads_same_bits(isa, amsgrad, decoupled, weight_decay, dtype, n):
    """adam_step(ctx=...) on 1, 2, 3 threads and on a Model's threads: the same bits as the
    caller alone (the step is elementwise; a wrong part boundary skips or repeats elements)."""
    rng = rng_for("adam-split", amsgrad, decoupled, weight_decay, dname(dtype), n)
    start, g = _buffers(rng, n, dtype), randn(rng, (n,), dtype)
    kw = dict(step=7, lr=0.01, weight_decay=weight_decay, amsgrad=amsgrad, decoupled=decoupled)
    results = {}
    for name, owner in thread_owners().items():
        bufs = [b.copy() for b in start]
        core.adam_step(bufs[0], g, *bufs[1:], ctx=owner, **kw)
        results[name] = bufs
    want = results.pop("none")
    for name, got in results.items():
        for what, a, b in zip(("params", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), got, want):
            np.testing.assert_array_equal(
                a, b, strict=True, err_msg=f"adam_step ctx={name} n={n} {what}"
            )


# ---------------------------------------------------------------------------------------
# boundary


def _args(n=4, dtype=np.float64):
    return [np.ones(n, dtype), np.ones(n, dtype), np.zeros(n, dtype), np.zeros(n, dtype), None]


@pytest.mark.boundary
@pytest.mark.parametrize(
    "kwargs,error,fragment",
    [
        (dict(lr=0.1), TypeError, "step"),
        (dict(step=1), TypeError, "lr"),
        (dict(step=0, lr=0.1), ValueError, r"step must be >= 1 \(the first step is 1\), got 0"),
        (dict(step=1, lr=-0.1), ValueError, "lr must be >= 0, got -0.1"),
        (dict(step=1, lr=0.1, eps=-1e-8), ValueError, "eps must be >= 0"),
        (dict(step=1, lr=0.1, weight_decay=-1.0), ValueError, "weight_decay must be >= 0"),
        (dict(step=1, lr=0.1, beta1=1.0), ValueError, r"beta1 must be in \[0, 1\), got 1"),
        (dict(step=1, lr=0.1, beta2=-0.5), ValueError, r"beta2 must be in \[0, 1\), got -0.5"),
        (dict(step=1, lr=0.1, beta2=float("nan")), ValueError, "beta2 must be in"),
        (dict(step=1, lr=0.1, amsgrad=True), ValueError, "max_exp_avg_sq is None, but amsgrad"),
    ],
    ids=[
        "no-step",
        "no-lr",
        "step-0",
        "lr-negative",
        "eps-negative",
        "weight_decay-negative",
        "beta1-1",
        "beta2-negative",
        "beta2-nan",
        "amsgrad-without-max",
    ],
)
def test_adam_step_scalar_rules(kwargs, error, fragment):
    args = _args()
    with pytest.raises(error, match=fragment):
        core.adam_step(*args, **kwargs)
    np.testing.assert_array_equal(args[0], 1.0)  # untouched


@pytest.mark.boundary
@pytest.mark.parametrize("name", ["grads", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"])
def test_adam_step_names_the_bad_buffer(name):
    """A buffer of the wrong dtype, length or layout is refused by name; nothing is written."""
    index = ["params", "grads", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"].index(name)
    for bad, fragment in (
        (np.zeros(4, np.float32), f"{name} has dtype float32"),
        (np.zeros(5), rf"{name} has shape \(5,\), expected \(4,\)"),
        (np.zeros(8)[::2], name),
        (np.zeros((4, 1)), name),
    ):
        args = _args()
        args[4] = np.zeros(4)
        args[index] = bad
        with pytest.raises((TypeError, ValueError), match=fragment):
            core.adam_step(*args, step=1, lr=0.1, amsgrad=True)
        np.testing.assert_array_equal(args[0], 1.0)


@pytest.mark.boundary
def test_adam_step_max_buffer_ignored_without_amsgrad():
    """Without amsgrad, max_exp_avg_sq is neither read nor checked (None, or any object)."""
    args = _args()
    args[4] = "unused"
    core.adam_step(*args, step=1, lr=0.1)
    assert (args[0] < 1).all()


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernel (_core_helpers.family_tests)

globals().update(family_tests(("adam_step",), gil=("adam_step",)))
