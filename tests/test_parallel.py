"""The data-parallel engine: N workers equal 1 worker, on every transport; failures stop the
run with the rank named and nothing left behind."""

import glob
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from dptrain import comm as parallel


def _shm_segments():
    return set(glob.glob("/dev/shm/psm_*"))


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_n_workers_equal_one_worker(train_small, sequential, backend, workers):
    """Global batch 100 over 1030 samples: the last batch (30) is uneven, and 100 does not
    split evenly over 3 workers either."""
    r = train_small(workers=workers, backend=backend)
    np.testing.assert_allclose(
        r["params"], sequential["params"], rtol=0, atol=1e-5, err_msg=f"{backend} x {workers}"
    )
    np.testing.assert_allclose(r["train_loss"], sequential["train_loss"], rtol=1e-5)
    assert r["config"]["workers"] == workers
    assert len(r["rank_phase_seconds"]) == workers


def test_spawned_processes_equal_one_worker(train_small, sequential):
    before = _shm_segments()
    r = train_small(workers=2, backend="process", start_method="spawn")
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5)
    assert _shm_segments() == before


def test_float64_threads_match_tightly(train_small):
    a = train_small(dtype="float64")
    b = train_small(dtype="float64", workers=4, backend="thread")
    np.testing.assert_allclose(b["params"], a["params"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_raising_worker_stops_the_run_and_is_named(train_small, backend):
    before = _shm_segments()
    t0 = time.monotonic()
    with pytest.raises(
        parallel.WorkerError,
        match=r"worker rank 1 failed: RuntimeError: "
        r"injected fault on rank 1 at step 3",
    ) as info:
        train_small(workers=3, backend=backend, fault=(1, 3, "raise"))
    assert info.value.rank == 1
    assert time.monotonic() - t0 < 10
    assert _shm_segments() == before


def test_a_killed_worker_process_stops_the_run_and_leaves_nothing_behind(train_small):
    import multiprocessing

    before = _shm_segments()
    t0 = time.monotonic()
    with pytest.raises(
        parallel.WorkerError, match="worker rank 2 failed: killed by signal SIGKILL"
    ) as info:
        train_small(workers=3, backend="process", fault=(2, 5, "kill"))
    assert info.value.rank == 2
    assert time.monotonic() - t0 < 10
    assert _shm_segments() == before
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("dptrain")]


def test_oversubscription_warns(train_small):
    cores = os.cpu_count() or 1
    with pytest.warns(RuntimeWarning, match="exceeds the"):
        train_small(workers=cores + 1, backend="thread", epochs=1)


# ------------------------------------------------------------------ MPI


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_mpi_ranks_equal_one_worker(mpi_weights, sequential, ranks, tmp_path):
    got = mpi_weights(ranks)
    np.testing.assert_allclose(got, sequential["params"], rtol=0, atol=1e-5)


@pytest.mark.mpi
def test_mpi_ranks_report_their_own_step_breakdown(mpi_weights, tmp_path):
    out, trace = tmp_path / "run.json", tmp_path / "trace.json"
    mpi_weights(2, "--out", str(out), "--trace", str(trace), "--straggle", "1:3")
    res = json.loads(out.read_text())
    ranks = res["rank_phase_seconds"]
    assert len(ranks) == 2
    # rank 0 waits at the entry barrier for the straggling rank 1
    assert ranks[0]["sync_wait"] > 0.5 * 0.003 * res["steps"] > ranks[1]["sync_wait"]
    tids = {e["tid"] for e in json.loads(trace.read_text())["traceEvents"]}
    assert tids == {0, 1}


@pytest.mark.mpi
def test_a_failing_mpi_rank_aborts_every_rank_and_is_named(mpiexec, tmp_path, mpich_leftovers):
    t0 = time.monotonic()
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
            "--backend",
            "mpi",
            "--quiet",
            "--inject-fault",
            "1:3:raise",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode != 0
    assert "worker rank 1 failed: RuntimeError: injected fault on rank 1 at step 3" in r.stderr
    assert time.monotonic() - t0 < 30


# ------------------------------------------------------------------ deterministic mode


# ------------------------------------------------------------------ checkpoints


# ------------------------------------------------------------------ weak scaling


# ------------------------------------------------------------------ algorithms


# ------------------------------------------------------------------ buckets


# ------------------------------------------------------------------ overlap


# ------------------------------------------------------------------ MPI launch detection


@pytest.mark.parametrize("backend, workers", [("thread", 1), ("thread", 2), ("process", 2)])
def test_epoch_lines_are_printed_by_the_launcher_on_every_transport(train_small, backend, workers):
    """Rank 0 reports each epoch as it ends (comm.report) and the launching process prints
    its line, in order, before the breakdown: the same on threads and processes."""
    lines = []
    train_small(workers=workers, backend=backend, quiet=False, progress=False, log=lines.append)
    epochs = [i for i, line in enumerate(lines) if line.startswith("epoch ")]
    assert [lines[i].split()[1] for i in epochs] == ["1/2", "2/2"]
    assert "time per step" in lines[epochs[-1] + 1]
