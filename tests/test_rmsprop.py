"""The RMSprop step (csrc/dp_adam.h): dptrain._core.rmsprop_step against
dptrain.reference.rmsprop_step (PyTorch's RMSprop rule), plain, centered, with momentum and
weight decay, over odd sizes, both dtypes, every kernel ISA; split over threads with the same
bits; the rule by hand; the step's boundary; and the optimizer in training (the same bits on
1, 2 and 4 workers in --deterministic, a resumed run equal to an uninterrupted one)."""

import itertools

import _runs
import numpy as np
import pytest
from _core_helpers import DTYPES, assert_close, dname, family_tests, randn, rng_for, thread_owners

import dptrain
from dptrain import _core as core
from dptrain import reference as ref


def configs():
    return [
        pytest.param(c, m, wd, id=f"centered={c}-momentum={m}-wd={wd}")
        for c, m, wd in itertools.product([False, True], [0.0, 0.9], [0.0, 0.05])
    ]


def _state(rng, n, dtype):
    """square_avg, grad_avg, momentum_buffer with some history (sq >= gavg^2)."""
    gavg = randn(rng, (n,), dtype) * 0.1
    return [gavg * gavg + randn(rng, (n,), dtype) ** 2, gavg, randn(rng, (n,), dtype) * 0.1]


def _scales(bufs, g, *, lr, weight_decay, momentum, centered):
    """Each output's magnitude for the tolerance: the sum of its terms' magnitudes (in
    float64), the step g' / avg's grown by sq / var where the centered variance cancels."""
    p, sq, gavg, buf = (np.abs(b.astype(np.float64)) for b in bufs)
    gp = np.abs(g.astype(np.float64)) + weight_decay * p
    sq1 = 0.99 * sq + 0.01 * gp * gp
    if centered:
        ga1 = 0.99 * gavg + 0.01 * gp
        var = np.abs(
            bufs[1] * 0.99
            + 0.01 * (g + weight_decay * bufs[0]) ** 2
            - (bufs[2] * 0.99 + 0.01 * (g + weight_decay * bufs[0])) ** 2
        )
        step = gp / (np.sqrt(var) + 1e-8) * (1 + sq1 / np.maximum(var, 1e-300))
    else:
        ga1 = gavg
        step = gp / (np.sqrt(sq1) + 1e-8)
    buf1 = momentum * buf + step
    return {
        "params": p + lr * (buf1 if momentum else step),
        "square_avg": sq1,
        "grad_avg": ga1 + gp,
        "momentum_buffer": buf1,
    }


@pytest.mark.kernels
@pytest.mark.parametrize("n", [1, 7, 33, 129, 1000, 4099])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("centered,momentum,weight_decay", configs())
def test_rmsprop_step_against_the_reference(isa, centered, momentum, weight_decay, dtype, n):
    """Four steps from a zero state, then two from a state with history."""
    rng = rng_for("rmsprop", centered, momentum, weight_decay, dname(dtype), n)
    kw = dict(lr=0.01, weight_decay=weight_decay, momentum=momentum, centered=centered)
    what = f"rmsprop_step n={n} {dname(dtype)} {kw}"
    zero = [randn(rng, (n,), dtype)] + [np.zeros(n, dtype) for _ in range(3)]
    for steps, bufs in ((4, zero), (2, [randn(rng, (n,), dtype), *_state(rng, n, dtype)])):
        mine, theirs = [b.copy() for b in bufs], [b.copy() for b in bufs]
        for step in range(steps):
            g = randn(rng, (n,), dtype)
            g_in = g.copy()
            scales = _scales(theirs, g, **kw)
            core.rmsprop_step(mine[0], g, *mine[1:], **kw)
            ref.rmsprop_step(theirs[0], g, *theirs[1:], **kw)
            np.testing.assert_array_equal(g, g_in, err_msg=what + " modified grads")
            for name, got, want, used in zip(
                ("params", "square_avg", "grad_avg", "momentum_buffer"),
                mine,
                theirs,
                (True, True, centered, momentum > 0),
            ):
                if not used:  # neither read nor written
                    np.testing.assert_array_equal(
                        got,
                        bufs[["params", "square_avg", "grad_avg", "momentum_buffer"].index(name)],
                    )
                    continue
                assert_close(
                    got,
                    want,
                    dtype=dtype,
                    scale=scales[name],
                    k=16 if centered else 8,  # the variance's few roundings, amplified
                    what=f"{what} {name} after step {step + 1}",
                )


def test_rmsprop_step_by_hand():
    p, g = np.array([1.0, -2.0]), np.array([0.5, 4.0])
    sq, ga, buf = np.array([1.0, 0.0]), np.array([0.5, 0.0]), np.array([0.1, 0.0])
    core.rmsprop_step(p, g, sq, ga, buf, lr=0.1, alpha=0.5, eps=0.0, momentum=0.5, centered=True)
    want_sq = np.array([0.5 * 1 + 0.5 * 0.25, 0.5 * 16])
    want_ga = np.array([0.5, 2.0])
    avg = np.sqrt(want_sq - want_ga**2)
    want_buf = np.array([0.05, 0.0]) + g / avg
    np.testing.assert_allclose(sq, want_sq, rtol=1e-15)
    np.testing.assert_allclose(ga, want_ga, rtol=1e-15)
    np.testing.assert_allclose(buf, want_buf, rtol=1e-15)
    np.testing.assert_allclose(p, [1.0, -2.0] - 0.1 * want_buf, rtol=1e-15)


def test_a_variance_rounded_below_zero_is_zero_and_a_nan_stays():
    """A gradient that stays the same has variance 0, which rounding can put below 0: the
    step takes 0 there (torch's sqrt would give NaN and end the run); a NaN input stays NaN."""
    g = np.full(64, 0.1, np.float32) * np.linspace(1, 3, 64, dtype=np.float32)
    p, sq, ga = np.zeros(64, np.float32), g * g, g.copy()
    core.rmsprop_step(p, g, sq, ga, None, lr=1e-3, alpha=0.0, centered=True)
    assert np.isfinite(p).all()
    p, g2 = np.zeros(2), np.array([np.nan, 1.0])
    core.rmsprop_step(p, g2, np.zeros(2), np.zeros(2), None, lr=0.1, centered=True)
    assert np.isnan(p[0]) and np.isfinite(p[1])


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("centered,momentum,weight_decay", configs())
def test_rmsprop_step_split_over_threads_same_bits(isa, centered, momentum, weight_decay, dtype):
    n = 100003
    rng = rng_for("rmsprop-split", centered, momentum, dname(dtype))
    start = [randn(rng, (n,), dtype), *_state(rng, n, dtype)]
    g = randn(rng, (n,), dtype)
    kw = dict(lr=0.01, weight_decay=weight_decay, momentum=momentum, centered=centered)
    results = {}
    for name, owner in thread_owners().items():
        bufs = [b.copy() for b in start]
        core.rmsprop_step(bufs[0], g, *bufs[1:], ctx=owner, **kw)
        results[name] = bufs
    want = results.pop("none")
    for name, got in results.items():
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, strict=True, err_msg=f"ctx={name}")


@pytest.mark.boundary
@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(lr=-0.1), "lr must be >= 0, got -0.1"),
        (dict(lr=0.1, alpha=1.5), r"alpha must be in \[0, 1\], got 1.5"),
        (dict(lr=0.1, alpha=float("nan")), "alpha must be finite, got nan"),
        (dict(lr=0.1, eps=-1.0), "eps must be >= 0"),
        (dict(lr=0.1, momentum=-0.5), "momentum must be >= 0"),
        (dict(lr=0.1, centered=True), "grad_avg is None, but centered=True needs it"),
        (dict(lr=0.1, momentum=0.9), "momentum_buffer is None, but momentum > 0 needs it"),
    ],
)
def test_rmsprop_step_scalar_rules(kwargs, fragment):
    p = np.ones(4)
    with pytest.raises(ValueError, match=fragment):
        core.rmsprop_step(p, np.ones(4), np.zeros(4), None, None, **kwargs)
    np.testing.assert_array_equal(p, 1.0)  # untouched


@pytest.mark.boundary
def test_rmsprop_step_names_the_bad_buffer():
    for name, index in (("square_avg", 2), ("grad_avg", 3), ("momentum_buffer", 4)):
        args = [np.ones(4), np.ones(4), np.zeros(4), np.zeros(4), np.zeros(4)]
        args[index] = np.zeros(5)
        with pytest.raises(ValueError, match=rf"{name} has shape \(5,\), expected \(4,\)"):
            core.rmsprop_step(*args, lr=0.1, momentum=0.9, centered=True)


globals().update(family_tests(("rmsprop_step",), gil=("rmsprop_step",)))


# ---------------------------------------------------------------------------------------
# the optimizer in training

SMALL = dict(_runs.SMALL, optimizer="rmsprop", lr=3e-3)


@pytest.mark.parametrize("options", [{}, dict(momentum=0.9, centered=True, weight_decay=1e-3)])
def test_rmsprop_trains_with_the_same_bits_on_any_number_of_workers(options):
    runs = [
        dptrain.train(**SMALL, **options, workers=w, backend="thread", deterministic=True)
        for w in (1, 2, 4)
    ]
    assert runs[0]["epochs"][-1]["train_loss"] < runs[0]["epochs"][0]["train_loss"]
    for r in runs[1:]:
        assert np.array_equal(r["params"], runs[0]["params"])
        for k, v in runs[0]["optimizer_state"].items():
            assert np.array_equal(r["optimizer_state"][k], v), k
    assert set(runs[0]["optimizer_state"]) == {"steps", "square_avg"} | (
        {"grad_avg"} if options.get("centered") else set()
    )


def test_a_resumed_rmsprop_run_ends_as_an_uninterrupted_one(tmp_path):
    from dptrain.comm import WorkerError

    opts = dict(
        SMALL,
        epochs=3,
        momentum=0.5,
        centered=True,
        workers=2,
        backend="thread",
        deterministic=True,
    )
    whole = dptrain.train(**opts)
    ckpt = tmp_path / "run.npz"
    with pytest.raises((WorkerError, RuntimeError), match="injected fault"):
        dptrain.train(**opts, checkpoint=ckpt, fault=(1, 25, "raise"))
    resumed = dptrain.train(**opts, resume=ckpt)
    assert np.array_equal(resumed["params"], whole["params"])
    for k, v in whole["optimizer_state"].items():
        assert np.array_equal(resumed["optimizer_state"][k], v), k


@pytest.mark.filterwarnings("ignore:.*has not converged")
def test_the_estimators_take_solver_rmsprop():
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    from dptrain.sklearn import MLPClassifier

    X, y = load_digits(return_X_y=True)
    est = MLPClassifier(
        solver="rmsprop",
        learning_rate_init=1e-3,
        max_iter=5,
        random_state=0,
        engine_options={"centered": True},
    ).fit(X / 16, y)
    assert est.score(X / 16, y) > 0.9
    solver, state = est._optimizer  # what a warm start continues from
    assert solver == "rmsprop" and {"square_avg", "grad_avg"} <= set(state)
