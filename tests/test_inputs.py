"""One input contract: a model's predict, logits, evaluate, loss_grad and forward_backward take
what dptrain.fit takes (X of any real dtype, integer labels of any width, whole-number float
labels), converted as fit converts them, and refuse what fit refuses, naming it."""

import numpy as np
import pytest

import dptrain
from dptrain.data import DataError


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))  # float64, as NumPy makes it
    return X, (X[:, 0] > 0).astype(np.uint8) + (X[:, 1] > 0)  # uint8 labels, 3 classes


def test_readme_flow_fit_then_predict_and_evaluate_on_new_float64_data():
    X, y = _data()
    model = dptrain.MLP([6, 16, 3])
    dptrain.fit(model, X, y, epochs=2, batch_size=16, quiet=True)
    X_new, y_new = _data(seed=1)
    expected = model.predict(X_new.astype(np.float32))
    assert np.array_equal(model.predict(X_new), expected)
    loss, accuracy = model.evaluate(X_new, y_new)
    assert (loss, accuracy) == model.evaluate(X_new.astype(np.float32), y_new.astype(np.int64))
    assert 0.0 <= accuracy <= 1.0


@pytest.mark.parametrize(
    "x_dtype", [np.float64, np.float16, np.int32, np.uint8, np.int64, np.bool_]
)
@pytest.mark.parametrize("y_dtype", [np.uint8, np.int8, np.int32, np.int64, np.float64])
def test_every_call_takes_what_fit_takes(x_dtype, y_dtype):
    X, y = _data()
    x, labels = X.astype(x_dtype), y.astype(y_dtype)
    x32, y64 = x.astype(np.float32), y.astype(np.int64)
    model = dptrain.MLP([6, 8, 3])
    assert np.array_equal(model.logits(x), model.logits(x32))
    assert np.array_equal(model.predict(x.tolist()), model.predict(x32))
    assert model.evaluate(x, labels) == model.evaluate(x32, y64)
    model.zero_grad()
    assert model.loss_grad(x, labels) == model.loss_grad(x32, y64)
    assert model.forward_backward(x, labels) == model.forward_backward(x32, y64)


def test_float64_model_and_regression_targets():
    X, _ = _data()
    target = X[:, :1].sum(axis=1)  # (n,) float64, as fit takes it
    model = dptrain.MLP([6, 8, 1], loss="mse", dtype="float64")
    assert model.evaluate(X, target)[0] == model.evaluate(X, target[:, None])[0]
    model32 = dptrain.MLP([6, 8, 1], loss="mse")
    assert (
        model32.evaluate(X, target)[0]
        == model32.evaluate(X.astype(np.float32), target[:, None].astype(np.float32))[0]
    )


def test_conversion_is_said_once(capsys, monkeypatch):
    from dptrain.engine import data

    monkeypatch.setattr(data, "ANNOUNCED", set())  # what earlier tests had said
    X, y = _data()
    model = dptrain.MLP([6, 8, 3])
    model.predict(X)
    model.predict(X[:10])
    err = capsys.readouterr().err
    assert err.count("float64 to float32 on every call") == 1, err


@pytest.mark.parametrize(
    "labels, error, match",
    [
        (np.array([0.0, np.nan] * 32), DataError, r"y\[1\] = nan is not a whole number"),
        (np.array([0.0, 1.5] * 32), DataError, r"y\[1\] = 1.5 is not a whole number"),
        (np.array([0, 3] * 32, np.uint8), DataError, r"y\[1\] = 3 is out of range 0..2"),
        (np.array([0, -1] * 32, np.int32), DataError, r"y\[1\] = -1 is negative"),
        (np.zeros((64, 3), np.int32), DataError, r"one-hot rows\? pass y.argmax"),
        (np.zeros(63, np.int32), DataError, "y has 63 labels but [xX] has 64 rows"),
        (np.array(["a", "b"] * 32), TypeError, "y has dtype <U1"),
    ],
)
def test_what_fit_refuses_is_refused_by_name(labels, error, match):
    X, _ = _data()
    model = dptrain.MLP([6, 8, 3])
    with pytest.raises(error, match=match):
        model.evaluate(X, labels)
    with pytest.raises(error, match=match):
        model.loss_grad(X, labels)
    with pytest.raises(error, match=match):
        dptrain.fit(model, X, labels, epochs=1, quiet=True)


def test_bad_rows_are_refused_by_name():
    X, y = _data()
    model = dptrain.MLP([6, 8, 3])
    bad = X.copy()
    bad[5, 2] = np.nan
    with pytest.raises(DataError, match="x row 5 holds nan"):
        model.predict(bad)
    with pytest.raises(TypeError, match="x has dtype complex128"):
        model.predict(X.astype(np.complex128))
    with pytest.raises(ValueError, match=r"expected \(B, 6\) rows"):
        model.predict(X.reshape(64, 2, 3))


def test_matching_arrays_are_used_as_they_are(monkeypatch):
    # the training loop's batches already are int64 labels and rows of the model's dtype:
    # nothing is converted on its hot path
    from dptrain import models

    def refuse(*args, **kwargs):
        raise AssertionError("converted")

    monkeypatch.setattr(models, "as_rows", refuse)
    monkeypatch.setattr(models, "as_targets", refuse)
    X, y = _data()
    model = dptrain.MLP([6, 8, 3])
    model.loss_grad(X.astype(np.float32), y.astype(np.int64))


def test_one_sample_without_its_batch_axis_says_how_to_pass_it():
    model = dptrain.MLP([20, 8, 3], seed=0)
    x = np.random.default_rng(0).normal(size=(5, 20))
    for one in (x[0], x[0].astype(np.float32), list(x[0])):
        with pytest.raises(
            ValueError,
            match=r"x has shape \(20,\), expected \(B, 20\) rows; for one sample pass "
            r"x.reshape\(1, -1\)",
        ):
            model.predict(one)
    with pytest.raises(ValueError, match=r"x has shape \(20,\)"):
        model.evaluate(x[0], np.array([1]))
    with pytest.raises(ValueError, match=r"x has shape \(5, 20, 1\), expected \(B, 20\) rows$"):
        model.predict(x.reshape(5, 20, 1))
    assert model.predict(x[:1]).shape == (1,)
