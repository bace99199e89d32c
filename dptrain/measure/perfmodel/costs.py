"""What one all-reduce costs in the alpha-beta model: the networks (``Network``, the presets
``NETWORKS``), the cost of each algorithm over p workers, flat or hierarchical (nodes of
several ranks), and the expected wait for the slowest of p workers (``expected_max_normal``).
Plain formulas: nothing here is fitted."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ...comm.algorithms import ALGORITHMS as EXCHANGE_ALGORITHMS
from .checks import _nonneg, _number, _positive_int

# the algorithms of a network between machines ('native' is a transport's own, not modeled)
ALGORITHMS = tuple(a for a in EXCHANGE_ALGORITHMS if a != "native")


# Reduction cost per byte (gamma) on the host that sums: numpy float32 a += b over the MLP's
# gradient, in cache, timed on the machine the benchmarks run on (the figures: bench/README.md,
# "Design measurements behind the comments").
DEFAULT_GAMMA = 3e-11


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
            raise ValueError(
                f"network {self.name!r}: alpha is {a!r} s, expected a finite latency >= 0"
            )
        if not bw > 0:
            raise ValueError(f"network {self.name!r}: bandwidth is {bw!r} bytes/s, expected > 0")
        object.__setattr__(self, "alpha", a)
        object.__setattr__(self, "bandwidth", bw)

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 0.0 if math.isinf(self.bandwidth) else 1.0 / self.bandwidth

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "alpha_s": self.alpha,
            "beta_s_per_byte": self.beta,
            "bandwidth_bytes_per_s": None if math.isinf(self.bandwidth) else self.bandwidth,
        }


# Nominal figures, to the order of magnitude: bandwidths are line rates (what MPI achieves is
# typically 85-95 % of them); latencies are per-message MPI latencies: tens of microseconds
# through the kernel's TCP stack on Ethernet, about a microsecond over EDR InfiniBand verbs.
# Pass your own Network(...) for a cluster you have measured.
# "shared memory" is fitted to our measurements (bench/bench_allreduce.py, 2 processes): least
# squares in relative error of 2 alpha + M beta + M gamma / 2 (the ring form at p = 2) with
# gamma = DEFAULT_GAMMA, so that the projections start from a link we have timed (the data and
# how well it fits: bench/README.md, "Design measurements behind the comments").
NETWORKS = {
    net.name: net
    for net in (
        Network("10 GbE", alpha=20e-6, bandwidth=10e9 / 8),
        Network("25 GbE", alpha=10e-6, bandwidth=25e9 / 8),
        Network("100 Gb InfiniBand (EDR)", alpha=1.0e-6, bandwidth=100e9 / 8),
        Network("shared memory", alpha=0.17e-6, bandwidth=27.4e9),
    )
}


def get_network(network) -> Network:
    """A Network, or the preset of that name (see NETWORKS)."""
    if isinstance(network, Network):
        return network
    if isinstance(network, str):
        if network not in NETWORKS:
            raise ValueError(
                f"network is {network!r}, expected a Network or one of {sorted(NETWORKS)}"
            )
        return NETWORKS[network]
    raise ValueError(f"network is {network!r}, expected a Network or one of {sorted(NETWORKS)}")


# ------------------------------------------------------------------ cost of one all-reduce
def allreduce_coefficients(algorithm: str, p: int) -> tuple[float, float, float]:
    """(n_alpha, n_beta, n_gamma): one all-reduce of M bytes over p workers costs
    n_alpha alpha + n_beta M beta + n_gamma M gamma on its critical path.

    - ring (reduce-scatter + all-gather): 2 (p - 1) messages of M / p each;
      (p - 1) / p M summed per worker.
    - tree (recursive doubling, as dptrain.comm.algorithms.tree_allreduce does it): with
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


def allreduce_seconds(
    algorithm: str, p: int, nbytes: float, network, gamma: float = DEFAULT_GAMMA
) -> float:
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


def _terms(
    algorithm: str,
    p: int,
    nbytes: float,
    net: Network,
    gamma: float,
    ranks_per_node: int | None,
    node_network,
) -> tuple[float, float]:
    """(seconds of latency, seconds of bytes) of one all-reduce of nbytes over p workers:
    flat on net, or hierarchical with ranks_per_node ranks per node (see
    hierarchical_allreduce_seconds). The latency part is what buckets multiply."""
    m = 1 if not ranks_per_node else min(_positive_int("ranks_per_node", ranks_per_node), p)
    if m == 1:
        na, nb, ng = allreduce_coefficients(algorithm, p)
        return na * net.alpha, nb * nbytes * net.beta + ng * nbytes * gamma
    node = get_network(node_network)
    nodes = -(-p // m)
    if nodes == 1:  # one node: the shared-memory all-reduce alone
        na, nb, ng = allreduce_coefficients("ring", m)
        return na * node.alpha, nb * nbytes * node.beta + ng * nbytes * gamma
    na, nb, ng = allreduce_coefficients(algorithm, nodes)
    # the node's sum: a barrier in and out, each rank sums its 1/m slice of the m arrays;
    # then the leaders; then a barrier and every rank copies the total out of shared memory
    latency = 3 * node.alpha + na * net.alpha
    volume = (
        (m - 1) / m * nbytes * (node.beta + gamma)
        + nbytes * node.beta
        + nb * nbytes * net.beta
        + ng * nbytes * gamma
    )
    return latency, volume


def hierarchical_allreduce_seconds(
    algorithm: str,
    p: int,
    nbytes: float,
    ranks_per_node: int,
    network,
    node_network="shared memory",
    gamma: float = DEFAULT_GAMMA,
) -> float:
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
    latency, volume = _terms(
        algorithm,
        p,
        nbytes,
        get_network(network),
        _nonneg("gamma", gamma),
        ranks_per_node,
        node_network,
    )
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
    fp = cdf**p
    pos, neg = x >= 0, x <= 0
    return float(_integral(1.0 - fp[pos], x[pos]) - _integral(fp[neg], x[neg]))


def _integral(y: np.ndarray, x: np.ndarray) -> float:
    """Trapezoidal rule (np.trapz was renamed np.trapezoid in NumPy 2)."""
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2.0)
