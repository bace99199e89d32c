"""Fault injection for elastic runs (issue 37's target): N runs per transport of
`python -m dptrain train --elastic --deterministic` on MNIST (an MLP, 4 workers by default),
each with one worker failed at a random step (the rank, the step and the kind drawn from a
seeded generator): raised (an exception), killed (SIGKILL, processes only: a thread cannot be
killed alone) or stopped (SIGSTOP, or a thread that sleeps, past --timeout). Each run is a
fresh command line, as a user runs it; it passes when it exits 0 and its saved weights are
bitwise equal to the uninterrupted run's. Its recovery is the result's: from the start of the
step the failure interrupted to the end of its redo (the target: <= 1 s + --timeout).

Backend "mpi" (with mpi4py and mpiexec): `python -m dptrain elastic --every K -- mpiexec -n 4
python -m dptrain train ...`, the job restarted on 2 ranks from its last checkpoint; its cost
is the wall time beyond the uninterrupted MPI job's (the restart, the redone steps, and for a
stop the timeout), measured in the same run.

Backend "ulfm" (Open MPI 5, as dptrain.comm.ulfm.open_mpi finds it: $DPTRAIN_OPENMPI or the
mpiexec on PATH): `mpiexec --with-ft ulfm -n 4 python -m dptrain train --elastic ...`, the
job going on in place; its recovery is the result's, as on threads and processes.

Prints one row per run and a summary per transport and kind (passes, recovery median and
maximum); --json writes every row. --overhead R instead measures what --elastic costs when
no one fails (its shared tally of the epoch's sums and its per-step bookkeeping): R repeats
of the same run with and without it, interleaved, on each backend; the step's p50 median
over the repeats and their ratio. Run:
    python bench/bench_elastic.py [--runs 20] [--workers 4] [--timeout 2]
        [--backends thread,process] [--limit N] [--json out.json]
    python bench/bench_elastic.py --overhead 7 [--workers 2] [--limit N] [--backends ...,ulfm]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

KINDS = {"thread": ("raise", "stop"), "process": ("raise", "kill", "stop")}
KINDS["mpi"] = KINDS["ulfm"] = KINDS["process"]


@functools.cache  # (it runs `mpiexec --version`: once per benchmark)
def open_mpi() -> tuple[list, dict]:
    from dptrain.comm import ulfm

    found = ulfm.open_mpi()
    if found is None:
        sys.exit("backend ulfm: no Open MPI 5 found (set DPTRAIN_OPENMPI, see its docstring)")
    return found


def command(args, workdir, name, backend, fault=None, elastic=None) -> list[str]:
    train = [sys.executable, "-m", "dptrain", "train"]
    if backend == "ulfm":
        train = [*open_mpi()[0], "--oversubscribe", "-n", str(args.workers), *train]
    if backend == "mpi":  # the ranks are the workers
        train = ["mpiexec", "-n", str(args.workers), *train]
        if fault is not None:
            train = [
                sys.executable,
                "-m",
                "dptrain",
                "elastic",
                "--every",
                str(args.every),
                "--",
                *train,
            ]
    cmd = [
        *train,
        "--dataset",
        "mnist",
        "--epochs",
        str(args.epochs),
        *(
            ["--workers", str(args.workers), "--backend", backend]
            if backend not in ("mpi", "ulfm")
            else []
        ),
        "--deterministic",
        "--quiet",
        "--save-weights",
        os.path.join(workdir, name + ".npz"),
        "--out",
        os.path.join(workdir, name + ".json"),
    ]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if fault is not None:
        cmd += ["--timeout", str(args.timeout), "--inject-fault", fault]
    if (fault is not None and backend != "mpi") or elastic:
        cmd += ["--elastic"]
    return cmd


def environment(backend: str) -> dict:
    return {**os.environ, **open_mpi()[1]} if backend == "ulfm" else dict(os.environ)


def overhead(args) -> int:
    """--overhead: the step's p50 with and without --elastic, no fault, interleaved."""
    import dptrain

    print(
        f"--elastic's cost with no failure: MNIST MLP, {args.workers} workers, "
        f"{args.overhead} repeats interleaved (step p50, ms)"
    )
    for backend in args.backends.split(","):
        if backend == "mpi":
            continue
        p50 = {False: [], True: []}
        for i in range(args.overhead):
            for elastic in (False, True) if i % 2 == 0 else (True, False):
                if backend == "ulfm":  # a job of its own, its result read back
                    with tempfile.TemporaryDirectory() as workdir:
                        subprocess.run(
                            command(args, workdir, "o", "ulfm", elastic=elastic)
                            + ["--timeout", str(args.timeout)],
                            check=True,
                            env=environment("ulfm"),
                        )
                        with open(os.path.join(workdir, "o.json")) as f:
                            step = json.load(f)["breakdown"]["step_seconds"]["p50"]
                    p50[elastic].append(step * 1e3)
                    continue
                r = dptrain.train(
                    "mlp",
                    dataset="mnist",
                    limit=args.limit or None,
                    epochs=args.epochs,
                    workers=args.workers,
                    backend=backend,
                    deterministic=True,
                    elastic=elastic,
                    quiet=True,
                )
                p50[elastic].append(r.breakdown["step_seconds"]["p50"] * 1e3)
        off, on = statistics.median(p50[False]), statistics.median(p50[True])
        print(
            f"  {backend:8} without {off:.3f} ({min(p50[False]):.3f}-{max(p50[False]):.3f})"
            f"  with {on:.3f} ({min(p50[True]):.3f}-{max(p50[True]):.3f})  ratio {on / off:.3f}"
        )
    return 0


def run(cmd: list, backend: str, timeout: float) -> subprocess.CompletedProcess:
    """cmd, its output captured; one still running after `timeout` seconds is killed with
    its process group and counted as a hang (exit code None)."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(backend),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(
            cmd, None, out, err + f"\nhung: killed after {timeout:g} s"
        )


def weights(path: str) -> dict:
    with np.load(path) as f:
        return {k: f[k].copy() for k in ("params", "velocity")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per transport")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="training samples (0: all)")
    ap.add_argument("--backends", default="thread,process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=20, help="mpi: steps between checkpoints")
    ap.add_argument("--json")
    ap.add_argument("--run-timeout", type=float, default=120.0, help="a run's limit (s): a hang")
    ap.add_argument("--overhead", type=int, default=0, help="repeats of the no-failure A/B")
    args = ap.parse_args()
    if args.overhead:
        return overhead(args)
    rng = np.random.default_rng(args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        # the uninterrupted run (deterministic: the same bits on any backend and world size)
        subprocess.run(command(args, workdir, "ref", "thread"), check=True)
        ref = weights(os.path.join(workdir, "ref.npz"))
        with open(os.path.join(workdir, "ref.json")) as f:
            steps = json.load(f)["steps"]
        print(f"uninterrupted: {steps} steps on {args.workers} workers")
        base_wall = {}
        if "mpi" in args.backends.split(","):  # the MPI job that loses no one, timed
            t0 = time.perf_counter()
            subprocess.run(command(args, workdir, "mpi-ref", "mpi"), check=True)
            base_wall["mpi"] = time.perf_counter() - t0
            got = weights(os.path.join(workdir, "mpi-ref.npz"))
            same = all(np.array_equal(got[k], ref[k]) for k in ref)
            print(f"uninterrupted MPI job: {base_wall['mpi']:.1f} s, bitwise {same}")
        print(
            f"{'backend':8} {'run':>3} {'fault':>16} {'exit':>4} {'bitwise':>7} "
            f"{'recovery s':>10} {'wall s':>6}"
        )
        for backend in args.backends.split(","):
            for i in range(args.runs):
                kind = str(rng.choice(KINDS[backend]))
                fault = f"{rng.integers(args.workers)}:{rng.integers(1, steps - 1)}:{kind}"
                name = f"{backend}-{i}"
                t0 = time.perf_counter()
                proc = run(command(args, workdir, name, backend, fault), backend, args.run_timeout)
                wall = time.perf_counter() - t0
                row = dict(
                    backend=backend,
                    run=i,
                    fault=fault,
                    kind=kind,
                    exit=proc.returncode,
                    wall_seconds=wall,
                    bitwise=False,
                    recovery_seconds=None,
                )
                if proc.returncode == 0:
                    got = weights(os.path.join(workdir, name + ".npz"))
                    row["bitwise"] = all(np.array_equal(got[k], ref[k]) for k in ref)
                    with open(os.path.join(workdir, name + ".json")) as f:
                        events = json.load(f)["elastic"] or []
                    row["recoveries"] = len(events)
                    if events:
                        row["recovery_seconds"] = events[0]["recovery_seconds"]
                    elif backend in base_wall:  # a restarted job: its wall time beyond
                        row["recovery_seconds"] = wall - base_wall[backend]
                else:
                    row["stderr"] = proc.stderr[-2000:]
                rows.append(row)
                rec = row["recovery_seconds"]
                print(
                    f"{backend:8} {i:>3} {fault:>16} {str(row['exit']):>4} "
                    f"{str(row['bitwise']):>7} {rec if rec is None else round(rec, 3):>10} "
                    f"{wall:6.1f}",
                    flush=True,
                )
                if proc.returncode != 0:
                    print(proc.stderr[-2000:], file=sys.stderr)
    print("\nsummary (recovery: from the interrupted step's start to its redo's end)")
    ok_all = True
    for backend in args.backends.split(","):
        for kind in KINDS[backend]:
            sel = [r for r in rows if r["backend"] == backend and r["kind"] == kind]
            if not sel:
                continue
            ok = [r for r in sel if r["exit"] == 0 and r["bitwise"]]
            rec = [r["recovery_seconds"] for r in sel if r["recovery_seconds"] is not None]
            bound = 1.0 + (args.timeout if kind == "stop" else 0.0)
            if backend == "mpi":  # a restart: MPI's start-up and up to --every steps again
                bound = float("inf")
            within = sum(x <= bound for x in rec)
            ok_all &= len(ok) == len(sel) and within == len(sel)
            what = "recovery" if backend != "mpi" else "wall time beyond the uninterrupted job's"
            print(
                f"  {backend:8} {kind:6} {len(ok)}/{len(sel)} exit 0 and bitwise; {what} "
                f"median {statistics.median(rec) if rec else float('nan'):.3f} s, max "
                f"{max(rec) if rec else float('nan'):.3f} s"
                + (f"; {within}/{len(sel)} within {bound:g} s" if backend != "mpi" else "")
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), rows=rows), f, indent=1)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
