"""Figures of where the time goes: the phases stacked per configuration, and one worker
against p workers per phase."""

from __future__ import annotations

from ..timing import PHASES
from .labels import (
    _context,
    _dim_text,
    _machine_text,
    _repeats_text,
    _seconds_text,
    _series_label,
    _workers_text,
)
from .load import NotEnoughData, _oversubscribed, _phase_seconds, _series, _stat, _summary, _varying
from .style import (
    _figure,
    _footnote,
    _phase_bar,
    _seconds_axis,
    _style,
    _titles,
    _worker_colors,
)


def plot_breakdown(sweep):
    """Stacked phases per configuration: seconds (top) and share of the time (bottom)."""
    rows, sweep = _summary(sweep)
    rows = [r for r in rows if r.get("phases")]
    if not rows:
        raise NotEnoughData("breakdown needs per-phase times; no summary row has 'phases'")
    dims = _varying(rows)
    ordered = [
        r for grp in _series(rows, [d for d in dims if d != "n_samples"]).values() for r in grp
    ]
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
            if phase == "average" and not any(h):  # local SGD's: no legend entry elsewhere
                continue
            pct = [100 * v / t if t > 0 else 0.0 for v, t in zip(h, totals)]
            _phase_bar(ax, x, h, bottom, phase, 0.8)
            _phase_bar(ax_pct, x, pct, bottom_pct, phase, 0.8, label=False)
            bottom = [b + v for b, v in zip(bottom, h)]
            bottom_pct = [b + v for b, v in zip(bottom_pct, pct)]
        measured = [_stat(r, "time")[0] for r in ordered]
        ax.scatter(
            x,
            measured,
            marker="_",
            s=500,
            color="black",
            lw=2,
            zorder=4,
            label="measured training time",
        )
        for xi, t, m in zip(x, totals, measured):
            ax.annotate(
                _seconds_text(t),
                (xi, max(t, m)),
                textcoords="offset points",
                xytext=(0, 4),
                ha="center",
                va="bottom",
                fontsize=7.5,
            )
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
                    ordered[start].get(d) for d in dims
                ):
                    ax_pct.annotate(
                        "\n".join(_dim_text(d, ordered[start].get(d)) for d in dims),
                        ((x[start] + x[i - 1]) / 2, 0),
                        xycoords=("data", "axes fraction"),
                        xytext=(0, -20),
                        textcoords="offset points",
                        ha="center",
                        va="top",
                        fontsize=9,
                    )
                    start = i
        ax_pct.set_xlabel("configuration (p = workers)", labelpad=8 + 14 * len(dims))
        ctx = _context(rows, sweep=sweep)
        _titles(fig, "Where the training time goes, per configuration", ctx)
        handles, names = ax.get_legend_handles_labels()
        ax.legend(
            handles[::-1],
            names[::-1],
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            title="phase (stacked)",
        )
        _footnote(
            fig,
            "\n".join(
                filter(
                    None,
                    [
                        f"{_repeats_text(rows)}. Phases summed over the steps of a run, mean "
                        f"over ranks; the number on a bar is their sum, the black mark the "
                        f"measured training time. sync wait = waiting for the slowest worker, "
                        f"communication = the transfer itself.",
                        _machine_text(sweep),
                    ],
                )
            ),
        )
    return fig


_BAR_METRICS = (
    ("total", "total"),
    ("compute", "compute (fwd + bwd)"),
    ("communication", "communication"),
    ("sync_wait", "sync wait"),
)


def plot_baseline_vs_distributed(sweep, *, n_samples=None):
    """Grouped bars: total, compute, communication and sync-wait time, 1 worker vs p workers.

    One data-set size (default: the largest that has a 1-worker run and a p-worker run).
    """
    rows, sweep = _summary(sweep)
    sizes = sorted(
        {r["n_samples"] for r in rows if r["workers"] == 1}
        & {r["n_samples"] for r in rows if r["workers"] > 1}
    )
    if not sizes:
        raise NotEnoughData(
            "baseline vs distributed needs a 1-worker run and a p-worker run "
            "of the same data-set size; the sweep has none"
        )
    if n_samples is None:
        n_samples = sizes[-1]
    elif n_samples not in sizes:
        raise ValueError(
            f"n_samples={n_samples!r} has no 1-worker and p-worker pair in the "
            f"sweep; sizes that do: {sizes}"
        )
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
            label = _workers_text(r["workers"]) + (
                " (baseline)"
                if r["workers"] == 1
                else " (oversubscribed)"
                if _oversubscribed(r["workers"], sweep)
                else ""
            )
            if variant_dims:
                label += ", " + _series_label(variant_dims, variant)
            cont = ax.bar(
                xs,
                values,
                width=width * 0.95,
                color=wcolors[r["workers"]],
                hatch=hatches[variants.index(variant) % 4],
                edgecolor="white",
                label=label,
            )
            base = baselines.get(variant)
            if r["workers"] > 1 and base is not None:
                # what perfect scaling would give: the 1-worker total and compute over p
                ideal = [
                    _stat(base, "time")[0] / r["workers"],
                    _phase_seconds(base)["compute"] / r["workers"],
                ]
                ax.hlines(
                    ideal,
                    [v - width * 0.45 for v in xs[:2]],
                    [v + width * 0.45 for v in xs[:2]],
                    color="black",
                    lw=2,
                    linestyles="--",
                    zorder=4,
                    label="ideal: 1-worker time / p" if not ideal_drawn else None,
                )
                ideal_drawn = True
            ax.bar_label(
                cont,
                labels=[_seconds_text(v) for v in values],
                fontsize=7.5,
                padding=2,
                rotation=90 if len(bars) > 4 else 0,
            )
        ax.set_xticks(range(len(_BAR_METRICS)), [name for _, name in _BAR_METRICS])
        ax.set_ylim(0, top * (1.3 if len(bars) > 4 else 1.15))
        unit = _seconds_axis(ax.yaxis, ax.get_ylim()[1])
        ax.set_ylabel(f"time per run  [{unit}]  (mean over ranks)")
        ax.grid(axis="x", visible=False)
        ctx = _context(rows, sweep=sweep)
        _titles(fig, "1 worker vs p workers: where the time goes", ctx)
        ax.legend(loc="upper right")
        _footnote(
            fig,
            "\n".join(
                filter(
                    None,
                    [
                        f"{_repeats_text(rows)}. total = training-loop time on rank 0; the "
                        f"phases are summed over steps, mean over ranks (each of p workers "
                        f"computes 1/p of every batch).",
                        _machine_text(sweep),
                    ],
                )
            ),
        )
    return fig
