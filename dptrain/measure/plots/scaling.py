"""Figures of scaling: speedup vs workers (with its table), parallel efficiency and training
time vs data-set size."""

from __future__ import annotations

from .labels import (
    _above_cores_short,
    _above_cores_text,
    _context,
    _fmt_n,
    _machine_text,
    _oversubscribed_text,
    _repeats_text,
    _series_label,
    _workers_text,
)
from .load import (
    NotEnoughData,
    _is_number,
    _oversubscribed,
    _series,
    _stat,
    _summary,
    _varying,
    machine_cores,
)
from .style import (
    _LINESTYLES,
    _MARKERS,
    _colors,
    _figure,
    _footnote,
    _red_title,
    _seconds_axis,
    _style,
    _titles,
    _worker_colors,
)


def plot_speedup(sweep, *, table: bool = True):
    """Speedup T1/Tp vs workers: one line per data-set size (and backend, all-reduce, ...)."""
    rows, sweep = _summary(sweep)
    rows = [r for r in rows if _stat(r, "speedup") is not None]
    workers = sorted({r["workers"] for r in rows})
    if len(workers) < 2:
        raise NotEnoughData(
            f"speedup vs workers needs at least two worker counts with a "
            f"speedup; the sweep has {workers or 'none'}"
        )
    dims = _varying(rows)
    groups = _series(rows, dims)
    colors = _colors(len(groups), "plasma", 0.05, 0.75) if len(groups) > 1 else ["#1f77b4"]
    cores = machine_cores(sweep)
    over = [p for p in workers if _oversubscribed(p, sweep)]
    above = _above_cores(rows, cores)
    with _style():
        # beside the plot: the table on top, the legend under it (clear of the lines)
        n_legend = (
            len(groups)
            + 2
            + any(_is_number(r.get("ceiling_speedup")) for r in rows)
            + bool(over)
            + bool(over or above)
            + bool(above)
        )
        table_in, legend_in = 0.22 * (len(rows) + 1) + 0.5, 0.22 * n_legend + 0.3
        if table:
            fig = _figure(12.5, max(5.0, table_in + legend_in + 1.3))
            grid = fig.add_gridspec(
                2, 2, width_ratios=(1.2, 1), height_ratios=(table_in, legend_in)
            )
            ax = fig.add_subplot(grid[:, 0])
            tab_ax, legend_ax = fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 1])
        else:
            fig = _figure(7.5, 5.0 + (0.22 * n_legend if n_legend > 4 else 0))
            ax, tab_ax, legend_ax = fig.subplots(), None, None
        top = max(workers)
        ax.plot(
            [1, top],
            [1, top],
            "--",
            color="black",
            lw=1.2,
            label="ideal (speedup = workers)",
            zorder=1,
        )
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        handles = [ax.get_lines()[0]]
        shaded = list(groups)[-1]  # the largest data set (the last series) is shaded
        any_ceiling = False
        for (key, grp), color, marker in zip(groups.items(), colors, _MARKERS * 8):
            name = _series_label(dims, key)
            p = [r["workers"] for r in grp]
            med, lo, hi = zip(*(_stat(r, "speedup") for r in grp))
            yerr = [[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]]
            bars = ax.errorbar(
                p,
                med,
                yerr=yerr,
                color=color,
                marker=marker,
                ms=6,
                lw=2,
                capsize=4,
                label=f"measured{', ' + name if name else ''}",
                zorder=3,
            )
            handles.append(bars)
            if key == shaded:
                ax.fill_between(
                    p,
                    med,
                    p,
                    where=[m <= q for m, q in zip(med, p)],
                    color=color,
                    alpha=0.15,
                    lw=0,
                    interpolate=True,
                    zorder=0,
                )
                handles.append(
                    Patch(
                        color=color,
                        alpha=0.15,
                        lw=0,
                        label=(
                            "efficiency loss (ideal − measured)" + (f", {name}" if name else "")
                        ),
                    )
                )
            ceil = [
                (r["workers"], r["ceiling_speedup"])
                for r in grp
                if _is_number(r.get("ceiling_speedup"))
            ]
            if ceil:
                any_ceiling = True
                if 1 in p and all(q != 1 for q, _ in ceil):
                    ceil.insert(0, (1, 1.0))  # one worker is its own ceiling
                cx, cy = zip(*sorted(ceil))
                ax.plot(
                    cx,
                    cy,
                    ":",
                    color=color,
                    marker="v",
                    ms=6,
                    lw=1.8,
                    zorder=2,
                    label=f"contention ceiling{', ' + name if name else ''}",
                )
        if any_ceiling:
            handles.append(
                Line2D(
                    [],
                    [],
                    ls=":",
                    marker="v",
                    color="#555555",
                    lw=1.8,
                    label="contention ceiling"
                    + (" (dotted, same color)" if len(groups) > 1 else ""),
                )
            )
        highest = max(
            [top]
            + [_stat(r, "speedup")[2] for r in rows]
            + [r["ceiling_speedup"] for r in rows if _is_number(r.get("ceiling_speedup"))]
        )
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
        elif len(handles) <= 4:  # below the ideal line, right: empty in a speedup plot
            ax.legend(handles=handles, loc="lower right")
        else:
            ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12))
        if tab_ax is not None:
            _speedup_table(tab_ax, rows, dims, sweep)
        notes = [
            f"{_repeats_text(rows)}; error bars: min–max. Speedup against our own "
            f"1-worker run of the same size in the same sweep."
        ]
        if any(_is_number(r.get("ceiling_speedup")) for r in rows):
            notes.append(
                "Contention ceiling: T1 / time of p uncoupled 1-worker runs started "
                "together (what the hardware allows without communication)."
            )
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
        ax.annotate(
            f"oversubscribed\n(> {cores} cores)",
            ((left + right) / 2, 0.98),
            xycoords=("data", "axes fraction"),
            ha="center",
            va="top",
            fontsize=8.5,
            color="#444444",
        )
        handles.append(
            Patch(
                color="#9a9a9a", alpha=0.18, lw=0, label=f"oversubscribed: workers > {cores} cores"
            )
        )
    if over or above:
        ax.axhline(cores, color="#b22222", ls=(0, (1, 2)), lw=1.3, zorder=1)
        handles.append(
            Line2D(
                [],
                [],
                color="#b22222",
                ls=(0, (1, 2)),
                lw=1.3,
                label=f"{cores} cores: the most CPU-bound work can gain",
            )
        )
    if above:
        xs, ys = zip(*above)
        ax.scatter(xs, ys, s=260, facecolors="none", edgecolors="#b22222", lw=1.8, zorder=5)
        handles.append(
            Line2D(
                [],
                [],
                ls="",
                marker="o",
                ms=12,
                mfc="none",
                mec="#b22222",
                mew=1.8,
                label=f"speedup > {cores} cores (see note)",
            )
        )
        _above_cores_note(ax, cores)
    return handles


def _above_cores_note(ax, cores: int) -> None:
    """A short red note on ``ax`` where it hides the least data (a legend with a title only,
    placed 'best'; added as an artist, so the axes' own legend stays ``ax.get_legend()``)."""
    from matplotlib.legend import Legend

    note = Legend(
        ax, [], [], title=_above_cores_short(cores), loc="best", title_fontsize=8, framealpha=0.92
    )
    _red_title(note)
    note.set_zorder(6)
    ax.add_artist(note)


def _speedup_table(ax, rows, dims, sweep=None) -> None:
    ax.axis("off")
    ax.grid(False)
    longest = max(_stat(r, "time")[0] for r in rows)
    unit, scale, fmt = ("ms", 1000.0, "{:.1f}") if longest < 10 else ("s", 1.0, "{:.2f}")
    header = (["configuration"] if dims else []) + [
        "workers",
        f"time [{unit}]",
        "speedup",
        "efficiency",
    ]
    has_ceiling = any(_is_number(r.get("ceiling_speedup")) for r in rows)
    if has_ceiling:
        header.append("ceiling")
    cores = machine_cores(sweep)
    has_note = any(_oversubscribed(r["workers"], sweep) for r in rows) or bool(
        _above_cores(rows, cores)
    )
    if has_note:
        header.append("note")
    cells = []
    for key, grp in _series(rows, dims).items():
        for r in grp:
            t = _stat(r, "time")[0]
            s = _stat(r, "speedup")[0]
            e = _stat(r, "efficiency")
            line = ([_series_label(dims, key)] if dims else []) + [
                str(r["workers"]),
                fmt.format(scale * t),
                f"{s:.2f}×",
                f"{100 * e[0]:.0f} %" if e else "–",
            ]
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


def _per_size(sweep, key: str, what: str):
    rows, sweep = _summary(sweep)
    rows = [r for r in rows if _stat(r, key) is not None]
    sizes = sorted({r["n_samples"] for r in rows})
    if len(sizes) < 2:
        raise NotEnoughData(
            f"{what} vs data-set size needs at least two data-set sizes; "
            f"the sweep has {sizes or 'none'}"
        )
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
        label = _workers_text(p) + (
            ", " + _series_label(variant_dims, variant) if variant_dims else ""
        )
        if _oversubscribed(p, sweep):
            label += " (oversubscribed)"
        ax.errorbar(
            n,
            med,
            yerr=yerr,
            color=wcolors[p],
            marker=_MARKERS[vi % 6],
            ls=_LINESTYLES[vi % 4],
            lw=2,
            ms=6,
            capsize=3,
            label=label,
        )


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
        raise NotEnoughData(
            "efficiency vs data-set size needs a worker count > 1; the sweep has only 1-worker runs"
        )
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
        above = [r for r in rows if r["workers"] > 1 and _above_cores([r], cores, ceiling=False)]
        if above:
            # the point whose median or max over repeats is above: at the larger of the two
            ax.scatter(
                [r["n_samples"] for r in above],
                [
                    100
                    * (
                        _stat(r, "efficiency")[0]
                        if _stat(r, "speedup")[0] > cores
                        else _stat(r, "efficiency")[2]
                    )
                    for r in above
                ],
                s=260,
                facecolors="none",
                edgecolors="#b22222",
                lw=1.8,
                zorder=5,
                label=f"speedup > {cores} cores",
            )
        legend = ax.legend(
            loc="best", title=_above_cores_short(cores) if above else None, title_fontsize=8
        )
        if above:  # the explanation heads the legend, clear of the data
            _red_title(legend)
        notes = [
            f"{_repeats_text(rows)}; error bars: min–max. Efficiency = (T1 / Tp) / p, T1 "
            f"from the 1-worker run of the same size."
        ]
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
        notes = [
            f"{_repeats_text(rows)}; error bars: min–max. Time: the training loop on rank "
            f"0, between barriers (start-up and evaluation excluded)."
        ]
        if any(_oversubscribed(r["workers"], sweep) for r in rows):
            notes.append(_oversubscribed_text(sweep))
        _footnote(fig, "\n".join(filter(None, notes + [_machine_text(sweep)])))
    return fig
