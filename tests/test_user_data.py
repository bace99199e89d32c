"""The user's own data on N workers: arrays of any real dtype, int or float labels, .npy
memory maps, through dptrain.train, dptrain.fit and the CLI, on every transport, equal to one
worker."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dptrain

ROOT = Path(__file__).resolve().parent.parent
OPTS = dict(hidden=(16,), epochs=2, batch_size=64, lr=0.05, quiet=True)


def problem(n=900, d=12, dtype=np.float64, labels="int"):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, d)).astype(dtype)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    return x, (y.astype(np.float64) if labels == "float" else y)


@pytest.fixture(scope="module")
def one_worker():
    x, y = problem()
    return dptrain.train("mlp", X=x, y=y, validation=0.2, **OPTS)


@pytest.mark.parametrize(
    "dtype, labels", [(np.float64, "int"), (np.float32, "float"), (np.uint8, "int")]
)
@pytest.mark.parametrize("backend, workers", [("thread", 2), ("process", 2), ("thread", 3)])
def test_arrays_on_every_transport_equal_one_worker(dtype, labels, backend, workers):
    x, y = problem(dtype=np.float64, labels=labels)
    if dtype == np.uint8:
        x = np.clip(x * 40 + 128, 0, 255).astype(np.uint8)
    else:
        x = x.astype(dtype)
    one = dptrain.train("mlp", X=x, y=y, validation=0.2, **OPTS)
    many = dptrain.train("mlp", X=x, y=y, validation=0.2, workers=workers, backend=backend, **OPTS)
    # 1e-5, relative to the weights' size: unscaled uint8 inputs grow weights of ~200
    np.testing.assert_allclose(many["params"], one["params"], rtol=1e-5, atol=1e-5)
    assert many.config["dataset"] == "arrays" and many["dataset"]["n_test"] == 180


def test_a_memory_mapped_npy_is_not_copied_into_workers(tmp_path, one_worker):
    x, y = problem()
    np.save(tmp_path / "x.npy", x.astype(np.float32))
    np.save(tmp_path / "y.npy", y)
    ds = dptrain.data.from_npy(tmp_path / "x.npy", tmp_path / "y.npy", validation=0.2)
    assert isinstance(ds.x_train, np.memmap)
    assert dptrain.data.memmap_region(ds.x_train)[0] == str(tmp_path / "x.npy")
    for backend in ("thread", "process"):
        r = dptrain.train("mlp", ds, workers=2, backend=backend, **OPTS)
        np.testing.assert_allclose(r["params"], one_worker["params"], rtol=0, atol=1e-5)


def test_fit_trains_the_users_model_in_place():
    x, y = problem()
    model = dptrain.MLP([12, 16, 3], seed=4)
    start = model.params.copy()
    r = dptrain.fit(
        model,
        x.astype(np.float32),
        y,
        epochs=10,
        batch_size=64,
        lr=0.05,
        quiet=True,
        workers=2,
        backend="process",
    )
    assert r.model is model and not np.array_equal(model.params, start)
    again = dptrain.MLP([12, 16, 3], seed=4)
    dptrain.fit(again, x.astype(np.float32), y, epochs=10, batch_size=64, lr=0.05, quiet=True)
    np.testing.assert_allclose(model.params, again.params, rtol=0, atol=1e-5)
    assert (model.predict(x.astype(np.float32)) == y).mean() > 0.8


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(y=np.array([0, 1, -1] * 300)), r"y\[2\] = -1 is negative"),
        (dict(y=np.arange(899)), r"900.*899|899.*900"),
        (dict(X=np.array([[np.nan] * 12] * 900)), r"row 0"),
    ],
)
def test_bad_user_data_is_refused_naming_the_row(bad, message):
    x, y = problem()
    args = {"X": x, "y": y}
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=message):
        dptrain.train("mlp", **args, **OPTS)


@pytest.mark.mpi
def test_cli_npy_files_under_mpiexec_equal_one_worker(mpiexec, tmp_path):
    x, y = problem()
    np.save(tmp_path / "x.npy", x.astype(np.float32))
    np.save(tmp_path / "y.npy", y)
    args = [
        "-m",
        "dptrain",
        "train",
        "--model",
        "mlp",
        "--hidden",
        "16",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--lr",
        "0.05",
        "--quiet",
        "--train-x",
        str(tmp_path / "x.npy"),
        "--train-y",
        str(tmp_path / "y.npy"),
        "--validation",
        "0.2",
    ]
    one = subprocess.run(
        [sys.executable, *args, "--save-weights", str(tmp_path / "one.npz")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert one.returncode == 0, one.stderr
    two = subprocess.run(
        [
            mpiexec,
            "-n",
            "2",
            sys.executable,
            *args,
            "--save-weights",
            str(tmp_path / "two.npz"),
            "--out",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert two.returncode == 0, two.stderr
    np.testing.assert_allclose(
        dptrain.load_model(tmp_path / "two.npz").params,
        dptrain.load_model(tmp_path / "one.npz").params,
        atol=1e-5,
    )
    assert json.loads((tmp_path / "r.json").read_text())["config"]["workers"] == 2
