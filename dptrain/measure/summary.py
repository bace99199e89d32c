"""A sweep's tables: the RUN row of one training run (``run_row``), the SUMMARY rows of its
configurations (``summarize``: medians and min/max over the repeats, speedup, efficiency,
the contention ceiling, the gap to the ideal split into its parts), flat CSV (``write_csv``)
and the text table (``format_summary``). The fields: docs/sweep_schema.md; how a sweep runs:
dptrain.measure.sweep."""

from __future__ import annotations

import csv
import io

import numpy as np

from .._files import write_text_atomically
from . import timing

GAP_PARTS = {
    "contention": ("data", "compute"),
    "communication": ("communication", "average"),
    "sync_wait": ("sync_wait",),
    "serial": ("update", "other"),
}


def _stats(xs) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None}
    return {"median": float(np.median(xs)), "min": float(min(xs)), "max": float(max(xs))}


def run_row(
    result: dict, *, n_samples: int, repeat: int, independent: float | None, backend: str
) -> dict:
    """The RUN row of one train() result (backend: the sweep's, also for its 1-worker runs,
    which are that transport's degenerate case)."""
    c, b = result["config"], result["breakdown"]
    return {
        "model": c["model"],
        "dataset": c["dataset"],
        "backend": backend,
        "allreduce": c["allreduce"],
        "n_samples": n_samples,
        "workers": c["workers"],
        "threads": c["threads"],
        "repeat": repeat,
        "epochs": c["epochs"],
        "batch_size": c["batch_size"],
        "steps": result["steps"],
        "param_count": result["model"]["n_params"],
        "dtype": c["dtype"],
        "param_bytes": b["param_bytes"],
        "train_seconds": result["train_seconds"],
        "rank_train_seconds": b["rank_train_seconds"],
        "phases": b["phase_seconds"],
        "rank_phases": b["rank_phase_seconds"],
        "collective_calls": b["collective_calls"],
        "bytes_sent": b["bytes_sent"],
        "step_seconds": b["step_seconds"],
        "steal_fraction": b["steal_fraction"],
        "timer_fraction": b["timer_fraction"],
        "final_test_accuracy": result["final_test_accuracy"],
        "independent_seconds": independent,
    }


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
        row = {
            "model": k[0],
            "dataset": k[1],
            "backend": rows[0]["backend"],
            "allreduce": k[2],
            "n_samples": k[3],
            "workers": p,
            "repeats": len(rows),
            "time": _stats(times),
            "speedup": _stats(speed),
            "efficiency": _stats([s / p for s in speed]),
            "phases": phases,
            "ceiling_speedup": t1 / float(np.median(indep)) if (t1 and indep) else None,
            "param_bytes": rows[0]["param_bytes"],
            "steps": rows[0]["steps"],
            "batch_size": rows[0]["batch_size"],
            "collective_calls": rows[0]["collective_calls"],
            "bytes_sent": rows[0]["bytes_sent"],
            "step_p50": float(np.median([r["step_seconds"]["p50"] for r in rows])),
            "step_p99": float(np.median([r["step_seconds"]["p99"] for r in rows])),
            "steal_fraction": _stats([r["steal_fraction"] for r in rows])["median"],
        }
        if base:
            base_ph = {
                ph: float(np.median([r["phases"][ph] for r in base])) for ph in timing.PHASES
            }
            row["gap"] = {
                part: sum(phases[ph] - base_ph[ph] / p for ph in members)
                for part, members in GAP_PARTS.items()
            }
            row["ideal_seconds"] = t1 / p
        out.append(row)
    return out


def _flat(row: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}_"))
        elif isinstance(v, list):
            continue  # per-rank detail stays in the JSON
        else:
            out[prefix + k] = v
    return out


def write_csv(rows: list[dict], path) -> None:
    """Writes rows (nested dicts flattened to prefix_key columns, lists left out) as CSV."""
    flat = [_flat(r) for r in rows]
    fields = list(dict.fromkeys(k for r in flat for k in r))
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(flat)
    write_text_atomically(path, text.getvalue())


def data_label(config: dict) -> str:
    """The data set as tables and figures name it: its real name, flagged when the data
    are synthetic or the run was a quick one."""
    name = config.get("dataset", "?")
    flags = (["SYNTHETIC DATA"] if str(name).startswith("synthetic") else []) + (
        ["QUICK RUN"] if config.get("quick") else []
    )
    return name + (f" ({', '.join(flags)})" if flags else "")


def format_summary(summary: list[dict]) -> str:
    """The summary as a text table: time, speedup, efficiency (median [min, max]), ceiling
    and where the gap to the ideal went."""
    head = (
        f"{'samples':>8} {'workers':>7} {'time s':>8} {'speedup':>17} {'effic.':>6} "
        f"{'ceiling':>7}  gap to ideal: contention / comm / sync / serial (ms)"
    )
    lines = [head, "-" * len(head)]
    for s in summary:
        sp = s["speedup"]
        spd = (
            f"{sp['median']:.2f} [{sp['min']:.2f},{sp['max']:.2f}]"
            if sp["median"] is not None
            else "-"
        )
        eff = f"{s['efficiency']['median']:.2f}" if s["efficiency"]["median"] else "-"
        ceil = f"{s['ceiling_speedup']:.2f}" if s["ceiling_speedup"] else "-"
        gap = (
            " / ".join(f"{1e3 * s['gap'][k]:.1f}" for k in GAP_PARTS)
            if "gap" in s and s["workers"] > 1
            else ""
        )
        lines.append(
            f"{s['n_samples']:>8} {s['workers']:>7} {s['time']['median']:>8.3f} "
            f"{spd:>17} {eff:>6} {ceil:>7}  {gap}"
        )
    return "\n".join(lines)
