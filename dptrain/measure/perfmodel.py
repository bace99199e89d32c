"""The performance model: fitted from a sweep, checked on runs left out, projected to clusters.

One run of synchronous data-parallel SGD (p workers, n samples, E epochs, global batch b,
a gradient of M bytes) is modelled as S = E * ceil(n / b) identical steps:

    T_p = S * (t_sample * b / p + t_serial + T_comm(p, M) + T_sync(p))

- t_sample: seconds of per-sample work (forward + backward, and gathering the sample). Each
  worker does its shard of every global batch, so this part shrinks as 1 / p.
- t_serial: seconds per step that every worker spends whatever p is (the optimizer update of
  the whole model, per-call overheads, the rest of the loop). It is Amdahl's serial part: the
  serial fraction at one worker is t_serial / (t_serial + t_sample * b).
- T_comm(p, M): one gradient all-reduce in the alpha-beta model (``allreduce_seconds``).
- T_sync(p): waiting for the slowest worker (see "Synchronization" below).

What the data identifies, and from which column of the sweep's RUN rows (sweep_schema.md):
each measured phase is a total over the run, so each is a sum of regressors we know exactly
(steps, samples per worker, the algorithm's message and byte counts) times an unknown
coefficient, and all coefficients are fitted at once by non-negative least squares:

- data, compute, update, other: a per-sample coefficient (x samples per worker, E n / p) plus
  a per-step coefficient (x steps). Both are needed per phase: gathering a batch shrinks with
  p, a Python call per step does not. t_sample and t_serial are the sums over these phases.
  Separating them needs runs with at least two values of samples per worker per step (two
  worker counts, or two batch sizes).
- communication: alpha and beta of the measured transport, as effective per-message latency
  and per-byte time of the all-reduce the runs used (their ``allreduce`` field; the
  shared-memory and MPI 'native' all-reduces are reduce-scatter + all-gather, so they are
  modelled as ``native_algorithm='ring'`` unless told otherwise). For the ring, latency and
  bandwidth are told apart by two worker counts above 1; for the tree, whose message and byte
  counts grow alike, by two bucket sizes; the parameter server's (one message per gradient)
  only together with runs of another algorithm. The cost of summing (gamma) is collinear with beta
  for one algorithm, so the fitted beta includes it. With too few configurations, pass a known
  ``alpha`` (e.g. ``NETWORKS["shared memory"].alpha``) and only beta is fitted.
- parameter server: the training loop updates on rank 0 and then broadcasts the parameters
  inside its update phase, so for 'ps' runs communication + update are fitted as one sum
  (the PS cost plus the update's own coefficients): this holds wherever the sweep puts the
  broadcast.
- repeats: each configuration's repeats are reduced to their median phases first (see
  ``_medians``), and every configuration weighs the same in relative error.
- sync_wait: sigma (below), plus the load imbalance of uneven shards, which is known from the
  per-sample coefficients: a worker with ceil(b / p) samples is t_sample later than one with
  b / p on average.

Synchronization: at each collective every worker waits for the last to arrive, and the phases
are means over ranks, so the measured wait per step is E[max of arrivals] - E[mean of
arrivals]. With i.i.d. Gaussian jitter of standard deviation sigma per step this is
sigma * e(p), e(p) = E[max of p standard normals] (``expected_max_normal``): exactly 0 at p = 1,
1 / sqrt(pi) at p = 2, growing like sqrt(2 ln p) for large p. We use the exact e(p) rather
than its asymptote sqrt(2 ln p), which is 2x too large at p = 2 and would bias sigma (and
then every projection) from the small worker counts a sweep has. One parameter, physical
shape, zero where there is no one to wait for.

Validation: ``validate`` fits on some runs and predicts the configurations left out.
``validation_verdict`` calls that a validation only when every held-out prediction is within
the target (15 %) and there are at least as many held-out configurations as the fit has
parameters (11, or 10 with a known alpha); ``dptrain.plots`` and ``python -m dptrain plot``
print its line and draw a projection from a model that fails it as "NOT VALIDATED ...
projection shown for illustration only".

What is left out on purpose: overlap of communication with the backward pass (the measured
communication phase is what the overlap did not hide, and is fitted as such), contention
between workers that share a host's memory bandwidth or time-share cores (filter out runs
with more workers than cores, or they will show as fit errors), network congestion, and
per-run fixed costs (the sweep's train_seconds excludes start-up). Everything here is plain
Python + NumPy; every object has a JSON-ready ``to_dict``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from .._plain import plain
from ..comm.algorithms import ALGORITHMS as EXCHANGE_ALGORITHMS
from .timing import PHASES

__all__ = ["PHASES", "ALGORITHMS", "Network", "NETWORKS", "DEFAULT_GAMMA", "TARGET_ERROR_PCT",
           "get_network", "allreduce_coefficients", "allreduce_seconds", "HIERARCHICAL",
           "hierarchical_allreduce_seconds",
           "expected_max_normal", "DEFAULT_WORKERS", "FittedModel", "Prediction", "Validation",
           "fit", "validate", "validation_verdict", "project", "break_even_samples", "analyze",
           "load_runs"]

# the algorithms of a network between machines ('native' is a transport's own, not modeled)
ALGORITHMS = tuple(a for a in EXCHANGE_ALGORITHMS if a != "native")
WORK_PHASES = ("data", "compute", "update", "other")   # per-sample + per-step coefficients
DEFAULT_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TARGET_ERROR_PCT = 15.0

# Reduction cost per byte (gamma) on the host that sums: numpy float32 a += b over the MLP's
# 0.94 MB gradient took 0.028 ns/B (in cache; 0.057 ns/B for 16 MB from DRAM), median of 200
# calls on the 2-core EPYC VM the benchmarks run on.
DEFAULT_GAMMA = 3e-11


# ------------------------------------------------------------------ input checks
def _number(name, value, inf=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} is {value!r}, expected a number")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not inf):
        raise ValueError(f"{name} is {value!r}, expected a finite number")
    return v


def _nonneg(name, value) -> float:
    v = _number(name, value)
    if v < 0:
        raise ValueError(f"{name} is {value!r}, expected a number >= 0")
    return v


def _positive_int(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer() and value >= 1:
            return int(value)
        raise ValueError(f"{name} is {value!r}, expected a positive integer")
    if value < 1:
        raise ValueError(f"{name} is {value!r}, expected a positive integer")
    return int(value)


def _check_algorithm(algorithm):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm is {algorithm!r}, expected one of {ALGORITHMS}")


# ------------------------------------------------------------------ networks
@dataclass(frozen=True)
class Network:
    """A link between workers: per-message latency ``alpha`` (s) and ``bandwidth`` (bytes/s).

    beta = 1 / bandwidth is the time per byte; bandwidth may be math.inf (beta = 0)."""

    name: str
    alpha: float
    bandwidth: float

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"network name must be a non-empty string, got {self.name!r}")
        a, bw = _number("alpha", self.alpha), _number("bandwidth", self.bandwidth, inf=True)
        if a < 0 or math.isinf(a):
            raise ValueError(f"network {self.name!r}: alpha is {a!r} s, expected a finite "
                             f"latency >= 0")
        if not bw > 0:
            raise ValueError(f"network {self.name!r}: bandwidth is {bw!r} bytes/s, expected > 0")
        object.__setattr__(self, "alpha", a)
        object.__setattr__(self, "bandwidth", bw)

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 0.0 if math.isinf(self.bandwidth) else 1.0 / self.bandwidth

    def to_dict(self) -> dict:
        return {"name": self.name, "alpha_s": self.alpha, "beta_s_per_byte": self.beta,
                "bandwidth_bytes_per_s": None if math.isinf(self.bandwidth) else self.bandwidth}


# Nominal figures, to the order of magnitude: bandwidths are line rates (what MPI achieves is
# typically 85-95 % of them); latencies are per-message MPI latencies: tens of microseconds
# through the kernel's TCP stack on Ethernet, about a microsecond over EDR InfiniBand verbs.
# Pass your own Network(...) for a cluster you have measured.
# "shared memory" is fitted from our measurements: bench/bench_allreduce.py, 2 processes over
# multiprocessing.shared_memory, p50 of 64 B .. 16 MB (bench/results/allreduce.json, commit
# 85d9054), least squares in relative error of 2 alpha + M beta + M gamma / 2 (the ring form
# at p = 2) with gamma = DEFAULT_GAMMA: within 10 % from 64 B to 1 MB, 27 % under at 16 MB
# (out of cache).
NETWORKS = {net.name: net for net in (
    Network("10 GbE", alpha=20e-6, bandwidth=10e9 / 8),
    Network("25 GbE", alpha=10e-6, bandwidth=25e9 / 8),
    Network("100 Gb InfiniBand (EDR)", alpha=1.0e-6, bandwidth=100e9 / 8),
    Network("shared memory", alpha=0.17e-6, bandwidth=27.4e9),
)}


def get_network(network) -> Network:
    """A Network, or the preset of that name (see NETWORKS)."""
    if isinstance(network, Network):
        return network
    if isinstance(network, str):
        if network not in NETWORKS:
            raise ValueError(f"network is {network!r}, expected a Network or one of "
                             f"{sorted(NETWORKS)}")
        return NETWORKS[network]
    raise ValueError(f"network is {network!r}, expected a Network or one of {sorted(NETWORKS)}")


# ------------------------------------------------------------------ cost of one all-reduce
def allreduce_coefficients(algorithm: str, p: int) -> tuple[float, float, float]:
    """(n_alpha, n_beta, n_gamma): one all-reduce of M bytes over p workers costs
    n_alpha alpha + n_beta M beta + n_gamma M gamma on its critical path.

    - ring (reduce-scatter + all-gather): 2 (p - 1) messages of M / p each;
      (p - 1) / p M summed per worker.
    - tree (recursive doubling, as dptrain.collectives.tree_allreduce does it): with
      q = floor(log2 p), q rounds exchanging (and summing) all M. When p is not a power of
      two the extra ranks first fold into partners (one message of M, one sum) and get the
      result back at the end (one message of M): q + 2 messages, q + 1 sums. (ceil(log2 p)
      rounds plus the fold would count one round twice: p = 3 is fold, 1 round, unfold.)
    - ps (a flat parameter server): the root receives p - 1 gradients one after another
      through its single link, sums them, then sends the parameters to p - 1 workers:
      2 (p - 1) messages of M and (p - 1) M summed, all serialized on the root.
    """
    _check_algorithm(algorithm)
    p = _positive_int("p", p)
    if p == 1:
        return 0.0, 0.0, 0.0
    if algorithm == "ring":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p, (p - 1) / p
    if algorithm == "tree":
        q = p.bit_length() - 1
        if p == 1 << q:
            return float(q), float(q), float(q)
        return q + 2.0, q + 2.0, q + 1.0
    return 2.0 * (p - 1), 2.0 * (p - 1), float(p - 1)


def allreduce_seconds(algorithm: str, p: int, nbytes: float, network,
                      gamma: float = DEFAULT_GAMMA) -> float:
    """Seconds for one all-reduce of ``nbytes`` over ``p`` workers linked by ``network``
    (a Network or a preset name), with ``gamma`` seconds per byte summed (0 to leave the
    reduction out). p = 1 costs 0."""
    net = get_network(network)
    nbytes = _nonneg("nbytes", nbytes)
    gamma = _nonneg("gamma", gamma)
    na, nb, ng = allreduce_coefficients(algorithm, p)
    return na * net.alpha + nb * nbytes * net.beta + ng * nbytes * gamma


# ------------------------------------------------------------------ hierarchical all-reduce
# The all-reduce of dptrain's MPI backend (dptrain.comm.hier) on nodes of several ranks: the
# node's ranks sum over shared memory, one leader per node all-reduces between nodes by the
# flat algorithm, the node's ranks read the total. Projections name it "hier-" + algorithm.
HIERARCHICAL = ("hier-ring", "hier-tree")


def _terms(algorithm: str, p: int, nbytes: float, net: Network, gamma: float,
           ranks_per_node: int | None, node_network) -> tuple[float, float]:
    """(seconds of latency, seconds of bytes) of one all-reduce of nbytes over p workers:
    flat on net, or hierarchical with ranks_per_node ranks per node (see
    hierarchical_allreduce_seconds). The latency part is what buckets multiply."""
    m = 1 if not ranks_per_node else min(_positive_int("ranks_per_node", ranks_per_node), p)
    if m == 1:
        na, nb, ng = allreduce_coefficients(algorithm, p)
        return na * net.alpha, nb * nbytes * net.beta + ng * nbytes * gamma
    node = get_network(node_network)
    nodes = -(-p // m)
    if nodes == 1:                   # one node: the shared-memory all-reduce alone
        na, nb, ng = allreduce_coefficients("ring", m)
        return na * node.alpha, nb * nbytes * node.beta + ng * nbytes * gamma
    na, nb, ng = allreduce_coefficients(algorithm, nodes)
    # the node's sum: a barrier in and out, each rank sums its 1/m slice of the m arrays;
    # then the leaders; then a barrier and every rank copies the total out of shared memory
    latency = 3 * node.alpha + na * net.alpha
    volume = ((m - 1) / m * nbytes * (node.beta + gamma) + nbytes * node.beta
              + nb * nbytes * net.beta + ng * nbytes * gamma)
    return latency, volume


def hierarchical_allreduce_seconds(algorithm: str, p: int, nbytes: float, ranks_per_node: int,
                                   network, node_network="shared memory",
                                   gamma: float = DEFAULT_GAMMA) -> float:
    """Seconds for one hierarchical all-reduce of ``nbytes`` over ``p`` workers, nodes of
    ``ranks_per_node`` ranks (m) joined by ``network``, the ranks of a node by
    ``node_network`` (default the measured shared-memory preset):

        3 alpha_node + (m - 1) / m M (beta_node + gamma)     the node's sum, in shared memory
        + T_algorithm(ceil(p / m) nodes, M, network)          the leaders' all-reduce
        + M beta_node                                         every rank reads the total

    Only ceil(p / m) workers cross the network, each with the whole gradient: against the
    flat ring's 2 (p - 1) messages, 2 (p / m - 1). On one node it is the shared-memory
    all-reduce alone."""
    _check_algorithm(algorithm)
    p = _positive_int("p", p)
    nbytes = _nonneg("nbytes", nbytes)
    ranks_per_node = _positive_int("ranks_per_node", ranks_per_node)
    latency, volume = _terms(algorithm, p, nbytes, get_network(network), _nonneg("gamma", gamma),
                             ranks_per_node, node_network)
    return latency + volume


# ------------------------------------------------------------------ synchronization shape
@lru_cache(maxsize=None)
def _normal_grid():
    x = np.linspace(-12.0, 12.0, 24001)
    cdf = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    return x, cdf


@lru_cache(maxsize=4096)
def expected_max_normal(p: int) -> float:
    """E[max of p i.i.d. standard normals]: 0 at p = 1, 1/sqrt(pi) at 2, 3/(2 sqrt(pi)) at 3,
    ~sqrt(2 ln p) for large p. Integrated numerically: E[max] = int_0^inf (1 - F^p) dx -
    int_-inf^0 F^p dx with F the normal CDF."""
    p = _positive_int("p", p)
    if p == 1:
        return 0.0
    x, cdf = _normal_grid()
    fp = cdf ** p
    pos, neg = x >= 0, x <= 0
    return float(_integral(1.0 - fp[pos], x[pos]) - _integral(fp[neg], x[neg]))


def _integral(y: np.ndarray, x: np.ndarray) -> float:
    """Trapezoidal rule (np.trapz was renamed np.trapezoid in NumPy 2)."""
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2.0)


# ------------------------------------------------------------------ work per run
def _work(n_samples: int, batch_size: int, epochs: int, p: int) -> tuple[int, float, float]:
    """(steps, samples per worker on average, samples of the busiest worker), whole run.
    The last batch of an epoch holds n mod b samples; shards differ by at most one."""
    full, rem = divmod(n_samples, batch_size)
    steps = epochs * (full + (rem > 0))
    mean = epochs * n_samples / p
    busiest = epochs * (full * -(-batch_size // p) + -(-rem // p))
    return steps, mean, float(busiest)


# ------------------------------------------------------------------ runs
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
    allreduce: str          # as the sweep wrote it
    algorithm: str          # the model's algorithm for it
    train_seconds: float
    phases: dict

    @property
    def config(self) -> tuple:
        return (self.workers, self.n_samples, self.batch_size, self.epochs, self.allreduce,
                self.param_bytes, self.calls_per_step)


_SAME = ("model", "dataset", "backend", "dtype", "threads")


def _run_list(runs) -> list:
    """The RUN dicts of a list (or any iterable) of them, or of a sweep dict holding them."""
    if isinstance(runs, Mapping) and "runs" in runs:
        runs = runs["runs"]
    if isinstance(runs, (str, bytes, Mapping)) or not isinstance(runs, Iterable):
        raise ValueError(f"runs must be a list of RUN dicts (or a sweep dict with 'runs'), "
                         f"got {type(runs).__name__}")
    runs = list(runs)
    if not runs:
        raise ValueError("runs is empty: the model needs a sweep's RUN rows to fit")
    return runs


def _parse_runs(runs: list, native_algorithm: str) -> list[_Run]:
    if native_algorithm not in ALGORITHMS:
        raise ValueError(f"native_algorithm is {native_algorithm!r}, expected one of "
                         f"{ALGORITHMS}")
    out = []
    for i, r in enumerate(runs):
        if not isinstance(r, Mapping):
            raise ValueError(f"runs[{i}] is a {type(r).__name__}, expected a RUN dict")
        for key in ("workers", "n_samples", "batch_size", "epochs", "param_bytes",
                    "train_seconds", "phases"):
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
            if name not in ph:
                raise ValueError(f"runs[{i}]: phases has no {name!r} (expected {PHASES})")
            try:
                phases[name] = _nonneg(f"phases[{name!r}]", ph[name])
            except ValueError as exc:
                raise ValueError(f"runs[{i}]: {exc}") from None
        steps, mean, busiest = _work(n, b, e, p)
        if "steps" in r and r["steps"] is not None and int(r["steps"]) != steps:
            raise ValueError(f"runs[{i}]: steps is {r['steps']!r}, but epochs * "
                             f"ceil(n_samples / batch_size) = {e} * ceil({n} / {b}) = {steps}")
        allreduce = r.get("allreduce", "native")
        if allreduce == "native":
            algorithm = native_algorithm
        elif allreduce in ALGORITHMS:
            algorithm = allreduce
        else:
            raise ValueError(f"runs[{i}]: allreduce is {allreduce!r}, expected 'native' or "
                             f"one of {ALGORITHMS}")
        calls = r.get("collective_calls")
        if algorithm == "ps" or calls is None or p == 1:
            cps = 1.0
        else:
            cps = _nonneg("collective_calls", calls) / steps
            if cps <= 0:
                raise ValueError(f"runs[{i}]: collective_calls is {calls!r} with {p} workers; "
                                 f"expected at least one all-reduce per step")
        out.append(_Run(i, p, n, b, e, steps, mean, busiest, m, cps, allreduce, algorithm,
                        t, phases))
    for key in _SAME:
        values = {repr(r.get(key)) for r in runs}
        if len(values) > 1:
            raise ValueError(f"runs mix {key} values {sorted(values)}: fit one {key} at a time "
                             f"(filter the runs), the model's coefficients belong to one")
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
        out.append(_Run(first.index, first.workers, first.n_samples, first.batch_size,
                        first.epochs, first.steps, first.mean_work, first.busiest_work,
                        first.param_bytes, first.calls_per_step, first.allreduce,
                        first.algorithm,
                        float(np.median([m.train_seconds for m in members])), phases))
    return out


# ------------------------------------------------------------------ least squares
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
    "per_sample": ("s/sample", "seconds of the {} phase per sample a worker processes "
                               "(shrinks as 1/p)"),
    "per_step": ("s/step", "seconds of the {} phase per step whatever p is (serial)"),
    "alpha": ("s", "latency per message of the measured transport (effective)"),
    "beta": ("s/byte", "time per byte of the measured transport, summing included"),
    "sigma": ("s/step", "standard deviation of a worker's arrival time per step; the wait "
                        "is sigma * E[max of p normals]"),
}


def _design(runs: Sequence[_Run], fixed_alpha: float | None):
    """Weighted rows (one per run and measured quantity) of y = A theta, theta as
    _param_names(); with a fixed alpha its column moves into y."""
    names = _param_names()
    col = {nm: j for j, nm in enumerate(names)}
    rows, ys, what = [], [], []
    for r in runs:
        w = 1.0 / r.train_seconds          # every run counts in relative error
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
            f"counts (or batch sizes)")
    multi = [r for r in runs if r.workers > 1]
    if not multi:
        raise ValueError("too few distinct configurations to fit: every run has workers=1, "
                         "so nothing measures communication or synchronization; add runs "
                         "with 2 or more workers")
    if fixed_alpha is None:
        shapes = set()
        for r in multi:
            na, nb, _ = allreduce_coefficients(r.algorithm, r.workers)
            shapes.add(round(r.calls_per_step * na / (nb * r.param_bytes), 9)
                       if nb * r.param_bytes > 0 else math.inf)
        if len(shapes) < 2:
            confs = sorted({(r.workers, r.algorithm, r.param_bytes, r.calls_per_step)
                            for r in multi})
            raise ValueError(
                f"too few distinct configurations to fit: latency (alpha) and bandwidth "
                f"(beta) of the transport cannot be told apart from the multi-worker "
                f"configurations (workers, algorithm, param_bytes, calls per step) {confs}; "
                f"the ring needs two worker counts above 1, the tree two bucket sizes, the "
                f"parameter server runs with another algorithm; or pass a known alpha=..., "
                f"e.g. NETWORKS['shared memory'].alpha")


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
        raise ValueError("too few distinct configurations to fit: the runs do not determine "
                         f"every parameter of {names}")
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
        coefficients={nm: values[nm] for nm in _param_names() if nm not in
                      ("alpha", "beta", "sigma")},
        alpha=values["alpha"], beta=values["beta"], sigma=values["sigma"],
        alpha_fixed=fixed is not None, native_algorithm=native_algorithm,
        algorithm=max(counts, key=counts.get),
        batch_size=ref.batch_size, epochs=ref.epochs, n_samples=ref.n_samples,
        param_bytes=ref.param_bytes, calls_per_step=ref.calls_per_step,
        labels={k: first.get(k) for k in _SAME},
        n_runs=len(parsed), n_configurations=len(configs),
        workers_fitted=sorted({r.workers for r in parsed}),
        n_samples_fitted=sorted({r.n_samples for r in parsed}))
    rel = [(model.predict_run(r).seconds - r.train_seconds) / r.train_seconds for r in configs]
    model.fit_rms_error_pct = float(100.0 * np.sqrt(np.mean(np.square(rel))))
    return model


@dataclass
class Prediction:
    """Predicted seconds of one run, its breakdown and the configuration it is for.

    phases: the six PHASES (a parameter server's broadcast counted in communication);
    breakdown: parallel_work (t_sample b / p per step, the part that shrinks), serial
    (t_serial per step), communication, sync_wait (jitter and uneven shards)."""

    seconds: float
    phases: dict
    breakdown: dict
    config: dict

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "phases": dict(self.phases),
                "breakdown": dict(self.breakdown), "config": dict(self.config)}


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

    def predict(self, workers: int, n_samples: int | None = None, *,
                batch_size: int | None = None, epochs: int | None = None,
                param_bytes: float | None = None, calls_per_step: float | None = None,
                algorithm: str | None = None, network=None,
                gamma: float | None = None, ranks_per_node: int | None = None,
                node_network="shared memory") -> Prediction:
        """Predicted seconds of a run of ``n_samples`` (default: the sweep's largest) on
        ``workers``. Unset arguments take the sweep's values; network=None is the measured
        transport (gamma then 0: its beta includes summing), a Network or preset name uses
        that link with gamma (default DEFAULT_GAMMA) for the sums. ranks_per_node > 1: the
        hierarchical all-reduce (hierarchical_allreduce_seconds) on nodes of that many ranks
        linked inside by node_network."""
        p = _positive_int("workers", workers)
        n = self.n_samples if n_samples is None else _positive_int("n_samples", n_samples)
        b = self.batch_size if batch_size is None else _positive_int("batch_size", batch_size)
        e = self.epochs if epochs is None else _positive_int("epochs", epochs)
        m = self.param_bytes if param_bytes is None else _nonneg("param_bytes", param_bytes)
        cps = self.calls_per_step if calls_per_step is None else _nonneg("calls_per_step",
                                                                          calls_per_step)
        alg = self.algorithm if algorithm is None else algorithm
        _check_algorithm(alg)
        if network is None:
            net, g = self.network, 0.0 if gamma is None else _nonneg("gamma", gamma)
        else:
            net = get_network(network)
            g = DEFAULT_GAMMA if gamma is None else _nonneg("gamma", gamma)
        steps, mean, busiest = _work(n, b, e, p)
        if ranks_per_node is not None and alg == "ps":
            raise ValueError("ranks_per_node: the hierarchical all-reduce has no parameter-"
                             "server form; use algorithm 'ring' or 'tree'")
        latency, volume = _terms(alg, p, m, net, g, ranks_per_node, node_network)
        calls = 1.0 if alg == "ps" else cps
        comm = steps * (calls * latency + volume)
        c = self.coefficients
        phases = {ph: c[f"{ph}_per_sample"] * mean + c[f"{ph}_per_step"] * steps
                  for ph in WORK_PHASES}
        phases["communication"] = comm
        phases["sync_wait"] = (steps * self.sigma * expected_max_normal(p)
                               + self.t_sample * (busiest - mean))
        phases = {ph: float(phases[ph]) for ph in PHASES}
        breakdown = {"parallel_work": self.t_sample * mean, "serial": self.t_serial * steps,
                     "communication": comm, "sync_wait": phases["sync_wait"]}
        config = {"workers": p, "n_samples": n, "batch_size": b, "epochs": e, "steps": steps,
                  "param_bytes": m, "calls_per_step": calls, "algorithm": alg,
                  "network": net.name, "gamma": g, "ranks_per_node": ranks_per_node}
        return Prediction(float(sum(phases.values())), phases,
                          {k: float(v) for k, v in breakdown.items()}, config)

    def predict_run(self, run) -> Prediction:
        """The prediction for the configuration of one RUN (dict) on the measured transport."""
        r = run if isinstance(run, _Run) else _parse_runs([run], self.native_algorithm)[0]
        return self.predict(r.workers, r.n_samples, batch_size=r.batch_size, epochs=r.epochs,
                            param_bytes=r.param_bytes, calls_per_step=r.calls_per_step,
                            algorithm=r.algorithm)

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
            {"name": "t_sample", "value": self.t_sample, "unit": "s/sample",
             "meaning": "per-sample work, all phases (T_comp = t_sample * samples)"},
            {"name": "t_serial", "value": self.t_serial, "unit": "s/step",
             "meaning": "serial work per step, all phases"},
            {"name": "serial_fraction", "value": self.serial_fraction, "unit": "1",
             "meaning": f"Amdahl serial fraction of a 1-worker step of {self.batch_size} "
                        f"samples (speedup <= 1 / f)"},
        ]
        return rows

    def to_dict(self) -> dict:
        return plain({
            "parameters": self.parameters(),
            "alpha_fixed": self.alpha_fixed,
            "algorithm": self.algorithm, "native_algorithm": self.native_algorithm,
            "reference": {"n_samples": self.n_samples, "batch_size": self.batch_size,
                          "epochs": self.epochs, "param_bytes": self.param_bytes,
                          "calls_per_step": self.calls_per_step},
            "labels": self.labels, "n_runs": self.n_runs,
            "n_configurations": self.n_configurations,
            "n_fitted_parameters": self.n_fitted_parameters,
            "workers_fitted": self.workers_fitted, "n_samples_fitted": self.n_samples_fitted,
            "fit_rms_error_pct": self.fit_rms_error_pct,
            "network": self.network.to_dict()})


# ------------------------------------------------------------------ validation
def validation_verdict(max_abs_error_pct: float, target_pct: float = TARGET_ERROR_PCT,
                       n_points: int | None = None, n_parameters: int | None = None) -> dict:
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
        problems.append(f"checked on {n_points} held-out point{'s' if n_points != 1 else ''}"
                        f" for {n_parameters} fitted parameters: not a validation")
    if problems:
        text = "NOT VALIDATED: " + "; ".join(problems)
        if err <= target:                   # the error passed: say so, after the failure
            text += f" (held-out error up to {err:.1f} %, within the {target:g} % target)"
    else:
        text = f"validated: held-out error up to {err:.1f} % <= {target:g} % target"
        if n_points is not None:
            text += f" on {n_points} held-out point{'s' if n_points != 1 else ''}"
            text += (f" for {n_parameters} fitted parameters" if n_parameters is not None
                     else " (number of fitted parameters not given)")
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
        return validation_verdict(self.max_abs_error_pct, self.target_pct, self.n_points,
                                  self.fit.n_fitted_parameters)

    @property
    def validated(self) -> bool:
        return self.verdict()["validated"]

    def to_rows(self) -> list[dict]:
        return plain(self.rows)

    def to_dict(self) -> dict:
        verdict = self.verdict()
        return plain({"holdout": self.holdout, "target_pct": self.target_pct,
                          "max_abs_error_pct": self.max_abs_error_pct,
                          "within_target": self.within_target, "n_points": self.n_points,
                          "n_fitted_parameters": self.fit.n_fitted_parameters,
                          "validated": verdict["validated"], "verdict": verdict["text"],
                          "rows": self.to_rows(), "fit": self.fit.to_dict()})


def validate(runs, holdout="n_samples", *, target_pct: float = TARGET_ERROR_PCT,
             **fit_kwargs) -> Validation:
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
        raise ValueError(f"holdout is {holdout!r}, expected 'workers', 'n_samples' or a "
                         f"callable run -> bool")
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
        rows.append({"workers": key[0], "n_samples": key[1], "batch_size": key[2],
                     "epochs": key[3], "allreduce": key[4], "repeats": len(members),
                     "measured": measured, "predicted": pred.seconds,
                     "error_pct": 100.0 * (pred.seconds - measured) / measured,
                     "measured_phases": {ph: float(np.median([r.phases[ph] for r in members]))
                                         for ph in PHASES},
                     "predicted_phases": pred.phases})
    return Validation(label, rows, model, target)


# ------------------------------------------------------------------ projection
def _networks(networks) -> list[Network]:
    if networks is None:
        return list(NETWORKS.values())
    if isinstance(networks, (str, Network)):
        networks = [networks]
    nets = [get_network(n) for n in networks]
    if not nets:
        raise ValueError("networks is empty: name at least one network")
    return nets


def project(model: FittedModel, workers: Sequence[int] = DEFAULT_WORKERS, networks=None,
            algorithms: Sequence[str] = ALGORITHMS, *, n_samples: int | None = None,
            batch_size: int | None = None, gamma: float = DEFAULT_GAMMA,
            ranks_per_node: int | None = None) -> list[dict]:
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
            base = model.predict(1, n_samples, batch_size=batch_size, algorithm=alg,
                                 network=net, gamma=gamma)
            for p in ps:
                pr = model.predict(p, n_samples, batch_size=batch_size, algorithm=alg,
                                   network=net, gamma=gamma, ranks_per_node=rpn)
                speedup = base.seconds / pr.seconds if pr.seconds > 0 else math.inf
                rows.append({"network": net.name, "algorithm": f"hier-{alg}" if rpn else alg,
                             "ranks_per_node": rpn, "workers": p,
                             "n_samples": pr.config["n_samples"],
                             "batch_size": pr.config["batch_size"],
                             "seconds": pr.seconds, "speedup": speedup,
                             "efficiency": speedup / p,
                             "communication_seconds": pr.breakdown["communication"],
                             "sync_seconds": pr.breakdown["sync_wait"],
                             "serial_seconds": pr.breakdown["serial"],
                             "parallel_seconds": pr.breakdown["parallel_work"]})
    return plain(rows)


def break_even_samples(model: FittedModel, workers: int, network=None,
                       algorithm: str | None = None, *, gamma: float | None = None,
                       param_bytes: float | None = None,
                       calls_per_step: float | None = None) -> float:
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
        raise ValueError(f"workers is {p}, expected 2 or more (the break-even compares p "
                         f"workers with one)")
    alg = model.algorithm if algorithm is None else algorithm
    _check_algorithm(alg)
    if network is None:
        net, g = model.network, 0.0 if gamma is None else _nonneg("gamma", gamma)
    else:
        net = get_network(network)
        g = DEFAULT_GAMMA if gamma is None else _nonneg("gamma", gamma)
    m = model.param_bytes if param_bytes is None else _nonneg("param_bytes", param_bytes)
    cps = model.calls_per_step if calls_per_step is None else _nonneg("calls_per_step",
                                                                       calls_per_step)
    na, nb, ng = allreduce_coefficients(alg, p)
    calls = 1.0 if alg == "ps" else cps
    cost = calls * na * net.alpha + nb * m * net.beta + ng * m * g \
        + model.sigma * expected_max_normal(p)
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
def analyze(runs, *, holdout="n_samples", workers: Sequence[int] = DEFAULT_WORKERS,
            networks=None, algorithms: Sequence[str] = ALGORITHMS,
            gamma: float = DEFAULT_GAMMA, ranks_per_node: int | None = None,
            **fit_kwargs) -> dict:
    """Fit on all runs, validate with ``holdout`` (None to skip), project (ranks_per_node:
    also the hierarchical all-reduce on nodes of that many ranks), and compute the
    break-even per network, algorithm and worker count: one JSON-ready dict for the plots
    and the report."""
    model = fit(runs, **fit_kwargs)
    out = {"fit": model.to_dict()}
    if holdout is not None:
        out["validation"] = validate(runs, holdout, **fit_kwargs).to_dict()
    out["projection"] = project(model, workers, networks, algorithms, gamma=gamma,
                                ranks_per_node=ranks_per_node)
    out["break_even"] = [
        {"network": net.name, "algorithm": alg, "workers": p,
         "samples_per_step": break_even_samples(model, p, net, alg, gamma=gamma)}
        for net in _networks(networks) for alg in algorithms for p in workers if p > 1]
    return plain(out)


def load_runs(path) -> list[dict]:
    """The RUN rows of a sweep: a sweep directory (holding sweep.json) or a sweep.json."""
    path = Path(path)
    if path.is_dir():
        path = path / "sweep.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist: expected a sweep directory or sweep.json")
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise ValueError(f"{path} has no 'runs' list (see the sweep schema)")
    return doc["runs"]


