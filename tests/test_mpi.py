"""The MPI backend's start (dptrain.comm.mpi): picked from the launcher's environment, run
from the clone's root under mpiexec, refused with a non-MPI backend."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dptrain import comm as parallel

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("var", [v for v, _ in parallel.mpi.MPI_LAUNCH_VARIABLES])
def test_backend_follows_the_mpi_launcher(monkeypatch, var):
    for v, _ in parallel.mpi.MPI_LAUNCH_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    assert parallel.resolve_backend(None) == ("thread", None)
    monkeypatch.setenv(var, "1")  # one rank: nothing to coordinate
    assert parallel.resolve_backend(None) == ("thread", None)
    assert parallel.resolve_backend("process") == ("process", None)
    monkeypatch.setenv(var, "4")
    backend, note = parallel.resolve_backend(None)
    assert backend == "mpi" and f"{var}=4" in note and "4 ranks" in note
    assert parallel.resolve_backend("mpi") == ("mpi", None)
    for explicit in ("thread", "process"):
        with pytest.raises(
            ValueError,
            match=rf"one of 4 ranks, but backend='{explicit}' .*use backend='mpi'",
        ):
            parallel.resolve_backend(explicit)
    with pytest.raises(ValueError, match="backend is 'gpu'"):
        parallel.resolve_backend("gpu")


@pytest.mark.mpi
def test_mpiexec_without_backend_runs_one_mpi_training_from_the_clone_root(mpiexec, tmp_path):
    """The README's way in: `mpiexec -n 2 python -m dptrain train` from the clone's root
    (where ./dptrain is first on sys.path) trains once on 2 MPI ranks and says so."""
    out = tmp_path / "run.json"
    r = subprocess.run(
        [
            mpiexec,
            "-n",
            "2",
            sys.executable,
            "-m",
            "dptrain",
            "train",
            "--model",
            "softmax",
            "--dataset",
            "synthetic",
            "--n-samples",
            "2000",
            "--epochs",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert "as one of 2 ranks: using the MPI backend" in first, r.stdout
    assert r.stdout.count("epoch 1/1") == 1  # one training, reported once
    res = json.loads(out.read_text())
    assert res["config"]["backend"] == "mpi" and res["config"]["workers"] == 2


@pytest.mark.mpi
def test_mpiexec_with_a_non_mpi_backend_is_refused(mpiexec, tmp_path):
    r = subprocess.run(
        [
            mpiexec,
            "-n",
            "2",
            sys.executable,
            "-m",
            "dptrain",
            "train",
            "--model",
            "softmax",
            "--dataset",
            "synthetic",
            "--n-samples",
            "500",
            "--epochs",
            "1",
            "--backend",
            "thread",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode != 0
    assert "one of 2 ranks, but --backend thread would" in r.stderr, r.stderr
    assert "use --backend mpi, or start one process" in r.stderr, r.stderr
    assert "epoch" not in r.stdout
