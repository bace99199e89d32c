"""The figures' house style: matplotlib imported lazily, the rc settings, a figure made
without pyplot, titles and footnotes wrapped to its width, one color per phase and per
worker count, tick labels without float noise.

Nothing here knows what a sweep is: the figure modules pass it numbers and text.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from contextlib import contextmanager

PHASE_LABELS = {
    "data": "data",
    "compute": "compute (fwd + bwd)",
    "communication": "communication",
    "sync_wait": "sync wait",
    "update": "optimizer update",
    "other": "other",
    "average": "average (local SGD)",
}
# One color per phase in every figure: waiting is red, moving bytes orange, useful work blue.
PHASE_COLORS = {
    "data": "#2ca02c",
    "compute": "#1f77b4",
    "communication": "#ff7f0e",
    "sync_wait": "#d62728",
    "update": "#9467bd",
    "other": "#9a9a9a",
    "average": "#e6a117",  # local SGD's exchange: moving bytes, as communication
}
BASELINE_COLOR = "#6f6f6f"

_PIP_HINT = 'pip install "dptrain[plot]"'


def _matplotlib():
    try:
        import matplotlib
        import matplotlib.figure  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"dptrain.measure.plots needs matplotlib, which is not installed: {_PIP_HINT}"
        ) from exc
    return matplotlib


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and hasattr(shell, "kernel")  # Jupyter, Colab; not a terminal


@contextmanager
def _style():
    mpl = _matplotlib()
    with mpl.rc_context(
        {
            "font.size": 10,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "legend.fontsize": 8.5,
            "xtick.labelsize": 9,
            "ytick.labelsize": 9,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.axisbelow": True,
            "svg.fonttype": "none",
        }
    ):  # SVG text stays text
        yield mpl


def _figure(width: float, height: float):
    mpl = _matplotlib()
    fig = mpl.figure.Figure(figsize=(width, height), layout="constrained")
    if _in_notebook():
        importlib.import_module("matplotlib.pyplot")  # registers the inline display
    else:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    return fig


def _titles(fig, what: str, context: str = "") -> None:
    """The figure's title: what it shows, and under it for which model/data/backend (wrapped
    between its ' · ' parts to the figure's width, so that no part is cut off)."""
    width = int(fig.get_figwidth() * 11)  # characters of 12 pt per line
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
    width = int(fig.get_figwidth() * 15)  # characters of 8 pt per line, with room to spare
    lines = [wrapped for para in text.split("\n") for wrapped in _wrap(para, width)]
    fig.supxlabel("\n".join(lines), fontsize=8, color="#444444", ha="left", x=0.01)


def _red_title(legend) -> None:
    legend.get_title().set_color("#b22222")
    legend.get_title().set_multialignment("left")
    legend.get_frame().set_edgecolor("#b22222")


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


def _phase_bar(ax, x, heights, bottom, phase: str, width: float, label: bool = True):
    """One phase's segment of stacked bars, in its color (and its label for the legend)."""
    return ax.bar(
        x,
        heights,
        bottom=bottom,
        width=width,
        color=PHASE_COLORS[phase],
        label=PHASE_LABELS[phase] if label else None,
        edgecolor="white",
        lw=0.5,
    )


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
