"""Sequential training end to end: accuracy targets, the JSON result, the CLI, save/load."""

import json
import math

import numpy as np
import pytest
from _mnist import find_mnist, mnist_mark

import dptrain
from dptrain import optim, reference
from dptrain.measure import timing
from dptrain.models import MLP, load_model

MNIST_DIR, needs_mnist = find_mnist(), mnist_mark()


def _train(**kw):
    kw.setdefault("quiet", True)
    kw.setdefault("allow_download", False)
    return dptrain.train(**kw)


# ------------------------------------------------------------------ accuracy targets
@needs_mnist
def test_mlp_reaches_97_5_percent_on_mnist_in_3_epochs():
    r = _train(
        model="mlp",
        dataset="mnist",
        data_dir=MNIST_DIR,
        epochs=3,
        batch_size=128,
        lr=0.1,
        momentum=0.9,
        seed=0,
    )
    assert r["dataset"]["source"].startswith(str(MNIST_DIR)), r["dataset"]
    assert r["final_test_accuracy"] >= 0.975, r["test_accuracy"]


@needs_mnist
def test_softmax_regression_reaches_92_percent_on_mnist():
    r = _train(
        model="softmax", dataset="mnist", data_dir=MNIST_DIR, epochs=3, lr=0.1, momentum=0.9, seed=0
    )
    assert r["final_test_accuracy"] >= 0.92, r["test_accuracy"]


def test_logistic_regression_reaches_0_999_on_synthetic_1m_x_20():
    r = _train(
        model="logreg",
        dataset="synthetic",
        n_samples=1_000_000,
        n_features=20,
        epochs=8,
        batch_size=8192,
        lr=0.1,
        momentum=0.0,
        dtype="float64",
        lr_schedule="constant",
    )
    assert r["dataset"]["n_train"] == 1_000_000
    assert r["final_test_accuracy"] >= 0.999, r["test_accuracy"]


# ------------------------------------------------------------------ the result
def test_result_json_holds_config_history_and_timings(tmp_path):
    out = tmp_path / "run.json"
    r = _train(
        model="softmax", dataset="synthetic", n_samples=3000, epochs=2, batch_size=100, out=out
    )
    saved = json.loads(out.read_text())
    assert saved["config"]["batch_size"] == 100 and saved["config"]["model"] == "softmax"
    assert len(saved["train_loss"]) == 2 and len(saved["test_accuracy"]) == 2
    assert saved["steps"] == 2 * 30 and saved["samples"] == 6000
    assert 0 < saved["train_seconds"] <= saved["wall_seconds"]
    assert saved["samples_per_second"] == pytest.approx(6000 / saved["train_seconds"])
    assert set(saved["phase_seconds"]) == set(timing.PHASES)
    # the phases of every step add up to the training time
    assert sum(saved["phase_seconds"].values()) == pytest.approx(saved["train_seconds"], rel=1e-9)
    assert saved["train_loss"][1] < saved["train_loss"][0]
    assert r["final_test_accuracy"] == saved["final_test_accuracy"]


def test_fixed_order_runs_are_identical_and_seed_matters(tmp_path):
    kw = dict(
        model="mlp",
        hidden=(16,),
        dataset="synthetic",
        n_samples=2000,
        epochs=2,
        batch_size=64,
        shuffle=False,
    )
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    _train(save_weights=a, seed=1, **kw)
    _train(save_weights=b, seed=1, **kw)
    pa, pb = load_model(a).params, load_model(b).params
    assert np.array_equal(pa, pb)
    c = tmp_path / "c.npz"
    _train(save_weights=c, seed=2, **kw)
    assert not np.array_equal(pa, load_model(c).params)


def test_training_matches_a_numpy_reference_loop():
    """Three SGD steps through train()'s pieces equal the same steps done with dptrain.reference."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((96, 9))
    y = rng.integers(0, 4, 96)
    m = MLP((9, 8, 4), dtype="float64", seed=5)
    opt = optim.SGD(m, 0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    layers = [("dense", 8), "relu", ("dense", 4)]  # MLP((9, 8, 4))'s layer list
    p = reference.model_init_params(layers, (9,), "softmax_xent", 5, np.float64)
    v = np.zeros_like(p)
    for step, (s, e) in enumerate([(0, 32), (32, 64), (64, 96)]):
        m.zero_grad()
        m.loss_grad(x[s:e], y[s:e])
        opt.step()
        g = np.zeros_like(p)
        reference.model_loss_grad(layers, (9,), "softmax_xent", p, g, x[s:e], y[s:e])
        reference.sgd_step(
            p, g, v, lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=True, first_step=step == 0
        )
    np.testing.assert_allclose(m.params, p, rtol=1e-12, atol=1e-12)


def test_limit_keeps_the_first_n_samples():
    r = _train(model="softmax", dataset="synthetic", n_samples=5000, limit=1234, epochs=1)
    assert r["dataset"]["n_train"] == 1234
    assert r["steps"] == math.ceil(1234 / 128)


def test_divergence_is_reported_not_silent():
    with pytest.raises(FloatingPointError, match="diverged"):
        _train(
            model="mlp",
            hidden=(32,),
            dataset="synthetic",
            n_samples=2000,
            epochs=2,
            lr=1e30,
            momentum=0.9,
            lr_schedule="constant",
        )


# ------------------------------------------------------------------ models


# ------------------------------------------------------------------ the command line


def test_a_huge_batch_size_on_a_small_data_set_does_not_allocate_it():
    import dptrain

    r = dptrain.train(
        model="softmax", dataset="synthetic", n_samples=200, epochs=1, batch_size=10**11, quiet=True
    )
    assert r["steps"] == 1
