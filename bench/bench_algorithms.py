"""The four gradient-exchange algorithms on each transport: native, ring, tree, ps.

For 8 KB, 1 MB and 16 MB float32 buffers, every algorithm the training loop offers
(`--allreduce`) through the engine's own communicators, exactly as training calls them:

- native: `comm.allreduce_sum_(a)` (the shared-memory one-pass reduce / MPI_Allreduce);
- ring, tree: the point-to-point schedules (`comm.algorithms.ring_allreduce` /
  `tree_allreduce` over MPI Sendrecv; `_core.ShmGroup` with algorithm="ring"/"tree" over
  shared memory, one barrier per step), on arrays from `comm.zeros(n, algorithm=...)`;
- ps: the parameter server's exchange per step: `comm.reduce_sum_(grads)` to rank 0, then
  `comm.broadcast_(params)` of the same size (the update on rank 0 in between is not timed).

Transports: `process` (2 worker processes over one shared segment, the engine's launcher) and
`mpi` (this script re-run under `mpiexec -n 2` in a helper mode). Timing as in
bench_allreduce.py: back-to-back calls after warm-up, a perf_counter pair around each, rank 0's
p50 pooled over the repeats. Before timing, one exchange of rank+1 must give 3 everywhere.

Run: python bench/bench_algorithms.py [--quick] [--json PATH]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import json  # noqa: E402
import shutil  # noqa: E402

import numpy as np  # noqa: E402

from bench_allreduce import _fmt_us, _timed_loop, percentiles_us  # noqa: E402
from dptrain import comm as dpcomm  # noqa: E402

WORLD = 2
SIZES = [("8 KB", 2048), ("1 MB", 262144), ("16 MB", 4 * 1024 * 1024)]
from dptrain.comm.algorithms import ALGORITHMS  # noqa: E402


def calls(n: int, quick: bool) -> int:
    c = 2000 if n <= 4096 else 300 if n <= 300_000 else 30
    return max(10, c // 5) if quick else c


def exchange(comm: dpcomm.Communicator, alg: str, buf):
    """The call training makes for one step's exchange with this algorithm on buf."""
    if alg != "ps":
        return lambda: comm.allreduce_sum_(buf)

    def ps():
        comm.reduce_sum_(buf, root=0)
        comm.broadcast_(buf, root=0)  # the parameters go back out: same bytes

    return ps


def time_rank(comm: dpcomm.Communicator, quick: bool) -> dict:
    out = {}
    for alg in ALGORITHMS:
        for label, n in SIZES:
            buf = comm.zeros(n, np.float32, algorithm=alg if alg in ("ring", "tree") else "native")
            call = exchange(comm, alg, buf)
            buf[:] = comm.rank + 1.0
            if alg == "ps":
                total = comm.reduce_sum_(buf, root=0)
                ok = comm.rank != 0 or bool(np.all(total == 3.0))
                comm.barrier()
            else:
                call()
                ok = bool(np.all(buf == 3.0))
            if not ok:
                raise AssertionError(f"{comm.backend} {alg} {label}: wrong sum on rank {comm.rank}")
            buf[:] = 0.0
            comm.barrier()
            number = calls(n, quick)
            out[f"{alg} {label}"] = _timed_loop(call, number, max(5, number // 10))
    return out


def _process_target(comm, quick):
    return time_rank(comm, quick)


def run_processes_once(quick: bool) -> dict:
    return dpcomm.run_processes(WORLD, _process_target, (quick,), start_method="spawn")[0]


def run_mpi_once(mpiexec: str, quick: bool) -> dict:
    return _util.run_mpi_helper(mpiexec, WORLD, __file__, ["--quick"] if quick else [])


def mpi_helper(out_path: str, quick: bool) -> None:
    comm = dpcomm.MPIComm(measure_wait=False)  # the bare collectives
    res = time_rank(comm, quick)
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


def main(argv=None):
    def extra(p):
        p.add_argument("--mpi-helper", metavar="OUT", help=__import__("argparse").SUPPRESS)

    args = _util.parse_args(
        "native/ring/tree/ps on the process and MPI transports", extra, argv=argv
    )
    if args.mpi_helper:
        mpi_helper(args.mpi_helper, args.quick)
        return None
    env = _util.environment()
    _util.print_environment(env)
    repeats = 1 if args.quick else 3
    runners = {"process": lambda: run_processes_once(args.quick)}
    mpiexec = shutil.which("mpiexec")
    if mpiexec:
        runners["mpi"] = lambda: run_mpi_once(mpiexec, args.quick)
    else:
        print("# no mpiexec here: the MPI column is left out")
    raw = {t: {} for t in runners}
    for r in range(repeats):
        for t in list(runners) if r % 2 == 0 else list(runners)[::-1]:
            for key, xs in runners[t]().items():
                raw[t].setdefault(key, []).extend(xs)
    rows, table = [], []
    for label, n in SIZES:
        for alg in ALGORITHMS:
            key = f"{alg} {label}"
            row = {"size": label, "bytes": 4 * n, "algorithm": alg}
            cells = [label, alg]
            for t in ("process", "mpi"):
                if t in raw:
                    p50, p90 = percentiles_us(raw[t][key])
                    row[t] = {"p50_us": p50, "p90_us": p90}
                    cells.append(f"{_fmt_us(p50)} / {_fmt_us(p90)}")
                else:
                    cells.append("-")
            if "mpi" in row:
                cells.append(f"{row['mpi']['p50_us'] / row['process']['p50_us']:.1f}x")
            else:
                cells.append("-")
            rows.append(row)
            table.append(cells)
    print()
    _util.print_table(
        ["size", "algorithm", "process (shm)", "MPI", "MPI/shm"],
        table,
        title=f"One gradient exchange between {WORLD} workers: p50 / p90 us per "
        f"call on rank 0 ({repeats} repeat(s) pooled)",
    )
    _util.write_json(
        args.json,
        "algorithms",
        env,
        {"world": WORLD, "repeats": repeats, "quick": args.quick},
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
