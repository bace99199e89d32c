"""Local SGD's price (``engine.local``): communication every H steps instead of every step.

A synchronous run's phases become local SGD's, one replica per worker, by three rules:

- no gradient exchange: the communication phase is gone;
- an average every H steps and at each epoch's end (ceil(s / H) per epoch of s steps; every
  step of the first local_after epochs): averaged_arrays all-reduces of the parameters' bytes
  each (2: the parameters and SGD's momentum, ``--local-momentum average``; 1: the parameters
  alone), each priced as one of the synchronous run's gradient exchanges (same bytes), in the
  average phase;
- the wait at an average: each worker's H steps of independent jitter add up to a spread
  sqrt(H) times one step's, so the wait for the slowest is sqrt(H) times the synchronous
  step's (per step: 1 / sqrt(H), where the exchange falls as 1 / H). A wait that does not
  average out (uneven shards: the same worker has the bigger one at every step) adds up
  whatever H is.

The work phases (data, compute, update, other) stay as they are. ``local_sgd_phases`` applies
the rules to any synchronous phases: a measured run's (``predict_local_run``: what local SGD
would take, from the synchronous run alone) or the fitted model's (``FittedModel.predict``
with sync_every).
"""

from __future__ import annotations

import math

from ..timing import PHASES
from .checks import _nonneg, _nonneg_int, _positive_int


def averages_and_waits(
    steps_per_epoch: int, epochs: int, sync_every: int, local_after: int = 0
) -> tuple[int, float]:
    """(averages, wait units) of a local SGD run: the averages it takes, and the sum over them
    of sqrt(steps since the one before) (the wait's growth with the steps between two)."""
    s = _positive_int("steps_per_epoch", steps_per_epoch)
    e = _positive_int("epochs", epochs)
    h = _positive_int("sync_every", sync_every)
    synchronous = min(_nonneg_int("local_after", local_after), e)
    full, rest = divmod(s, h)
    local = e - synchronous
    averages = synchronous * s + local * (full + (rest > 0))
    waits = synchronous * s + local * (full * math.sqrt(h) + math.sqrt(rest))
    return averages, waits


def local_sgd_phases(
    phases: dict,
    *,
    steps_per_epoch: int,
    epochs: int,
    sync_every: int,
    local_after: int = 0,
    averaged_arrays: int = 2,
    exchanges_per_step: float = 1.0,
    uneven_wait: float = 0.0,
) -> dict:
    """Synchronous SGD's phases (seconds, the whole run: every PHASES name, "average" may be
    absent) as local SGD's (see the module docstring). exchanges_per_step: the gradient
    all-reduces of a synchronous step (its communication is that many exchanges of the
    parameters' bytes); uneven_wait: the part of sync_wait that does not average out."""
    missing = [p for p in PHASES if p != "average" and p not in phases]
    if missing:
        raise ValueError(f"phases has no {missing[0]!r} (expected {PHASES})")
    out = {p: _nonneg(f"phases[{p!r}]", phases.get(p, 0.0)) for p in PHASES}
    arrays = _positive_int("averaged_arrays", averaged_arrays)
    calls = _nonneg("exchanges_per_step", exchanges_per_step)
    uneven = min(_nonneg("uneven_wait", uneven_wait), out["sync_wait"])
    if _positive_int("sync_every", sync_every) == 1:
        return out  # an average every step, taken as it is, is synchronous SGD (config.local)
    steps = _positive_int("steps_per_epoch", steps_per_epoch) * _positive_int("epochs", epochs)
    averages, waits = averages_and_waits(steps_per_epoch, epochs, sync_every, local_after)
    exchange = out["communication"] / (steps * calls) if calls else 0.0
    jitter = (out["sync_wait"] - uneven) / steps  # one synchronous step's wait
    out["average"] += averages * arrays * exchange
    out["communication"] = 0.0
    out["sync_wait"] = waits * jitter + uneven
    return out


def predict_local_run(
    run: dict, sync_every: int, local_after: int = 0, averaged_arrays: int = 2
) -> dict:
    """Local SGD's phases and seconds predicted from one measured synchronous run (a
    ``train()`` result: its ``breakdown``, ``steps``, ``epochs`` history) at period
    sync_every: {"seconds", "phases"}. Its whole sync_wait is taken as jitter (no uneven
    shards: one global batch split evenly)."""
    b = run["breakdown"]
    epochs = len(run["epochs"])
    if not epochs or run["steps"] % epochs:
        raise ValueError(
            f"the run has {run['steps']} steps over {epochs} epochs: expected whole epochs of "
            f"synchronous SGD"
        )
    if run.get("local_sgd"):
        raise ValueError("the run is local SGD's: predict from a synchronous run")
    phases = local_sgd_phases(
        b["phase_seconds"],
        steps_per_epoch=run["steps"] // epochs,
        epochs=epochs,
        sync_every=sync_every,
        local_after=local_after,
        averaged_arrays=averaged_arrays,
    )
    return {"seconds": sum(phases.values()), "phases": phases}
