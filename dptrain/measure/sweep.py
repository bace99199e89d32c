"""Scaling sweeps: workers x data-set size, repeated, into tables a user can trust.

``sweep(...)`` trains every configuration (each data-set size with each worker count,
``repeat`` times, worker counts interleaved so that a slow spell of the host hits all of them)
and returns / writes (``out=DIR``):

- ``sweep.json``: {"config", "machine", "runs": [RUN...], "summary": [SUMMARY...]};
- ``runs.csv`` and ``summary.csv``: the same rows, flat;
- ``traces/<size>_<workers>w.json``: a Chrome trace of the first steps of repeat 0.

A RUN row is one training run: its time (``train_seconds``: the training loop, measured
between barriers; workers are started and the data loaded before it), its phase breakdown
(``dptrain.timing``), step percentiles, collective calls and bytes, the host's steal time,
and for worker counts > 1 the contention ceiling (``independent_seconds``: the same number of
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

import csv
import json
import os
import platform
from pathlib import Path

import numpy as np

from .._plain import is_json
from . import timing
from .progress import Progress

__all__ = ["sweep", "summarize", "format_summary", "write_csv", "run_row", "machine_info",
           "data_label"]

GAP_PARTS = {"contention": ("data", "compute"), "communication": ("communication",),
             "sync_wait": ("sync_wait",), "serial": ("update", "other")}
TRACE_STEPS = 30
SWEEP_BACKENDS = ("thread", "process")   # a sweep starts its own workers (MPI: one mpiexec each)


def machine_info() -> dict:
    """What the sweep ran on: cores, CPU model, the C core's SIMD level, Python, platform."""
    from .. import build_info
    info = build_info()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "simd": info.get("simd"),
            "python": platform.python_version(), "platform": platform.platform()}


def _stats(xs) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None}
    return {"median": float(np.median(xs)), "min": float(min(xs)), "max": float(max(xs))}


def run_row(result: dict, *, n_samples: int, repeat: int, independent: float | None,
            backend: str) -> dict:
    """The RUN row of one train() result (backend: the sweep's, also for its 1-worker runs,
    which are that transport's degenerate case)."""
    c, b = result["config"], result["breakdown"]
    return {"model": c["model"], "dataset": c["dataset"], "backend": backend,
            "allreduce": c["allreduce"], "n_samples": n_samples, "workers": c["workers"],
            "threads": c["threads"], "repeat": repeat, "epochs": c["epochs"],
            "batch_size": c["batch_size"], "steps": result["steps"],
            "param_count": result["model"]["n_params"], "dtype": c["dtype"],
            "param_bytes": b["param_bytes"], "train_seconds": result["train_seconds"],
            "rank_train_seconds": b["rank_train_seconds"],
            "phases": b["phase_seconds"], "rank_phases": b["rank_phase_seconds"],
            "collective_calls": b["collective_calls"], "bytes_sent": b["bytes_sent"],
            "step_seconds": b["step_seconds"], "steal_fraction": b["steal_fraction"],
            "timer_fraction": b["timer_fraction"],
            "final_test_accuracy": result["final_test_accuracy"],
            "independent_seconds": independent}


def summarize(runs: list[dict]) -> list[dict]:
    """SUMMARY rows (see the module docstring) from RUN rows; the 1-worker runs of each size
    are the baseline."""
    key = lambda r: (r["model"], r["dataset"], r["allreduce"], r["n_samples"])  # noqa: E731
    groups: dict = {}
    for r in runs:
        groups.setdefault(key(r) + (r["workers"],), []).append(r)
    out = []
    for k in sorted(groups, key=lambda k: (k[3], k[4])):
        rows = groups[k]
        p = k[4]
        base = groups.get(k[:4] + (1,))
        t1 = float(np.median([r["train_seconds"] for r in base])) if base else None
        times = [r["train_seconds"] for r in rows]
        speed = [t1 / t for t in times] if t1 else []
        phases = {ph: float(np.median([r["phases"][ph] for r in rows])) for ph in timing.PHASES}
        indep = [r["independent_seconds"] for r in rows if r["independent_seconds"]]
        row = {"model": k[0], "dataset": k[1], "backend": rows[0]["backend"],
               "allreduce": k[2], "n_samples": k[3], "workers": p, "repeats": len(rows),
               "time": _stats(times), "speedup": _stats(speed),
               "efficiency": _stats([s / p for s in speed]), "phases": phases,
               "ceiling_speedup": t1 / float(np.median(indep)) if (t1 and indep) else None,
               "param_bytes": rows[0]["param_bytes"], "steps": rows[0]["steps"],
               "batch_size": rows[0]["batch_size"],
               "collective_calls": rows[0]["collective_calls"],
               "bytes_sent": rows[0]["bytes_sent"],
               "step_p50": float(np.median([r["step_seconds"]["p50"] for r in rows])),
               "step_p99": float(np.median([r["step_seconds"]["p99"] for r in rows])),
               "steal_fraction": _stats([r["steal_fraction"] for r in rows])["median"]}
        if base:
            base_ph = {ph: float(np.median([r["phases"][ph] for r in base]))
                       for ph in timing.PHASES}
            row["gap"] = {part: sum(phases[ph] - base_ph[ph] / p for ph in members)
                          for part, members in GAP_PARTS.items()}
            row["ideal_seconds"] = t1 / p
        out.append(row)
    return out


def _flat(row: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}_"))
        elif isinstance(v, list):
            continue                          # per-rank detail stays in the JSON
        else:
            out[prefix + k] = v
    return out


def write_csv(rows: list[dict], path) -> None:
    """Writes rows (nested dicts flattened to prefix_key columns, lists left out) as CSV."""
    flat = [_flat(r) for r in rows]
    fields = list(dict.fromkeys(k for r in flat for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(flat)


def sweep(model: str = "mlp", dataset: str = "mnist", *, sizes=(5000, 10000, 20000, 40000),
          workers=(1, 2, 4), backend: str = "process", repeat: int = 3, epochs: int = 1,
          batch_size: int = 128, allreduce: str = "native", ceiling: bool = True,
          out=None, quiet: bool = False, log=print, quick: bool = False, **train_kw) -> dict:
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
        raise ValueError(f"backend is {backend!r}: a sweep starts its own workers with "
                         f"'thread' or 'process' (under MPI, run one mpiexec per worker count)")
    sizes = sorted({int(s) for s in sizes})
    counts = sorted({int(w) for w in workers} | {1})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sizes must be positive sample counts, got {sizes}")
    if counts[0] < 1:
        raise ValueError(f"workers must be positive, got {counts}")
    if int(repeat) < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    say = (lambda *a: None) if quiet else log
    outdir = Path(out) if out else None
    if outdir:
        (outdir / "traces").mkdir(parents=True, exist_ok=True)
    size_arg = "n_samples" if dataset == "synthetic" else "limit"
    common = dict(model=model, dataset=dataset, epochs=epochs, batch_size=batch_size,
                  allreduce=allreduce, quiet=True, backend=backend, **train_kw)
    plan = [(n, r, p) for n in sizes for r in range(repeat)
            for p in (counts if r % 2 == 0 else counts[::-1])]
    runs = []
    n_ceiling = sum(1 for n, r, p in plan if p > 1) if ceiling else 0
    with Progress(len(plan) + n_ceiling, "sweep", quiet=quiet) as bar:
        for n, r, p in plan:
            kw = dict(common, workers=p, **{size_arg: n})
            if p == 1:
                kw["backend"] = "thread"     # 1 worker runs in this process, no communicator
            trace = (outdir / "traces" / f"{n}_{p}w.json") if (outdir and r == 0) else None
            res = train(**kw)
            if trace:
                res["step_times"].chrome_trace(trace, last_step=TRACE_STEPS)
            bar.update(f"{n} samples x {p} worker(s), repeat {r + 1}: "
                       f"{res['train_seconds']:.3f} s")
            indep = None
            if ceiling and p > 1:
                indep = train(**kw, uncoupled=True)["train_seconds"]
                bar.update(f"{n} samples, {p} uncoupled workers: {indep:.3f} s")
            runs.append(run_row(res, n_samples=n, repeat=r, independent=indep, backend=backend))
    summary = summarize(runs)
    used = runs[0]["dataset"]             # what the runs trained on, e.g. "synthetic-mnist"
    result = {"config": dict(model=model, dataset=used, requested_dataset=dataset,
                             synthetic=used.startswith("synthetic"), quick=bool(quick),
                             sizes=sizes, workers=counts, backend=backend, repeat=repeat,
                             epochs=epochs, batch_size=batch_size, allreduce=allreduce,
                             ceiling=ceiling,
                             **{k: v for k, v in train_kw.items() if is_json(v)}),
              "machine": machine_info(), "runs": runs, "summary": summary}
    if outdir:
        (outdir / "sweep.json").write_text(json.dumps(result, indent=1) + "\n")
        write_csv(runs, outdir / "runs.csv")
        write_csv(summary, outdir / "summary.csv")
        say(f"wrote {outdir / 'sweep.json'}, runs.csv, summary.csv, traces/")
    say(f"{model} on {data_label(result['config'])}:\n" + format_summary(summary))
    return result


def data_label(config: dict) -> str:
    """The data set as tables and figures name it: its real name, flagged when the data
    are synthetic or the run was a quick one."""
    name = config.get("dataset", "?")
    flags = (["SYNTHETIC DATA"] if str(name).startswith("synthetic") else []) + (
        ["QUICK RUN"] if config.get("quick") else [])
    return name + (f" ({', '.join(flags)})" if flags else "")


def format_summary(summary: list[dict]) -> str:
    """The summary as a text table: time, speedup, efficiency (median [min, max]), ceiling
    and where the gap to the ideal went."""
    head = (f"{'samples':>8} {'workers':>7} {'time s':>8} {'speedup':>17} {'effic.':>6} "
            f"{'ceiling':>7}  gap to ideal: contention / comm / sync / serial (ms)")
    lines = [head, "-" * len(head)]
    for s in summary:
        sp = s["speedup"]
        spd = (f"{sp['median']:.2f} [{sp['min']:.2f},{sp['max']:.2f}]"
               if sp["median"] is not None else "-")
        eff = f"{s['efficiency']['median']:.2f}" if s["efficiency"]["median"] else "-"
        ceil = f"{s['ceiling_speedup']:.2f}" if s["ceiling_speedup"] else "-"
        gap = (" / ".join(f"{1e3 * s['gap'][k]:.1f}" for k in GAP_PARTS)
               if "gap" in s and s["workers"] > 1 else "")
        lines.append(f"{s['n_samples']:>8} {s['workers']:>7} {s['time']['median']:>8.3f} "
                     f"{spd:>17} {eff:>6} {ceil:>7}  {gap}")
    return "\n".join(lines)
