"""The held-out check: fit on some runs, predict the configurations left out (``validate``),
and whether that validates the model (``validation_verdict``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._plain import plain
from ..timing import PHASES
from .checks import _nonneg
from .fitting import FittedModel, fit
from .runs import _parse_runs, _run_list

TARGET_ERROR_PCT = 15.0


def validation_verdict(
    max_abs_error_pct: float,
    target_pct: float = TARGET_ERROR_PCT,
    n_points: int | None = None,
    n_parameters: int | None = None,
) -> dict:
    """Whether a held-out check validates the model, and one line that says why or why not:
    ``{"validated": bool, "problems": [...], "text": "..."}``.

    A check validates the model when every held-out prediction is within ``target_pct`` and
    it has at least as many held-out points (configurations) as the model has fitted
    parameters: with fewer, agreement says little about the model (a fit with k free
    parameters can be bent through k points). ``n_points`` / ``n_parameters`` None: not known,
    that test is left out (and the text says so). This text is what the figures and the
    command line print, so a projection from a failed check is never shown as a forecast.
    """
    err = _nonneg("max_abs_error_pct", max_abs_error_pct)
    target = _nonneg("target_pct", target_pct)
    problems = []
    if not err <= target:
        problems.append(f"held-out error up to {err:.1f} % > {target:g} % target")
    if n_points is not None and n_parameters is not None and n_points < n_parameters:
        problems.append(
            f"checked on {n_points} held-out point{'s' if n_points != 1 else ''}"
            f" for {n_parameters} fitted parameters: not a validation"
        )
    if problems:
        text = "NOT VALIDATED: " + "; ".join(problems)
        if err <= target:  # the error passed: say so, after the failure
            text += f" (held-out error up to {err:.1f} %, within the {target:g} % target)"
    else:
        text = f"validated: held-out error up to {err:.1f} % <= {target:g} % target"
        if n_points is not None:
            text += f" on {n_points} held-out point{'s' if n_points != 1 else ''}"
            text += (
                f" for {n_parameters} fitted parameters"
                if n_parameters is not None
                else " (number of fitted parameters not given)"
            )
    return {"validated": not problems, "problems": problems, "text": text}


@dataclass
class Validation:
    """Predicted vs measured for the configurations left out of the fit (rows: workers,
    n_samples, ..., measured = median train_seconds over repeats, predicted, error_pct).

    ``within_target``: every held-out error within target_pct; ``validated``: that, and at
    least as many held-out configurations as fitted parameters (``validation_verdict``)."""

    holdout: str
    rows: list
    fit: FittedModel
    target_pct: float = TARGET_ERROR_PCT

    @property
    def max_abs_error_pct(self) -> float:
        return max(abs(r["error_pct"]) for r in self.rows)

    @property
    def within_target(self) -> bool:
        return self.max_abs_error_pct <= self.target_pct

    @property
    def n_points(self) -> int:
        """Held-out configurations (each the median over its repeats)."""
        return len(self.rows)

    def verdict(self) -> dict:
        """``validation_verdict`` of this check: validated or not, and the line that says so."""
        return validation_verdict(
            self.max_abs_error_pct, self.target_pct, self.n_points, self.fit.n_fitted_parameters
        )

    @property
    def validated(self) -> bool:
        return self.verdict()["validated"]

    def to_rows(self) -> list[dict]:
        return plain(self.rows)

    def to_dict(self) -> dict:
        verdict = self.verdict()
        return plain(
            {
                "holdout": self.holdout,
                "target_pct": self.target_pct,
                "max_abs_error_pct": self.max_abs_error_pct,
                "within_target": self.within_target,
                "n_points": self.n_points,
                "n_fitted_parameters": self.fit.n_fitted_parameters,
                "validated": verdict["validated"],
                "verdict": verdict["text"],
                "rows": self.to_rows(),
                "fit": self.fit.to_dict(),
            }
        )


def validate(
    runs, holdout="n_samples", *, target_pct: float = TARGET_ERROR_PCT, **fit_kwargs
) -> Validation:
    """Fit on some runs and predict the configurations left out.

    holdout: 'n_samples' (leave out the largest data set), 'workers' (the largest worker
    count: the stronger test, an extrapolation in p; it needs three or more worker counts,
    and for the ring four, or a known alpha=...), or a callable run -> bool marking the runs
    to leave out. fit_kwargs go to fit."""
    target = _nonneg("target_pct", target_pct)
    raw = _run_list(runs)
    parsed_all = _parse_runs(raw, fit_kwargs.get("native_algorithm", "ring"))
    if holdout in ("workers", "n_samples"):
        top = max(getattr(r, holdout) for r in parsed_all)
        out = [getattr(r, holdout) == top for r in parsed_all]
        label = f"{holdout}={top}"
    elif callable(holdout):
        out = [bool(holdout(run)) for run in raw]
        label = getattr(holdout, "__name__", "callable")
    else:
        raise ValueError(
            f"holdout is {holdout!r}, expected 'workers', 'n_samples' or a callable run -> bool"
        )
    if not any(out):
        raise ValueError(f"holdout {label!r} leaves no run out: nothing to validate")
    if all(out):
        raise ValueError(f"holdout {label!r} leaves every run out: nothing to fit")
    model = fit([run for run, o in zip(raw, out) if not o], **fit_kwargs)
    groups: dict = {}
    for r, o in zip(parsed_all, out):
        if o:
            groups.setdefault(r.config, []).append(r)
    rows = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[4])):
        members = groups[key]
        measured = float(np.median([r.train_seconds for r in members]))
        pred = model.predict_run(members[0])
        rows.append(
            {
                "workers": key[0],
                "n_samples": key[1],
                "batch_size": key[2],
                "epochs": key[3],
                "allreduce": key[4],
                "repeats": len(members),
                "measured": measured,
                "predicted": pred.seconds,
                "error_pct": 100.0 * (pred.seconds - measured) / measured,
                "measured_phases": {
                    ph: float(np.median([r.phases[ph] for r in members])) for ph in PHASES
                },
                "predicted_phases": pred.phases,
            }
        )
    return Validation(label, rows, model, target)
