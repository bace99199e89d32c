"""Early stopping on the training loss (TrainConfig's ``tol`` and ``n_iter_no_change``):
scikit-learn's rule for its stochastic solvers, decided by rank 0 and obeyed by every
worker, on every transport, and across a resume."""

import numpy as np
import pytest

import dptrain
from dptrain.engine.loop import Plateau


def rows(n=240, d=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    return X, (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.int64)


def fit(**kw):
    X, y = rows()
    options = dict(epochs=80, lr=0.2, batch_size=60, lr_schedule="constant", quiet=True)
    return dptrain.fit(dptrain.MLP([6, 8, 2], seed=0), X, y, **{**options, **kw})


def sklearn_stop(losses, tol, patience):
    """The epoch (1-based) where scikit-learn's MLP would stop on this loss curve, else None,
    written from its documented rule: the count of epochs whose loss is not below the best
    so far by tol resets on an improvement; training stops when the count exceeds patience."""
    best, count = np.inf, 0
    for epoch, loss in enumerate(losses, 1):
        count = count + 1 if loss > best - tol else 0
        best = min(best, loss)
        if count > patience:
            return epoch
    return None


def test_the_rule_is_scikit_learns():
    rng = np.random.default_rng(1)
    for _ in range(200):
        losses = np.cumsum(rng.normal(-0.01, 0.02, 40)) + 2
        tol, patience = rng.choice([0.0, 1e-3, 1e-2]), int(rng.integers(1, 6))
        rule = Plateau(tol, patience)
        ours = next((e for e, loss in enumerate(losses, 1) if rule.stalled(loss)), None)
        assert ours == sklearn_stop(losses, tol, patience)


def test_a_run_stops_where_the_rule_says_and_says_so():
    full = fit()
    losses = [h["train_loss"] for h in full.history]
    expected = sklearn_stop(losses, 1e-3, 3)
    assert expected is not None and expected < 80, "the test's run must plateau early"
    lines = []
    stopped = fit(tol=1e-3, n_iter_no_change=3, quiet=False, log=lines.append)
    assert len(stopped.history) == expected
    assert [h["train_loss"] for h in stopped.history] == losses[:expected]
    assert "stopped" in stopped.history[-1]
    assert f"stopped after epoch {expected}:" in "\n".join(lines)
    assert stopped["samples"] == expected * 240
    assert len(fit(tol=None).history) == 80  # the default: every epoch


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_every_worker_stops_at_the_same_epoch(backend):
    one = fit(tol=1e-3, n_iter_no_change=3, deterministic=True)
    two = fit(tol=1e-3, n_iter_no_change=3, deterministic=True, workers=2, backend=backend)
    assert len(two.history) == len(one.history) < 80
    np.testing.assert_array_equal(two.model.params, one.model.params)


def test_a_resumed_run_stops_where_the_whole_run_does(tmp_path):
    ckpt = tmp_path / "ck.npz"
    # a checkpoint every epoch (4 steps): the last one is written in the stopping epoch's
    # last step, before its record; resumed, the loop rebuilds the count from the history
    whole = fit(tol=1e-3, n_iter_no_change=3, checkpoint=str(ckpt), checkpoint_every=4)
    resumed = fit(tol=1e-3, n_iter_no_change=3, resume=str(ckpt))
    assert len(resumed.history) == len(whole.history) < 80
    np.testing.assert_array_equal(resumed.model.params, whole.model.params)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("tol", -1e-3, "tol must be a finite number >= 0"),
        ("tol", float("nan"), "tol must be a finite number >= 0"),
        ("n_iter_no_change", 0, "n_iter_no_change"),
    ],
)
def test_bad_values_are_named(option, value, message):
    with pytest.raises(ValueError, match=message):
        fit(**{option: value})
