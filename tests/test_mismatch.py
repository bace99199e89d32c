"""Collectives that refuse mismatched arrays (issue 37 item 6): every collective first checks
that every rank passed the same length, dtype and range, the same root and scale, and called
the same collective (shared memory: ShmGroup.agree in the world barrier; MPI: one small
all-reduce, mpi_agree), and raises CollectiveMismatch on every rank, naming what each rank
passed, before any array is touched. Before this check the issue's examples returned partial
or garbage sums ([1.0, 2.875, 1.0, 2.875] on rank 0) or hung."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from dptrain.comm import CollectiveMismatch, launch
from dptrain.comm.mpi import find_mpiexec


def _ones(n, dtype=np.float32):
    return np.ones(n, dtype)


# name -> a worker's calls for rank r; and the words the error must hold for rank 0 and rank 1
CASES = {
    "dtype": (
        lambda c: c.allreduce_sum_(_ones(4, np.float32 if c.rank == 0 else np.float64)),
        (
            "rank 0: allreduce_sum_ of a float32 array of length 4",
            "rank 1: allreduce_sum_ of a float64 array of length 4",
        ),
    ),
    "length": (
        lambda c: c.allreduce_sum_(_ones(4 + c.rank)),
        ("float32 array of length 4;", "float32 array of length 5"),
    ),
    "range": (
        lambda c: c.allreduce_sum_(_ones(8), start=0, stop=4 + c.rank),
        ("length 8 [0:4]", "length 8 [0:5]"),
    ),
    "scale": (
        lambda c: c.allreduce_sum_(_ones(8), scale=1.0 + c.rank),
        ("rank 0: allreduce_sum_ of a float32 array of length 8;", "scale 2"),
    ),
    "broadcast length": (
        lambda c: c.broadcast_(_ones(4 + c.rank), 0),
        ("broadcast_ of a float32 array of length 4, root 0", "length 5, root 0"),
    ),
    "broadcast root": (
        lambda c: c.broadcast_(_ones(4), c.rank),
        ("length 4, root 0", "rank 1: broadcast_ of a float32 array of length 4, root 1"),
    ),
    "reduce dtype": (
        lambda c: c.reduce_sum_(_ones(3, np.float64 if c.rank else np.float32), 0),
        ("reduce_sum_ of a float32", "reduce_sum_ of a float64"),
    ),
    "another collective": (
        lambda c: c.barrier() if c.rank == 0 else c.allreduce_sum_(_ones(2)),
        ("rank 0: barrier", "rank 1: allreduce_sum_"),
    ),
    "zeros against a plain array": (
        lambda c: c.allreduce_sum_(c.zeros(4) if c.rank == 0 else _ones(4)),
        ("length 4 from comm.zeros()", "rank 1: allreduce_sum_ of a float32 array of length 4"),
    ),
    "overlap bucket": (
        lambda c: c.wait_([c.allreduce_async_(c.zeros(10), 0, 5 + c.rank)]),
        ("allreduce_async_ of a float32 array of length 10 [0:5]", "[0:6]"),
    ),
}


def _every_rank_raises(case):
    calls = CASES[case][0]

    def worker(comm):
        ok = np.full(3, float(comm.rank + 1))
        comm.allreduce_sum_(ok)  # a matched call first: the check lets it through
        assert np.all(ok == 3.0), ok
        try:
            calls(comm)
        except CollectiveMismatch as exc:
            return str(exc)
        return None

    return worker


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_mismatched_collective_raises_on_every_rank_naming_each(backend, case):
    got = launch(_every_rank_raises(case), workers=2, backend=backend, timeout=20)
    for message in got:
        assert message is not None, f"{case}: a rank went on"
        for words in CASES[case][1]:
            assert words in message, message
    assert got[0] == got[1]


def test_matched_collectives_still_give_their_sums():
    def worker(comm):
        r = comm.rank
        a = comm.zeros(10, np.float64)
        a[:] = r + 1
        comm.allreduce_sum_(a, start=2, stop=7, scale=0.5)
        b = np.full(4, float(r), np.float32)
        comm.broadcast_(b, 2)
        chunks = comm.shared_zeros(6, 5, np.float64)
        out = comm.shared_zeros(1, 5, np.float64)[0]
        for i in range(r * 6 // 3, (r + 1) * 6 // 3):
            chunks[i][:] = i
        comm.sum_into_(out, chunks)
        comm.barrier_after_work(0)
        return a.tolist(), b.tolist(), out.tolist()

    for backend in ("thread", "process"):
        got = launch(worker, workers=3, backend=backend, timeout=20)
        for r, (a, b, out) in enumerate(got):
            assert a == [r + 1] * 2 + [3.0] * 5 + [r + 1] * 3
            assert b == [2.0] * 4 and out == [15.0] * 5


MPI_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from mpi4py import MPI
    from dptrain.comm import CollectiveMismatch, HierComm, MPIComm
    w = MPI.COMM_WORLD
    kind = sys.argv[1]
    c = MPIComm(w) if kind == "flat" else HierComm(w, nodes=int(kind))
    r = c.rank
    out = open(f"rank{r}.txt", "w")
    cases = [
        lambda: c.allreduce_sum_(np.ones(4, np.float32 if r == 0 else np.float64)),
        lambda: c.allreduce_sum_(np.ones(4 + r, np.float32)),
        lambda: c.broadcast_(np.ones(4, np.float32), r),
        lambda: c.barrier() if r == 0 else c.allreduce_sum_(np.ones(2, np.float32)),
    ]
    for i, call in enumerate(cases):
        try:
            call()
            print(f"case {i}: no error on rank {r}", file=out)
        except CollectiveMismatch as exc:
            print(f"case {i}: {exc}", file=out)
    ok = np.full(3, r + 1.0)
    c.allreduce_sum_(ok)
    assert np.all(ok == 3), ok
    if kind != "flat":
        c.close_windows()
    out.close()
""")


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["flat", "1", "2"], ids=["MPIComm", "hier-1-node", "hier-2-nodes"])
def test_mpi_ranks_refuse_mismatched_collectives(kind):
    mpiexec = find_mpiexec()
    with tempfile.TemporaryDirectory(prefix="dptrain-mismatch-") as cwd:
        script = os.path.join(cwd, "mismatch.py")
        with open(script, "w") as f:
            f.write(MPI_SCRIPT)
        r = subprocess.run(
            [mpiexec, "-n", "2", sys.executable, script, kind],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=cwd,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        lines = []
        for rank in (0, 1):
            with open(os.path.join(cwd, f"rank{rank}.txt")) as f:
                lines += f.read().splitlines()
    for i, words in enumerate(
        [
            ("float32 array of length 4", "rank 1: allreduce_sum_ of a float64"),
            ("length 4;", "length 5"),
            ("root 0", "rank 1: broadcast_ of a float32 array of length 4, root 1"),
            ("rank 0: barrier", "rank 1: allreduce_sum_"),
        ]
    ):
        mine = [line for line in lines if line.startswith(f"case {i}:")]
        assert len(mine) == 2, lines  # both ranks raised
        for line in mine:
            assert all(w in line for w in words), line
