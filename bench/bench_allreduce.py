"""One all-reduce of a float32 buffer between 2 workers: shared memory against MPI.

The transports, the same 2 workers, the same buffer sizes (64 B ... 16 MB, and 0.94 MB: the
MLP 784-256-128-10's 235,146-float gradient):

- thread:  `comm.allreduce_sum_(buf)` between 2 threads of this process (the `thread`
  backend's collective: `_core.ShmGroup.allreduce` on an array from `comm.zeros`, reduced
  where it lies), as the training loop calls it;
- thread, pinned: the same with each thread pinned to its own CPU. A diagnostic, not what the
  engine does: unpinned, the GIL hand-off after each call wakes the other thread through a
  futex, the scheduler may put it on the waker's CPU, and then both take turns on one core,
  every wait lasting the barrier's whole spin phase (200 us);
- process: the same call between 2 processes mapping one shared segment (the `process`
  backend's collective; workers started with 'spawn');
- MPI+shm: `comm.allreduce_sum_(buf)` between 2 MPI ranks on one node (the `mpi` backend's
  collective: `dptrain.comm.HierComm`, the node's ranks reduce over an MPI-3 shared window
  with the process transport's C group; no MPI message on one node);
- MPI:     `comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)` between 2 MPI ranks (mpi4py: the
  `mpi` backend's collective with --no-mpi-shm). The MPI columns re-run this script under
  `mpiexec -n 2` in a helper mode that writes its timings as JSON.

What is timed: back-to-back calls, one `time.perf_counter()` pair around each call, on every
worker, after warm-up calls; there is NO barrier between calls (that would time the barrier),
so each call also absorbs the skew between the two workers, as it does in training. The
figures are rank 0's per-call p50 and p90. They include the Python call (about 0.5-1 us:
argument parsing, GIL release) and the perf_counter pair; the header line "call floor" shows
both for a group of ONE worker, where nobody is waited for.

Every call uses scale=1.0 on buffers that hold zeros (so the values stay finite over thousands
of calls); before timing, one all-reduce of rank+1 must give 3 everywhere, on every transport
and size.

Repeats: each repeat runs every transport over every size (order of the transports reversed
every other repeat; a fresh pair of processes / a fresh mpiexec each repeat). p50/p90 are over
the calls of all repeats pooled; `noise` is (max - min) / median of the per-repeat p50s, the
largest of the four columns.

Targets (from the issue): shared memory p50 <= 40 us at 0.94 MB and >= 4x faster than
MPI_Allreduce on the same buffer; p50 <= 1 us for buffers up to 1 KB; MPI ranks on one node
(MPI+shm) within 1.2x of the process transport at 0.94 MB.

Run: python bench/bench_allreduce.py [--quick] [--json PATH]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from dptrain import _core  # noqa: E402
from dptrain import comm as dpcomm  # noqa: E402

WORLD = 2
MLP_GRAD_FLOATS = 235_146
# (label, float32 count)
SIZES = [
    ("64 B", 16),
    ("1 KB", 256),
    ("8 KB", 2048),
    ("64 KB", 16384),
    ("1 MB", 262144),
    ("0.94 MB", MLP_GRAD_FLOATS),
    ("16 MB", 4 * 1024 * 1024),
]
SMALL_TARGET_US = 1.0  # p50 for buffers up to 1 KB
MLP_TARGET_US = 40.0  # p50 at 0.94 MB
MLP_MPI_RATIO_TARGET = 4.0  # MPI p50 / shared-memory p50 at 0.94 MB
MPI_SHM_OVER_PROCESS_TARGET = 1.2  # MPI+shm p50 / process p50 at 0.94 MB
# the shared-memory columns: the thread transport as the engine runs it, the same with each
# thread pinned to its own CPU (a diagnostic, see the module docstring), the process transport
SHM_TRANSPORTS = ["thread", "pinned", "process", "mpi-shm"]
SHORT = {
    "thread": "thread",
    "pinned": "thr.pinned",
    "process": "process",
    "mpi-shm": "MPI+shm",
    "mpi": "MPI",
}
LONG = {
    "thread": "thread",
    "pinned": "thread, pinned",
    "process": "process",
    "mpi-shm": "MPI ranks, node shared memory",
    "mpi": "MPI",
}


def calls_per_repeat(nbytes: int, quick: bool) -> int:
    """Timed calls of one size per repeat: a few ms to ~0.2 s per transport."""
    if nbytes <= 64 * 1024:
        n = 4000
    elif nbytes <= 1024 * 1024:
        n = 600
    else:
        n = 60
    return max(20, n // 4) if quick else n


def warmup_calls(number: int) -> int:
    return max(10, number // 10)


def check_sum(call, buf, rank: int, label: str, transport: str) -> None:
    """One all-reduce of rank+1 on every worker must give 1+2 = 3 everywhere."""
    buf[:] = rank + 1.0
    call()
    if not np.all(buf == 3.0):
        bad = int(np.argmax(buf != 3.0))
        raise AssertionError(
            f"{transport} all-reduce of {label}: rank {rank} has {buf[bad]} at {bad}, expected 3.0"
        )


def pin_to_own_cpu(rank: int) -> None:
    """Pins the calling thread to its own CPU (rank r -> the r-th CPU this process may use;
    on Linux, sched_setaffinity(0) applies to the calling thread only)."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})


def run_shm_rank(comm, plan, transport: str, pin: bool = False) -> dict:
    """One worker of the shared-memory group: every size in `plan` [(label, n, number)];
    returns {label: [seconds per call]}. The wait policy is the one training uses."""
    if pin:
        pin_to_own_cpu(comm.rank)
    out = {}
    for label, n, number in plan:
        buf = comm.zeros(n, np.float32)

        def call(buf=buf):
            comm.allreduce_sum_(buf)

        check_sum(call, buf, comm.rank, label, transport)
        comm.barrier()  # nobody zeroes before both have checked
        buf[:] = 0.0
        comm.barrier()
        out[label] = _util.timed_loop(call, number, warmup_calls(number))
    return out


def run_threads_once(plan, pin: bool = False) -> dict:
    policy = dpcomm.WaitPolicy.for_workers(WORLD, backend="thread", timeout=60.0)
    results = dpcomm.run_threads(
        WORLD, lambda comm: run_shm_rank(comm, plan, "thread", pin), policy=policy, join_timeout=300
    )
    return results[0]


def _process_target(comm, plan) -> dict:
    """One worker process ('spawn': a module-level function with plain arguments)."""
    return run_shm_rank(comm, plan, "process")


def run_processes_once(plan) -> dict:
    """Two worker processes over one shared segment, started, watched and cleaned up by the
    engine's own launcher; returns rank 0's timings."""
    policy = dpcomm.WaitPolicy.for_workers(WORLD, backend="process", timeout=60.0)
    results = dpcomm.run_processes(
        WORLD, _process_target, (plan,), policy=policy, start_method="spawn"
    )
    return results[0]


def run_mpi_once(plan, mpiexec: str, mode: str = "flat") -> dict:
    """Runs this script's --mpi-helper mode under `mpiexec -n 2`; rank 0's timings."""
    return _util.run_mpi_helper(
        mpiexec, WORLD, __file__, ["--plan", json.dumps(plan), "--mode", mode], 300
    )


def mpi_helper(out_path: str, plan, mode: str) -> None:
    """Helper mode, one MPI rank: the same timing loop on comm.Allreduce(IN_PLACE) (flat), or
    on HierComm.allreduce_sum_ of an array from its zeros (hier)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != WORLD:
        raise SystemExit(f"--mpi-helper needs {WORLD} ranks, got {comm.Get_size()}")
    hier = dpcomm.HierComm(comm) if mode == "hier" else None
    out = {}
    for label, n, number in plan:
        buf, call = _util.mpi_allreduce_call(comm, hier, n)
        check_sum(call, buf, rank, label, SHORT["mpi-shm" if hier else "mpi"])
        buf[:] = 0.0
        comm.Barrier()
        out[label] = _util.timed_loop(call, number, warmup_calls(number))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)


def call_floor(number: int = 20000) -> dict:
    """What a call costs when nobody is waited for: the perf_counter pair around an empty
    call, and ShmGroup.allreduce of 64 B in a group of ONE worker (call + barrier + sum)."""
    raw = np.zeros(2 * _core.group_control_bytes(1) + 64 + 64, np.uint8)
    mem = raw[(-raw.ctypes.data) % 64 :]
    control = mem[: _core.group_control_bytes(1)]
    _core.init_group_control(control, 1)
    group = _core.ShmGroup(control, [mem[-64:].view(np.float32)], 0)
    empty = _util.timed_loop(lambda: None, number, 1000)
    solo = _util.timed_loop(group.allreduce, number, 1000)
    return {
        "timer_pair_us": 1e6 * float(np.median(empty)),
        "solo_allreduce_64B_us": 1e6 * float(np.median(solo)),
    }


def percentiles_us(xs) -> tuple[float, float]:
    a = np.asarray(xs)
    return 1e6 * float(np.percentile(a, 50)), 1e6 * float(np.percentile(a, 90))


def main(argv=None):
    def extra(p):
        p.add_argument("--mpi-helper", metavar="OUT", help=argparse.SUPPRESS)
        p.add_argument("--plan", help=argparse.SUPPRESS)
        p.add_argument("--mode", default="flat", help=argparse.SUPPRESS)

    args = _util.parse_args(
        "all-reduce latency between 2 workers: shared memory vs MPI", extra, argv=argv
    )
    if args.mpi_helper:
        mpi_helper(args.mpi_helper, json.loads(args.plan), args.mode)
        return None

    repeats = 2 if args.quick else 7
    mpiexec = shutil.which("mpiexec")
    try:
        import mpi4py

        mpi_version = mpi4py.__version__
    except ImportError:
        mpi_version = None
    env = _util.environment(mpi4py=mpi_version, mpiexec=mpiexec)
    _util.print_environment(env)
    if env["loadavg_1min"] and env["loadavg_1min"] > 0.5:
        print(
            f"# WARNING: load average {env['loadavg_1min']:.2f} before the start: other "
            f"processes compete with the 2 workers for the 2 cores"
        )
    floor = call_floor(5000 if args.quick else 20000)
    print(
        f"# call floor: perf_counter pair around an empty call {floor['timer_pair_us']:.2f} us;"
        f" ShmGroup.allreduce of 64 B in a group of 1 (no peer) "
        f"{floor['solo_allreduce_64B_us']:.2f} us"
    )

    plan = [(label, n, calls_per_repeat(4 * n, args.quick)) for label, n in SIZES]
    runners = {
        "thread": lambda: run_threads_once(plan),
        "pinned": lambda: run_threads_once(plan, pin=True),
        "process": lambda: run_processes_once(plan),
    }
    if mpiexec and mpi_version:
        runners["mpi-shm"] = lambda: run_mpi_once(plan, mpiexec, "hier")
        runners["mpi"] = lambda: run_mpi_once(plan, mpiexec)
    else:
        print("# MPI: no mpiexec or mpi4py here, the MPI column is left out")
    names = list(runners)
    # raw[transport][label] = list over repeats of per-call seconds
    raw = {t: {label: [] for label, _ in SIZES} for t in names}
    t_start = time.perf_counter()
    for r in range(repeats):
        for t in names if r % 2 == 0 else names[::-1]:
            for label, calls in runners[t]().items():
                raw[t][label].append(calls)
    elapsed = time.perf_counter() - t_start

    shm = [t for t in SHM_TRANSPORTS if t in raw]
    rows, table = [], []
    for label, n in SIZES:
        row = {
            "size": label,
            "floats": n,
            "bytes": 4 * n,
            "calls": calls_per_repeat(4 * n, args.quick) * repeats,
        }
        cells = [label, f"{row['calls']}"]
        noise = 0.0
        for t in shm + ["mpi"]:
            if t not in raw:
                cells.append("-")
                continue
            pooled = [x for rep in raw[t][label] for x in rep]
            p50, p90 = percentiles_us(pooled)
            rep_p50 = [percentiles_us(rep)[0] for rep in raw[t][label]]
            noise = max(noise, _util.spread(rep_p50))
            row[t] = {"p50_us": p50, "p90_us": p90, "repeat_p50_us": rep_p50}
            cells.append(f"{_fmt_us(p50)} / {_fmt_us(p90)}")
        for t in shm:
            if "mpi" in row:
                row[f"mpi_over_{t}"] = row["mpi"]["p50_us"] / row[t]["p50_us"]
                cells.append(f"{row[f'mpi_over_{t}']:.1f}x")
            else:
                cells.append("-")
        row["noise"] = noise
        cells.append(f"{100 * noise:.0f}%")
        rows.append(row)
        table.append(cells)
    print()
    _util.print_table(
        ["size", "calls"]
        + [SHORT[t] for t in shm]
        + ["MPI"]
        + [f"MPI/{SHORT[t]}" for t in shm]
        + ["noise"],
        table,
        title=f"All-reduce of a float32 buffer between {WORLD} workers: p50 / p90 "
        f"us per call on rank 0 (back-to-back calls, {repeats} interleaved "
        f"repeats pooled); MPI/x = ratio of p50s",
    )

    targets = []
    by = {row["size"]: row for row in rows}
    for t in shm:
        small = max(by[s][t]["p50_us"] for s in ("64 B", "1 KB"))
        targets.append(
            [
                f"{LONG[t]}: p50 up to 1 KB (worst of 64 B, 1 KB)",
                f"{small:.2f} us",
                f"<= {SMALL_TARGET_US:.0f} us",
                _util.verdict(small, SMALL_TARGET_US, False),
            ]
        )
        mlp = by["0.94 MB"][t]["p50_us"]
        targets.append(
            [
                f"{LONG[t]}: p50 at 0.94 MB",
                f"{mlp:.1f} us",
                f"<= {MLP_TARGET_US:.0f} us",
                _util.verdict(mlp, MLP_TARGET_US, False),
            ]
        )
        if "mpi" in by["0.94 MB"]:
            ratio = by["0.94 MB"][f"mpi_over_{t}"]
            targets.append(
                [
                    f"{LONG[t]}: MPI p50 / its p50 at 0.94 MB",
                    f"{ratio:.1f}x",
                    f">= {MLP_MPI_RATIO_TARGET:.0f}x",
                    _util.verdict(ratio, MLP_MPI_RATIO_TARGET, True),
                ]
            )
    if "mpi-shm" in shm:
        ratio = by["0.94 MB"]["mpi-shm"]["p50_us"] / by["0.94 MB"]["process"]["p50_us"]
        targets.append(
            [
                "MPI+shm p50 / process p50 at 0.94 MB",
                f"{ratio:.2f}x",
                f"<= {MPI_SHM_OVER_PROCESS_TARGET}x",
                _util.verdict(ratio, MPI_SHM_OVER_PROCESS_TARGET, False),
            ]
        )
    print()
    _util.print_table(["target", "measured", "target", "met"], targets, align="lrrl")
    print(
        f"# p50/p90 include the Python call and the timer pair (see the call floor above); "
        f"{elapsed:.0f} s of timing"
    )
    _util.write_json(
        args.json,
        "allreduce",
        env,
        {
            "world": WORLD,
            "repeats": repeats,
            "quick": args.quick,
            "sizes": SIZES,
            "call_floor": floor,
            "calls_per_repeat": {label: c for label, _, c in plan},
        },
        rows,
    )
    return rows


def _fmt_us(us: float) -> str:
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:.0f}"


if __name__ == "__main__":
    main()
