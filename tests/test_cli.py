"""The command line (python -m dptrain): help, info, a training run's files, the demo with
no data present, bad values."""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from dptrain.models import load_model


def test_cli_help_and_info():
    r = _cli("--help")
    assert r.returncode == 0 and "train" in r.stdout and "info" in r.stdout
    r = _cli("info")
    assert r.returncode == 0
    for key in ("simd", "dtypes", "compiler", "openmp", "mpi"):
        assert key in r.stdout


def test_cli_train_writes_result_and_weights(tmp_path):
    out, w = tmp_path / "run.json", tmp_path / "w.npz"
    r = _cli(
        "train",
        "--model",
        "softmax",
        "--dataset",
        "synthetic",
        "--n-samples",
        "2000",
        "--epochs",
        "2",
        "--batch-size",
        "50",
        "--lr",
        "0.05",
        "--momentum",
        "0.9",
        "--seed",
        "0",
        "--no-shuffle",
        "--dtype",
        "float64",
        "--out",
        str(out),
        "--save-weights",
        str(w),
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    res = json.loads(out.read_text())
    assert res["config"]["dtype"] == "float64" and res["config"]["shuffle"] is False
    assert load_model(w).dtype == np.float64


def test_cli_main_job_runs_with_no_data_present(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DPTRAIN_DATA"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["HOME"] = str(tmp_path)
    r = _cli("train", "--no-download", "--epochs", "1", "--limit", "3000", env=env, cwd=tmp_path)
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


def _cli(*args, env=None, cwd=None):
    # run outside the checkout (`python -m` puts the working directory first on sys.path, and
    # the source tree's dptrain/ has no built extension), in a directory removed afterwards
    if cwd is None:
        with tempfile.TemporaryDirectory(prefix="dptrain-cli-") as tmp:
            return _cli(*args, env=env, cwd=tmp)
    return subprocess.run(
        [sys.executable, "-m", "dptrain", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
