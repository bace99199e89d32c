"""Pinned against unpinned workers (`--pin` / `--no-pin`): the measurement behind `--pin`'s
default (issue 34, item 3; bench/README.md, "Pinning").

Each run is one `python -m dptrain train` (under `mpiexec -n N` for the mpi rows), its
`train_seconds` read from the result JSON: 3 epochs of weak scaling, the per-worker batch of
issue 34's workloads (MLP 784-256-128-10 on MNIST, 128 samples per worker per step; the
studies' CNN on 3x32x32, 32 per worker: CIFAR-10 where --data-dir or $DPTRAIN_DATA holds it,
else its announced synthetic stand-in), `--limit` samples. For every worker count and
transport, pinned and unpinned runs alternate (ABBA: the order flips every repeat), after one
untimed run of each. Reported: samples/s, median [min, max] of the repeats, pinned over
unpinned, and in how many repeats the pinned run was the faster of its pair.

    python bench/bench_pin.py [--workers 2 16] [--models mlp cnn] [--repeats 5]
                              [--transports process mpi thread] [--limit 30000] [--json out.json]

Default worker counts: 2 and every usable CPU (os.sched_getaffinity), where that is more.
The mpi rows need mpiexec and mpi4py; they are left out, saying so, without them.
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import json
import os
import subprocess
import sys
import tempfile

from dptrain.comm.mpi import find_mpiexec

MODELS = {
    "mlp": ["--model", "mlp", "--dataset", "mnist", "--batch-per-worker", "128"],
    "cnn": ["--model", "cnn", "--dataset", "cifar10", "--batch-per-worker", "32"],
}
TRANSPORTS = ("process", "mpi", "thread")


def run(model: str, transport: str, workers: int, pin: bool, limit: int, epochs: int) -> float:
    """One training run's samples per second."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, "-m", "dptrain", "train", *MODELS[model], "--limit", str(limit)]
        cmd += ["--epochs", str(epochs), "--pin" if pin else "--no-pin", "--quiet"]
        cmd += ["--out", out]
        if transport == "mpi":
            cmd = [find_mpiexec(), "-n", str(workers), *cmd]
        else:
            cmd += ["--workers", str(workers), "--backend", transport]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_util.child_env())
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stderr}")
        with open(out) as f:
            result = json.load(f)
    return result["samples_per_second"]


def main() -> None:
    cpus = len(os.sched_getaffinity(0))

    def extra(p):
        p.add_argument("--workers", type=int, nargs="+", default=sorted({2, max(2, cpus)}))
        p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=["mlp"])
        p.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
        p.add_argument("--repeats", type=int, default=5)
        p.add_argument("--limit", type=int, default=30000, help="training samples per run")
        p.add_argument("--epochs", type=int, default=3)

    args = _util.parse_args(__doc__.splitlines()[0], extra)
    repeats, limit = (3, 6000) if args.quick else (args.repeats, args.limit)
    env = _util.environment()
    _util.print_environment(env)
    transports = list(args.transports)
    if "mpi" in transports and find_mpiexec() is None:
        print("# mpi left out: mpiexec or mpi4py is not installed")
        transports.remove("mpi")
    rows, table = [], []
    for model in args.models:
        for workers in args.workers:
            for transport in transports:
                if workers > cpus:
                    print(f"# {workers} workers > {cpus} usable CPUs: --pin refuses, left out")
                    continue
                case = (model, transport, workers)
                for pin in (True, False):  # untimed warm-up (page cache, first imports)
                    run(*case, pin, limit, 1)
                got = {True: [], False: []}
                for rep in range(repeats):
                    for pin in (True, False) if rep % 2 == 0 else (False, True):
                        got[pin].append(run(*case, pin, limit, args.epochs))
                pairs = list(zip(got[True], got[False]))
                rows.append(
                    {"model": model, "transport": transport, "workers": workers}
                    | {"pinned": got[True], "unpinned": got[False]}
                )
                table.append(
                    [
                        model,
                        transport,
                        workers,
                        *(
                            f"{_util.median(got[p]):,.0f} [{min(got[p]):,.0f}, {max(got[p]):,.0f}]"
                            for p in (True, False)
                        ),
                        f"{_util.median(got[True]) / _util.median(got[False]):.3f}",
                        f"{sum(a > b for a, b in pairs)} of {len(pairs)}",
                    ]
                )
    _util.print_table(
        ["model", "transport", "workers", "pinned samples/s", "unpinned", "ratio", "pin faster"],
        table,
        title=f"--pin against --no-pin, {repeats} repeats, {args.epochs} epochs of {limit} "
        f"samples (medians [min, max])",
    )
    _util.write_json(
        args.json,
        "bench_pin",
        env,
        {"repeats": repeats, "limit": limit, "epochs": args.epochs, "usable_cpus": cpus},
        rows,
    )


if __name__ == "__main__":
    main()
