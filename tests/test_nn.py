"""dptrain.nn: models the user writes as a list of layers, trained by the same engine.

What is checked: a Sequential builds the plan its layers say (shapes, parameter layout, fused
stages) and its gradient is the NumPy twin's; the named models ARE Sequentials of their
layers (the same parameters from the same seed); a user's model with activations the named
ones lack (tanh, sigmoid, GELU) trains with dptrain.fit on 1 and 2 workers (threads and
processes) to bitwise the same weights in deterministic mode; mean-squared-error regression
trains end to end; save/load keeps the architecture; bad layer lists are refused naming the
layer.
"""

import numpy as np
import pytest
from _core_helpers import cnn_spec, mlp_spec

import dptrain
from dptrain import nn, reference
from dptrain.models import CNN, MLP, Sequential, load_model


def blobs(n=600, d=12, classes=3, seed=0):
    """Separable Gaussian blobs: (X float32 (n, d), y int64)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(classes, d))
    y = rng.integers(0, classes, n)
    return (centers[y] + rng.normal(size=(n, d))).astype(np.float32), y.astype(np.int64)


# ---------------------------------------------------------------- building
def test_layers_build_the_plan_they_say():
    model = nn.Sequential(
        [
            nn.Conv2d(4, 3, padding=1),
            nn.Tanh(),
            nn.MaxPool2(),
            nn.Flatten(),
            nn.Dense(16),
            nn.GELU(),
            nn.Dense(3),
        ],
        input_shape=(2, 6, 6),
    )
    shapes = [tuple(s) for s in model.plan["shapes"]]
    assert shapes == [(4, 6, 6), (4, 6, 6), (4, 3, 3), (36,), (16,), (16,), (3,)]
    assert model.sizes == (72, 36, 16, 3) and model.n_features == 72 and model.n_outputs == 3
    assert model.n_params == 4 * 2 * 9 + 4 + 36 * 16 + 16 + 16 * 3 + 3
    (w0, b0), (w1, b1), (w2, b2) = model.layers()
    assert w0.shape == (4, 2, 3, 3) and w1.shape == (16, 36) and w2.shape == (3, 16)
    assert np.shares_memory(w1, model.params) and b2.shape == (3,)
    # conv -> tanh is one stage; GELU is never fused (its backward needs its input)
    assert [s["ops"] for s in model.plan["stages"]] == [
        "conv+tanh",
        "maxpool2",
        "dense",
        "gelu",
        "dense",
    ]
    text = model.summary()
    assert "Conv2d(4, 3, padding=1)" in text and "GELU()" in text and f"{model.n_params:,}" in text
    assert repr(model).startswith("Sequential([Conv2d(4, 3, padding=1), Tanh(), MaxPool2()")


def test_spec_tuples_and_layers_mix_and_round_trip():
    a = nn.Sequential([("dense", 8), "sigmoid", nn.Dense(2)], input_shape=(5,))
    b = nn.Sequential([nn.Dense(8), nn.Sigmoid(), ("dense", 2)], input_shape=5)
    assert a.plan["layers"] == b.plan["layers"]
    np.testing.assert_array_equal(a.params, b.params)
    assert [nn.from_spec(s) for s in a.plan["layers"]] == [nn.Dense(8), nn.Sigmoid(), nn.Dense(2)]


def test_named_models_are_sequentials_of_their_layers():
    """MLP and CNN are layer lists: the same seed gives the same parameters as the equivalent
    Sequential, and as the NumPy twin's PyTorch-style init."""
    mlp = MLP((20, 16, 8, 3), seed=5)
    seq = nn.mlp(20, (16, 8), 3, seed=5)
    np.testing.assert_array_equal(mlp.params, seq.params)
    np.testing.assert_array_equal(
        mlp.params, reference.model_init_params(*mlp_spec((20, 16, 8, 3)), 5)
    )
    cnn = CNN((1, 10, 10), 4, channels=(3, 5), hidden=(7,), seed=2)
    seq = nn.cnn((1, 10, 10), 4, channels=(3, 5), hidden=(7,), seed=2)
    np.testing.assert_array_equal(cnn.params, seq.params)
    np.testing.assert_array_equal(
        cnn.params, reference.model_init_params(*cnn_spec((1, 10, 10), (3, 5), (7, 4)), 2)
    )
    # the input, each conv block's pooled output (3x4x4, 5x1x1), each dense layer's output
    assert cnn.sizes == (100, 48, 5, 7, 4)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_sequential_gradient_is_the_twins(dtype):
    """A Sequential of the CNN's layers and one of an MLP's against reference.model_loss_grad
    on the layer lists written out (tests/_core_helpers.py): same loss and gradient to
    rounding."""
    rng = np.random.default_rng(1)
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    seq = nn.cnn((2, 9, 9), 5, channels=(3,), hidden=(6,), dtype=dtype, seed=3)
    x = rng.normal(size=(7, 2 * 81)).astype(dtype)
    y = rng.integers(0, 5, 7)
    loss, correct = seq.loss_grad(x, y)
    ref_grads = np.zeros_like(seq.params)
    ref_loss, ref_correct = reference.model_loss_grad(
        *cnn_spec((2, 9, 9), (3,), (6, 5)), seq.params, ref_grads, x, y
    )
    assert correct == ref_correct
    np.testing.assert_allclose(loss, ref_loss, **tol)
    np.testing.assert_allclose(seq.grads, ref_grads, **tol)

    seq = nn.mlp(6, (5,), 1, loss="sigmoid_bce", dtype=dtype)
    x = rng.normal(size=(9, 6)).astype(dtype)
    y = rng.integers(0, 2, 9)
    loss, _ = seq.loss_grad(x, y)
    ref_grads = np.zeros_like(seq.params)
    ref_loss, _ = reference.model_loss_grad(
        *mlp_spec((6, 5, 1), "sigmoid_bce"), seq.params, ref_grads, x, y
    )
    np.testing.assert_allclose(loss, ref_loss, **tol)
    np.testing.assert_allclose(seq.grads, ref_grads, **tol)


def test_mse_is_pytorchs_mean_squared_error():
    """A sample's mse loss is the mean over its outputs (PyTorch's MSELoss); its gradient,
    checked by central differences in float64."""
    rng = np.random.default_rng(2)
    model = nn.mlp(4, (5,), 3, activation="tanh", loss="mse", dtype="float64", seed=1)
    x, t = rng.normal(size=(6, 4)), rng.normal(size=(6, 3))
    loss_sum, correct = model.loss_grad(x, t)
    z = model.logits(x)
    assert correct == 0
    np.testing.assert_allclose(loss_sum, ((z - t) ** 2).mean(axis=1).sum(), rtol=1e-12)
    mean_loss, accuracy = model.evaluate(x, t)
    assert accuracy is None and mean_loss == pytest.approx(((z - t) ** 2).mean())
    # gradient of the batch-mean loss (grad_scale 1/B) by central differences
    p0, eps = model.params.copy(), 1e-6
    for i in rng.choice(model.n_params, 12, replace=False):
        model.params[i] = p0[i] + eps
        up = ((model.logits(x) - t) ** 2).mean()
        model.params[i] = p0[i] - eps
        down = ((model.logits(x) - t) ** 2).mean()
        model.params[i] = p0[i]
        assert model.grads[i] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-9)


@pytest.mark.parametrize(
    "layers, shape, match",
    [
        (
            [nn.Conv2d(4, 3)],
            (12,),
            r"layers\[0\] \('conv'\) gets a \(12,\) input: conv needs a "
            r"\(C, H, W\) input",
        ),
        ([nn.Conv2d(4, 5), nn.Dense(2)], (1, 4, 4), r"layers\[0\].*kernel larger than the padded"),
        (
            [nn.Dense(3), nn.MaxPool2()],
            (1, 8, 8),
            r"layers\[1\] \('maxpool2'\).*needs a \(C, H, W\)",
        ),
        ([nn.ReLU()], (3,), "no dense, conv, layernorm or batchnorm layer"),
        ([nn.Dense(1)], (3,), "softmax cross-entropy needs >= 2 outputs"),
        (
            [("dense", 0)],
            (3,),
            r"layers\[0\] = \('dense', 0\): the output size must be 1\.\.2147483647",
        ),
        (["softmax"], (3,), r"layers\[0\]: unknown layer 'softmax'"),
        ([3], (3,), r"layers\[0\] = 3 is not a layer: .*BatchNorm, LayerNorm, Residual\)"),
        ([nn.ReLU, nn.Dense(2)], (3,), r"layers\[0\] is the class ReLU, not a layer: write ReLU"),
    ],
)
def test_bad_layer_lists_are_refused_naming_the_layer(layers, shape, match):
    with pytest.raises((ValueError, TypeError), match=match):
        nn.Sequential(layers, input_shape=shape)


def test_bad_layer_arguments_are_refused_where_they_are_written():
    with pytest.raises(TypeError, match=r"Residual takes a list of layers, .* pass \[ReLU\(\)\]"):
        nn.Residual(nn.ReLU())
    assert repr(nn.Dropout(0.9999999999)) == "Dropout(0.9999999999)"  # not Dropout(1)
    with pytest.raises(ValueError, match="Dense out_features must be >= 1, got 0"):
        nn.Dense(0)
    with pytest.raises(TypeError, match="Conv2d kernel_size must be an int, got float"):
        nn.Conv2d(8, 3.0)
    with pytest.raises(ValueError, match="Conv2d padding must be >= 0"):
        nn.Conv2d(8, 3, padding=-1)
    with pytest.raises(TypeError, match="layers must be a list of layers"):
        nn.Sequential(nn.Dense(3), input_shape=(4,))
    with pytest.raises(ValueError, match="loss is 'hinge'"):
        nn.Sequential([nn.Dense(3)], input_shape=(4,), loss="hinge")


# ---------------------------------------------------------------- training
def small_net(**kw):
    return nn.Sequential(
        [nn.Dense(16), nn.Tanh(), nn.Dense(8), nn.GELU(), nn.Dense(3)], input_shape=(12,), **kw
    )


@pytest.mark.parametrize("workers, backend", [(2, "thread"), (2, "process")])
def test_your_model_trains_to_the_same_weights_on_any_number_of_workers(workers, backend):
    X, y = blobs()
    opts = dict(epochs=2, batch_size=64, lr=0.05, deterministic=True, quiet=True, seed=0)
    one = small_net(seed=4)
    r1 = dptrain.fit(one, X, y, workers=1, **opts)
    many = small_net(seed=4)
    r2 = dptrain.fit(many, X, y, workers=workers, backend=backend, **opts)
    np.testing.assert_array_equal(one.params, many.params)
    assert r1.history[-1]["train_loss"] == r2.history[-1]["train_loss"]
    assert r2.model is many and r2["model"]["kind"] == "sequential"
    assert one.evaluate(X, y)[1] > 0.9


def test_mse_regression_trains_end_to_end(capsys):
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(800, 3)).astype(np.float32)
    y = (X @ np.array([1.5, -2.0, 0.5]) + 0.3 + rng.normal(0, 0.01, 800)).astype(np.float32)
    model = nn.mlp(3, (16,), 1, loss="mse", seed=0)
    before = model.evaluate(X, y[:, None])[0]
    result = dptrain.fit(
        model, X, y, epochs=8, batch_size=32, lr=0.05, workers=2, validation=0.2, log=print
    )
    after = model.evaluate(X, y[:, None])[0]
    assert after < before / 20 and after < 0.02, (before, after)
    rec = result.history[-1]
    assert rec["train_accuracy"] is None and rec["test_accuracy"] is None
    out = capsys.readouterr().out
    assert "test loss" in out and "acc" not in out  # a regression reports no accuracy
    with pytest.raises(ValueError, match="regresses onto 1 output"):
        dptrain.fit(model, X, np.stack([y, y], axis=1), epochs=1, quiet=True)
    with pytest.raises(ValueError, match=r"y\[0\] = .* is not a whole number"):
        dptrain.fit(nn.mlp(3, (4,), 2), X, y, epochs=1, quiet=True)


def test_fit_takes_images_of_the_models_shape_and_no_other():
    """An image model's X: samples of its (C, H, W), or flat rows, as logits takes them; the
    same number of values in another shape (channels-last images, above all) is refused by
    name, not trained on as another image."""
    model = nn.Sequential(
        [nn.Conv2d(4, 3, padding=1), nn.GlobalAvgPool(), nn.Dense(3)], input_shape=(3, 8, 8)
    )
    rng = np.random.default_rng(0)
    y = np.arange(12) % 3
    nchw = rng.standard_normal((12, 3, 8, 8)).astype(np.float32)
    for X in (nchw, nchw.reshape(12, -1)):
        dptrain.fit(model, X, y, epochs=1, batch_size=4, quiet=True)
    with pytest.raises(ValueError, match=r"X looks channels last: pass X.transpose\(0, 3, 1, 2\)"):
        dptrain.fit(model, nchw.transpose(0, 2, 3, 1), y, epochs=1, quiet=True)
    with pytest.raises(
        ValueError, match=r"samples of shape \(3, 8, 8\), but X's are \(1, 8, 24\)$"
    ):
        dptrain.fit(model, nchw.reshape(12, 8, 24), y, epochs=1, quiet=True)
    with pytest.raises(ValueError, match=r"but X's are \(3, 4, 4, 4\)$"):
        dptrain.fit(model, nchw.reshape(12, 3, 4, 4, 4), y, epochs=1, quiet=True)


def test_channels_last_images_are_read_as_they_are_and_said():
    """Without a model to check against (the CLI's layers, the estimators), 4-D X is read
    channels first, as documented; samples that look channels last get a note saying how
    they were read and how to transpose them."""
    from dptrain.data import from_arrays

    X = np.zeros((6, 10, 10, 3), np.float32)
    ds = from_arrays(X, np.arange(6) % 2)
    assert ds.input_shape == (10, 10, 3)
    (note,) = [n for n in ds.notes if "channels" in n]
    assert "10 channels of 10 x 3" in note and "X.transpose(0, 3, 1, 2)" in note
    assert not any(
        "channels" in n for n in from_arrays(X.transpose(0, 3, 1, 2), np.arange(6) % 2).notes
    )


def test_train_names_only_the_named_models():
    with pytest.raises(ValueError, match="dptrain.fit"):
        dptrain.train(model="sequential", dataset="synthetic", quiet=True)


def test_save_and_load_keep_any_architecture(tmp_path):
    model = nn.lenet5((1, 16, 16), 4, activation="tanh", seed=3)
    model.velocity[:] = 0.25
    path = tmp_path / "lenet.npz"
    model.save(path)
    back = load_model(path)
    assert isinstance(back, Sequential) and back.plan["layers"] == model.plan["layers"]
    assert back.input_shape == (1, 16, 16)
    np.testing.assert_array_equal(back.params, model.params)
    np.testing.assert_array_equal(back.velocity, model.velocity)
    x = np.random.default_rng(0).normal(size=(3, 256)).astype(np.float32)
    np.testing.assert_array_equal(back.logits(x), model.logits(x))
    other = nn.lenet5((1, 16, 16), 4, activation="relu")
    with pytest.raises(ValueError, match="saved model has layers"):
        other.load_state(path)


def test_the_cli_trains_a_model_written_as_layers(tmp_path, capsys):
    """--layers NAME[:SIZE...],...: a model of the user's from the command line, saved with
    its architecture (load_model rebuilds it)."""
    from dptrain import cli

    out = tmp_path / "m.npz"
    rc = cli.main(
        [
            "train",
            "--layers",
            "dense:16,tanh,dense:2",
            "--dataset",
            "synthetic",
            "--n-samples",
            "400",
            "--epochs",
            "1",
            "--workers",
            "2",
            "--quiet",
            "--save-weights",
            str(out),
        ]
    )
    assert rc == 0
    model = load_model(out)
    assert isinstance(model, Sequential) and model.loss == "softmax_xent"
    assert model.plan["layers"] == [("dense", 16), ("tanh",), ("dense", 2)]
    # a binary data set and a last dense:1 is logistic: sigmoid BCE
    rc = cli.main(
        [
            "train",
            "--layers",
            "dense:1",
            "--dataset",
            "synthetic",
            "--n-samples",
            "400",
            "--epochs",
            "1",
            "--quiet",
            "--save-weights",
            str(out),
        ]
    )
    assert rc == 0 and load_model(out).loss == "sigmoid_bce"
    capsys.readouterr()
    assert (
        cli.main(
            [
                "train",
                "--layers",
                "dense:16,relu,dense:3",
                "--dataset",
                "synthetic",
                "--n-samples",
                "400",
                "--epochs",
                "1",
                "--quiet",
            ]
        )
        != 0
    )
    assert "the model has 3 outputs, but the data set has 2 classes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse refuses the text
        cli.main(["train", "--layers", "dense:x", "--quiet"])
    assert exit_.value.code == 2
    assert "--layers: 'dense:x' has a size that is not an int" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_regression_trains_to_the_same_weights_on_any_number_of_workers(backend):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 5))  # float64 in, converted once
    y = np.stack([X[:, 0] - X[:, 1], np.tanh(X[:, 2])], axis=1)
    opts = dict(epochs=2, batch_size=32, lr=0.05, deterministic=True, quiet=True)
    one, two = (nn.mlp(5, (8,), 2, activation="gelu", loss="mse", seed=1) for _ in range(2))
    dptrain.fit(one, X, y, workers=1, **opts)
    dptrain.fit(two, X, y, workers=2, backend=backend, **opts)
    np.testing.assert_array_equal(one.params, two.params)
    assert one.evaluate(X.astype(np.float32), y.astype(np.float32))[0] < 0.5
