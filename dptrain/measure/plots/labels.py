"""The words on a figure: what is the same in every row (the subtitle), a configuration's
label, and what a reader must not miss (provenance): synthetic data, a quick run, an
oversubscribed worker count, a speedup above the machine's cores.
"""

from __future__ import annotations

import textwrap

from .load import CONFIG_DIMS, _oversubscribed, _sweep_config, _threads, _varying, machine_cores


def _fmt_n(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def _dim_text(dim: str, value) -> str:
    if dim == "n_samples":
        return f"n = {_fmt_n(value)}"
    if dim == "backend":
        return f"{value} backend"
    if dim == "allreduce":
        return f"{value} all-reduce"
    return str(value)


def _context(rows, exclude=(), sweep=None) -> str:
    """What is the same in every row, for a title: 'mlp on mnist · process backend · ...',
    and what the reader must not miss: synthetic data, a quick run (``_data_marks``)."""
    varying = _varying(rows)
    fixed = {
        d: rows[0].get(d)
        for d in CONFIG_DIMS
        if d not in exclude and d not in varying and rows[0].get(d) is not None
    }
    if (
        "dataset" not in fixed
        and "dataset" not in varying
        and "dataset" not in exclude
        and _sweep_config(sweep).get("dataset") is not None
    ):
        fixed["dataset"] = _sweep_config(sweep)["dataset"]  # rows without a dataset field
    parts = []
    if "model" in fixed or "dataset" in fixed:
        parts.append(
            " on ".join(
                _dataset_text(fixed[d]) if d == "dataset" else str(fixed[d])
                for d in ("model", "dataset")
                if d in fixed
            )
        )
    parts += [_dim_text(d, fixed[d]) for d in ("backend", "allreduce", "n_samples") if d in fixed]
    named = _is_synthetic_name(fixed.get("dataset"))  # already marked after its name
    return " · ".join(parts + _data_marks(sweep, rows, synthetic_named=named))


# A figure of synthetic stand-in data, or of a quick pipeline check, says so in its subtitle.
SYNTHETIC_MARK = "SYNTHETIC DATA"
QUICK_MARK = "QUICK RUN"


def _is_synthetic_name(name) -> bool:
    return isinstance(name, str) and name.strip().lower().startswith("synthetic")


def _dataset_text(name) -> str:
    """A data set's name as the sweep recorded it, '(SYNTHETIC DATA)' after a synthetic one."""
    return f"{name} ({SYNTHETIC_MARK})" if _is_synthetic_name(name) else str(name)


def _is_synthetic(sweep, rows=()) -> bool:
    """Whether any data set the sweep recorded (its rows', its config's) is synthetic, or the
    sweep flags itself ``synthetic: true``."""
    config = _sweep_config(sweep)
    names = [r.get("dataset") for r in rows if isinstance(r, dict)] + [config.get("dataset")]
    flags = [config.get("synthetic"), sweep.get("synthetic") if isinstance(sweep, dict) else None]
    return any(map(_is_synthetic_name, names)) or any(f is True for f in flags)


def _is_quick(sweep) -> bool:
    """A quick study run (``quick: true`` at the top of sweep.json or in its config)."""
    top = sweep.get("quick") if isinstance(sweep, dict) else None
    return top is True or _sweep_config(sweep).get("quick") is True


def _data_marks(sweep, rows=(), *, synthetic_named: bool = False) -> list:
    """['SYNTHETIC DATA', 'QUICK RUN'] as far as they apply (the first left out where the
    data set's name already carries it)."""
    marks = []
    if _is_synthetic(sweep, rows) and not synthetic_named:
        marks.append(SYNTHETIC_MARK)
    if _is_quick(sweep):
        marks.append(QUICK_MARK)
    return marks


def _oversubscribed_text(sweep) -> str:
    """Oversubscribed, explained: 'Oversubscribed: workers > 2 cores, ...'."""
    cores, threads = machine_cores(sweep), _threads(sweep)
    per = f" × {threads} threads" if threads > 1 else ""
    return (
        f"Oversubscribed: workers{per} > {cores} cores; the workers time-share the cores "
        f"(these runs are left out of the performance-model fit)."
    )


def _above_cores_text(cores: int) -> str:
    """Why a speedup can exceed the core count (the figure's note under the plot)."""
    return (
        f"Circled red, speedup > {cores} cores: more than {cores} cores can give "
        f"CPU-bound work, so either superlinear (cache effects: each worker's shard fits "
        f"in cache) or a noisy baseline (a slow 1-worker run). See the min–max bars; "
        f"repeat the sweep to tell them apart."
    )


def _above_cores_short(cores: int) -> str:
    return textwrap.fill(
        f"speedup > {cores} cores (circled): superlinear (cache effects) or "
        f"a noisy baseline; see the note below",
        38,
    )


def _machine_text(sweep) -> str:
    machine = (sweep or {}).get("machine") or {}
    parts = []
    if machine.get("cores"):
        parts.append(f"{machine['cores']} cores")
    for key in ("cpu", "simd"):
        if machine.get(key):
            parts.append(str(machine[key]))
    return "machine: " + ", ".join(parts) if parts else ""


def _repeats_text(rows) -> str:
    reps = sorted({r.get("repeats") for r in rows if isinstance(r.get("repeats"), int)})
    if not reps:
        return "medians over repeats"
    text = "/".join(str(r) for r in reps)
    return f"medians of {text} repeat{'s' if reps != [1] else ''}"


def _series_label(dims, key) -> str:
    return ", ".join(_dim_text(d, v) for d, v in zip(dims, key))


def _workers_text(p: int) -> str:
    return f"{p} worker{'s' if p != 1 else ''}"


def _seconds_text(v: float) -> str:
    return f"{1000 * v:.3g} ms" if v < 1 else f"{v:.3g} s"


def _run_text(config, sweep=None) -> str:
    """One run's configuration (a trace's otherData) for a subtitle, with ``_data_marks``."""
    config = config if isinstance(config, dict) else {}
    parts = []
    if config.get("model") or config.get("dataset"):
        parts.append(
            " on ".join(
                _dataset_text(config[k]) if k == "dataset" else str(config[k])
                for k in ("model", "dataset")
                if config.get(k)
            )
        )
    if config.get("workers"):
        over = isinstance(config["workers"], int) and _oversubscribed(config["workers"], sweep)
        parts.append(
            _workers_text(config["workers"])
            + (f" (oversubscribed: > {machine_cores(sweep)} cores)" if over else "")
        )
    for d in ("backend", "allreduce", "n_samples"):
        if config.get(d) is not None:
            parts.append(_dim_text(d, config[d]))
    marks = _data_marks(sweep, [config], synthetic_named=_is_synthetic_name(config.get("dataset")))
    return " · ".join(parts + marks)
