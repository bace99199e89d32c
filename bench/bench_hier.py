"""The MPI backend's exchange at 4 ranks: flat MPI_Allreduce against the hierarchical
all-reduce (dptrain.comm.hier) on 1, 2 and 4 (simulated) nodes.

Layouts, all under `mpiexec -n 4` on this machine:

- flat MPI:     `comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)` over the 4 ranks (what
  `--no-mpi-shm` runs; MPICH's own shared-memory path inside the machine);
- 1 node:       HierComm, the 4 ranks share one window: no MPI message at all;
- 2 nodes of 2: HierComm with `--mpi-nodes 2`: each pair sums over shared memory, the 2
  leaders all-reduce with MPI_Allreduce, the pair reads the total;
- 4 nodes of 1: HierComm with `--mpi-nodes 4`: every rank its own leader (the inter-node
  path alone, plus HierComm's own copies).

Two measurements:

1. One all-reduce of the MLP's 0.94 MB float32 gradient (235,146 floats) and of 8 KB:
   back-to-back calls, a perf_counter pair around each on rank 0, after warm-up calls; p50
   and p90 over the calls of every repeat pooled (as bench_allreduce.py).
2. Training: the MNIST MLP 784-256-128-10 (the first 12,000 samples or the announced
   synthetic stand-in, global batch 128, 1 epoch), `python -m dptrain train --out` in each
   layout; the exchange per step = rank 0's communication + sync_wait phases per step, from
   the result's breakdown, and train_seconds. The final losses must agree (1e-5 relative).

Layouts run interleaved (the order reversed every other repeat), a fresh mpiexec each run.
On a machine with fewer than 4 cores the 4 ranks time-share the cores (the header says so):
the figures then include the scheduler, and only their ratios within this run mean anything.

Run: python bench/bench_hier.py [--quick] [--json PATH]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

RANKS = 4
SIZES = [("8 KB", 2048), ("0.94 MB", 235_146)]
LAYOUTS = {
    "flat MPI": ("flat", 0),
    "1 node": ("hier", 1),
    "2 nodes of 2": ("hier", 2),
    "4 nodes of 1": ("hier", 4),
}
MNIST_DIR = "/work/shared/data/mnist"


def helper(out_path: str, mode: str, nodes: int, number: int) -> None:
    """One MPI rank: times the all-reduce of each size in one layout; rank 0 writes JSON."""
    from mpi4py import MPI
    from dptrain.comm import HierComm

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    hier = HierComm(world, nodes=nodes) if mode == "hier" else None
    out = {}
    for label, n in SIZES:
        buf, call = _util.mpi_allreduce_call(world, hier, n)
        buf[:] = rank + 1
        call()
        if not np.all(buf == size * (size + 1) / 2):
            raise AssertionError(f"{mode}/{nodes}: wrong sum at {label} on rank {rank}")
        buf[:] = 0
        world.Barrier()
        out[label] = _util.timed_loop(call, number, max(10, number // 10))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)


def micro(mpiexec: str, mode: str, nodes: int, number: int) -> dict:
    return _util.run_mpi_helper(
        mpiexec,
        RANKS,
        __file__,
        ["--mode", mode, "--nodes", str(nodes), "--number", str(number)],
        300,
    )


def train(mpiexec: str, mode: str, nodes: int, limit: int) -> dict:
    data = (
        ["--dataset", "mnist", "--data-dir", MNIST_DIR, "--no-download"]
        if os.path.isdir(MNIST_DIR)
        else ["--dataset", "mnist", "--no-download"]
    )
    layout = ["--no-mpi-shm"] if mode == "flat" else ["--mpi-nodes", str(nodes)]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [
            mpiexec,
            "-n",
            str(RANKS),
            sys.executable,
            "-m",
            "dptrain",
            "train",
            "--model",
            "mlp",
            *data,
            "--limit",
            str(limit),
            "--epochs",
            "1",
            "--batch-size",
            "128",
            "--backend",
            "mpi",
            "--quiet",
            "--out",
            out,
            *layout,
        ]
        proc = subprocess.run(
            cmd, cwd=tmp, env=_util.child_env(), capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
        with open(out) as f:
            res = json.load(f)
    phases = res["rank_phase_seconds"][0]
    steps = res["steps"]
    return {
        "train_seconds": res["train_seconds"],
        "steps": steps,
        "exchange_per_step": (phases["communication"] + phases["sync_wait"]) / steps,
        "loss": res["train_loss"][-1],
        "dataset": res["dataset"]["name"],
        "layout": res["config"].get("mpi_layout"),
    }


def main(argv=None):
    def extra(p):
        p.add_argument("--mpi-helper", metavar="OUT", help=argparse.SUPPRESS)
        p.add_argument("--mode", default="flat", help=argparse.SUPPRESS)
        p.add_argument("--nodes", type=int, default=0, help=argparse.SUPPRESS)
        p.add_argument("--number", type=int, default=400, help=argparse.SUPPRESS)

    args = _util.parse_args(
        "4 MPI ranks: flat MPI_Allreduce vs the hierarchical all-reduce", extra, argv=argv
    )
    if args.mpi_helper:
        helper(args.mpi_helper, args.mode, args.nodes, args.number)
        return None
    mpiexec = shutil.which("mpiexec")
    try:
        import mpi4py
    except ImportError:
        mpiexec = None
    if not mpiexec:
        print("# no mpiexec or mpi4py here: nothing to measure (pip install '.[mpi]')")
        return None
    env = _util.environment(mpi4py=mpi4py.__version__, mpiexec=mpiexec)
    _util.print_environment(env)
    cores = os.cpu_count() or 1
    if cores < RANKS:
        print(
            f"# NOTE: {RANKS} ranks on {cores} cores: the ranks time-share the cores; compare "
            f"the layouts only with each other, in this run"
        )
    repeats = 2 if args.quick else 5
    number = 100 if args.quick else 400
    limit = 4000 if args.quick else 12000
    raw = {name: {label: [] for label, _ in SIZES} for name in LAYOUTS}
    runs = {name: [] for name in LAYOUTS}
    names = list(LAYOUTS)
    t0 = time.perf_counter()
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            mode, nodes = LAYOUTS[name]
            for label, calls in micro(mpiexec, mode, nodes, number).items():
                raw[name][label].append(calls)
            runs[name].append(train(mpiexec, mode, nodes, limit))
    rows, table = [], []
    flat = {
        label: float(np.median([x for rep in raw["flat MPI"][label] for x in rep]))
        for label, _ in SIZES
    }
    flat_step = float(np.median([x["exchange_per_step"] for x in runs["flat MPI"]]))
    for name in names:
        row = {"layout": name}
        cells = [name]
        for label, _ in SIZES:
            pooled = np.array([x for rep in raw[name][label] for x in rep])
            p50, p90 = 1e6 * np.percentile(pooled, 50), 1e6 * np.percentile(pooled, 90)
            row[label] = {"p50_us": p50, "p90_us": p90}
            cells += [f"{p50:.1f} / {p90:.1f}", f"{1e6 * flat[label] / p50:.2f}x"]
        step = [x["exchange_per_step"] for x in runs[name]]
        secs = [x["train_seconds"] for x in runs[name]]
        row.update(
            exchange_per_step_us=1e6 * float(np.median(step)),
            train_seconds=float(np.median(secs)),
            noise=_util.spread(secs),
            loss=runs[name][0]["loss"],
            layout_ranks=runs[name][0]["layout"],
        )
        cells += [
            f"{row['exchange_per_step_us']:.0f}",
            f"{flat_step / float(np.median(step)):.2f}x",
            f"{row['train_seconds']:.3f}",
            f"{100 * row['noise']:.0f}%",
        ]
        rows.append(row)
        table.append(cells)
    print()
    _util.print_table(
        [
            "layout",
            "8 KB p50 / p90 us",
            "vs flat",
            "0.94 MB p50 / p90 us",
            "vs flat",
            "exchange us/step",
            "vs flat",
            "train s",
            "noise",
        ],
        table,
        title=f"{RANKS} MPI ranks, {repeats} interleaved repeats: all-reduce per "
        f"call (rank 0, {number} calls per repeat) and the MLP's exchange "
        f"per training step (communication + sync wait, rank 0); "
        f"vs flat = flat MPI's figure / this one",
    )
    losses = [row["loss"] for row in rows]
    agree = max(losses) - min(losses) <= 1e-5 * abs(losses[0])
    print(
        f"# data: {runs['flat MPI'][0]['dataset']}; final training losses "
        f"{', '.join(f'{v:.6f}' for v in losses)}: {'agree' if agree else 'DIFFER'}; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    _util.write_json(
        args.json,
        "hier",
        env,
        {"ranks": RANKS, "repeats": repeats, "calls": number, "limit": limit},
        rows,
    )
    if not agree:
        raise SystemExit("the layouts trained different models")
    return rows


if __name__ == "__main__":
    main()
