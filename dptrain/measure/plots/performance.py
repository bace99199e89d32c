"""Figures of the performance model (dptrain.measure.perfmodel): predicted vs measured
times, and the projection to large clusters, each carrying the model's held-out verdict."""

from __future__ import annotations

import math
from statistics import median

from .labels import _fmt_n, _workers_text
from .load import _check_rows, _is_number, _validation_rows
from .style import (
    _LINESTYLES,
    _MARKERS,
    _figure,
    _footnote,
    _matplotlib,
    _style,
    _tick_formatter,
    _tick_text,
    _titles,
    _worker_colors,
    _wrap,
)

TOLERANCE_BAND = 0.15  # the performance model's target: predictions within 15 %


def model_verdict(validation) -> dict:
    """``perfmodel.validation_verdict`` of a validation: perfmodel's dict
    (``Validation.to_dict()``, which carries the target and the number of fitted
    parameters), bare rows (``{workers, n_samples, measured, predicted}``, the rows with
    ``held_out: false`` not counted), or None (no validation given: not validated)."""
    from ..perfmodel import TARGET_ERROR_PCT, validation_verdict

    if validation is None:
        return {
            "validated": False,
            "problems": ["no held-out validation given"],
            "text": "NOT VALIDATED: no held-out validation given",
        }
    doc = validation if isinstance(validation, dict) else {"rows": validation}
    rows = [r for r in doc.get("rows") or () if isinstance(r, dict)]
    held = [r for r in rows if r.get("held_out", True) is not False]
    if not held:
        return {
            "validated": False,
            "problems": ["no held-out points"],
            "text": "NOT VALIDATED: no held-out points (every configuration was in the fit)",
        }
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


def _verdict_box(ax, verdict, x, y, ha, va, width=52, extra="", below=None):
    """The verdict in a box on ``ax`` (at axes fraction x, y; or, given an artist `below`,
    14 points under its lower left corner): red when not validated. Returns the text."""
    color = "#2a6e2a" if verdict["validated"] else _NOT_VALIDATED_RED
    text = "\n".join(_wrap(verdict["text"], width)) + (f"\n{extra}" if extra else "")
    where = (
        dict(xycoords=ax.transAxes)
        if below is None
        else dict(xycoords=below, xytext=(0, -14), textcoords="offset points")
    )
    return ax.annotate(
        text,
        (x, y),
        **where,
        ha=ha,
        va=va,
        fontsize=8.5,
        color=color,
        fontweight="normal" if verdict["validated"] else "bold",
        zorder=6,
        bbox=dict(fc="white", ec=color, lw=1.5 if not verdict["validated"] else 1, alpha=0.95),
    )


def plot_model_validation(validation, *, context: str = ""):
    """Predicted vs measured training time, the y = x line and the ±15 % band, and whether
    the check validates the model (``model_verdict``), in the title and in a box.

    ``validation``: perfmodel's validation dict (``Validation.to_dict()``, which also knows
    the number of fitted parameters) or its rows ``{workers, n_samples, measured,
    predicted}`` (seconds); an optional boolean ``held_out`` marks configurations left out of
    the fit (filled markers).
    """
    rows = _check_rows(
        _validation_rows(validation),
        ("workers", "n_samples", "measured", "predicted"),
        "model validation",
    )
    for i, r in enumerate(rows):
        for k in ("measured", "predicted"):
            if not _is_number(r[k]) or r[k] <= 0:
                raise ValueError(f"model validation row {i}.{k} is {r[k]!r}, expected seconds > 0")
    verdict = model_verdict(validation)
    wcolors = _worker_colors(r["workers"] for r in rows)
    sizes = sorted({r["n_samples"] for r in rows})
    lo = min(min(r["measured"], r["predicted"]) for r in rows) / 1.4
    hi = max(max(r["measured"], r["predicted"]) for r in rows) * 1.4
    errors = [abs(r["predicted"] / r["measured"] - 1) for r in rows]
    within = sum(e <= TOLERANCE_BAND + 1e-12 for e in errors)
    has_split = any("held_out" in r for r in rows)
    with _style():
        fig = _figure(9.4, 6.8)
        ax = fig.subplots()
        line = [lo, hi]
        ax.fill_between(
            line,
            [v * (1 - TOLERANCE_BAND) for v in line],
            [v * (1 + TOLERANCE_BAND) for v in line],
            color="#2ca02c",
            alpha=0.15,
            lw=0,
            label=f"±{TOLERANCE_BAND:.0%} of measured",
        )
        ax.plot(line, line, "-", color="black", lw=1, label="predicted = measured")
        for p in sorted(wcolors):
            for held in (True, False) if has_split else (None,):
                pts = [
                    r
                    for r in rows
                    if r["workers"] == p and (held is None or bool(r.get("held_out")) == held)
                ]
                if not pts:
                    continue
                label = _workers_text(p) + (
                    "" if held is None else ", held out" if held else ", in the fit"
                )
                ax.scatter(
                    [r["measured"] for r in pts],
                    [r["predicted"] for r in pts],
                    s=[30 + 50 * sizes.index(r["n_samples"]) / max(1, len(sizes) - 1) for r in pts],
                    color=wcolors[p] if held is not False else "none",
                    edgecolors=wcolors[p],
                    lw=1.5,
                    zorder=3,
                    label=label,
                )
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
        # the legend, the verdict and the figures in a column right of the axes, each below
        # the one before: inside, they would hide the points that miss by most (far from
        # the diagonal, in the corners), which are the figure's evidence
        legend = ax.legend(loc="upper left", bbox_to_anchor=(1.03, 1.0), borderaxespad=0)
        box = _verdict_box(ax, verdict, 0, 0, "left", "top", width=34, below=legend)
        ax.annotate(
            f"{within} of {len(rows)} within ±{TOLERANCE_BAND:.0%}\n"
            f"median |error| {100 * median(errors):.1f} %, "
            f"max {100 * max(errors):.1f} %",
            (0, 0),
            xycoords=box,
            xytext=(0, -14),
            textcoords="offset points",
            ha="left",
            va="top",
            fontsize=9,
            bbox=dict(fc="white", ec="#bbbbbb", alpha=0.9),
        )
        size_text = (
            f"Marker size grows with the data-set size ({_fmt_n(sizes[0])} to "
            f"{_fmt_n(sizes[-1])} samples)."
            if len(sizes) > 1
            else f"Every point: {_fmt_n(sizes[0])} samples."
        )
        _footnote(
            fig,
            f"{size_text} Model: T_p = T_comp / p + T_comm(p) + T_sync(p), fitted "
            f"to the sweep. Model check: {verdict['text']}.",
        )
    return fig


def plot_projection(rows, *, context: str = "", validation=None):
    """Projected speedup (and efficiency) vs workers up to large clusters, log2 axes.

    ``rows``: ``{network, algorithm, workers, speedup, efficiency}``; one line per
    (network, algorithm): color per network, line style per algorithm. ``validation``: the
    model's held-out check (perfmodel's validation dict, or its rows; see ``model_verdict``).
    A projection whose model is not validated (or that comes without a validation) is drawn
    with "NOT VALIDATED ... for illustration only" in its title and in a red box.
    """
    rows = _check_rows(
        rows, ("network", "algorithm", "workers", "speedup", "efficiency"), "projection"
    )
    for i, r in enumerate(rows):
        for k in ("workers", "speedup", "efficiency"):
            if not _is_number(r[k]) or r[k] <= 0:
                raise ValueError(f"projection row {i}.{k} is {r[k]!r}, expected a number > 0")
    verdict = model_verdict(validation)
    networks = list(dict.fromkeys(str(r["network"]) for r in rows))
    algorithms = list(dict.fromkeys(str(r["algorithm"]) for r in rows))
    palette = _matplotlib().colormaps["Dark2"].colors  # not the phase colors
    ncolors = {net: palette[i % len(palette)] for i, net in enumerate(networks)}
    top = max(r["workers"] for r in rows)
    with _style():
        fig = _figure(13.5, 5.6)
        ax, ax_eff = fig.subplots(1, 2)
        ideal = [2**k for k in range(int(math.log2(top)) + 1)]
        if ideal[-1] < top:
            ideal.append(top)
        ax.plot(ideal, ideal, "--", color="black", lw=1.2, label="ideal (speedup = workers)")
        ax_eff.axhline(100, color="black", ls="--", lw=1.2)
        for net in networks:
            for ai, alg in enumerate(algorithms):
                pts = sorted(
                    (r for r in rows if str(r["network"]) == net and str(r["algorithm"]) == alg),
                    key=lambda r: r["workers"],
                )
                if not pts:
                    continue
                style = dict(
                    color=ncolors[net],
                    ls=_LINESTYLES[ai % 4],
                    marker=_MARKERS[ai % 6],
                    ms=4,
                    lw=1.8,
                )
                ax.plot(
                    [r["workers"] for r in pts],
                    [r["speedup"] for r in pts],
                    label=f"{net}, {alg}",
                    **style,
                )
                ax_eff.plot(
                    [r["workers"] for r in pts], [100 * r["efficiency"] for r in pts], **style
                )
        for a in (ax, ax_eff):
            a.set_xscale("log", base=2)
            a.set_xticks(ideal, [str(v) for v in ideal])
            a.set_xlabel("workers p  [log2 scale]")
        ax.set_yscale("log", base=2)
        low = min(1.0, min(r["speedup"] for r in rows))
        powers = list(range(math.floor(math.log2(low)), len(ideal)))
        stride = 1 if len(powers) <= 12 else 2  # at most ~12 labels; 1 is always one
        yticks = [2.0**k for k in powers if k % stride == 0]
        ax.set_yticks(yticks, [_tick_text(v) for v in yticks])
        from matplotlib.ticker import NullFormatter

        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(low / 1.3, ideal[-1] * 1.3)
        ax.set_ylabel("predicted speedup  [×, log2 scale]")
        ax_eff.set_ylabel("predicted parallel efficiency  [%]")
        ax_eff.set_ylim(0, 105)
        title = (
            "Performance model: projected scaling to large clusters"
            if verdict["validated"]
            else "Performance-model projection: NOT VALIDATED, for illustration only"
        )
        _titles(fig, title, context)
        ax.set_title("speedup")
        ax_eff.set_title("parallel efficiency (speedup / p)")
        if not verdict["validated"]:
            # upper left: above the ideal line, where no projection can go
            _verdict_box(ax, verdict, 0.02, 0.98, "left", "top", width=48, extra=_ILLUSTRATION)
            ax_eff.text(
                0.5,
                0.5,
                "NOT VALIDATED",
                transform=ax_eff.transAxes,
                ha="center",
                va="center",
                rotation=25,
                fontsize=30,
                color=_NOT_VALIDATED_RED,
                alpha=0.18,
                fontweight="bold",
                zorder=0,
            )
        fig.legend(
            handles=ax.get_lines(),
            loc="outside right upper",
            title="network, all-reduce\nalgorithm",
        )
        _footnote(
            fig,
            "Projection of the performance model fitted to the measured sweep: "
            "compute time from the sweep, communication from an alpha-beta model "
            f"of each algorithm on the named network. Model check: "
            f"{verdict['text']}" + ("." if verdict["validated"] else f"; {_ILLUSTRATION}."),
        )
    return fig
