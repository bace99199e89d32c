"""The model's input: a sweep's RUN rows (docs/sweep_schema.md), read, checked and reduced to
one per configuration (the median over its repeats), and the work of a run (steps, samples
per worker)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..._files import read_json
from ..timing import PHASES
from .checks import _nonneg, _positive_int
from .costs import ALGORITHMS


def _work(n_samples: int, batch_size: int, epochs: int, p: int) -> tuple[int, float, float]:
    """(steps, samples per worker on average, samples of the busiest worker), whole run.
    The last batch of an epoch holds n mod b samples; shards differ by at most one."""
    full, rem = divmod(n_samples, batch_size)
    steps = epochs * (full + (rem > 0))
    mean = epochs * n_samples / p
    busiest = epochs * (full * -(-batch_size // p) + -(-rem // p))
    return steps, mean, float(busiest)


@dataclass(frozen=True)
class _Run:
    index: int
    workers: int
    n_samples: int
    batch_size: int
    epochs: int
    steps: int
    mean_work: float
    busiest_work: float
    param_bytes: float
    calls_per_step: float
    allreduce: str  # as the sweep wrote it
    algorithm: str  # the model's algorithm for it
    train_seconds: float
    phases: dict

    @property
    def config(self) -> tuple:
        return (
            self.workers,
            self.n_samples,
            self.batch_size,
            self.epochs,
            self.allreduce,
            self.param_bytes,
            self.calls_per_step,
        )


_SAME = ("model", "dataset", "backend", "dtype", "threads")


def _run_list(runs) -> list:
    """The RUN dicts of a list (or any iterable) of them, or of a sweep dict holding them."""
    if isinstance(runs, Mapping) and "runs" in runs:
        runs = runs["runs"]
    if isinstance(runs, (str, bytes, Mapping)) or not isinstance(runs, Iterable):
        raise ValueError(
            f"runs must be a list of RUN dicts (or a sweep dict with 'runs'), "
            f"got {type(runs).__name__}"
        )
    runs = list(runs)
    if not runs:
        raise ValueError("runs is empty: the model needs a sweep's RUN rows to fit")
    return runs


def _parse_runs(runs: list, native_algorithm: str) -> list[_Run]:
    if native_algorithm not in ALGORITHMS:
        raise ValueError(f"native_algorithm is {native_algorithm!r}, expected one of {ALGORITHMS}")
    out = []
    for i, r in enumerate(runs):
        if not isinstance(r, Mapping):
            raise ValueError(f"runs[{i}] is a {type(r).__name__}, expected a RUN dict")
        for key in (
            "workers",
            "n_samples",
            "batch_size",
            "epochs",
            "param_bytes",
            "train_seconds",
            "phases",
        ):
            if key not in r:
                raise ValueError(f"runs[{i}] has no {key!r} (see the RUN schema)")
        try:
            p = _positive_int("workers", r["workers"])
            n = _positive_int("n_samples", r["n_samples"])
            b = _positive_int("batch_size", r["batch_size"])
            e = _positive_int("epochs", r["epochs"])
            m = _nonneg("param_bytes", r["param_bytes"])
            t = _nonneg("train_seconds", r["train_seconds"])
        except ValueError as exc:
            raise ValueError(f"runs[{i}]: {exc}") from None
        if t <= 0:
            raise ValueError(f"runs[{i}]: train_seconds is {t!r}, expected > 0")
        ph = r["phases"]
        if not isinstance(ph, Mapping):
            raise ValueError(f"runs[{i}]: phases is {ph!r}, expected a dict of {PHASES}")
        phases = {}
        for name in PHASES:
            if name == "average" and name not in ph:  # sweeps of before local SGD's phase
                phases[name] = 0.0
                continue
            if name not in ph:
                raise ValueError(f"runs[{i}]: phases has no {name!r} (expected {PHASES})")
            try:
                phases[name] = _nonneg(f"phases[{name!r}]", ph[name])
            except ValueError as exc:
                raise ValueError(f"runs[{i}]: {exc}") from None
        steps, mean, busiest = _work(n, b, e, p)
        if "steps" in r and r["steps"] is not None and int(r["steps"]) != steps:
            raise ValueError(
                f"runs[{i}]: steps is {r['steps']!r}, but epochs * "
                f"ceil(n_samples / batch_size) = {e} * ceil({n} / {b}) = {steps}"
            )
        allreduce = r.get("allreduce", "native")
        if allreduce == "native":
            algorithm = native_algorithm
        elif allreduce in ALGORITHMS:
            algorithm = allreduce
        else:
            raise ValueError(
                f"runs[{i}]: allreduce is {allreduce!r}, expected 'native' or one of {ALGORITHMS}"
            )
        calls = r.get("collective_calls")
        if algorithm == "ps" or calls is None or p == 1:
            cps = 1.0
        else:
            cps = _nonneg("collective_calls", calls) / steps
            if cps <= 0:
                raise ValueError(
                    f"runs[{i}]: collective_calls is {calls!r} with {p} workers; "
                    f"expected at least one all-reduce per step"
                )
        out.append(
            _Run(i, p, n, b, e, steps, mean, busiest, m, cps, allreduce, algorithm, t, phases)
        )
    for key in _SAME:
        values = {repr(r.get(key)) for r in runs}
        if len(values) > 1:
            raise ValueError(
                f"runs mix {key} values {sorted(values)}: fit one {key} at a time "
                f"(filter the runs), the model's coefficients belong to one"
            )
    return out


def _medians(runs: Sequence[_Run]) -> list[_Run]:
    """One _Run per configuration: the median over its repeats of train_seconds and of each
    phase. A time-shared host gives occasional slow repeats (a worker descheduled while the
    other spins at the barrier); the median keeps least squares from chasing them."""
    groups: dict = {}
    for r in runs:
        groups.setdefault(r.config, []).append(r)
    out = []
    for members in groups.values():
        first = members[0]
        phases = {ph: float(np.median([m.phases[ph] for m in members])) for ph in PHASES}
        out.append(
            _Run(
                first.index,
                first.workers,
                first.n_samples,
                first.batch_size,
                first.epochs,
                first.steps,
                first.mean_work,
                first.busiest_work,
                first.param_bytes,
                first.calls_per_step,
                first.allreduce,
                first.algorithm,
                float(np.median([m.train_seconds for m in members])),
                phases,
            )
        )
    return out


def load_runs(path) -> list[dict]:
    """The RUN rows of a sweep: a sweep directory (holding sweep.json) or a sweep.json."""
    from ..plots.load import SWEEP_EXPECTED, sweep_json  # plots imports perfmodel

    try:
        path = sweep_json(path)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    doc = read_json(path, SWEEP_EXPECTED)
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise ValueError(f"{path} has no 'runs' list (see the sweep schema)")
    return doc["runs"]
