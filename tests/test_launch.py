"""Your own loop on N workers: dptrain.launch runs fn(comm, *args) on threads, processes and
MPI ranks, the public communicator's collectives on any array, and the example script."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dptrain
from dptrain.comm import WorkerError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "custom_loop.py"


def collectives(comm, n):
    """Every public collective once, on arrays from comm.zeros and on the caller's own."""
    a = comm.zeros(n, np.float32)
    a[:] = comm.rank + 1
    comm.allreduce_sum_(a)
    own = np.full(5, comm.rank + 1.0)  # not from zeros: goes through staging
    comm.allreduce_mean_(own)
    part = np.arange(6.0) + comm.rank
    comm.allreduce_sum_(part, start=2, stop=4)  # a range only
    root = np.arange(3.0) * (comm.rank + 1)
    comm.broadcast_(root, root=comm.size - 1)
    chunks = comm.shared_zeros(4, 3, np.float64)
    total = comm.shared_zeros(1, 3, np.float64)[0]
    for i in range(comm.rank * 4 // comm.size, (comm.rank + 1) * 4 // comm.size):
        chunks[i][:] = i + 1
    comm.sum_into_(total, chunks)
    reduced = comm.reduce_sum_(a, root=0)
    comm.barrier()
    return (
        a.tolist(),
        own.tolist(),
        part.tolist(),
        root.tolist(),
        total.tolist(),
        reduced.tolist() if comm.rank == 0 else None,
    )


@pytest.mark.parametrize("backend, workers", [("thread", 1), ("thread", 3), ("process", 2)])
def test_the_public_collectives(backend, workers):
    results = dptrain.launch(collectives, 4, workers=workers, backend=backend)
    assert len(results) == workers
    s = workers * (workers + 1) / 2  # 1 + 2 + ... + workers
    for rank, (a, own, part, root, total, reduced) in enumerate(results):
        assert a == [s] * 4
        assert own == [s / workers] * 5
        want = list(np.arange(6.0) + rank)
        want[2:4] = [
            2 * workers + workers * (workers - 1) / 2,
            3 * workers + workers * (workers - 1) / 2,
        ]
        assert part == want
        assert root == list(np.arange(3.0) * workers)
        assert total == [10.0] * 3  # 1 + 2 + 3 + 4, in chunk order
        if rank == 0:
            assert reduced == [s * workers] * 4  # the sum of the already summed a


def failing(comm):
    comm.barrier()
    if comm.rank == 1:
        raise KeyError("bad worker")
    comm.barrier()  # rank 0 waits here: stopped by the abort
    return "never"


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_raising_worker_stops_the_launch_and_is_named(backend):
    with pytest.raises(WorkerError, match=r"worker rank 1 failed: KeyError: 'bad worker'"):
        dptrain.launch(failing, workers=2, backend=backend)


def test_launch_checks_its_arguments():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        dptrain.launch(failing, workers=0, backend="thread")
    with pytest.raises(ValueError, match="backend is 'gpu'"):
        dptrain.launch(failing, workers=2, backend="gpu")


def test_allreduce_async_needs_an_array_in_place():
    def fn(comm):
        with pytest.raises(ValueError, match=r"needs an array from comm.zeros"):
            comm.allreduce_async_(np.zeros(4, np.float32))
        a = comm.zeros(4, np.float32)
        a[:] = 1
        comm.wait_([comm.allreduce_async_(a)])
        return a.tolist()

    assert dptrain.launch(fn, workers=2, backend="thread") == [[2.0] * 4] * 2


def _example(backend=None, workers=None):
    args = ([] if backend is None else ["--backend", backend]) + (
        [] if workers is None else ["--workers", str(workers)]
    )
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--epochs", "2", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_the_example_trains_the_same_model_on_every_transport():
    one = _example()
    assert one.startswith("1 worker(s): final loss")
    loss = one.split("final loss ")[1]
    for backend in ("thread", "process"):
        line = _example(backend, 2)
        assert line.startswith("2 worker(s)") and line.endswith(loss), (line, one)
    mpiexec = shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        pytest.skip("the thread and process runs were checked; MPI needs mpi4py and mpiexec")
    r = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, str(EXAMPLE), "--epochs", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("2 worker(s)") and line.endswith(loss), (line, one)


class _World:
    """mpi4py's COMM_WORLD as abort_job uses it: the size, and Abort recorded."""

    def __init__(self):
        self.aborted = None

    def Get_size(self):
        return 4

    def Abort(self, code):
        self.aborted = code


@pytest.mark.parametrize(
    "exc, rank, code, cause",
    [
        (RuntimeError("boom"), 3, 1, "failed: RuntimeError: boom"),
        (KeyboardInterrupt(), 3, 130, "interrupted (SIGINT)"),
    ],
)
def test_a_failing_mpi_rank_names_itself_then_waits_for_the_launcher_then_aborts(
    monkeypatch, capsys, exc, rank, code, cause
):
    # MPICH's Hydra forwards a rank's stderr through its proxy: an abort that reaches the
    # launcher first lost the line (1 run in 80 of a 4-rank job under load), hence the wait
    from dptrain.comm import mpi

    events, world = [], _World()
    monkeypatch.setattr(mpi, "_HELD", [])  # this test's election, given back after it
    monkeypatch.setattr(mpi.time, "sleep", lambda s: events.append(("sleep", s)))
    monkeypatch.setattr(mpi.os, "_exit", lambda c: events.append(("exit", c)))
    mpi.abort_job(world, rank, exc)
    said = f"dptrain: worker rank {rank} {cause}; aborting all 4 MPI ranks\n"
    assert capsys.readouterr().err == said
    assert events == [("sleep", mpi.ABORT_GRACE_SECONDS), ("exit", code)]
    assert mpi.ABORT_GRACE_SECONDS > 0 and world.aborted == code


def test_ctrl_c_is_said_by_the_first_rank_of_the_node_to_handle_it(monkeypatch, capsys):
    """Ctrl-C reaches every rank: the first of the node to handle it says it, the others (in
    this test, this same process asking again) say nothing."""
    from dptrain.comm import mpi

    monkeypatch.setattr(mpi, "_HELD", [])
    name = f"test-{os.getpid()}"
    assert mpi.first_on_node(name) is True
    assert mpi.first_on_node(name) is False
    monkeypatch.setattr(mpi.time, "sleep", lambda s: None)
    monkeypatch.setattr(mpi.os, "_exit", lambda c: None)
    monkeypatch.setattr(mpi, "first_on_node", lambda what: False)
    mpi.abort_job(_World(), 2, KeyboardInterrupt())
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("code, status", [(0xFFFFFFFE, 1), (0xFFFFFFF0, 130)])
def test_a_rank_woken_by_anothers_abort_says_nothing_and_lets_the_first_abort(
    monkeypatch, capsys, code, status
):
    """Issue 37: the late rank that another timed out waiting for, arriving during that one's
    grace, printed "worker rank R failed: GroupAborted", naming itself as failed. A rank woken
    by another's abort (its timeout's, its failure's, its Ctrl-C's) is silent and waits
    twice the grace, so that the first rank's line and exit status come first."""
    from dptrain import _core
    from dptrain.comm import mpi

    events, world = [], _World()
    monkeypatch.setattr(mpi.time, "sleep", lambda s: events.append(("sleep", s)))
    monkeypatch.setattr(mpi.os, "_exit", lambda c: events.append(("exit", c)))
    mpi.abort_job(world, 1, _core.GroupAborted("group aborted", code))
    assert capsys.readouterr().err == ""
    assert events == [("sleep", 2 * mpi.ABORT_GRACE_SECONDS), ("exit", status)]
    assert world.aborted == status


def test_a_second_interrupt_during_the_wait_still_aborts_the_mpi_job(monkeypatch):
    from dptrain.comm import mpi

    def interrupted(seconds):
        raise KeyboardInterrupt

    world, exits = _World(), []
    monkeypatch.setattr(mpi, "_HELD", [])
    monkeypatch.setattr(mpi.time, "sleep", interrupted)
    monkeypatch.setattr(mpi.os, "_exit", exits.append)
    mpi.abort_job(world, 0, KeyboardInterrupt())
    assert world.aborted == 130 and exits == [130]
