"""Figures of a sweep: where data-parallel training time went, and what more workers would give.

Every function takes plain data and returns a ``matplotlib.figure.Figure``:

- ``plot_speedup(sweep)``: speedup vs workers, measured medians with min/max bars, the ideal
  line, the efficiency loss shaded between them, the contention ceiling where measured, and a
  table of time / speedup / efficiency per configuration.
- ``plot_efficiency_vs_size(sweep)`` and ``plot_time_vs_size(sweep)``: one line per worker count.
- ``plot_breakdown(sweep)``: stacked phases per configuration, in seconds and in % of the step.
- ``plot_baseline_vs_distributed(sweep)``: grouped bars, 1 worker vs p workers, per phase.
- ``plot_timeline(trace)``: a few steps of a Chrome trace, one row per rank.
- ``plot_model_validation(rows)`` and ``plot_projection(rows)``: the performance model's
  predicted vs measured times, and its projection to large clusters (rows as produced by
  dptrain.perfmodel: ``{workers, n_samples, measured, predicted}`` and ``{network, algorithm,
  workers, speedup, efficiency}``).

What a figure never leaves out (the issue "no run passes synthetic data off as real"):

- the data set's name as the sweep recorded it in every subtitle, followed by
  "(SYNTHETIC DATA)" when it is synthetic, and "QUICK RUN" for a sweep marked ``quick: true``;
- a speedup above the machine's core count (``machine.cores`` in sweep.json) circled with why
  it can happen, and worker counts with more workers x threads than cores marked
  oversubscribed (the command line leaves them out of the model fit);
- whether the performance model passed its held-out check (``model_verdict``, after
  ``perfmodel.validation_verdict``): a projection from a model that did not is titled and
  boxed "NOT VALIDATED ... for illustration only", and the command line prints the same line.

``plot_sweep(sweep_dir, out_dir)`` writes every figure the data allows (PNG and SVG) and returns
the files; a figure that needs more than the sweep holds (two worker counts, two data-set sizes,
a trace) raises ``NotEnoughData`` when called alone and is skipped by ``plot_sweep``.
``save_figure(fig, path)`` writes one figure; ``main_plot(args)`` is ``python -m dptrain plot
results/ --out figures/``. Every phase has one color in every figure (``PHASE_COLORS``).

A sweep is ``sweep.json`` as written by dptrain.sweep (the contract: SUMMARY rows with ``time``,
``speedup``, ``efficiency`` as ``{median, min, max}`` over repeats, ``phases`` as medians, and
``ceiling_speedup``); the functions accept the loaded dict, a list of SUMMARY rows, or (through
``load_sweep``) the directory or file. Times are seconds in the data, shown in s or ms.

matplotlib is optional (``pip install "dptrain[plot]"``) and imported only when a figure is
made. Figures are made without pyplot: no global figure list to leak in long sweeps, and
outside a notebook each figure draws on an Agg canvas whatever backend the user has selected.
In a notebook pyplot is imported once, so that the returned figure displays inline.

Left out on purpose: interactive figures, and any statistics beyond what the sweep recorded
(medians and min/max over repeats are drawn as they are).
"""
from __future__ import annotations

import importlib
import json
import math
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

# The phases of a step, in the order they are stacked (the contract in dptrain.sweep).
from .timing import PHASES  # noqa: E402  (the one list of phases)

__all__ = ["plot_sweep", "load_sweep", "load_trace", "plot_speedup", "plot_efficiency_vs_size",
           "plot_time_vs_size", "plot_breakdown", "plot_baseline_vs_distributed",
           "plot_timeline", "plot_model_validation", "plot_projection", "model_verdict",
           "save_figure", "machine_cores", "NotEnoughData", "FIGURE_NAMES"]

PHASE_LABELS = {"data": "data", "compute": "compute (fwd + bwd)",
                "communication": "communication", "sync_wait": "sync wait",
                "update": "optimizer update", "other": "other"}
# One color per phase in every figure: waiting is red, moving bytes orange, useful work blue.
PHASE_COLORS = {"data": "#2ca02c", "compute": "#1f77b4", "communication": "#ff7f0e",
                "sync_wait": "#d62728", "update": "#9467bd", "other": "#9a9a9a"}

# What makes a configuration (besides the worker count), in the order labels name them.
CONFIG_DIMS = ("model", "dataset", "backend", "allreduce", "n_samples")
BASELINE_COLOR = "#6f6f6f"
FIGURE_NAMES = ("speedup", "efficiency_vs_size", "time_vs_size", "breakdown",
                "baseline_vs_distributed", "timeline", "model_validation", "model_projection")
TOLERANCE_BAND = 0.15      # the performance model's target: predictions within 15 %

_PIP_HINT = 'pip install "dptrain[plot]"'


class NotEnoughData(ValueError):
    """The data cannot make this figure (e.g. one worker count only); plot_sweep skips it."""


# ------------------------------------------------------------------ matplotlib, lazily
def _matplotlib():
    try:
        import matplotlib
        import matplotlib.figure  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"dptrain.plots needs matplotlib, which is not installed: "
                          f"{_PIP_HINT}") from exc
    return matplotlib


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and hasattr(shell, "kernel")   # Jupyter, Colab; not a terminal


@contextmanager
def _style():
    mpl = _matplotlib()
    with mpl.rc_context({"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10,
                         "legend.fontsize": 8.5, "xtick.labelsize": 9, "ytick.labelsize": 9,
                         "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False, "axes.axisbelow": True,
                         "svg.fonttype": "none"}):           # SVG text stays text
        yield mpl


def _figure(width: float, height: float):
    mpl = _matplotlib()
    fig = mpl.figure.Figure(figsize=(width, height), layout="constrained")
    if _in_notebook():
        importlib.import_module("matplotlib.pyplot")   # registers the inline display
    else:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        FigureCanvasAgg(fig)
    return fig


def _titles(fig, what: str, context: str = "") -> None:
    """The figure's title: what it shows, and under it for which model/data/backend (wrapped
    between its ' · ' parts to the figure's width, so that no part is cut off)."""
    width = int(fig.get_figwidth() * 11)            # characters of 12 pt per line
    lines, line = [], ""
    for part in context.split(" · ") if context else ():
        if line and len(line) + 3 + len(part) > width:
            lines.append(line)
            line = part
        else:
            line = f"{line} · {part}" if line else part
    if line:
        lines.append(line)
    fig.suptitle("\n".join([what] + lines), fontsize=12)


def _wrap(text: str, width: int) -> list:
    """Lines of at most ``width`` characters that never break '15 %' from its unit."""
    return textwrap.wrap(text.replace(" %", "\u00a0%"), width) or [""]


def _footnote(fig, text: str) -> None:
    """How to read the figure (repeats, error bars, definitions), wrapped to its width."""
    width = int(fig.get_figwidth() * 17)
    lines = [wrapped for para in text.split("\n") for wrapped in _wrap(para, width)]
    fig.supxlabel("\n".join(lines), fontsize=8, color="#444444", ha="left", x=0.01)


# ------------------------------------------------------------------ input
def load_sweep(source) -> dict:
    """A sweep as a dict: from a directory holding sweep.json, the file itself, or a dict.

    A bare list of SUMMARY rows is accepted too (wrapped as ``{"summary": rows}``). The rows
    are checked here (``ValueError`` naming the row and the field), so the figures can trust them.
    """
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            path = path / "sweep.json"
        if not path.is_file():
            raise FileNotFoundError(f"no sweep found: {path} does not exist (expected the "
                                    f"sweep.json written by `python -m dptrain sweep`)")
        try:
            sweep = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
    else:
        sweep = source
    if isinstance(sweep, list):
        sweep = {"summary": sweep}
    if not isinstance(sweep, dict) or "summary" not in sweep:
        raise ValueError(f"sweep must be a dict with a 'summary' list (sweep.json), a list of "
                         f"SUMMARY rows, or a path; got {type(sweep).__name__}"
                         + (f" with keys {sorted(sweep)}" if isinstance(sweep, dict) else ""))
    _check_summary(sweep["summary"])
    return sweep


def _check_summary(rows) -> None:
    if not isinstance(rows, list) or not rows:
        raise ValueError("sweep summary is empty: there is no configuration to plot "
                         "(did the sweep finish?)")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"summary[{i}] is a {type(row).__name__}, expected a dict")
        for key in ("workers", "n_samples", "time"):
            if key not in row:
                raise ValueError(f"summary[{i}] has no {key!r} (keys: {sorted(row)})")
        for key in ("workers", "n_samples"):
            v = row[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"summary[{i}].{key} is {v!r}, expected an integer >= 1")
        for key in ("time", "speedup", "efficiency"):
            stat = row.get(key)
            if stat is None and key != "time":
                continue                  # no baseline for this size: no speedup to draw
            where = f"summary[{i}] ({_config_text(row)}).{key}"
            if not isinstance(stat, dict) or not _is_number(stat.get("median")):
                raise ValueError(f"{where} is {stat!r}, expected "
                                 f"{{'median': .., 'min': .., 'max': ..}}")
            med, lo, hi = _stat(row, key)
            if not lo <= med <= hi:
                raise ValueError(f"{where} has min {lo}, median {med}, max {hi}; expected "
                                 f"min <= median <= max")
        phases = row.get("phases")
        if phases is not None:
            _check_phases(phases, f"summary[{i}] ({_config_text(row)}).phases")


def _check_phases(phases, where: str) -> None:
    if not isinstance(phases, dict):
        raise ValueError(f"{where} is a {type(phases).__name__}, expected a dict of seconds "
                         f"per phase")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise ValueError(f"{where} has unknown phase(s) {unknown}; the phases are {PHASES}")
    for name, value in phases.items():
        if not _is_number(value) or value < 0:
            raise ValueError(f"{where}[{name!r}] is {value!r}, expected seconds >= 0")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _summary(data) -> tuple[list, dict]:
    """(SUMMARY rows, the sweep dict) from whatever the public functions were given."""
    sweep = load_sweep(data)
    return sweep["summary"], sweep


def _stat(row, key):
    """(median, min, max) of a ``{median, min, max}`` field, or None where it is missing."""
    stat = row.get(key)
    if not isinstance(stat, dict) or not _is_number(stat.get("median")):
        return None
    med = stat["median"]
    lo = stat.get("min") if _is_number(stat.get("min")) else med
    hi = stat.get("max") if _is_number(stat.get("max")) else med
    return med, lo, hi


def _phase_seconds(row) -> dict:
    """The row's phases as seconds, every phase present (a phase not recorded counts as 0)."""
    phases = row.get("phases") or {}
    return {p: float(phases.get(p, 0.0)) for p in PHASES}


# ------------------------------------------------------------------ labels
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


def _config_text(row) -> str:
    return ", ".join(f"{d}={row[d]}" for d in (*CONFIG_DIMS, "workers") if d in row)


def _varying(rows, dims=CONFIG_DIMS) -> list:
    return [d for d in dims if len({repr(r.get(d)) for r in rows}) > 1]


def _context(rows, exclude=(), sweep=None) -> str:
    """What is the same in every row, for a title: 'mlp on mnist · process backend · ...',
    and what the reader must not miss: synthetic data, a quick run (``_data_marks``)."""
    varying = _varying(rows)
    fixed = {d: rows[0].get(d) for d in CONFIG_DIMS
             if d not in exclude and d not in varying and rows[0].get(d) is not None}
    if "dataset" not in fixed and "dataset" not in varying and "dataset" not in exclude \
            and _sweep_config(sweep).get("dataset") is not None:
        fixed["dataset"] = _sweep_config(sweep)["dataset"]    # rows without a dataset field
    parts = []
    if "model" in fixed or "dataset" in fixed:
        parts.append(" on ".join(_dataset_text(fixed[d]) if d == "dataset" else str(fixed[d])
                                 for d in ("model", "dataset") if d in fixed))
    parts += [_dim_text(d, fixed[d]) for d in ("backend", "allreduce", "n_samples") if d in fixed]
    named = _is_synthetic_name(fixed.get("dataset"))       # already marked after its name
    return " · ".join(parts + _data_marks(sweep, rows, synthetic_named=named))


# ------------------------------------------------------------------ provenance
# A figure of synthetic stand-in data, or of a quick pipeline check, says so in its subtitle.
SYNTHETIC_MARK = "SYNTHETIC DATA"
QUICK_MARK = "QUICK RUN"


def _sweep_config(sweep) -> dict:
    config = (sweep or {}).get("config") if isinstance(sweep, dict) else None
    return config if isinstance(config, dict) else {}


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


# ------------------------------------------------------------------ the machine
def machine_cores(sweep):
    """The core count the sweep recorded for its machine (``machine.cores``), or None."""
    machine = (sweep or {}).get("machine") if isinstance(sweep, dict) else None
    for key in ("cores", "cpus", "cpu_count"):
        value = (machine or {}).get(key) if isinstance(machine, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def _threads(sweep) -> int:
    """Threads per worker: the sweep config's ``threads``, else the most any run used, else 1."""
    value = _sweep_config(sweep).get("threads")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    runs = (sweep or {}).get("runs") if isinstance(sweep, dict) else None
    used = [r.get("threads") for r in runs or () if isinstance(r, dict)]
    return max((t for t in used if isinstance(t, int) and not isinstance(t, bool) and t >= 1),
               default=1)


def _oversubscribed(workers: int, sweep) -> bool:
    """More workers x threads than the machine's cores: they time-share them (the command
    line leaves such runs out of the model fit for the same reason)."""
    cores = machine_cores(sweep)
    return cores is not None and workers * _threads(sweep) > cores


def _oversubscribed_text(sweep) -> str:
    """Oversubscribed, explained: 'Oversubscribed: workers > 2 cores, ...'."""
    cores, threads = machine_cores(sweep), _threads(sweep)
    per = f" × {threads} threads" if threads > 1 else ""
    return (f"Oversubscribed: workers{per} > {cores} cores; the workers time-share the cores "
            f"(these runs are left out of the performance-model fit).")


def _above_cores_text(cores: int) -> str:
    """Why a speedup can exceed the core count (the figure's note under the plot)."""
    return (f"Circled red, speedup > {cores} cores: more than {cores} cores can give "
            f"CPU-bound work, so either superlinear (cache effects: each worker's shard fits "
            f"in cache) or a noisy baseline (a slow 1-worker run). See the min–max bars; "
            f"repeat the sweep to tell them apart.")


def _above_cores_short(cores: int) -> str:
    return textwrap.fill(f"speedup > {cores} cores (circled): superlinear (cache effects) or "
                         f"a noisy baseline; see the note below", 38)


def _red_title(legend) -> None:
    legend.get_title().set_color("#b22222")
    legend.get_title().set_multialignment("left")
    legend.get_frame().set_edgecolor("#b22222")


def _above_cores_note(ax, cores: int) -> None:
    """A short red note on ``ax`` where it hides the least data (a legend with a title only,
    placed 'best'; added as an artist, so the axes' own legend stays ``ax.get_legend()``)."""
    from matplotlib.legend import Legend
    note = Legend(ax, [], [], title=_above_cores_short(cores), loc="best", title_fontsize=8,
                  framealpha=0.92)
    _red_title(note)
    note.set_zorder(6)
    ax.add_artist(note)


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


def _series(rows, dims) -> dict:
    """Rows grouped by the values of ``dims``: {key tuple: rows sorted by (n_samples, workers)}."""
    groups: dict = {}
    for row in rows:
        groups.setdefault(tuple(row.get(d) for d in dims), []).append(row)
    for key in groups:
        groups[key].sort(key=lambda r: (r.get("n_samples") or 0, r["workers"]))
    return dict(sorted(groups.items(), key=lambda kv: tuple(map(_order, kv[0]))))


def _order(value):
    """A sort key for mixed values: numbers by value, then everything else by its text."""
    return (0, value, "") if _is_number(value) else (1, 0, str(value))


def _series_label(dims, key) -> str:
    return ", ".join(_dim_text(d, v) for d, v in zip(dims, key))


def _workers_text(p: int) -> str:
    return f"{p} worker{'s' if p != 1 else ''}"


def _tick_text(v: float) -> str:
    """A tick label without float noise: at most 3 significant digits (0.00390625 ->
    '0.00391'), thousands written out (1500 -> '1,500')."""
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _tick_formatter():
    from matplotlib.ticker import FuncFormatter
    return FuncFormatter(lambda v, _: _tick_text(v))


def _seconds_axis(axis, top: float) -> str:
    """Tick labels of a time axis whose data are seconds: milliseconds where the axis ends
    below 0.1 s (0.0175 s reads '17.5'), else seconds. Returns the unit for the label."""
    from matplotlib.ticker import FuncFormatter
    scale, unit = (1000.0, "ms") if top < 0.1 else (1.0, "s")
    axis.set_major_formatter(FuncFormatter(lambda v, _: _tick_text(scale * v)))
    return unit


def _colors(n: int, cmap: str = "viridis", lo: float = 0.1, hi: float = 0.8) -> list:
    mpl = _matplotlib()
    cm = mpl.colormaps[cmap]
    if n == 1:
        return [cm((lo + hi) / 2)]
    return [cm(lo + (hi - lo) * i / (n - 1)) for i in range(n)]


def _worker_colors(workers) -> dict:
    """One color per worker count, the same in every figure of a sweep; 1 worker is grey."""
    many = sorted(w for w in set(workers) if w != 1)
    colors = dict(zip(many, _colors(len(many), "viridis", 0.15, 0.8))) if many else {}
    colors[1] = BASELINE_COLOR
    return colors


_LINESTYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P")


# ------------------------------------------------------------------ 1. speedup vs workers
def plot_speedup(sweep, *, table: bool = True):
    """Speedup T1/Tp vs workers: one line per data-set size (and backend, all-reduce, ...)."""
    rows, sweep = _summary(sweep)
    rows = [r for r in rows if _stat(r, "speedup") is not None]
    workers = sorted({r["workers"] for r in rows})
    if len(workers) < 2:
        raise NotEnoughData(f"speedup vs workers needs at least two worker counts with a "
                            f"speedup; the sweep has {workers or 'none'}")
    dims = _varying(rows)
    groups = _series(rows, dims)
    colors = _colors(len(groups), "plasma", 0.05, 0.75) if len(groups) > 1 else ["#1f77b4"]
    cores = machine_cores(sweep)
    over = [p for p in workers if _oversubscribed(p, sweep)]
    above = _above_cores(rows, cores)
    with _style():
        # beside the plot: the table on top, the legend under it (clear of the lines)
        n_legend = (len(groups) + 2 + any(_is_number(r.get("ceiling_speedup")) for r in rows)
                    + bool(over) + bool(over or above) + bool(above))
        table_in, legend_in = 0.22 * (len(rows) + 1) + 0.5, 0.22 * n_legend + 0.3
        if table:
            fig = _figure(12.5, max(5.0, table_in + legend_in + 1.3))
            grid = fig.add_gridspec(2, 2, width_ratios=(1.2, 1),
                                    height_ratios=(table_in, legend_in))
            ax = fig.add_subplot(grid[:, 0])
            tab_ax, legend_ax = fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 1])
        else:
            fig = _figure(7.5, 5.0 + (0.22 * n_legend if n_legend > 4 else 0))
            ax, tab_ax, legend_ax = fig.subplots(), None, None
        top = max(workers)
        ax.plot([1, top], [1, top], "--", color="black", lw=1.2, label="ideal (speedup = workers)",
                zorder=1)
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        handles = [ax.get_lines()[0]]
        shaded = list(groups)[-1]            # the largest data set (the last series) is shaded
        any_ceiling = False
        for (key, grp), color, marker in zip(groups.items(), colors, _MARKERS * 8):
            name = _series_label(dims, key)
            p = [r["workers"] for r in grp]
            med, lo, hi = zip(*(_stat(r, "speedup") for r in grp))
            yerr = [[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]]
            bars = ax.errorbar(p, med, yerr=yerr, color=color, marker=marker, ms=6, lw=2,
                               capsize=4, label=f"measured{', ' + name if name else ''}",
                               zorder=3)
            handles.append(bars)
            if key == shaded:
                ax.fill_between(p, med, p, where=[m <= q for m, q in zip(med, p)],
                                color=color, alpha=0.15, lw=0, interpolate=True, zorder=0)
                handles.append(Patch(color=color, alpha=0.15, lw=0, label=(
                    "efficiency loss (ideal − measured)" + (f", {name}" if name else ""))))
            ceil = [(r["workers"], r["ceiling_speedup"]) for r in grp
                    if _is_number(r.get("ceiling_speedup"))]
            if ceil:
                any_ceiling = True
                if 1 in p and all(q != 1 for q, _ in ceil):
                    ceil.insert(0, (1, 1.0))       # one worker is its own ceiling
                cx, cy = zip(*sorted(ceil))
                ax.plot(cx, cy, ":", color=color, marker="v", ms=6, lw=1.8, zorder=2,
                        label=f"contention ceiling{', ' + name if name else ''}")
        if any_ceiling:
            handles.append(Line2D([], [], ls=":", marker="v", color="#555555", lw=1.8,
                                  label="contention ceiling" + (" (dotted, same color)"
                                                                if len(groups) > 1 else "")))
        highest = max([top] + [_stat(r, "speedup")[2] for r in rows]
                      + [r["ceiling_speedup"] for r in rows
                         if _is_number(r.get("ceiling_speedup"))])
        ax.set_xticks(workers)
        ax.set_xlim(0.8, top * 1.05)
        ax.set_ylim(0, highest * 1.08)
        handles += _mark_cores(ax, sweep, over, above, workers, top * 1.05)
        ax.set_xlabel("workers p")
        ax.set_ylabel("speedup T(1 worker) / T(p workers)  [×]")
        ctx = _context(rows, sweep=sweep)
        _titles(fig, "Speedup vs workers", ctx)
        if legend_ax is not None:
            legend_ax.axis("off")
            legend_ax.legend(handles=handles, loc="upper center", fontsize=9)
        elif len(handles) <= 4:     # below the ideal line, right: empty in a speedup plot
            ax.legend(handles=handles, loc="lower right")
        else:
            ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12))
        if tab_ax is not None:
            _speedup_table(tab_ax, rows, dims, sweep)
        notes = [f"{_repeats_text(rows)}; error bars: min–max. Speedup against our own "
                 f"1-worker run of the same size in the same sweep."]
        if any(_is_number(r.get("ceiling_speedup")) for r in rows):
            notes.append("Contention ceiling: T1 / time of p uncoupled 1-worker runs started "
                         "together (what the hardware allows without communication).")
        if over:
            notes.append(f"Shaded grey. {_oversubscribed_text(sweep)}")
        if above:
            notes.append(_above_cores_text(cores))
        mach = _machine_text(sweep)
        if mach:
            notes.append(mach)
        _footnote(fig, "\n".join(notes))
    return fig


def _above_cores(rows, cores, *, ceiling: bool = True) -> list:
    """(workers, speedup) of every measured speedup (median, max over repeats, and the
    contention ceiling where ``ceiling``) above the machine's core count: more than the cores
    can give CPU-bound work."""
    if cores is None:
        return []
    out = []
    for r in rows:
        med, _, hi = _stat(r, "speedup")
        top = r.get("ceiling_speedup") if ceiling else None
        for value in (med, hi, top if _is_number(top) else None):
            if value is not None and value > cores:
                out.append((r["workers"], value))
    return sorted(set(out))


def _mark_cores(ax, sweep, over, above, workers, right) -> list:
    """Marks on a speedup axis: the oversubscribed worker counts shaded, the core count as a
    line, each speedup above it circled. Returns their legend handles."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    cores = machine_cores(sweep)
    handles = []
    if over:
        fitting = [p for p in workers if p not in over]
        left = (max(fitting) + min(over)) / 2 if fitting else ax.get_xlim()[0]
        ax.axvspan(left, right, color="#9a9a9a", alpha=0.18, lw=0, zorder=0)
        ax.annotate(f"oversubscribed\n(> {cores} cores)", ((left + right) / 2, 0.98),
                    xycoords=("data", "axes fraction"), ha="center", va="top", fontsize=8.5,
                    color="#444444")
        handles.append(Patch(color="#9a9a9a", alpha=0.18, lw=0,
                             label=f"oversubscribed: workers > {cores} cores"))
    if over or above:
        ax.axhline(cores, color="#b22222", ls=(0, (1, 2)), lw=1.3, zorder=1)
        handles.append(Line2D([], [], color="#b22222", ls=(0, (1, 2)), lw=1.3,
                              label=f"{cores} cores: the most CPU-bound work can gain"))
    if above:
        xs, ys = zip(*above)
        ax.scatter(xs, ys, s=260, facecolors="none", edgecolors="#b22222", lw=1.8, zorder=5)
        handles.append(Line2D([], [], ls="", marker="o", ms=12, mfc="none", mec="#b22222",
                              mew=1.8, label=f"speedup > {cores} cores (see note)"))
        _above_cores_note(ax, cores)
    return handles


def _speedup_table(ax, rows, dims, sweep=None) -> None:
    ax.axis("off")
    ax.grid(False)
    longest = max(_stat(r, "time")[0] for r in rows)
    unit, scale, fmt = ("ms", 1000.0, "{:.1f}") if longest < 10 else ("s", 1.0, "{:.2f}")
    header = (["configuration"] if dims else []) + ["workers", f"time [{unit}]", "speedup",
                                                    "efficiency"]
    has_ceiling = any(_is_number(r.get("ceiling_speedup")) for r in rows)
    if has_ceiling:
        header.append("ceiling")
    cores = machine_cores(sweep)
    has_note = any(_oversubscribed(r["workers"], sweep) for r in rows) or bool(
        _above_cores(rows, cores))
    if has_note:
        header.append("note")
    cells = []
    for key, grp in _series(rows, dims).items():
        for r in grp:
            t = _stat(r, "time")[0]
            s = _stat(r, "speedup")[0]
            e = _stat(r, "efficiency")
            line = ([_series_label(dims, key)] if dims else []) + [
                str(r["workers"]), fmt.format(scale * t), f"{s:.2f}×",
                f"{100 * e[0]:.0f} %" if e else "–"]
            if has_ceiling:
                c = r.get("ceiling_speedup")
                line.append(f"{c:.2f}×" if _is_number(c) else "–")
            if has_note:
                flags = ["oversubscribed"] if _oversubscribed(r["workers"], sweep) else []
                if _above_cores([r], cores):
                    flags.append(f"speedup > {cores} cores")
                line.append(", ".join(flags) or "–")
            cells.append(line)
    tab = ax.table(cellText=cells, colLabels=header, loc="upper center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(9)
    tab.scale(1, 1.25)
    tab.auto_set_column_width(list(range(len(header))))
    for (r, _), cell in tab.get_celld().items():
        cell.set_edgecolor("#bbbbbb")
        if r == 0:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("#eeeeee")
    ax.set_title("medians per configuration")


# ------------------------------------------------------------------ 2./3. vs data-set size
def _per_size(sweep, key: str, what: str):
    rows, sweep = _summary(sweep)
    rows = [r for r in rows if _stat(r, key) is not None]
    sizes = sorted({r["n_samples"] for r in rows})
    if len(sizes) < 2:
        raise NotEnoughData(f"{what} vs data-set size needs at least two data-set sizes; "
                            f"the sweep has {sizes or 'none'}")
    return rows, sweep, sizes


def _size_lines(ax, rows, key, scale, include_one_worker, sweep=None):
    """One line per (worker count, other varying dims) of ``key`` vs n_samples; the label of
    an oversubscribed worker count says so."""
    variant_dims = [d for d in _varying(rows) if d != "n_samples"]
    wcolors = _worker_colors(r["workers"] for r in rows)
    variants = list(_series(rows, variant_dims))
    groups = _series(rows, ("workers", *variant_dims))
    for (p, *variant), grp in groups.items():
        if p == 1 and not include_one_worker:
            continue
        vi = variants.index(tuple(variant))
        n = [r["n_samples"] for r in grp]
        med, lo, hi = (list(v) for v in zip(*(_stat(r, key) for r in grp)))
        med, lo, hi = ([scale * x for x in v] for v in (med, lo, hi))
        yerr = [[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]]
        label = _workers_text(p) + (", " + _series_label(variant_dims, variant)
                                    if variant_dims else "")
        if _oversubscribed(p, sweep):
            label += " (oversubscribed)"
        ax.errorbar(n, med, yerr=yerr, color=wcolors[p], marker=_MARKERS[vi % 6],
                    ls=_LINESTYLES[vi % 4], lw=2, ms=6, capsize=3, label=label)


def _size_axis(ax, sizes):
    from matplotlib.ticker import NullFormatter
    ax.set_xscale("log")
    ax.set_xticks(sizes, [_fmt_n(n) for n in sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(sizes[0] / 1.25, sizes[-1] * 1.25)
    ax.set_xlabel("data-set size  [training samples, log scale]")


def plot_efficiency_vs_size(sweep):
    """Parallel efficiency Sp/p vs data-set size, one line per worker count > 1."""
    rows, sweep, sizes = _per_size(sweep, "efficiency", "efficiency")
    if not any(r["workers"] > 1 for r in rows):
        raise NotEnoughData("efficiency vs data-set size needs a worker count > 1; the sweep "
                            "has only 1-worker runs")
    with _style():
        fig = _figure(7.5, 5.0)
        ax = fig.subplots()
        ax.axhline(100, color="black", ls="--", lw=1.2, label="ideal (100 %)")
        _size_lines(ax, rows, "efficiency", 100.0, include_one_worker=False, sweep=sweep)
        _size_axis(ax, sizes)
        top = max(100.0, *(100 * _stat(r, "efficiency")[2] for r in rows if r["workers"] > 1))
        ax.set_ylim(0, top * 1.1)
        ax.set_ylabel("parallel efficiency  speedup / p  [%]")
        ctx = _context(rows, exclude=("n_samples",), sweep=sweep)
        _titles(fig, "Parallel efficiency vs data-set size", ctx)
        # a speedup above the core count, as an efficiency: circled, with the explanation
        cores = machine_cores(sweep)
        above = [r for r in rows
                 if r["workers"] > 1 and _above_cores([r], cores, ceiling=False)]
        if above:
            # the point whose median or max over repeats is above: at the larger of the two
            ax.scatter([r["n_samples"] for r in above],
                       [100 * (_stat(r, "efficiency")[0]
                               if _stat(r, "speedup")[0] > cores else _stat(r, "efficiency")[2])
                        for r in above], s=260, facecolors="none", edgecolors="#b22222",
                       lw=1.8, zorder=5, label=f"speedup > {cores} cores")
        legend = ax.legend(loc="best", title=_above_cores_short(cores) if above else None,
                           title_fontsize=8)
        if above:                    # the explanation heads the legend, clear of the data
            _red_title(legend)
        notes = [f"{_repeats_text(rows)}; error bars: min–max. Efficiency = (T1 / Tp) / p, T1 "
                 f"from the 1-worker run of the same size."]
        if any(_oversubscribed(r["workers"], sweep) for r in rows if r["workers"] > 1):
            notes.append(_oversubscribed_text(sweep))
        if above:
            notes.append(_above_cores_text(cores))
        _footnote(fig, "\n".join(filter(None, notes + [_machine_text(sweep)])))
    return fig


def plot_time_vs_size(sweep):
    """Training time vs data-set size, one line per worker count (log x)."""
    rows, sweep, sizes = _per_size(sweep, "time", "time")
    with _style():
        fig = _figure(7.5, 5.0)
        ax = fig.subplots()
        _size_lines(ax, rows, "time", 1.0, include_one_worker=True, sweep=sweep)
        _size_axis(ax, sizes)
        ax.set_ylim(0, None)
        unit = _seconds_axis(ax.yaxis, ax.get_ylim()[1])
        ax.set_ylabel(f"training time  [{unit}]")
        ctx = _context(rows, exclude=("n_samples",), sweep=sweep)
        _titles(fig, "Training time vs data-set size", ctx)
        ax.legend(loc="upper left")
        notes = [f"{_repeats_text(rows)}; error bars: min–max. Time: the training loop on rank "
                 f"0, between barriers (start-up and evaluation excluded)."]
        if any(_oversubscribed(r["workers"], sweep) for r in rows):
            notes.append(_oversubscribed_text(sweep))
        _footnote(fig, "\n".join(filter(None, notes + [_machine_text(sweep)])))
    return fig


# ------------------------------------------------------------------ 4. stacked breakdown
def plot_breakdown(sweep):
    """Stacked phases per configuration: seconds (top) and share of the time (bottom)."""
    rows, sweep = _summary(sweep)
    rows = [r for r in rows if r.get("phases")]
    if not rows:
        raise NotEnoughData("breakdown needs per-phase times; no summary row has 'phases'")
    dims = _varying(rows)
    ordered = [r for grp in _series(rows, [d for d in dims if d != "n_samples"]).values()
               for r in grp]
    # bars of one data-set size (and variant) side by side, a gap between groups
    x, pos = [], 0.0
    for i, r in enumerate(ordered):
        if i and tuple(r.get(d) for d in dims) != tuple(ordered[i - 1].get(d) for d in dims):
            pos += 0.6
        x.append(pos)
        pos += 1.0
    seconds = [_phase_seconds(r) for r in ordered]
    totals = [sum(s.values()) for s in seconds]
    with _style():
        fig = _figure(max(7.5, 0.62 * len(ordered) + 3.5), 7.5)
        ax, ax_pct = fig.subplots(2, 1, sharex=True, height_ratios=(1.6, 1))
        bottom = [0.0] * len(ordered)
        bottom_pct = [0.0] * len(ordered)
        for phase in PHASES:
            h = [s[phase] for s in seconds]
            pct = [100 * v / t if t > 0 else 0.0 for v, t in zip(h, totals)]
            ax.bar(x, h, bottom=bottom, width=0.8, color=PHASE_COLORS[phase],
                   label=PHASE_LABELS[phase], edgecolor="white", lw=0.5)
            ax_pct.bar(x, pct, bottom=bottom_pct, width=0.8, color=PHASE_COLORS[phase],
                       edgecolor="white", lw=0.5)
            bottom = [b + v for b, v in zip(bottom, h)]
            bottom_pct = [b + v for b, v in zip(bottom_pct, pct)]
        measured = [_stat(r, "time")[0] for r in ordered]
        ax.scatter(x, measured, marker="_", s=500, color="black", lw=2, zorder=4,
                   label="measured training time")
        for xi, t, m in zip(x, totals, measured):
            ax.annotate(_seconds_text(t), (xi, max(t, m)), textcoords="offset points",
                        xytext=(0, 4), ha="center", va="bottom", fontsize=7.5)
        ax.set_ylim(0, max(*totals, *measured) * 1.12)
        unit = _seconds_axis(ax.yaxis, ax.get_ylim()[1])
        ax.set_ylabel(f"time per run  [{unit}]\n(mean over ranks)")
        ax_pct.set_ylabel("share of the time  [%]")
        ax_pct.set_ylim(0, 100)
        ax_pct.set_xticks(x, [f"p={r['workers']}" for r in ordered])
        for a in (ax, ax_pct):
            a.grid(axis="x", visible=False)
        # one label per group of bars (same data-set size, backend, ...) under its p= ticks
        if dims:
            start = 0
            for i in range(1, len(ordered) + 1):
                if i == len(ordered) or tuple(ordered[i].get(d) for d in dims) != tuple(
                        ordered[start].get(d) for d in dims):
                    ax_pct.annotate("\n".join(_dim_text(d, ordered[start].get(d)) for d in dims),
                                    ((x[start] + x[i - 1]) / 2, 0),
                                    xycoords=("data", "axes fraction"), xytext=(0, -20),
                                    textcoords="offset points", ha="center", va="top",
                                    fontsize=9)
                    start = i
        ax_pct.set_xlabel("configuration (p = workers)", labelpad=8 + 14 * len(dims))
        ctx = _context(rows, sweep=sweep)
        _titles(fig, "Where the training time goes, per configuration", ctx)
        handles, names = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  title="phase (stacked)")
        _footnote(fig, "\n".join(filter(None, [
            f"{_repeats_text(rows)}. Phases summed over the steps of a run, mean over ranks; "
            f"the number on a bar is their sum, the black mark the measured training time. "
            f"sync wait = waiting for the slowest worker, communication = the transfer itself.",
            _machine_text(sweep)])))
    return fig


# ------------------------------------------------------------------ 5. baseline vs distributed
_BAR_METRICS = (("total", "total"), ("compute", "compute (fwd + bwd)"),
                ("communication", "communication"), ("sync_wait", "sync wait"))


def plot_baseline_vs_distributed(sweep, *, n_samples=None):
    """Grouped bars: total, compute, communication and sync-wait time, 1 worker vs p workers.

    One data-set size (default: the largest that has a 1-worker run and a p-worker run).
    """
    rows, sweep = _summary(sweep)
    sizes = sorted({r["n_samples"] for r in rows
                    if r["workers"] == 1} & {r["n_samples"] for r in rows if r["workers"] > 1})
    if not sizes:
        raise NotEnoughData("baseline vs distributed needs a 1-worker run and a p-worker run "
                            "of the same data-set size; the sweep has none")
    if n_samples is None:
        n_samples = sizes[-1]
    elif n_samples not in sizes:
        raise ValueError(f"n_samples={n_samples!r} has no 1-worker and p-worker pair in the "
                         f"sweep; sizes that do: {sizes}")
    rows = [r for r in rows if r["n_samples"] == n_samples]
    variant_dims = [d for d in _varying(rows) if d != "n_samples"]
    bars = [r for grp in _series(rows, ("workers", *variant_dims)).values() for r in grp]
    wcolors = _worker_colors(r["workers"] for r in bars)
    variants = list(_series(rows, variant_dims))
    hatches = ("", "//", "..", "xx")
    baselines = {tuple(r.get(d) for d in variant_dims): r for r in bars if r["workers"] == 1}
    ideal_drawn = False
    width = 0.8 / len(bars)
    with _style():
        fig = _figure(max(7.5, 1.1 * len(bars) + 5.5), 5.2)
        ax = fig.subplots()
        top = 0.0
        for i, r in enumerate(bars):
            ph = _phase_seconds(r)
            values = [_stat(r, "time")[0]] + [ph[m] for m, _ in _BAR_METRICS[1:]]
            top = max(top, *values)
            xs = [g + (i - (len(bars) - 1) / 2) * width for g in range(len(_BAR_METRICS))]
            variant = tuple(r.get(d) for d in variant_dims)
            label = _workers_text(r["workers"]) + (" (baseline)" if r["workers"] == 1 else
                                                   " (oversubscribed)"
                                                   if _oversubscribed(r["workers"], sweep) else "")
            if variant_dims:
                label += ", " + _series_label(variant_dims, variant)
            cont = ax.bar(xs, values, width=width * 0.95, color=wcolors[r["workers"]],
                          hatch=hatches[variants.index(variant) % 4], edgecolor="white",
                          label=label)
            base = baselines.get(variant)
            if r["workers"] > 1 and base is not None:
                # what perfect scaling would give: the 1-worker total and compute over p
                ideal = [_stat(base, "time")[0] / r["workers"],
                         _phase_seconds(base)["compute"] / r["workers"]]
                ax.hlines(ideal, [v - width * 0.45 for v in xs[:2]],
                          [v + width * 0.45 for v in xs[:2]], color="black", lw=2,
                          linestyles="--", zorder=4,
                          label="ideal: 1-worker time / p" if not ideal_drawn else None)
                ideal_drawn = True
            ax.bar_label(cont, labels=[_seconds_text(v) for v in values], fontsize=7.5,
                         padding=2, rotation=90 if len(bars) > 4 else 0)
        ax.set_xticks(range(len(_BAR_METRICS)), [name for _, name in _BAR_METRICS])
        ax.set_ylim(0, top * (1.3 if len(bars) > 4 else 1.15))
        unit = _seconds_axis(ax.yaxis, ax.get_ylim()[1])
        ax.set_ylabel(f"time per run  [{unit}]  (mean over ranks)")
        ax.grid(axis="x", visible=False)
        ctx = _context(rows, sweep=sweep)
        _titles(fig, "1 worker vs p workers: where the time goes", ctx)
        ax.legend(loc="upper right")
        _footnote(fig, "\n".join(filter(None, [
            f"{_repeats_text(rows)}. total = training-loop time on rank 0; the phases are summed "
            f"over steps, mean over ranks (each of p workers computes 1/p of every batch).",
            _machine_text(sweep)])))
    return fig


def _seconds_text(v: float) -> str:
    return f"{1000 * v:.3g} ms" if v < 1 else f"{v:.3g} s"


# ------------------------------------------------------------------ 6. per-rank timeline
def _trace_slices(trace) -> tuple[list, dict]:
    """([(row key, phase, start us, dur us, step)], {row key: name}) from a Chrome trace."""
    if isinstance(trace, dict):
        events = trace.get("traceEvents")
    else:
        events = trace
    if not isinstance(events, list):
        raise ValueError("trace must be a Chrome trace dict with a 'traceEvents' list (or "
                         f"that list); got {type(trace).__name__}")
    slices, names = [], {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise ValueError(f"trace event {i} is a {type(ev).__name__}, expected a dict")
        row = (ev.get("pid", 0), ev.get("tid", 0))
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[row] = str((ev.get("args") or {}).get("name", row))
            continue
        if ev.get("ph") != "X":
            continue
        name = ev.get("name")
        if name not in PHASES:
            if ev.get("cat", "phase") == "phase":
                raise ValueError(f"trace event {i} has unknown phase {name!r}; the phases "
                                 f"are {PHASES}")
            continue                      # other categories (e.g. markers) are not drawn
        ts, dur = ev.get("ts"), ev.get("dur")
        if not _is_number(ts) or not _is_number(dur) or dur < 0:
            raise ValueError(f"trace event {i} ({name}) has ts={ts!r}, dur={dur!r}; expected "
                             f"microseconds, dur >= 0")
        step = (ev.get("args") or {}).get("step")
        slices.append((row, name, float(ts), float(dur), step))
    if not slices:
        raise ValueError("trace has no phase slices (events with ph 'X' named after a phase)")
    return slices, names


def plot_timeline(trace, *, steps: int | None = 3, first_step: int | None = None,
                  title: str | None = None, sweep=None):
    """A few steps of a run, one row per rank, a colored slice per phase.

    ``steps`` consecutive steps from ``first_step`` (default: the second recorded step, the
    first one after warm-up, where there are enough) are drawn; ``steps=None`` draws the whole
    trace. Slices without a step number are drawn when they overlap the chosen steps.
    ``sweep``: the sweep the trace belongs to; its data set's name (and whether it was
    synthetic, or a quick run) goes into the subtitle.
    """
    slices, names = _trace_slices(trace)
    known = sorted({s[4] for s in slices if isinstance(s[4], int)})
    if steps is not None and known:
        if steps < 1:
            raise ValueError(f"steps is {steps}, expected >= 1 (or None for the whole trace)")
        if first_step is None:
            first_step = known[1] if len(known) > steps else known[0]
        if first_step not in known:
            raise ValueError(f"first_step={first_step} is not in the trace (steps "
                             f"{known[0]}..{known[-1]})")
        wanted = set(known[known.index(first_step):known.index(first_step) + steps])
        stepped = [s for s in slices if s[4] in wanted]
        t0 = min(s[2] for s in stepped)
        t1 = max(s[2] + s[3] for s in stepped)
        slices = stepped + [s for s in slices if not isinstance(s[4], int)
                            and s[2] < t1 and s[2] + s[3] > t0]
        shown = sorted(wanted)
    else:
        shown = known
    t0 = min(s[2] for s in slices)
    ranks = sorted({s[0] for s in slices}, key=lambda r: tuple(map(_order, r)))
    y_of = {r: i for i, r in enumerate(ranks)}
    one_process = len({pid for pid, _ in ranks}) == 1
    other = trace.get("otherData") if isinstance(trace, dict) else None
    other = dict(other) if isinstance(other, dict) else {}
    if sweep is not None:
        recorded = {r.get("dataset") for r in sweep.get("summary", ()) if isinstance(r, dict)}
        recorded.discard(None)
        if len(recorded) == 1:                 # the name as the sweep recorded it
            other["dataset"] = recorded.pop()
        elif not recorded and _sweep_config(sweep).get("dataset") is not None:
            other["dataset"] = _sweep_config(sweep)["dataset"]
    with _style():
        fig = _figure(11.0, max(2.8, 0.55 * len(ranks) + 2.2))
        ax = fig.subplots()
        for phase in PHASES:
            mine = [s for s in slices if s[1] == phase]
            ax.barh([y_of[s[0]] for s in mine], [s[3] / 1000 for s in mine],
                    left=[(s[2] - t0) / 1000 for s in mine], height=0.7,
                    color=PHASE_COLORS[phase], label=PHASE_LABELS[phase], lw=0)
        # step boundaries: where each shown step starts (earliest slice over ranks)
        if shown and len(shown) <= 20:
            for step in shown:
                start = min((s[2] for s in slices if s[4] == step), default=None)
                if start is None:
                    continue
                x = (start - t0) / 1000
                ax.axvline(x, color="black", lw=0.8, ls=":", zorder=0)
                ax.annotate(f"step {step}", (x, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(2, 2), textcoords="offset points", fontsize=8,
                            va="bottom")
        ax.set_yticks(range(len(ranks)), [
            names.get(r, f"rank {r[1]}" if one_process else f"pid {r[0]}, tid {r[1]}")
            for r in ranks])
        ax.set_ylim(len(ranks) - 0.5, -0.5)          # rank 0 on top
        ax.set_xlim(0, None)
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("time since the first drawn slice  [ms]")
        ax.set_ylabel("worker")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase")
        what = (f"steps {shown[0]}–{shown[-1]}" if len(shown) > 1 else
                f"step {shown[0]}" if shown else "whole trace")
        _titles(fig, title or f"Per-rank timeline of {what}: what each worker does when",
                _run_text(other, sweep))
        _footnote(fig, "Slices from the run's merged Chrome trace (open the JSON in Perfetto "
                       "or chrome://tracing to see every step). sync wait = waiting for the "
                       "slowest worker to arrive; communication = the transfer itself.")
    return fig


def _run_text(config, sweep=None) -> str:
    """One run's configuration (a trace's otherData) for a subtitle, with ``_data_marks``."""
    config = config if isinstance(config, dict) else {}
    parts = []
    if config.get("model") or config.get("dataset"):
        parts.append(" on ".join(_dataset_text(config[k]) if k == "dataset" else str(config[k])
                                 for k in ("model", "dataset") if config.get(k)))
    if config.get("workers"):
        over = isinstance(config["workers"], int) and _oversubscribed(config["workers"], sweep)
        parts.append(_workers_text(config["workers"])
                     + (f" (oversubscribed: > {machine_cores(sweep)} cores)" if over else ""))
    for d in ("backend", "allreduce", "n_samples"):
        if config.get(d) is not None:
            parts.append(_dim_text(d, config[d]))
    marks = _data_marks(sweep, [config],
                        synthetic_named=_is_synthetic_name(config.get("dataset")))
    return " · ".join(parts + marks)


# ------------------------------------------------------------------ 7. performance model
def _check_rows(rows, keys, what: str) -> list:
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError(f"{what} rows are empty: nothing to plot")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{what} row {i} is a {type(row).__name__}, expected a dict")
        missing = [k for k in keys if k not in row]
        if missing:
            raise ValueError(f"{what} row {i} has no {missing} (expected keys {list(keys)})")
    return list(rows)


def _validation_rows(validation) -> list:
    """The rows of a validation given as perfmodel's dict (``Validation.to_dict()``) or as
    the rows themselves."""
    if isinstance(validation, dict):
        return validation.get("rows")
    return validation


def model_verdict(validation) -> dict:
    """``perfmodel.validation_verdict`` of a validation: perfmodel's dict
    (``Validation.to_dict()``, which carries the target and the number of fitted
    parameters), bare rows (``{workers, n_samples, measured, predicted}``, the rows with
    ``held_out: false`` not counted), or None (no validation given: not validated)."""
    from .perfmodel import TARGET_ERROR_PCT, validation_verdict
    if validation is None:
        return {"validated": False, "problems": ["no held-out validation given"],
                "text": "NOT VALIDATED: no held-out validation given"}
    doc = validation if isinstance(validation, dict) else {"rows": validation}
    rows = [r for r in doc.get("rows") or () if isinstance(r, dict)]
    held = [r for r in rows if r.get("held_out", True) is not False]
    if not held:
        return {"validated": False, "problems": ["no held-out points"],
                "text": "NOT VALIDATED: no held-out points (every configuration was in "
                        "the fit)"}
    err = doc.get("max_abs_error_pct")
    if not _is_number(err):
        err = max(100 * abs(r["predicted"] / r["measured"] - 1) for r in held)
    target = doc.get("target_pct") if _is_number(doc.get("target_pct")) else TARGET_ERROR_PCT
    n_params = doc.get("n_fitted_parameters")
    if n_params is None and isinstance(doc.get("fit"), dict):
        n_params = doc["fit"].get("n_fitted_parameters")
    n_points = doc.get("n_points") if isinstance(doc.get("n_points"), int) else len(held)
    return validation_verdict(err, target, n_points, n_params)


_ILLUSTRATION = "projection shown for illustration only"
_NOT_VALIDATED_RED = "#b22222"


def _verdict_box(ax, verdict, x, y, ha, va, width=52, extra="") -> None:
    """The verdict in a box on ``ax`` (axes fraction): red when not validated."""
    color = "#2a6e2a" if verdict["validated"] else _NOT_VALIDATED_RED
    text = "\n".join(_wrap(verdict["text"], width)) + (f"\n{extra}" if extra else "")
    ax.text(x, y, text, transform=ax.transAxes, ha=ha, va=va, fontsize=8.5, color=color,
            fontweight="normal" if verdict["validated"] else "bold", zorder=6,
            bbox=dict(fc="white", ec=color, lw=1.5 if not verdict["validated"] else 1,
                      alpha=0.95))


def plot_model_validation(validation, *, context: str = ""):
    """Predicted vs measured training time, the y = x line and the ±15 % band, and whether
    the check validates the model (``model_verdict``), in the title and in a box.

    ``validation``: perfmodel's validation dict (``Validation.to_dict()``, which also knows
    the number of fitted parameters) or its rows ``{workers, n_samples, measured,
    predicted}`` (seconds); an optional boolean ``held_out`` marks configurations left out of
    the fit (filled markers).
    """
    rows = _check_rows(_validation_rows(validation),
                       ("workers", "n_samples", "measured", "predicted"), "model validation")
    for i, r in enumerate(rows):
        for k in ("measured", "predicted"):
            if not _is_number(r[k]) or r[k] <= 0:
                raise ValueError(f"model validation row {i}.{k} is {r[k]!r}, expected seconds "
                                 f"> 0")
    verdict = model_verdict(validation)
    wcolors = _worker_colors(r["workers"] for r in rows)
    sizes = sorted({r["n_samples"] for r in rows})
    lo = min(min(r["measured"], r["predicted"]) for r in rows) / 1.4
    hi = max(max(r["measured"], r["predicted"]) for r in rows) * 1.4
    errors = [abs(r["predicted"] / r["measured"] - 1) for r in rows]
    within = sum(e <= TOLERANCE_BAND + 1e-12 for e in errors)
    has_split = any("held_out" in r for r in rows)
    with _style():
        fig = _figure(7.0, 6.8)
        ax = fig.subplots()
        line = [lo, hi]
        ax.fill_between(line, [v * (1 - TOLERANCE_BAND) for v in line],
                        [v * (1 + TOLERANCE_BAND) for v in line], color="#2ca02c", alpha=0.15,
                        lw=0, label=f"±{TOLERANCE_BAND:.0%} of measured")
        ax.plot(line, line, "-", color="black", lw=1, label="predicted = measured")
        for p in sorted(wcolors):
            for held in ((True, False) if has_split else (None,)):
                pts = [r for r in rows if r["workers"] == p
                       and (held is None or bool(r.get("held_out")) == held)]
                if not pts:
                    continue
                label = _workers_text(p) + ("" if held is None else
                                            ", held out" if held else ", in the fit")
                ax.scatter([r["measured"] for r in pts], [r["predicted"] for r in pts],
                           s=[30 + 50 * sizes.index(r["n_samples"]) / max(1, len(sizes) - 1)
                              for r in pts],
                           color=wcolors[p] if held is not False else "none",
                           edgecolors=wcolors[p], lw=1.5, zorder=3, label=label)
        from matplotlib.ticker import LogLocator, NullFormatter
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(_tick_formatter())
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.set_xlabel("measured training time  [s, log scale]")
        ax.set_ylabel("predicted training time  [s, log scale]")
        title = "Performance model: predicted vs measured training time"
        _titles(fig, title + ("" if verdict["validated"] else " (NOT VALIDATED)"), context)
        ax.legend(loc="upper left")
        ax.text(0.98, 0.03, f"{within} of {len(rows)} within ±{TOLERANCE_BAND:.0%}\n"
                f"median |error| {100 * sorted(errors)[len(errors) // 2]:.1f} %, "
                f"max {100 * max(errors):.1f} %", transform=ax.transAxes, ha="right",
                va="bottom", fontsize=9, bbox=dict(fc="white", ec="#bbbbbb", alpha=0.9))
        _verdict_box(ax, verdict, 0.98, 0.17, "right", "bottom", width=44)
        size_text = (f"Marker size grows with the data-set size ({_fmt_n(sizes[0])} to "
                     f"{_fmt_n(sizes[-1])} samples)." if len(sizes) > 1 else
                     f"Every point: {_fmt_n(sizes[0])} samples.")
        _footnote(fig, f"{size_text} Model: T_p = T_comp / p + T_comm(p) + T_sync(p), fitted "
                       f"to the sweep. Model check: {verdict['text']}.")
    return fig


def plot_projection(rows, *, context: str = "", validation=None):
    """Projected speedup (and efficiency) vs workers up to large clusters, log2 axes.

    ``rows``: ``{network, algorithm, workers, speedup, efficiency}``; one line per
    (network, algorithm): color per network, line style per algorithm. ``validation``: the
    model's held-out check (perfmodel's validation dict, or its rows; see ``model_verdict``).
    A projection whose model is not validated (or that comes without a validation) is drawn
    with "NOT VALIDATED ... for illustration only" in its title and in a red box.
    """
    rows = _check_rows(rows, ("network", "algorithm", "workers", "speedup", "efficiency"),
                       "projection")
    for i, r in enumerate(rows):
        for k in ("workers", "speedup", "efficiency"):
            if not _is_number(r[k]) or r[k] <= 0:
                raise ValueError(f"projection row {i}.{k} is {r[k]!r}, expected a number > 0")
    verdict = model_verdict(validation)
    networks = list(dict.fromkeys(str(r["network"]) for r in rows))
    algorithms = list(dict.fromkeys(str(r["algorithm"]) for r in rows))
    palette = _matplotlib().colormaps["Dark2"].colors     # not the phase colors
    ncolors = {net: palette[i % len(palette)] for i, net in enumerate(networks)}
    top = max(r["workers"] for r in rows)
    with _style():
        fig = _figure(13.5, 5.6)
        ax, ax_eff = fig.subplots(1, 2)
        ideal = [2 ** k for k in range(int(math.log2(top)) + 1)]
        if ideal[-1] < top:
            ideal.append(top)
        ax.plot(ideal, ideal, "--", color="black", lw=1.2, label="ideal (speedup = workers)")
        ax_eff.axhline(100, color="black", ls="--", lw=1.2)
        for net in networks:
            for ai, alg in enumerate(algorithms):
                pts = sorted((r for r in rows if str(r["network"]) == net
                              and str(r["algorithm"]) == alg), key=lambda r: r["workers"])
                if not pts:
                    continue
                style = dict(color=ncolors[net], ls=_LINESTYLES[ai % 4],
                             marker=_MARKERS[ai % 6], ms=4, lw=1.8)
                ax.plot([r["workers"] for r in pts], [r["speedup"] for r in pts],
                        label=f"{net}, {alg}", **style)
                ax_eff.plot([r["workers"] for r in pts], [100 * r["efficiency"] for r in pts],
                            **style)
        for a in (ax, ax_eff):
            a.set_xscale("log", base=2)
            a.set_xticks(ideal, [str(v) for v in ideal])
            a.set_xlabel("workers p  [log2 scale]")
        ax.set_yscale("log", base=2)
        low = min(1.0, min(r["speedup"] for r in rows))
        powers = list(range(math.floor(math.log2(low)), len(ideal)))
        stride = 1 if len(powers) <= 12 else 2            # at most ~12 labels; 1 is always one
        yticks = [2.0 ** k for k in powers if k % stride == 0]
        ax.set_yticks(yticks, [_tick_text(v) for v in yticks])
        from matplotlib.ticker import NullFormatter
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(low / 1.3, ideal[-1] * 1.3)
        ax.set_ylabel("predicted speedup  [×, log2 scale]")
        ax_eff.set_ylabel("predicted parallel efficiency  [%]")
        ax_eff.set_ylim(0, 105)
        title = ("Performance model: projected scaling to large clusters"
                 if verdict["validated"] else
                 "Performance-model projection: NOT VALIDATED, for illustration only")
        _titles(fig, title, context)
        ax.set_title("speedup")
        ax_eff.set_title("parallel efficiency (speedup / p)")
        if not verdict["validated"]:
            # upper left: above the ideal line, where no projection can go
            _verdict_box(ax, verdict, 0.02, 0.98, "left", "top", width=48,
                         extra=_ILLUSTRATION)
            ax_eff.text(0.5, 0.5, "NOT VALIDATED", transform=ax_eff.transAxes, ha="center",
                        va="center", rotation=25, fontsize=30, color=_NOT_VALIDATED_RED,
                        alpha=0.18, fontweight="bold", zorder=0)
        fig.legend(handles=ax.get_lines(), loc="outside right upper",
                   title="network, all-reduce\nalgorithm")
        _footnote(fig, "Projection of the performance model fitted to the measured sweep: "
                       "compute time from the sweep, communication from an alpha-beta model "
                       f"of each algorithm on the named network. Model check: "
                       f"{verdict['text']}"
                       + ("." if verdict["validated"] else f"; {_ILLUSTRATION}."))
    return fig


# ------------------------------------------------------------------ a whole sweep
# no dates or versions in the files
_METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None},
             "pdf": {"CreationDate": None, "Producer": None, "Creator": None}}


def save_figure(fig, path) -> Path:
    """Write ``fig`` to ``path`` (PNG, SVG or PDF by its suffix) in the house style."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in _METADATA:
        raise ValueError(f"path {str(path)!r} has suffix {path.suffix!r}, expected .png, .svg "
                         f"or .pdf")
    with _style():          # the SVG font setting is read when the file is written
        fig.savefig(path, dpi=130, metadata=_METADATA[fmt])
    return path


def load_trace(path) -> dict:
    """A Chrome trace-event JSON file as a dict (a bare event list is wrapped)."""
    path = Path(path)
    try:
        trace = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"trace {path} is not valid JSON: {exc}") from None
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    return trace


def _pick_trace(sweep_dir: Path):
    """The trace with the most ranks (then the first by name) in sweep_dir/traces, or None."""
    best = None
    for path in sorted((sweep_dir / "traces").glob("*.json")):
        trace = load_trace(path)
        ranks = {(e.get("pid", 0), e.get("tid", 0)) for e in trace.get("traceEvents", [])
                 if isinstance(e, dict) and e.get("ph") == "X"}
        if best is None or len(ranks) > best[0]:
            best = (len(ranks), trace)
    return best[1] if best else None


def plot_sweep(sweep_dir_or_dict, out_dir, formats=("png", "svg"), *, trace=None,
               validation=None, projection=None, report=None) -> list:
    """Write every figure the data allows to ``out_dir``; return the files written.

    ``trace``: a trace dict or file (default: the trace with the most ranks in the sweep
    directory's ``traces/``, if any). ``validation`` / ``projection``: the performance model's
    validation (perfmodel's dict, or its rows) and projection rows, drawn when given; the
    projection carries the validation's verdict (``model_verdict``). A figure the data does
    not allow (one worker count, one data-set size, no trace) is skipped, and ``report``
    (e.g. ``print``) is told why.
    """
    _matplotlib()
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    bad = [f for f in formats if f not in ("png", "svg", "pdf")]
    if not formats or bad:
        raise ValueError(f"formats is {formats!r}, expected some of 'png', 'svg', 'pdf'")
    sweep = load_sweep(sweep_dir_or_dict)
    if trace is None and isinstance(sweep_dir_or_dict, (str, Path)):
        root = Path(sweep_dir_or_dict)
        trace = _pick_trace(root if root.is_dir() else root.parent)
    elif isinstance(trace, (str, Path)):
        trace = load_trace(trace)
    context = _context(sweep["summary"], sweep=sweep)
    makers = {
        "speedup": lambda: plot_speedup(sweep),
        "efficiency_vs_size": lambda: plot_efficiency_vs_size(sweep),
        "time_vs_size": lambda: plot_time_vs_size(sweep),
        "breakdown": lambda: plot_breakdown(sweep),
        "baseline_vs_distributed": lambda: plot_baseline_vs_distributed(sweep),
        "timeline": (lambda: plot_timeline(trace, sweep=sweep)) if trace is not None else None,
        "model_validation": ((lambda: plot_model_validation(validation, context=context))
                             if validation is not None else None),
        "model_projection": ((lambda: plot_projection(
            projection, validation=validation,
            context=_context(sweep["summary"], exclude=("backend", "allreduce"), sweep=sweep)))
                             if projection is not None else None),
    }
    absent = {"timeline": "no trace given, and no traces/*.json in the sweep directory",
              "model_validation": "no performance-model validation rows given",
              "model_projection": "no performance-model projection rows given"}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in FIGURE_NAMES:
        make = makers[name]
        if make is None:
            if report:
                report(f"skipped {name}: {absent[name]}")
            continue
        try:
            fig = make()
        except NotEnoughData as exc:
            if report:
                report(f"skipped {name}: {exc}")
            continue
        for fmt in formats:
            path = out / f"{name}.{fmt}"
            save_figure(fig, path)
            written.append(path)
    return written


# ------------------------------------------------------------------ the command line
def main_plot(args) -> int:
    """``python -m dptrain plot SWEEP_DIR --out DIR``: args from dptrain.cli's ``plot`` parser."""
    quiet = getattr(args, "quiet", False)
    say = (lambda msg: None) if quiet else print
    try:
        sweep = load_sweep(args.sweep)
        say(f"sweep: {_context(sweep['summary'], sweep=sweep)}")
        validation = _read_model_file(getattr(args, "validation", None), "--validation",
                                      "validation")
        projection = _read_model_file(getattr(args, "projection", None), "--projection",
                                      "projection")
        if validation is None and projection is None and not getattr(args, "no_model", False):
            validation, projection = _fit_model(args.sweep, args.out, say)
        if validation is not None or projection is not None:
            verdict = model_verdict(validation)
            say(f"performance model: {verdict['text']}"
                + (f"; {_ILLUSTRATION} (marked so on the figure)"
                   if projection is not None and not verdict["validated"] else ""))
        files = plot_sweep(args.sweep, args.out, formats=tuple(args.formats),
                           trace=getattr(args, "trace", None), validation=validation,
                           projection=projection, report=say)
    except (ImportError, ValueError, OSError) as exc:      # no matplotlib, bad or no data
        print(f"dptrain: error: {exc}", file=sys.stderr)
        return 1
    for path in files:
        say(f"wrote {path}")
    return 0


def _fit_model(sweep, out_dir, say):
    """The performance model's validation (perfmodel's dict) and projection rows for a sweep
    directory (also written to out_dir/model.json), or (None, None) with the reason told when
    the sweep cannot be fitted. The projection adds the hierarchical all-reduce on nodes of
    as many ranks as the sweep's machine has cores. With a single worker count above 1 the
    transport's latency cannot be told from its bandwidth: the shared-memory preset's alpha
    is then used, and said so."""
    from . import perfmodel
    try:
        runs = perfmodel.load_runs(sweep)
    except ValueError as exc:
        say(f"no performance model: {exc}")
        return None, None
    # runs with more workers x threads than the sweep machine's cores time-share the cores:
    # the model has no term for that (see dptrain.perfmodel), so they are left out of the fit
    cores = machine_cores(load_sweep(sweep))
    if cores:
        fitting = [r for r in runs if r["workers"] * r.get("threads", 1) <= cores]
        if len(fitting) < len(runs):
            say(f"performance model: {len(runs) - len(fitting)} run(s) with more workers x "
                f"threads than the {cores} cores left out of the fit (oversubscribed)")
            runs = fitting
    # the hierarchical all-reduce projected on nodes like the sweep's machine (its cores)
    per_node = cores if cores and cores > 1 else None
    try:
        analysis = perfmodel.analyze(runs, ranks_per_node=per_node)
    except ValueError:
        alpha = perfmodel.NETWORKS["shared memory"].alpha
        try:
            analysis = perfmodel.analyze(runs, alpha=alpha, ranks_per_node=per_node)
        except ValueError as exc:
            say(f"no performance model: {exc}")
            return None, None
        say(f"performance model: alpha fixed at the shared-memory preset ({alpha:.2g} s): "
            f"the sweep has too few worker counts to fit it")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.json").write_text(json.dumps(analysis, indent=1) + "\n")
    say(f"performance model: wrote {out / 'model.json'}")
    return analysis.get("validation"), analysis["projection"]


def _read_model_file(path, option: str, key: str):
    """A JSON list of rows, or a dict: perfmodel's ``key`` entry of a model.json, or (for
    the validation) perfmodel's validation dict with its 'rows'."""
    if path is None:
        return None
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option} {path} is not valid JSON: {exc}") from None
    if isinstance(doc, dict) and key in doc:            # a model.json written by plot
        doc = doc[key]
    if key == "validation" and isinstance(doc, dict) and isinstance(doc.get("rows"), list):
        return doc
    if not isinstance(doc, list):
        raise ValueError(f"{option} {path} holds a {type(doc).__name__}, expected a JSON "
                         f"list of rows (or the model.json that plot writes)")
    return doc
