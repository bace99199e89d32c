"""Writing figures: one (``save_figure``), or every figure a sweep allows (``plot_sweep``)."""

from __future__ import annotations

from pathlib import Path

from ..._files import write_atomically
from .labels import _context
from .load import NotEnoughData, _pick_trace, load_sweep, load_trace
from .performance import plot_model_validation, plot_projection
from .phases import plot_baseline_vs_distributed, plot_breakdown
from .scaling import plot_efficiency_vs_size, plot_speedup, plot_time_vs_size
from .style import _matplotlib, _style
from .timeline import plot_timeline

FIGURE_NAMES = (
    "speedup",
    "efficiency_vs_size",
    "time_vs_size",
    "breakdown",
    "baseline_vs_distributed",
    "timeline",
    "model_validation",
    "model_projection",
)


# no dates or versions in the files
_METADATA = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "Producer": None, "Creator": None},
}


def save_figure(fig, path) -> Path:
    """Write ``fig`` to ``path`` (PNG, SVG or PDF by its suffix) in the house style."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in _METADATA:
        raise ValueError(
            f"path {str(path)!r} has suffix {path.suffix!r}, expected .png, .svg or .pdf"
        )
    with _style():  # the SVG font setting is read when the file is written
        write_atomically(
            path, lambda f: fig.savefig(f, format=fmt, dpi=130, metadata=_METADATA[fmt])
        )
    return path


def plot_sweep(
    sweep_dir_or_dict,
    out_dir,
    formats=("png", "svg"),
    *,
    trace=None,
    validation=None,
    projection=None,
    report=None,
) -> list:
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
        "model_validation": (
            (lambda: plot_model_validation(validation, context=context))
            if validation is not None
            else None
        ),
        "model_projection": (
            (
                lambda: plot_projection(
                    projection,
                    validation=validation,
                    context=_context(
                        sweep["summary"], exclude=("backend", "allreduce"), sweep=sweep
                    ),
                )
            )
            if projection is not None
            else None
        ),
    }
    absent = {
        "timeline": "no trace given, and no traces/*.json in the sweep directory",
        "model_validation": "no performance-model validation rows given",
        "model_projection": "no performance-model projection rows given",
    }
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
