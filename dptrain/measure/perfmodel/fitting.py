"""The fit: every coefficient of the model at once by non-negative least squares on a sweep's
runs (``fit``), the fitted model (``FittedModel``) and what it predicts (``Prediction``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..._plain import plain
from .checks import _nonneg, _nonneg_int, _positive_int
from .costs import (
    DEFAULT_GAMMA,
    Network,
    _check_algorithm,
    _terms,
    allreduce_coefficients,
    expected_max_normal,
    get_network,
)
from .local import local_sgd_phases
from .runs import _SAME, _medians, _parse_runs, _Run, _run_list, _work

WORK_PHASES = ("data", "compute", "update", "other")  # per-sample + per-step coefficients


def _nnls(a: np.ndarray, y: np.ndarray, max_iter: int = 500) -> np.ndarray:
    """min ||a x - y|| subject to x >= 0 (Lawson and Hanson's active-set method, 1974)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0))) * max(a.shape)
    for _ in range(max_iter):
        w = a.T @ (y - a @ x)
        candidates = ~passive & (w > tol)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, w, -np.inf))] = True
        while True:
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (s[passive] > 0).all():
                break
            bad = passive & (s <= 0)
            step = np.min(x[bad] / (x[bad] - s[bad]))
            x = x + step * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = s
    return x


# ------------------------------------------------------------------ the fit
def _param_names() -> list[str]:
    names = []
    for ph in WORK_PHASES:
        names += [f"{ph}_per_sample", f"{ph}_per_step"]
    return names + ["alpha", "beta", "sigma"]


_MEANING = {
    "per_sample": (
        "s/sample",
        "seconds of the {} phase per sample a worker processes (shrinks as 1/p)",
    ),
    "per_step": ("s/step", "seconds of the {} phase per step whatever p is (serial)"),
    "alpha": ("s", "latency per message of the measured transport (effective)"),
    "beta": ("s/byte", "time per byte of the measured transport, summing included"),
    "sigma": (
        "s/step",
        "standard deviation of a worker's arrival time per step; the wait "
        "is sigma * E[max of p normals]",
    ),
}


def _design(runs: Sequence[_Run], fixed_alpha: float | None):
    """Weighted rows (one per run and measured quantity) of y = A theta, theta as
    _param_names(); with a fixed alpha its column moves into y."""
    names = _param_names()
    col = {nm: j for j, nm in enumerate(names)}
    rows, ys, what = [], [], []
    for r in runs:
        w = 1.0 / r.train_seconds  # every run counts in relative error
        na, nb, _ = allreduce_coefficients(r.algorithm, r.workers)
        comm = np.zeros(len(names))
        comm[col["alpha"]] = r.steps * r.calls_per_step * na
        comm[col["beta"]] = r.steps * nb * r.param_bytes
        for ph in WORK_PHASES:
            row = np.zeros(len(names))
            row[col[f"{ph}_per_sample"]] = r.mean_work
            row[col[f"{ph}_per_step"]] = r.steps
            y = r.phases[ph]
            if ph == "update" and r.algorithm == "ps":
                row += comm
                y += r.phases["communication"]
            rows.append(row * w)
            ys.append(y * w)
            what.append((r.index, ph))
        if r.algorithm != "ps":
            rows.append(comm * w)
            ys.append(r.phases["communication"] * w)
            what.append((r.index, "communication"))
        row = np.zeros(len(names))
        row[col["sigma"]] = r.steps * expected_max_normal(r.workers)
        for ph in WORK_PHASES:
            row[col[f"{ph}_per_sample"]] = r.busiest_work - r.mean_work
        rows.append(row * w)
        ys.append(r.phases["sync_wait"] * w)
        what.append((r.index, "sync_wait"))
    a, y = np.array(rows), np.array(ys)
    if fixed_alpha is not None:
        y = y - a[:, col["alpha"]] * fixed_alpha
        a = np.delete(a, col["alpha"], axis=1)
        names = [nm for nm in names if nm != "alpha"]
    return a, y, names


def _check_identifiable(runs: Sequence[_Run], fixed_alpha):
    per_step = {r.batch_size / r.workers for r in runs}
    if len(per_step) < 2:
        raise ValueError(
            f"too few distinct configurations to fit: every run has "
            f"{next(iter(per_step)):g} samples per worker per step (batch_size / workers); "
            f"per-sample work and per-step serial work need runs at two or more worker "
            f"counts (or batch sizes)"
        )
    multi = [r for r in runs if r.workers > 1]
    if not multi:
        raise ValueError(
            "too few distinct configurations to fit: every run has workers=1, "
            "so nothing measures communication or synchronization; add runs "
            "with 2 or more workers"
        )
    if fixed_alpha is None:
        shapes = set()
        for r in multi:
            na, nb, _ = allreduce_coefficients(r.algorithm, r.workers)
            shapes.add(
                round(r.calls_per_step * na / (nb * r.param_bytes), 9)
                if nb * r.param_bytes > 0
                else math.inf
            )
        if len(shapes) < 2:
            confs = sorted(
                {(r.workers, r.algorithm, r.param_bytes, r.calls_per_step) for r in multi}
            )
            raise ValueError(
                f"too few distinct configurations to fit: latency (alpha) and bandwidth "
                f"(beta) of the transport cannot be told apart from the multi-worker "
                f"configurations (workers, algorithm, param_bytes, calls per step) {confs}; "
                f"the ring needs two worker counts above 1, the tree two bucket sizes, the "
                f"parameter server runs with another algorithm; or pass a known alpha=..., "
                f"e.g. NETWORKS['shared memory'].alpha"
            )


def fit(runs, *, native_algorithm: str = "ring", alpha: float | None = None) -> "FittedModel":
    """Fit the model (module docstring) to a sweep's RUN rows (a list of dicts, or the sweep
    dict holding them). The runs must share model, dataset, backend, dtype and threads.

    native_algorithm: the alpha-beta form used for runs with allreduce='native'.
    alpha: a known latency (s) of the transport; only beta is then fitted.
    Raises ValueError on bad runs and when the runs cannot identify every parameter."""
    fixed = None if alpha is None else _nonneg("alpha", alpha)
    runs = _run_list(runs)
    parsed = _parse_runs(runs, native_algorithm)
    _check_identifiable(parsed, fixed)
    configs = _medians(parsed)
    a, y, names = _design(configs, fixed)
    scale = np.linalg.norm(a, axis=0)
    if (scale == 0).any() or np.linalg.matrix_rank(a / scale) < a.shape[1]:
        raise ValueError(
            "too few distinct configurations to fit: the runs do not determine "
            f"every parameter of {names}"
        )
    theta = _nnls(a / scale, y) / scale
    values = dict(zip(names, (float(v) for v in theta)))
    if fixed is not None:
        values["alpha"] = fixed
    first = runs[0]
    ref = max(parsed, key=lambda r: (r.n_samples, r.workers))
    counts: dict = {}
    for r in parsed:
        counts[r.algorithm] = counts.get(r.algorithm, 0) + (r.workers > 1)
    model = FittedModel(
        coefficients={
            nm: values[nm] for nm in _param_names() if nm not in ("alpha", "beta", "sigma")
        },
        alpha=values["alpha"],
        beta=values["beta"],
        sigma=values["sigma"],
        alpha_fixed=fixed is not None,
        native_algorithm=native_algorithm,
        algorithm=max(counts, key=counts.get),
        batch_size=ref.batch_size,
        epochs=ref.epochs,
        n_samples=ref.n_samples,
        param_bytes=ref.param_bytes,
        calls_per_step=ref.calls_per_step,
        labels={k: first.get(k) for k in _SAME},
        n_runs=len(parsed),
        n_configurations=len(configs),
        workers_fitted=sorted({r.workers for r in parsed}),
        n_samples_fitted=sorted({r.n_samples for r in parsed}),
    )
    rel = [(model.predict_run(r).seconds - r.train_seconds) / r.train_seconds for r in configs]
    model.fit_rms_error_pct = float(100.0 * np.sqrt(np.mean(np.square(rel))))
    return model


@dataclass
class Prediction:
    """Predicted seconds of one run, its breakdown and the configuration it is for.

    phases: the PHASES (a parameter server's broadcast counted in communication; local SGD's
    averages in average);
    breakdown: parallel_work (t_sample b / p per step, the part that shrinks), serial
    (t_serial per step), communication, sync_wait (jitter and uneven shards)."""

    seconds: float
    phases: dict
    breakdown: dict
    config: dict

    def to_dict(self) -> dict:
        return {
            "seconds": self.seconds,
            "phases": dict(self.phases),
            "breakdown": dict(self.breakdown),
            "config": dict(self.config),
        }


@dataclass
class FittedModel:
    """The fitted parameters (see ``parameters()`` for each one's meaning and unit), the
    reference configuration of the sweep (its largest data set), and ``predict``."""

    coefficients: dict
    alpha: float
    beta: float
    sigma: float
    alpha_fixed: bool
    native_algorithm: str
    algorithm: str
    batch_size: int
    epochs: int
    n_samples: int
    param_bytes: float
    calls_per_step: float
    labels: dict
    n_runs: int
    n_configurations: int
    workers_fitted: list
    n_samples_fitted: list
    fit_rms_error_pct: float = float("nan")

    @property
    def n_fitted_parameters(self) -> int:
        """How many parameters the fit estimated: the per-sample and per-step coefficients,
        beta and sigma, and alpha unless it was given."""
        return len(self.coefficients) + 2 + (not self.alpha_fixed)

    @property
    def t_sample(self) -> float:
        """Seconds of work per sample (sum of the phases' per-sample coefficients)."""
        return sum(self.coefficients[f"{ph}_per_sample"] for ph in WORK_PHASES)

    @property
    def t_serial(self) -> float:
        """Seconds per step that do not shrink with p (sum of the per-step coefficients)."""
        return sum(self.coefficients[f"{ph}_per_step"] for ph in WORK_PHASES)

    def serial_fraction_at(self, batch_size: int) -> float:
        """Amdahl's serial fraction of a one-worker step of ``batch_size`` samples."""
        b = _positive_int("batch_size", batch_size)
        total = self.t_serial + self.t_sample * b
        return self.t_serial / total if total > 0 else 0.0

    @property
    def serial_fraction(self) -> float:
        """Amdahl's serial fraction at the sweep's batch size: speedup <= 1 / f."""
        return self.serial_fraction_at(self.batch_size)

    @property
    def network(self) -> Network:
        """The measured transport as a Network (its beta includes summing)."""
        bw = math.inf if self.beta == 0 else 1.0 / self.beta
        return Network(f"fitted ({self.labels.get('backend') or 'measured'})", self.alpha, bw)

    def link(self, network=None, gamma: float | None = None) -> tuple[Network, float]:
        """(the link, gamma) a prediction uses: network=None is the measured transport, with
        gamma 0 unless given (its beta includes summing); a Network or preset name is that
        link, with gamma DEFAULT_GAMMA unless given."""
        if network is None:
            return self.network, 0.0 if gamma is None else _nonneg("gamma", gamma)
        return get_network(network), DEFAULT_GAMMA if gamma is None else _nonneg("gamma", gamma)

    def predict(
        self,
        workers: int,
        n_samples: int | None = None,
        *,
        batch_size: int | None = None,
        epochs: int | None = None,
        param_bytes: float | None = None,
        calls_per_step: float | None = None,
        algorithm: str | None = None,
        network=None,
        gamma: float | None = None,
        ranks_per_node: int | None = None,
        node_network="shared memory",
        sync_every: int = 1,
        local_after: int = 0,
        averaged_arrays: int = 2,
    ) -> Prediction:
        """Predicted seconds of a run of ``n_samples`` (default: the sweep's largest) on
        ``workers``. Unset arguments take the sweep's values; network=None is the measured
        transport (gamma then 0: its beta includes summing), a Network or preset name uses
        that link with gamma (default DEFAULT_GAMMA) for the sums. ranks_per_node > 1: the
        hierarchical all-reduce (hierarchical_allreduce_seconds) on nodes of that many ranks
        linked inside by node_network.

        sync_every H > 1: local SGD (one replica per worker) after local_after synchronous
        epochs, averaging averaged_arrays arrays of param_bytes each (``local_sgd_phases``:
        the exchange falls as 1 / H, the wait as 1 / sqrt(H))."""
        p = _positive_int("workers", workers)
        period = _positive_int("sync_every", sync_every)
        synchronous_epochs = _nonneg_int("local_after", local_after)
        arrays = _positive_int("averaged_arrays", averaged_arrays)
        n = self.n_samples if n_samples is None else _positive_int("n_samples", n_samples)
        b = self.batch_size if batch_size is None else _positive_int("batch_size", batch_size)
        e = self.epochs if epochs is None else _positive_int("epochs", epochs)
        m = self.param_bytes if param_bytes is None else _nonneg("param_bytes", param_bytes)
        cps = (
            self.calls_per_step
            if calls_per_step is None
            else _nonneg("calls_per_step", calls_per_step)
        )
        alg = self.algorithm if algorithm is None else algorithm
        _check_algorithm(alg)
        if period > 1 and alg == "ps":
            raise ValueError(
                "sync_every > 1 (local SGD) averages with an all-reduce: the parameter "
                "server's algorithm 'ps' has no local SGD"
            )
        net, g = self.link(network, gamma)
        steps, mean, busiest = _work(n, b, e, p)
        if ranks_per_node is not None and alg == "ps":
            raise ValueError(
                "ranks_per_node: the hierarchical all-reduce has no parameter-"
                "server form; use algorithm 'ring' or 'tree'"
            )
        latency, volume = _terms(alg, p, m, net, g, ranks_per_node, node_network)
        calls = 1.0 if alg == "ps" else cps
        c = self.coefficients
        phases = {
            ph: c[f"{ph}_per_sample"] * mean + c[f"{ph}_per_step"] * steps for ph in WORK_PHASES
        }
        uneven = self.t_sample * (busiest - mean)  # the bigger shards: never averages out
        # local SGD's averages all-reduce each array in one call, bucketed or not
        phases["communication"] = steps * ((calls if period == 1 else 1.0) * latency + volume)
        phases["sync_wait"] = steps * self.sigma * expected_max_normal(p) + uneven
        phases = local_sgd_phases(
            phases,
            steps_per_epoch=steps // e,
            epochs=e,
            sync_every=period,
            local_after=synchronous_epochs,
            averaged_arrays=arrays,
            uneven_wait=uneven,
        )
        comm = phases["communication"] + phases["average"]
        breakdown = {
            "parallel_work": self.t_sample * mean,
            "serial": self.t_serial * steps,
            "communication": comm,
            "sync_wait": phases["sync_wait"],
        }
        config = {
            "workers": p,
            "n_samples": n,
            "batch_size": b,
            "epochs": e,
            "steps": steps,
            "param_bytes": m,
            "calls_per_step": calls,
            "algorithm": alg,
            "network": net.name,
            "gamma": g,
            "ranks_per_node": ranks_per_node,
            "sync_every": period,
            "local_after": synchronous_epochs,
        }
        return Prediction(
            float(sum(phases.values())), phases, {k: float(v) for k, v in breakdown.items()}, config
        )

    def predict_run(self, run) -> Prediction:
        """The prediction for the configuration of one RUN (dict) on the measured transport."""
        r = run if isinstance(run, _Run) else _parse_runs([run], self.native_algorithm)[0]
        return self.predict(
            r.workers,
            r.n_samples,
            batch_size=r.batch_size,
            epochs=r.epochs,
            param_bytes=r.param_bytes,
            calls_per_step=r.calls_per_step,
            algorithm=r.algorithm,
        )

    def parameters(self) -> list[dict]:
        """Every fitted parameter: {name, value, unit, meaning}, then the derived ones."""
        rows = []
        for nm, v in self.coefficients.items():
            ph, kind = nm.split("_per_")
            unit, text = _MEANING["per_" + kind]
            rows.append({"name": nm, "value": v, "unit": unit, "meaning": text.format(ph)})
        for nm in ("alpha", "beta", "sigma"):
            unit, text = _MEANING[nm]
            if nm == "alpha" and self.alpha_fixed:
                text += " (given, not fitted)"
            rows.append({"name": nm, "value": getattr(self, nm), "unit": unit, "meaning": text})
        rows += [
            {
                "name": "t_sample",
                "value": self.t_sample,
                "unit": "s/sample",
                "meaning": "per-sample work, all phases (T_comp = t_sample * samples)",
            },
            {
                "name": "t_serial",
                "value": self.t_serial,
                "unit": "s/step",
                "meaning": "serial work per step, all phases",
            },
            {
                "name": "serial_fraction",
                "value": self.serial_fraction,
                "unit": "1",
                "meaning": f"Amdahl serial fraction of a 1-worker step of {self.batch_size} "
                f"samples (speedup <= 1 / f)",
            },
        ]
        return rows

    def to_dict(self) -> dict:
        return plain(
            {
                "parameters": self.parameters(),
                "alpha_fixed": self.alpha_fixed,
                "algorithm": self.algorithm,
                "native_algorithm": self.native_algorithm,
                "reference": {
                    "n_samples": self.n_samples,
                    "batch_size": self.batch_size,
                    "epochs": self.epochs,
                    "param_bytes": self.param_bytes,
                    "calls_per_step": self.calls_per_step,
                },
                "labels": self.labels,
                "n_runs": self.n_runs,
                "n_configurations": self.n_configurations,
                "n_fitted_parameters": self.n_fitted_parameters,
                "workers_fitted": self.workers_fitted,
                "n_samples_fitted": self.n_samples_fitted,
                "fit_rms_error_pct": self.fit_rms_error_pct,
                "network": self.network.to_dict(),
            }
        )
