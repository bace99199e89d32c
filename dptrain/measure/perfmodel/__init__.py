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

What the data identifies, and from which column of the sweep's RUN rows (docs/sweep_schema.md):
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
parameters (11, or 10 with a known alpha); ``dptrain.measure.plots`` and ``python -m dptrain
plot`` print its line and draw a projection from a model that fails it as "NOT VALIDATED ...
projection shown for illustration only".

What is left out on purpose: overlap of communication with the backward pass (the measured
communication phase is what the overlap did not hide, and is fitted as such), contention
between workers that share a host's memory bandwidth or time-share cores (filter out runs
with more workers than cores, or they will show as fit errors), network congestion, and
per-run fixed costs (the sweep's train_seconds excludes start-up). Everything here is plain
Python + NumPy; every object has a JSON-ready ``to_dict``.

One module per part: ``costs`` (networks and the alpha-beta cost of each all-reduce, flat or
hierarchical; the synchronization shape), ``runs`` (the RUN rows read and checked),
``fitting`` (the least-squares fit, ``FittedModel``, ``Prediction``), ``local`` (local
SGD's price: an average every H steps instead of an exchange every step), ``validation`` (the
held-out check and its verdict), ``projection`` (projection, break-even, ``analyze``), and
``checks`` (the argument checks they share). Every public name imports from here.
"""

from __future__ import annotations

from ..timing import PHASES
from .costs import (
    ALGORITHMS,
    DEFAULT_GAMMA,
    HIERARCHICAL,
    NETWORKS,
    Network,
    allreduce_coefficients,
    allreduce_seconds,
    expected_max_normal,
    get_network,
    hierarchical_allreduce_seconds,
)
from .fitting import FittedModel, Prediction, fit
from .local import averages_and_waits, local_sgd_phases, predict_local_run
from .projection import DEFAULT_WORKERS, analyze, break_even_samples, project
from .runs import load_runs
from .validation import TARGET_ERROR_PCT, Validation, validate, validation_verdict

__all__ = [
    "PHASES",
    "ALGORITHMS",
    "Network",
    "NETWORKS",
    "DEFAULT_GAMMA",
    "TARGET_ERROR_PCT",
    "get_network",
    "allreduce_coefficients",
    "allreduce_seconds",
    "HIERARCHICAL",
    "hierarchical_allreduce_seconds",
    "expected_max_normal",
    "DEFAULT_WORKERS",
    "FittedModel",
    "Prediction",
    "local_sgd_phases",
    "predict_local_run",
    "averages_and_waits",
    "Validation",
    "fit",
    "validate",
    "validation_verdict",
    "project",
    "break_even_samples",
    "analyze",
    "load_runs",
]
