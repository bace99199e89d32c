"""Figures of a sweep: where data-parallel training time went, and what more workers would give.

Every function takes plain data and returns a ``matplotlib.figure.Figure``:

- ``plot_speedup(sweep)``: speedup vs workers, measured medians with min/max bars, the ideal
  line, the efficiency loss shaded between them, the contention ceiling where measured, and a
  table of time / speedup / efficiency per configuration.
- ``plot_efficiency_vs_size(sweep)`` and ``plot_time_vs_size(sweep)``: one line per worker count.
- ``plot_breakdown(sweep)``: stacked phases per configuration, in seconds and in % of the step.
- ``plot_baseline_vs_distributed(sweep)``: grouped bars, 1 worker vs p workers, per phase.
- ``plot_timeline(trace)``: a few steps of a Chrome trace, one row per rank.
- ``plot_accuracy_vs_time(runs)`` and ``plot_run_phases(runs)``: ``train()`` results side by
  side (``{label: result}``, e.g. synchronous SGD against local SGD at several periods): test
  accuracy at each epoch's end against the training time so far, and each run's phases.
- ``plot_model_validation(rows)`` and ``plot_projection(rows)``: the performance model's
  predicted vs measured times, and its projection to large clusters (rows as produced by
  dptrain.measure.perfmodel: ``{workers, n_samples, measured, predicted}`` and ``{network,
  algorithm, workers, speedup, efficiency}``).

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
``save_figure(fig, path)`` writes one figure. Every phase has one color in every figure
(``PHASE_COLORS``). The command line (``python -m dptrain plot results/ --out figures/``,
which also fits the performance model) is dptrain.measure.plot_command.

A sweep is ``sweep.json`` as written by dptrain.measure.sweep (the contract,
docs/sweep_schema.md: SUMMARY rows with ``time``, ``speedup``, ``efficiency`` as ``{median,
min, max}`` over repeats, ``phases`` as medians, and ``ceiling_speedup``); the functions
accept the loaded dict, a list of SUMMARY rows, or (through ``load_sweep``) the directory or
file. Times are seconds in the data, shown in s or ms.

matplotlib is optional (``pip install "dptrain[plot]"``) and imported only when a figure is
made. Figures are made without pyplot: no global figure list to leak in long sweeps, and
outside a notebook each figure draws on an Agg canvas whatever backend the user has selected.
In a notebook pyplot is imported once, so that the returned figure displays inline.

One module per role: ``style`` (matplotlib, lazily, and the house style), ``load`` (the
inputs, read and checked), ``labels`` (titles, labels and provenance marks), one module per
figure family (``scaling``, ``phases``, ``timeline``, ``performance``, ``tradeoff``), and ``write``
(``save_figure``, ``plot_sweep``). This package imports no matplotlib until a figure is made.

Left out on purpose: interactive figures, and any statistics beyond what the sweep recorded
(medians and min/max over repeats are drawn as they are).
"""

from __future__ import annotations

from ..timing import PHASES  # noqa: F401  (re-exported: the one list of phases)
from .load import NotEnoughData, load_sweep, load_trace, machine_cores
from .performance import model_verdict, plot_model_validation, plot_projection
from .phases import plot_baseline_vs_distributed, plot_breakdown
from .scaling import plot_efficiency_vs_size, plot_speedup, plot_time_vs_size
from .style import PHASE_COLORS, PHASE_LABELS  # noqa: F401  (re-exported)
from .timeline import plot_timeline
from .tradeoff import plot_accuracy_vs_time, plot_run_phases
from .write import FIGURE_NAMES, plot_sweep, save_figure

__all__ = [
    "plot_sweep",
    "load_sweep",
    "load_trace",
    "plot_speedup",
    "plot_efficiency_vs_size",
    "plot_time_vs_size",
    "plot_breakdown",
    "plot_baseline_vs_distributed",
    "plot_timeline",
    "plot_accuracy_vs_time",
    "plot_run_phases",
    "plot_model_validation",
    "plot_projection",
    "model_verdict",
    "save_figure",
    "machine_cores",
    "NotEnoughData",
    "FIGURE_NAMES",
]
