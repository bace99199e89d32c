"""The per-rank timeline: a few steps of a run's Chrome trace, one row per rank."""

from __future__ import annotations

from ..timing import PHASES
from .labels import _run_text
from .load import _order, _sweep_config, _trace_slices
from .style import PHASE_COLORS, PHASE_LABELS, _figure, _footnote, _style, _titles


def plot_timeline(
    trace,
    *,
    steps: int | None = 3,
    first_step: int | None = None,
    title: str | None = None,
    sweep=None,
):
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
            raise ValueError(
                f"first_step={first_step} is not in the trace (steps {known[0]}..{known[-1]})"
            )
        wanted = set(known[known.index(first_step) : known.index(first_step) + steps])
        stepped = [s for s in slices if s[4] in wanted]
        t0 = min(s[2] for s in stepped)
        t1 = max(s[2] + s[3] for s in stepped)
        slices = stepped + [
            s for s in slices if not isinstance(s[4], int) and s[2] < t1 and s[2] + s[3] > t0
        ]
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
        if len(recorded) == 1:  # the name as the sweep recorded it
            other["dataset"] = recorded.pop()
        elif not recorded and _sweep_config(sweep).get("dataset") is not None:
            other["dataset"] = _sweep_config(sweep)["dataset"]
    with _style():
        fig = _figure(11.0, max(2.8, 0.55 * len(ranks) + 2.2))
        ax = fig.subplots()
        for phase in PHASES:
            mine = [s for s in slices if s[1] == phase]
            if not mine and phase == "average":  # local SGD's: no legend entry elsewhere
                continue
            ax.barh(
                [y_of[s[0]] for s in mine],
                [s[3] / 1000 for s in mine],
                left=[(s[2] - t0) / 1000 for s in mine],
                height=0.7,
                color=PHASE_COLORS[phase],
                label=PHASE_LABELS[phase],
                lw=0,
            )
        # step boundaries: where each shown step starts (earliest slice over ranks)
        if shown and len(shown) <= 20:
            for step in shown:
                start = min((s[2] for s in slices if s[4] == step), default=None)
                if start is None:
                    continue
                x = (start - t0) / 1000
                ax.axvline(x, color="black", lw=0.8, ls=":", zorder=0)
                ax.annotate(
                    f"step {step}",
                    (x, 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(2, 2),
                    textcoords="offset points",
                    fontsize=8,
                    va="bottom",
                )
        ax.set_yticks(
            range(len(ranks)),
            [
                names.get(r, f"rank {r[1]}" if one_process else f"pid {r[0]}, tid {r[1]}")
                for r in ranks
            ],
        )
        ax.set_ylim(len(ranks) - 0.5, -0.5)  # rank 0 on top
        ax.set_xlim(0, None)
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("time since the first drawn slice  [ms]")
        ax.set_ylabel("worker")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase")
        what = (
            f"steps {shown[0]}–{shown[-1]}"
            if len(shown) > 1
            else f"step {shown[0]}"
            if shown
            else "whole trace"
        )
        _titles(
            fig,
            title or f"Per-rank timeline of {what}: what each worker does when",
            _run_text(other, sweep),
        )
        _footnote(
            fig,
            "Slices from the run's merged Chrome trace (open the JSON in Perfetto "
            "or chrome://tracing to see every step). sync wait = waiting for the "
            "slowest worker to arrive; communication = the transfer itself.",
        )
    return fig
