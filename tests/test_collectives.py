"""The point-to-point all-reduce algorithms against MPI_Allreduce, run under mpiexec."""

import subprocess
import sys
import textwrap

import pytest

from dptrain.comm.mpi import find_mpiexec

MPIEXEC = find_mpiexec()

pytestmark = pytest.mark.mpi  # MPI ranks under mpiexec (conftest skips without)

SCRIPT = textwrap.dedent("""
    import numpy as np
    from mpi4py import MPI
    from dptrain.comm.algorithms import ring_allreduce, tree_allreduce
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    for n in (1, 2, 5, 7, 1000, 4099):
        for dtype in (np.float32, np.float64):
            x = np.random.default_rng([r, n]).standard_normal(n).astype(dtype)
            want = x.copy()
            comm.Allreduce(MPI.IN_PLACE, want, op=MPI.SUM)
            for fn in (ring_allreduce, tree_allreduce):
                got = x.copy()
                fn(comm, got)
                tol = 1e-5 if dtype == np.float32 else 1e-12
                assert np.allclose(got, want, rtol=tol, atol=tol), (fn.__name__, n, dtype)
                every = comm.allgather(got.tobytes())
                assert all(e == every[0] for e in every), ("ranks differ", fn.__name__, n)
    if r == 0:
        print("collectives ok")
""")


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_ring_and_tree_equal_mpi_allreduce_and_agree_bitwise_across_ranks(ranks, tmp_path):
    r = subprocess.run(
        [MPIEXEC, "-n", str(ranks), sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "collectives ok" in r.stdout
