"""The model face (dptrain.models): gradients against finite differences, PyTorch's default
initialization, flat and caller-owned buffers, chunked gradients, save and load."""

import math

import numpy as np
import pytest

from dptrain import reference
from dptrain.models import CNN, MLP, LogisticRegression, SoftmaxRegression, load_model


@pytest.mark.parametrize(
    "make",
    [
        lambda: LogisticRegression(6, dtype="float64", seed=1),
        lambda: SoftmaxRegression(6, 4, dtype="float64", seed=1),
        lambda: MLP((6, 5, 7, 3), dtype="float64", seed=1),
    ],
    ids=["logreg", "softmax", "mlp"],
)
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
    assert np.abs(w1).max() > 0.9 / math.sqrt(784)  # uses the whole range
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
        m.loss_grad(x[10 * i : 10 * i + 10], y[10 * i : 10 * i + 10], grad_scale=1 / 40, grads=g)
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


def test_load_model_rejects_damaged_files_with_their_name(tmp_path):
    m = MLP((4, 3, 2))
    good = tmp_path / "m.npz"
    m.save(good)
    cases = {
        "scalar.npz": dict(
            config=np.array(open(good, "rb") and str(np.load(good)["config"])),
            params=np.float32(0.5),
            velocity=np.zeros(23, np.float32),
        ),
        "f64.npz": dict(config=np.load(good)["config"], params=np.zeros(23), velocity=np.zeros(23)),
        "novel.npz": dict(config=np.load(good)["config"], params=np.zeros(23, np.float32)),
        "nokind.npz": dict(config=np.array('{"sizes": [4, 3, 2]}'), params=np.zeros(23)),
    }
    for name, arrays in cases.items():
        np.savez(tmp_path / name, **arrays)
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            load_model(tmp_path / name)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match=r"junk.npz is a text file \(CSV\?\), not an .npz archive"):
        load_model(tmp_path / "junk.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(
        ValueError, match=r"single.npy is a .npy array \(np.save's format\), not an .npz archive"
    ):
        load_model(tmp_path / "single.npy")
    assert np.array_equal(load_model(good).params, m.params)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: MLP((64, 32, 16, 10), **kw),
        lambda **kw: MLP((64, 32, 1), loss="sigmoid_bce", **kw),
        lambda **kw: MLP((64, 24, 3), loss="mse", **kw),
        lambda **kw: SoftmaxRegression(64, 10, **kw),
        lambda **kw: LogisticRegression(64, **kw),
        lambda **kw: CNN((1, 8, 8), 10, channels=(4,), hidden=(16,), padding=1, **kw),
    ],
    ids=["mlp", "mlp-binary", "mlp-mse", "softmax", "logistic", "cnn"],
)
def test_logits_are_batch_invariant(make, dtype, threads):
    """A sample's outputs are the same bits whatever batch it is evaluated in: alone, among
    others, at another position (the kernels' sums for one row do not depend on the rows
    beside it; a single row once took the matrix-vector path, which sums in another order)."""
    model = make(dtype=dtype, threads=threads, seed=3)
    model.reset_parameters()
    x = np.random.default_rng(1).standard_normal((45, 64)).astype(dtype)
    full = model.logits(x)
    alone = np.concatenate([model.logits(x[i : i + 1]) for i in range(len(x))])
    chunks = np.concatenate([model.logits(x[i : i + 7]) for i in range(0, len(x), 7)])
    order = np.random.default_rng(2).permutation(len(x))
    shuffled = np.empty_like(full)
    shuffled[order] = model.logits(x[order])
    for other in (alone, chunks, shuffled):
        assert np.array_equal(other, full)
    assert np.array_equal(
        np.concatenate([model.predict(x[i : i + 1]) for i in range(45)]), model.predict(x)
    )
