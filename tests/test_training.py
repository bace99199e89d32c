"""Sequential training end to end: accuracy targets, the JSON result, the CLI, save/load."""
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import dptrain
from dptrain import optim, reference
from dptrain.measure import timing
from dptrain.models import MLP, LogisticRegression, SoftmaxRegression, load_model

MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"
needs_mnist = pytest.mark.skipif(not MNIST_DIR.is_dir(),
                                 reason=f"MNIST not present at {MNIST_DIR}")


def _train(**kw):
    kw.setdefault("quiet", True)
    kw.setdefault("allow_download", False)
    return dptrain.train(**kw)


# ------------------------------------------------------------------ accuracy targets
@needs_mnist
def test_mlp_reaches_97_5_percent_on_mnist_in_3_epochs():
    r = _train(model="mlp", dataset="mnist", data_dir=MNIST_DIR, epochs=3, batch_size=128,
               lr=0.1, momentum=0.9, seed=0)
    assert r["dataset"]["source"].startswith(str(MNIST_DIR)), r["dataset"]
    assert r["final_test_accuracy"] >= 0.975, r["test_accuracy"]


@needs_mnist
def test_softmax_regression_reaches_92_percent_on_mnist():
    r = _train(model="softmax", dataset="mnist", data_dir=MNIST_DIR, epochs=3, lr=0.1,
               momentum=0.9, seed=0)
    assert r["final_test_accuracy"] >= 0.92, r["test_accuracy"]


def test_logistic_regression_reaches_0_999_on_synthetic_1m_x_20():
    r = _train(model="logreg", dataset="synthetic", n_samples=1_000_000, n_features=20,
               epochs=8, batch_size=8192, lr=0.1, momentum=0.0, dtype="float64",
               lr_schedule="constant")
    assert r["dataset"]["n_train"] == 1_000_000
    assert r["final_test_accuracy"] >= 0.999, r["test_accuracy"]


# ------------------------------------------------------------------ the result
def test_result_json_holds_config_history_and_timings(tmp_path):
    out = tmp_path / "run.json"
    r = _train(model="softmax", dataset="synthetic", n_samples=3000, epochs=2, batch_size=100,
               out=out)
    saved = json.loads(out.read_text())
    assert saved["config"]["batch_size"] == 100 and saved["config"]["model"] == "softmax"
    assert len(saved["train_loss"]) == 2 and len(saved["test_accuracy"]) == 2
    assert saved["steps"] == 2 * 30 and saved["samples"] == 6000
    assert 0 < saved["train_seconds"] <= saved["wall_seconds"]
    assert saved["samples_per_second"] == pytest.approx(6000 / saved["train_seconds"])
    assert set(saved["phase_seconds"]) == set(timing.PHASES)
    # the phases of every step add up to the training time
    assert sum(saved["phase_seconds"].values()) == pytest.approx(saved["train_seconds"],
                                                                 rel=1e-9)
    assert saved["train_loss"][1] < saved["train_loss"][0]
    assert r["final_test_accuracy"] == saved["final_test_accuracy"]


def test_fixed_order_runs_are_identical_and_seed_matters(tmp_path):
    kw = dict(model="mlp", hidden=(16,), dataset="synthetic", n_samples=2000, epochs=2,
              batch_size=64, shuffle=False)
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    _train(save_weights=a, seed=1, **kw)
    _train(save_weights=b, seed=1, **kw)
    pa, pb = load_model(a).params, load_model(b).params
    assert np.array_equal(pa, pb)
    c = tmp_path / "c.npz"
    _train(save_weights=c, seed=2, **kw)
    assert not np.array_equal(pa, load_model(c).params)


def test_training_matches_a_numpy_reference_loop():
    """Three SGD steps through train()'s pieces equal the same steps done with reference.py."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((96, 9))
    y = rng.integers(0, 4, 96)
    m = MLP((9, 8, 4), dtype="float64", seed=5)
    opt = optim.SGD(m, 0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    layers = [("dense", 8), "relu", ("dense", 4)]          # MLP((9, 8, 4))'s layer list
    p = reference.model_init_params(layers, (9,), "softmax_xent", 5, np.float64)
    v = np.zeros_like(p)
    for step, (s, e) in enumerate([(0, 32), (32, 64), (64, 96)]):
        m.zero_grad()
        m.loss_grad(x[s:e], y[s:e])
        opt.step()
        g = np.zeros_like(p)
        reference.model_loss_grad(layers, (9,), "softmax_xent", p, g, x[s:e], y[s:e])
        reference.sgd_step(p, g, v, lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=True,
                           first_step=step == 0)
    np.testing.assert_allclose(m.params, p, rtol=1e-12, atol=1e-12)


def test_limit_keeps_the_first_n_samples():
    r = _train(model="softmax", dataset="synthetic", n_samples=5000, limit=1234, epochs=1)
    assert r["dataset"]["n_train"] == 1234
    assert r["steps"] == math.ceil(1234 / 128)


@pytest.mark.parametrize("kw, match", [
    (dict(epochs=0), "epochs must be a positive integer"),
    (dict(batch_size=-1), "batch_size must be a positive integer"),
    (dict(model="resnet"), "model is 'resnet'"),
    (dict(dtype="float16"), "dtype is 'float16'"),
    (dict(lr_schedule="linear"), "lr_schedule is 'linear'"),
    (dict(dataset="imagenet"), "imagenet"),
    (dict(lr=-1.0), "lr must be"),
])
def test_bad_arguments_are_named(kw, match):
    args = dict(model="softmax", dataset="synthetic", n_samples=500, epochs=1)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        _train(**args)


def test_divergence_is_reported_not_silent():
    with pytest.raises(FloatingPointError, match="diverged"):
        _train(model="mlp", hidden=(32,), dataset="synthetic", n_samples=2000, epochs=2,
               lr=1e30, momentum=0.9, lr_schedule="constant")


# ------------------------------------------------------------------ models
@pytest.mark.parametrize("make", [
    lambda: LogisticRegression(6, dtype="float64", seed=1),
    lambda: SoftmaxRegression(6, 4, dtype="float64", seed=1),
    lambda: MLP((6, 5, 7, 3), dtype="float64", seed=1),
], ids=["logreg", "softmax", "mlp"])
def test_model_gradient_matches_finite_differences(make):
    m = make()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((11, 6))
    y = rng.integers(0, 2 if m.n_outputs == 1 else m.n_outputs, 11)
    m.forward_backward(x, y)
    analytic = m.grads.copy()
    numeric = np.empty_like(analytic)
    eps = 1e-6
    for i in range(m.n_params):
        old = m.params[i]
        m.params[i] = old + eps
        lp = m.evaluate(x, y)[0]
        m.params[i] = old - eps
        lm = m.evaluate(x, y)[0]
        m.params[i] = old
        numeric[i] = (lp - lm) / (2 * eps)
    err = np.abs(analytic - numeric).max() / max(np.abs(numeric).max(), 1e-12)
    assert err < 1e-6, f"{type(m).__name__}: relative gradient error {err:.2e}"


def test_init_is_pytorch_default_and_deterministic():
    a, b = MLP((784, 256, 10), seed=7), MLP((784, 256, 10), seed=7)
    assert np.array_equal(a.params, b.params)
    (w1, b1), (w2, _) = a.layers()
    assert np.abs(w1).max() <= 1 / math.sqrt(784) and np.abs(w2).max() <= 1 / math.sqrt(256)
    assert np.abs(w1).max() > 0.9 / math.sqrt(784)     # uses the whole range
    assert not np.array_equal(a.params, MLP((784, 256, 10), seed=8).params)


def test_model_buffers_are_flat_and_can_be_caller_owned():
    n = reference.model_plan([("dense", 3)], (5,))["n_params"]
    params = reference.model_init_params([("dense", 3)], (5,), "softmax_xent", 0, np.float32)
    grads = np.zeros(n, np.float32)
    m = SoftmaxRegression(5, 3, params=params, grads=grads)
    assert m.params is params and m.grads is grads
    m.loss_grad(np.ones((2, 5), np.float32), np.array([0, 2]))
    assert np.abs(grads).sum() > 0
    with pytest.raises(ValueError, match=r"grads has dtype float64 and shape \(18,\)"):
        SoftmaxRegression(5, 3, grads=np.zeros(n))


def test_chunk_gradients_into_separate_buffers_sum_to_the_batch_gradient():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((40, 6)), rng.integers(0, 3, 40)
    m = MLP((6, 5, 3), dtype="float64")
    m.zero_grad()
    m.loss_grad(x, y)
    chunks = [np.zeros(m.n_params) for _ in range(4)]
    for i, g in enumerate(chunks):
        m.loss_grad(x[10 * i:10 * i + 10], y[10 * i:10 * i + 10], grad_scale=1 / 40, grads=g)
    np.testing.assert_allclose(sum(chunks), m.grads, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match=r"grads has shape \(3,\), expected"):
        m.loss_grad(x, y, grads=np.zeros(3))
    with pytest.raises(ValueError, match="grads shares memory with params"):
        m.loss_grad(x, y, grads=m.params)


def test_save_and_load_round_trip(tmp_path):
    m = MLP((8, 6, 3), seed=2)
    m.velocity[:] = 0.5
    path = tmp_path / "m.npz"
    m.save(path)
    back = load_model(path)
    assert isinstance(back, MLP) and back.sizes == m.sizes
    assert np.array_equal(back.params, m.params) and np.array_equal(back.velocity, m.velocity)
    x = np.random.default_rng(0).random((5, 8), dtype=np.float32)
    assert np.array_equal(back.predict(x), m.predict(x))
    with pytest.raises(ValueError, match="saved model has sizes"):
        MLP((8, 5, 3)).load_state(path)
    np.savez(tmp_path / "junk.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="not a dptrain model file"):
        load_model(tmp_path / "junk.npz")


def test_lr_schedules():
    assert optim.lr_at(5, 10, 0.2, "constant") == 0.2
    assert optim.lr_at(0, 10, 0.2, "cosine") == pytest.approx(0.2)
    assert optim.lr_at(5, 10, 0.2, "cosine") == pytest.approx(0.1)
    assert optim.lr_at(0, 10, 0.2, "constant", warmup_steps=4) == pytest.approx(0.05)
    assert optim.lr_at(3, 10, 0.2, "constant", warmup_steps=4) == pytest.approx(0.2)


# ------------------------------------------------------------------ the command line
def _cli(*args, env=None, cwd=None):
    # run outside the checkout (`python -m` puts the working directory first on sys.path, and
    # the source tree's dptrain/ has no built extension), in a directory removed afterwards
    if cwd is None:
        with tempfile.TemporaryDirectory(prefix="dptrain-cli-") as tmp:
            return _cli(*args, env=env, cwd=tmp)
    return subprocess.run([sys.executable, "-m", "dptrain", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def test_cli_help_and_info():
    r = _cli("--help")
    assert r.returncode == 0 and "train" in r.stdout and "info" in r.stdout
    r = _cli("info")
    assert r.returncode == 0
    for key in ("simd", "dtypes", "compiler", "openmp", "mpi"):
        assert key in r.stdout


def test_cli_train_writes_result_and_weights(tmp_path):
    out, w = tmp_path / "run.json", tmp_path / "w.npz"
    r = _cli("train", "--model", "softmax", "--dataset", "synthetic", "--n-samples", "2000",
             "--epochs", "2", "--batch-size", "50", "--lr", "0.05", "--momentum", "0.9",
             "--seed", "0", "--no-shuffle", "--dtype", "float64", "--out", str(out),
             "--save-weights", str(w), "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    res = json.loads(out.read_text())
    assert res["config"]["dtype"] == "float64" and res["config"]["shuffle"] is False
    assert load_model(w).dtype == np.float64


def test_cli_main_job_runs_with_no_data_present(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DPTRAIN_DATA"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["HOME"] = str(tmp_path)
    r = _cli("train", "--no-download", "--epochs", "1", "--limit", "3000", env=env,
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "synthetic" in r.stdout.lower()
    assert "test acc" in r.stdout


def test_cli_rejects_bad_values_with_a_message():
    r = _cli("train", "--epochs", "0")
    assert r.returncode == 2 and "expected a positive integer" in r.stderr
    r = _cli("train", "--hidden", "256,x")
    assert r.returncode == 2 and "--hidden" in r.stderr
    r = _cli("train", "--dataset", "synthetic", "--limit", "10", "--n-samples", "5")
    assert r.returncode == 1 and "limit" in r.stderr
