"""The optimizer's side (dptrain.optim): learning-rate schedules; Adam and AdamW on a model
(the rule on its buffers, their hyper-parameters refused by name, the first step's fresh
moments); every optimizer's state_dict round trip."""

import numpy as np
import pytest

from dptrain import optim
from dptrain import reference as ref


def test_lr_schedules():
    assert optim.lr_at(5, 10, 0.2, "constant") == 0.2
    assert optim.lr_at(0, 10, 0.2, "cosine") == pytest.approx(0.2)
    assert optim.lr_at(5, 10, 0.2, "cosine") == pytest.approx(0.1)
    assert optim.lr_at(0, 10, 0.2, "constant", warmup_steps=4) == pytest.approx(0.05)
    assert optim.lr_at(3, 10, 0.2, "constant", warmup_steps=4) == pytest.approx(0.2)
    # step and exponential: once an epoch (7 steps here), from the epoch the warm-up ends
    kw = dict(steps_per_epoch=7)
    assert optim.lr_at(13, 70, 0.2, "step", gamma=0.5, step_epochs=2, **kw) == 0.2
    assert optim.lr_at(14, 70, 0.2, "step", gamma=0.5, step_epochs=2, **kw) == 0.1
    assert optim.lr_at(41, 70, 0.2, "exponential", gamma=0.9, **kw) == pytest.approx(0.2 * 0.9**5)
    warm = dict(kw, warmup_steps=7, gamma=0.9)
    assert optim.lr_at(3, 70, 0.2, "exponential", **warm) == pytest.approx(0.2 * 4 / 7)
    assert optim.lr_at(7, 70, 0.2, "exponential", **warm) == 0.2
    assert optim.lr_at(14, 70, 0.2, "exponential", **warm) == pytest.approx(0.18)
    # onecycle: lr / 25 at the start, lr at 30 % of the steps, lr / 25 / 1e4 at the end
    assert optim.lr_at(0, 100, 0.2, "onecycle") == pytest.approx(0.2 / 25)
    assert optim.lr_at(29, 100, 0.2, "onecycle") == pytest.approx(0.2)
    assert optim.lr_at(99, 100, 0.2, "onecycle") == pytest.approx(0.2 / 25 / 1e4)
    with pytest.raises(ValueError, match="lr schedule 'step' needs steps_per_epoch, step_epochs"):
        optim.lr_at(3, 70, 0.2, "step", gamma=0.5)


@pytest.mark.parametrize("schedule", ["step", "exponential", "onecycle"])
def test_lr_schedules_follow_torchs(schedule):
    """The rate of every step equals torch's scheduler's (StepLR and ExponentialLR stepped
    once an epoch, OneCycleLR every step without momentum cycling)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: nothing to compare")
    sched = torch.optim.lr_scheduler
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    per_epoch, epochs = 7, 9
    total = per_epoch * epochs
    theirs, kw = {
        "step": (lambda: sched.StepLR(opt, step_size=2, gamma=0.5), dict(gamma=0.5, step_epochs=2)),
        "exponential": (lambda: sched.ExponentialLR(opt, gamma=0.9), dict(gamma=0.9)),
        "onecycle": (
            lambda: sched.OneCycleLR(opt, max_lr=0.1, total_steps=total, cycle_momentum=False),
            {},
        ),
    }[schedule]
    s = theirs()
    for step in range(total):
        want = opt.param_groups[0]["lr"]
        got = optim.lr_at(step, total, 0.1, schedule, steps_per_epoch=per_epoch, **kw)
        assert got == pytest.approx(want, rel=1e-12), step
        opt.step()
        if schedule == "onecycle" or (step + 1) % per_epoch == 0:
            s.step()


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(lr_schedule="step"), "lr_schedule='step' needs lr_step_epochs"),
        (dict(lr_schedule="exponential"), "lr_schedule='exponential' needs lr_gamma"),
        (dict(lr_gamma=0.5), "lr_gamma=0.5 is not an option of lr_schedule='cosine'"),
        (dict(lr_schedule="exponential", lr_gamma=1.5), r"lr_gamma must be a number in \(0, 1\]"),
        (dict(lr_schedule="step", lr_step_epochs=0), "lr_step_epochs"),
        (dict(lr_schedule="onecycle", warmup_epochs=1), "cannot run with lr_schedule='onecycle'"),
        (dict(warmup_epochs=5, epochs=2), r"warmup_epochs=5.0 is longer than the run \(epochs=2\)"),
    ],
)
def test_bad_schedule_options_are_refused_by_name(kwargs, fragment):
    from dptrain.config import TrainConfig

    with pytest.raises(ValueError, match=fragment):
        TrainConfig(**kwargs)


def test_a_run_follows_its_schedule():
    """A step schedule's run: each epoch's steps at their rate (the same on any number of
    workers: the rate is a function of the step)."""
    from _runs import SMALL

    import dptrain

    opts = dict(SMALL, epochs=3, lr_schedule="step", lr_step_epochs=1, lr_gamma=0.5)
    one = dptrain.train(**opts, deterministic=True, workers=1)
    two = dptrain.train(**opts, deterministic=True, workers=2, backend="thread")
    assert np.array_equal(one["params"], two["params"])
    cosine = dptrain.train(**dict(SMALL, epochs=3), deterministic=True)
    assert not np.array_equal(one["params"], cosine["params"])


# ---------------------------------------------------------------- Adam and AdamW
def _model(dtype="float64"):
    from dptrain import MLP

    return MLP((6, 5, 3), seed=1, dtype=dtype)


def _grad(model, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 6)).astype(model.params.dtype)
    model.zero_grad()
    model.loss_grad(x, rng.integers(0, 3, 8))


def test_adam_and_adamw_are_exported_with_torchs_defaults():
    import dptrain

    m = _model()
    a, w = dptrain.Adam(m), dptrain.AdamW(m)
    assert a.config() == dict(
        lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False
    )
    assert w.config()["weight_decay"] == 1e-2 and w.decoupled and not a.decoupled
    assert optim.OPTIMIZERS == {
        "sgd": optim.SGD,
        "adam": optim.Adam,
        "adamw": optim.AdamW,
        "rmsprop": optim.RMSprop,
    }
    assert dptrain.RMSprop(m).config() == dict(
        lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False
    )


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(lr=-1.0), "lr must be a finite number >= 0, got -1.0"),
        (dict(lr=float("nan")), "lr must be"),
        (dict(eps=-1e-8), "eps must be"),
        (dict(weight_decay=float("inf")), "weight_decay must be"),
        (dict(betas=(1.0, 0.999)), r"betas\[0\] must be a number in \[0, 1\), got 1.0"),
        (dict(betas=(0.9, -0.1)), r"betas\[1\] must be"),
        (dict(betas=(0.9,)), r"betas must be a pair \(beta1, beta2\), got \(0.9,\)"),
        (dict(betas="ab"), "betas must be a pair"),
        (dict(betas=(0.9, True)), r"betas\[1\]"),
        (dict(amsgrad="yes"), "amsgrad must be True or False"),
    ],
)
def test_adam_refuses_bad_hyper_parameters_by_name(kwargs, fragment):
    for cls in (optim.Adam, optim.AdamW):
        with pytest.raises(ValueError, match=fragment):
            cls(_model(), **kwargs)


@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_steps_are_the_reference_rule_on_the_models_buffers(cls, amsgrad):
    """Three steps of the optimizer on a model equal reference.adam_step on copies, with the
    first moment in model.velocity; grads= and lr= override as SGD's do."""
    m = _model()
    opt = cls(m, lr=0.01, weight_decay=0.1, amsgrad=amsgrad)
    p, mom, v, vmax = m.params.copy(), np.zeros_like(m.params), *np.zeros((2, len(m.params)))
    for step in (1, 2, 3):
        _grad(m, step)
        g = m.grads.copy()
        lr = 0.02 if step == 3 else None
        opt.step(lr=lr)
        ref.adam_step(
            p,
            g,
            mom,
            v,
            vmax if amsgrad else None,
            step=step,
            lr=lr or 0.01,
            weight_decay=0.1,
            amsgrad=amsgrad,
            decoupled=cls is optim.AdamW,
        )
        np.testing.assert_allclose(m.params, p, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(m.velocity, mom, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(opt.exp_avg_sq, v, rtol=1e-12, atol=1e-18)
    assert opt.steps == 3
    assert (opt.max_exp_avg_sq is not None) == amsgrad
    other = np.ones_like(m.grads)
    before = m.params.copy()
    opt.step(grads=other)  # an exchanged buffer instead of model.grads
    assert not np.array_equal(m.params, before)


def test_adam_first_step_starts_from_zero_moments():
    """A new optimizer's moments are 0 (as a new torch optimizer's), even where the model's
    velocity holds an SGD run's momentum."""
    m1, m2 = _model(), _model()
    m2.velocity[:] = 5.0
    _grad(m1), _grad(m2)
    optim.Adam(m1).step()
    optim.Adam(m2).step()
    np.testing.assert_array_equal(m1.params, m2.params)
    np.testing.assert_array_equal(m1.velocity, m2.velocity)


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam, optim.AdamW])
def test_state_dict_round_trip_continues_bitwise(cls):
    """state_dict() after 2 steps, loaded into a new optimizer on a copy of the model: steps
    3 and 4 give the same bits as the uninterrupted optimizer's."""
    kw = dict(lr=0.1, momentum=0.9) if cls is optim.SGD else dict(amsgrad=True)
    a = _model()
    opt = cls(a, **kw)
    for s in (1, 2):
        _grad(a, s)
        opt.step()
    state = opt.state_dict()
    assert state["steps"] == 2 and set(state) == (
        {"steps"} if cls is optim.SGD else {"steps", "exp_avg_sq", "max_exp_avg_sq"}
    )
    b = _model()
    b.params[:], b.velocity[:] = a.params, a.velocity
    opt_b = cls(b, **kw)
    opt_b.load_state_dict(state)
    for s in (3, 4):
        _grad(a, s), _grad(b, s)
        opt.step(), opt_b.step()
    np.testing.assert_array_equal(a.params, b.params)


def test_load_state_dict_refuses_a_state_that_does_not_fit():
    opt = optim.Adam(_model())
    good = opt.state_dict()
    with pytest.raises(ValueError, match=r"state holds \['exp_avg_sq', 'steps'\], expected"):
        optim.Adam(_model(), amsgrad=True).load_state_dict(good)
    with pytest.raises(ValueError, match=r"state\['exp_avg_sq'\] has dtype float32"):
        opt.load_state_dict({**good, "exp_avg_sq": good["exp_avg_sq"].astype(np.float32)})
    with pytest.raises(ValueError, match=r"state\['steps'\] must be an integer >= 0, got -1"):
        opt.load_state_dict({**good, "steps": -1})
    with pytest.raises(ValueError, match="expected \\['steps'\\]"):
        optim.SGD(_model(), lr=0.1).load_state_dict(good)
