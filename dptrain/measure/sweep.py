"""Scaling sweeps: workers x data-set size, repeated, into tables a user can trust.

``sweep(...)`` trains every configuration (each data-set size with each worker count,
``repeat`` times, worker counts interleaved so that a slow spell of the host hits all of them)
and returns / writes (``out=DIR``):

- ``sweep.json``: {"config", "machine", "runs": [RUN...], "summary": [SUMMARY...]};
- ``runs.csv`` and ``summary.csv``: the same rows, flat;
- ``traces/<size>_<workers>w.json``: a Chrome trace of the first steps of repeat 0 (an
  earlier sweep's in the folder are removed first).

Every field of these files: docs/sweep_schema.md. The rows and tables are made by
dptrain.measure.summary (re-exported here); this module runs the sweep.

A RUN row is one training run: its time (``train_seconds``: the training loop, measured
between barriers; workers are started and the data loaded before it), its phase breakdown
(``dptrain.measure.timing``), step percentiles, collective calls and bytes, the host's steal
time, and for worker counts > 1 the contention ceiling (``independent_seconds``: the same number of
workers run uncoupled at the same moment, each on its 1/p of the data). A SUMMARY row is one
configuration: median, min and max over the repeats of the time, the speedup T1/Tp (T1: our
own 1-worker run of the same size in the same sweep: sequential, in this process, with no
communicator, the fastest way we run one worker) and the efficiency Sp/p, the median
phases, the ceiling's speedup, and the decomposition of the gap Tp - T1/p into:

- contention: compute and data taking longer than 1/p of theirs in the 1-worker run (memory
  bandwidth and caches shared by the cores, a host that time-shares them);
- communication: the transfer; sync_wait: waiting for the slowest worker;
- serial: update and loop overhead that every worker repeats in full (the Amdahl part).

Each part is (phase time at p) - (phase time at 1) / p, so the four add up to the gap.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from .._files import write_text_atomically
from .._plain import is_json
from .progress import Progress
from .summary import data_label, format_summary, run_row, summarize, write_csv

__all__ = [
    "sweep",
    "summarize",
    "format_summary",
    "write_csv",
    "run_row",
    "machine_info",
    "data_label",
]

TRACE_STEPS = 30
SWEEP_BACKENDS = ("thread", "process")  # a sweep starts its own workers (MPI: one mpiexec each)


def machine_info() -> dict:
    """What the sweep ran on: cores, CPU model, the C core's SIMD level, Python, platform."""
    from .. import build_info

    info = build_info()
    return {
        "cores": os.cpu_count(),
        "cpu": info["cpu"],
        "simd": info.get("simd"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def sweep(
    model: str = "mlp",
    dataset: str = "mnist",
    *,
    sizes=(5000, 10000, 20000, 40000),
    workers=(1, 2, 4),
    backend: str = "process",
    repeat: int = 3,
    epochs: int = 1,
    batch_size: int = 128,
    allreduce: str = "native",
    ceiling: bool = True,
    out=None,
    quiet: bool = False,
    log=print,
    quick: bool = False,
    **train_kw,
) -> dict:
    """Runs the sweep (see the module docstring) and returns its dict; writes it to `out`.

    sizes: training-set sizes (the first N samples of MNIST, or N synthetic samples);
    workers: worker counts (1 is added: it is the baseline); backend: 'thread' | 'process'
    (MPI sweeps: one mpiexec per worker count, see the README); ceiling=False skips the
    uncoupled runs; quick=True marks a reduced run (a pipeline check, not a result) in
    the config, so that tables and figures say so. Other keyword arguments go to train()
    unchanged. The config's "dataset" is the data set the runs really used, e.g.
    "synthetic-mnist" when MNIST was not found ("requested_dataset" keeps the name asked for).
    """
    from ..engine import train

    if backend not in SWEEP_BACKENDS:
        raise ValueError(
            f"backend is {backend!r}: a sweep starts its own workers with "
            f"'thread' or 'process' (under MPI, run one mpiexec per worker count)"
        )
    sizes = sorted({int(s) for s in sizes})
    counts = sorted({int(w) for w in workers} | {1})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sizes must be positive sample counts, got {sizes}")
    if counts[0] < 1:
        raise ValueError(f"workers must be positive, got {counts}")
    if int(repeat) < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if train_kw.get("threads") == "auto":  # its runs would differ in threads, not only workers
        raise ValueError(
            "threads='auto' divides the CPUs among one run's workers, and a sweep's runs have "
            "1 to several workers: give threads a number"
        )
    say = (lambda *a: None) if quiet else log
    outdir = Path(out) if out else None
    if outdir:
        (outdir / "traces").mkdir(parents=True, exist_ok=True)
        # an earlier sweep's traces in the same folder: `plot` would draw one as this sweep's
        for old in (outdir / "traces").glob("*_*w.json"):
            old.unlink()
    size_arg = "n_samples" if dataset == "synthetic" else "limit"
    common = dict(
        model=model,
        dataset=dataset,
        epochs=epochs,
        batch_size=batch_size,
        allreduce=allreduce,
        quiet=True,
        backend=backend,
        **train_kw,
    )
    plan = [
        (n, r, p)
        for n in sizes
        for r in range(repeat)
        for p in (counts if r % 2 == 0 else counts[::-1])
    ]
    runs = []
    kept = dict(model=model, dataset=dataset, quick=quick, sizes=sizes, counts=counts)
    kept.update(backend=backend, repeat=repeat, epochs=epochs, batch_size=batch_size)
    kept.update(allreduce=allreduce, ceiling=ceiling, train_kw=train_kw)
    try:
        _run_plan(plan, runs, common, size_arg, outdir, ceiling, backend, quiet, train)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM (_signals.Terminated): the runs done are kept
        if outdir and runs:
            _finish(runs, outdir, say, plan=len(plan), interrupted=True, settings=kept)
        raise
    return _finish(runs, outdir, say, plan=len(plan), interrupted=False, settings=kept)


def _run_plan(plan, runs, common, size_arg, outdir, ceiling, backend, quiet, train):
    """Runs the sweep's plan, appending each run's row to runs as it ends."""
    n_ceiling = sum(1 for n, r, p in plan if p > 1) if ceiling else 0
    with Progress(len(plan) + n_ceiling, "sweep", quiet=quiet) as bar:
        for n, r, p in plan:
            kw = dict(common, workers=p, **{size_arg: n})
            if p == 1:
                kw["backend"] = "thread"  # 1 worker runs in this process, no communicator
            trace = (outdir / "traces" / f"{n}_{p}w.json") if (outdir and r == 0) else None
            res = train(**kw)
            if trace:
                res["step_times"].chrome_trace(trace, last_step=TRACE_STEPS)
            bar.update(f"{n} samples x {p} worker(s), repeat {r + 1}: {res['train_seconds']:.3f} s")
            indep = None
            if ceiling and p > 1:
                indep = train(**kw, uncoupled=True)["train_seconds"]
                bar.update(f"{n} samples, {p} uncoupled workers: {indep:.3f} s")
            runs.append(run_row(res, n_samples=n, repeat=r, independent=indep, backend=backend))


def _finish(runs, outdir, say, *, plan: int, interrupted: bool, settings: dict):
    """The sweep's result from its runs, written to outdir; an interrupted sweep's says so
    (its runs done of the plan's), and is written all the same: no run is lost. settings:
    the sweep's arguments, as its config records them."""
    g = settings
    summary = summarize(runs)
    used = runs[0]["dataset"]  # what the runs trained on, e.g. "synthetic-mnist"
    result = {
        "config": dict(
            model=g["model"],
            dataset=used,
            requested_dataset=g["dataset"],
            synthetic=used.startswith("synthetic"),
            quick=bool(g["quick"]),
            sizes=g["sizes"],
            workers=g["counts"],
            **{k: g[k] for k in ("backend", "repeat", "epochs", "batch_size", "allreduce")},
            ceiling=g["ceiling"],
            **{k: v for k, v in g["train_kw"].items() if is_json(v)},
        ),
        "machine": machine_info(),
        "runs": runs,
        "summary": summary,
    }
    if interrupted:
        result["config"]["interrupted"] = f"{len(runs)} of {plan} runs done"
    if outdir:
        write_text_atomically(outdir / "sweep.json", json.dumps(result, indent=1) + "\n")
        write_csv(runs, outdir / "runs.csv")
        write_csv(summary, outdir / "summary.csv")
        done = f" (interrupted: {len(runs)} of {plan} runs done)" if interrupted else ""
        say(f"wrote {outdir / 'sweep.json'}, runs.csv, summary.csv, traces/{done}")
    if not interrupted:
        say(f"{g['model']} on {data_label(result['config'])}:\n" + format_summary(summary))
    return result
