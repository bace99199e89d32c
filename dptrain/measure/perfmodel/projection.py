"""What the fitted model says about configurations never run: speedup and efficiency on
other networks and worker counts (``project``), the smallest batch at which p workers pay
(``break_even_samples``), and all of it with the fit and its check at once (``analyze``)."""

from __future__ import annotations

import math
from typing import Sequence

from ..._plain import plain
from .checks import _nonneg, _positive_int
from .costs import (
    ALGORITHMS,
    DEFAULT_GAMMA,
    NETWORKS,
    Network,
    _check_algorithm,
    allreduce_coefficients,
    expected_max_normal,
    get_network,
)
from .fitting import FittedModel, fit
from .validation import validate

DEFAULT_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _networks(networks) -> list[Network]:
    if networks is None:
        return list(NETWORKS.values())
    if isinstance(networks, (str, Network)):
        networks = [networks]
    nets = [get_network(n) for n in networks]
    if not nets:
        raise ValueError("networks is empty: name at least one network")
    return nets


def project(
    model: FittedModel,
    workers: Sequence[int] = DEFAULT_WORKERS,
    networks=None,
    algorithms: Sequence[str] = ALGORITHMS,
    *,
    n_samples: int | None = None,
    batch_size: int | None = None,
    gamma: float = DEFAULT_GAMMA,
    ranks_per_node: int | None = None,
) -> list[dict]:
    """Predicted time, speedup T_1 / T_p and efficiency speedup / p of the fitted workload on
    each network (names or Networks; default every preset) with each all-reduce algorithm.
    The baseline T_1 is the model's one worker (no communication). Rows: network, algorithm,
    workers, n_samples, batch_size, seconds, speedup, efficiency and the breakdown.
    ranks_per_node > 1 adds, after each network's flat rows, the hierarchical all-reduce
    (algorithm 'hier-ring', 'hier-tree': the ring or tree between nodes of that many ranks;
    row field ranks_per_node) for the ring and the tree asked for."""
    if not isinstance(model, FittedModel):
        raise ValueError(f"model is a {type(model).__name__}, expected a FittedModel from fit")
    ps = [_positive_int("workers", p) for p in workers]
    if not ps:
        raise ValueError("workers is empty: give at least one worker count")
    if isinstance(algorithms, str):
        algorithms = [algorithms]
    for alg in algorithms:
        _check_algorithm(alg)
    if ranks_per_node is not None:
        ranks_per_node = _positive_int("ranks_per_node", ranks_per_node)
    layouts = [(alg, None) for alg in algorithms]
    if ranks_per_node and ranks_per_node > 1:
        layouts += [(alg, ranks_per_node) for alg in algorithms if alg != "ps"]
    rows = []
    for net in _networks(networks):
        for alg, rpn in layouts:
            base = model.predict(
                1, n_samples, batch_size=batch_size, algorithm=alg, network=net, gamma=gamma
            )
            for p in ps:
                pr = model.predict(
                    p,
                    n_samples,
                    batch_size=batch_size,
                    algorithm=alg,
                    network=net,
                    gamma=gamma,
                    ranks_per_node=rpn,
                )
                speedup = base.seconds / pr.seconds if pr.seconds > 0 else math.inf
                rows.append(
                    {
                        "network": net.name,
                        "algorithm": f"hier-{alg}" if rpn else alg,
                        "ranks_per_node": rpn,
                        "workers": p,
                        "n_samples": pr.config["n_samples"],
                        "batch_size": pr.config["batch_size"],
                        "seconds": pr.seconds,
                        "speedup": speedup,
                        "efficiency": speedup / p,
                        "communication_seconds": pr.breakdown["communication"],
                        "sync_seconds": pr.breakdown["sync_wait"],
                        "serial_seconds": pr.breakdown["serial"],
                        "parallel_seconds": pr.breakdown["parallel_work"],
                    }
                )
    return plain(rows)


def break_even_samples(
    model: FittedModel,
    workers: int,
    network=None,
    algorithm: str | None = None,
    *,
    gamma: float | None = None,
    param_bytes: float | None = None,
    calls_per_step: float | None = None,
) -> float:
    """The smallest number of samples per synchronous step at which ``workers`` beat one
    worker (speedup > 1); with fewer, adding workers does not pay. math.inf if never.

    This is the data-set size for full-batch training (one step per pass over the data,
    batch_size = n). For mini-batch training with a fixed global batch, the data-set size
    only multiplies the number of steps and leaves the speedup unchanged: adding workers pays
    exactly when the global batch is at least this size.

    Solved from the model: one step on p workers beats one worker when
    t_sample (b - ceil(b / p)) > T_comm(p, M) + sigma e(p) (t_serial is the same on both
    sides); b - ceil(b / p) = floor(b (p - 1) / p) grows with b, so the smallest such b is
    ceil(k p / (p - 1)) with k the smallest integer above (T_comm + sigma e(p)) / t_sample."""
    if not isinstance(model, FittedModel):
        raise ValueError(f"model is a {type(model).__name__}, expected a FittedModel from fit")
    p = _positive_int("workers", workers)
    if p < 2:
        raise ValueError(
            f"workers is {p}, expected 2 or more (the break-even compares p workers with one)"
        )
    alg = model.algorithm if algorithm is None else algorithm
    _check_algorithm(alg)
    net, g = model.link(network, gamma)
    m = model.param_bytes if param_bytes is None else _nonneg("param_bytes", param_bytes)
    cps = (
        model.calls_per_step
        if calls_per_step is None
        else _nonneg("calls_per_step", calls_per_step)
    )
    na, nb, ng = allreduce_coefficients(alg, p)
    calls = 1.0 if alg == "ps" else cps
    cost = (
        calls * na * net.alpha
        + nb * m * net.beta
        + ng * m * g
        + model.sigma * expected_max_normal(p)
    )
    if model.t_sample <= 0:
        return math.inf
    k = math.floor(cost / model.t_sample) + 1
    b = math.ceil(k * p / (p - 1))
    # guard the floating-point edges of the closed form against the exact condition
    while b > 1 and model.t_sample * ((b - 1) - -(-(b - 1) // p)) > cost:
        b -= 1
    while not model.t_sample * (b - -(-b // p)) > cost:
        b += 1
    return b


# ------------------------------------------------------------------ everything at once
def analyze(
    runs,
    *,
    holdout="n_samples",
    workers: Sequence[int] = DEFAULT_WORKERS,
    networks=None,
    algorithms: Sequence[str] = ALGORITHMS,
    gamma: float = DEFAULT_GAMMA,
    ranks_per_node: int | None = None,
    **fit_kwargs,
) -> dict:
    """Fit on all runs, validate with ``holdout`` (None to skip), project (ranks_per_node:
    also the hierarchical all-reduce on nodes of that many ranks), and compute the
    break-even per network, algorithm and worker count: one JSON-ready dict for the plots
    and the report."""
    model = fit(runs, **fit_kwargs)
    out = {"fit": model.to_dict()}
    if holdout is not None:
        out["validation"] = validate(runs, holdout, **fit_kwargs).to_dict()
    out["projection"] = project(
        model, workers, networks, algorithms, gamma=gamma, ranks_per_node=ranks_per_node
    )
    out["break_even"] = [
        {
            "network": net.name,
            "algorithm": alg,
            "workers": p,
            "samples_per_step": break_even_samples(model, p, net, alg, gamma=gamma),
        }
        for net in _networks(networks)
        for alg in algorithms
        for p in workers
        if p > 1
    ]
    return plain(out)
