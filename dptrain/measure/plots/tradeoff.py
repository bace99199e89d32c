"""Local SGD's trade in two figures: test accuracy against training time per configuration
(what communicating less costs in accuracy and gives in time), and where each run's time
went (the phases, local SGD's average among them)."""

from __future__ import annotations

from ..timing import PHASES
from .labels import SYNTHETIC_MARK, _is_synthetic_name
from .style import (
    _colors,
    _figure,
    _footnote,
    _phase_bar,
    _style,
    _titles,
)


def _runs(runs) -> list[tuple[str, dict]]:
    """[(label, result)] from a dict {label: result} or pairs, each result a ``train()``
    result (or its JSON): its per-epoch ``epochs`` history, ``config`` and ``breakdown``."""
    pairs = list(runs.items()) if isinstance(runs, dict) else list(runs)
    if not pairs:
        raise ValueError("runs is empty: give {label: train() result} for at least one run")
    for label, r in pairs:
        if not isinstance(r, dict) or not r.get("epochs"):
            raise ValueError(f"run {label!r} has no per-epoch history ('epochs'): not a result")
        if any(h.get("test_accuracy") is None for h in r["epochs"]):
            raise ValueError(f"run {label!r} has no test accuracy (a regression, or no test set)")
    return pairs


def _context(pairs, quick: bool) -> str:
    """What every run shares (model, data set, workers), the marks a reader must not miss."""
    configs = [r.get("config", {}) for _, r in pairs]

    def shared(key):
        values = {c.get(key) for c in configs}
        return values.pop() if len(values) == 1 else None

    what = " on ".join(str(v) for v in (shared("model"), shared("dataset")) if v is not None)
    workers = shared("workers")
    parts = [what] if what else []
    if workers is not None:
        parts.append(f"{workers} workers")
    marks = []
    if any(_is_synthetic_name(c.get("dataset")) for c in configs):
        marks.append(SYNTHETIC_MARK)
    if quick:
        marks.append("QUICK RUN")
    return " · ".join(parts + marks)


def plot_accuracy_vs_time(runs, *, target: float | None = None, quick: bool = False):
    """Test accuracy (%) at each epoch's end against the training seconds so far, one line
    per run (``runs``: {label: train() result}); ``target``: a target accuracy (a fraction),
    drawn as a line, each run's first epoch at or above it marked."""
    pairs = _runs(runs)
    with _style():
        fig = _figure(8.5, 5.2)
        ax = fig.subplots()
        for (label, r), color in zip(pairs, _colors(len(pairs), "tab10", 0.0, 0.9)):
            t, xs, ys = 0.0, [], []
            for h in r["epochs"]:
                t += h["seconds"]
                xs.append(t)
                ys.append(100 * h["test_accuracy"])
            ax.plot(xs, ys, marker="o", ms=4, lw=1.6, color=color, label=label)
            if target is not None:
                hit = next((i for i, y in enumerate(ys) if y >= 100 * target), None)
                if hit is not None:
                    ax.plot(xs[hit], ys[hit], marker="o", ms=10, mfc="none", mec=color, mew=1.5)
        if target is not None:
            ax.axhline(
                100 * target, color="black", lw=0.8, ls="--", label=f"target {100 * target:g} %"
            )
        ax.set_xlabel("training time [s] (the training loop's, evaluation excluded)")
        ax.set_ylabel("test accuracy [%]")
        ax.set_xlim(0, None)
        ax.legend(loc="lower right")
        _titles(fig, "Test accuracy against training time", _context(pairs, quick))
        _footnote(
            fig,
            "One point per epoch (where the run evaluates); a circle marks each run's first "
            "epoch at or above the target. Local SGD trades accuracy per epoch for time per "
            "epoch: the line further left at the same height is the faster to that accuracy.",
        )
    return fig


def plot_run_phases(runs, *, quick: bool = False):
    """Stacked phases of each run's training time (mean over ranks), local SGD's average
    among them (``runs``: {label: train() result})."""
    pairs = _runs(runs)
    seconds = [r["breakdown"]["phase_seconds"] for _, r in pairs]
    shown = [p for p in PHASES if any(s.get(p, 0.0) > 0 for s in seconds)]
    with _style():
        fig = _figure(max(7.0, 0.9 * len(pairs) + 3.0), 5.0)
        ax = fig.subplots()
        x = range(len(pairs))
        bottom = [0.0] * len(pairs)
        for phase in shown:
            h = [s.get(phase, 0.0) for s in seconds]
            _phase_bar(ax, x, h, bottom, phase, 0.75)
            bottom = [b + v for b, v in zip(bottom, h)]
        for i, total in enumerate(bottom):
            ax.annotate(f"{total:.2f}", (i, total), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x), [label for label, _ in pairs], rotation=20, ha="right")
        ax.set_ylabel("training time [s], mean over ranks")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        _titles(fig, "Where the training time went", _context(pairs, quick))
        _footnote(
            fig,
            "sync wait = waiting at the collective for the slowest worker (at every step for "
            "synchronous SGD, at each average for local SGD); communication = the gradient's "
            "all-reduce; average = local SGD's average of the replicas.",
        )
    return fig
