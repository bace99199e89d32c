"""Elastic runs (TrainConfig's ``elastic``): a worker that fails costs the step it was in, not
the run.

The workers run as ever, but when one fails (raises, dies, or misses ``--timeout``), the
others do not fail with it: each stops at its next collective and hands home its state at the
last step every worker completed (``loop._snapshot``; ``comm.Interrupted``). In synchronous
training that state is the same on every worker, so no checkpoint file is needed: this
process takes the one furthest on, starts the workers again, one fewer (the same global
batch, shared out again; the same learning rate), from it (``Job.restore``, the arrays as the
launch's INIT_ extras: the parameters, the optimizer's state, the running statistics), and
they redo the interrupted step and go on, down to ``min_workers``; with ``respawn`` a new
worker takes each lost one's place, from the same step.

With ``deterministic`` the result is the same bits as a run that lost no one: each global
batch is summed in fixed chunks, whoever computes them. Without it, as between world sizes:
equal to rounding. What else a step depends on is a function of the step and the epoch (the
epoch's order, dropout's masks, augmentation, the learning rate), so nothing else is carried.

Each recovery is one line and one record (``TrainResult["elastic"]``): who was lost and why,
at which step, the world before and after, and how long it cost, from the interrupted step's
start to the end of its redo.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace

import numpy as np

from ..comm import Interrupted, WorkerError, launch
from ..comm.elastic import lost_record, regroup
from ..sampler import batch_bounds
from .loop import DIVERGED, INIT_OPTIMIZER, INIT_PARAMS, INIT_STATE, POSITION, train_worker


def launch_elastic(
    job, n_train: int, options: dict, say, report=None, watch=None, became=None
) -> tuple[list, list]:
    """Runs ``train_worker`` on job.world workers over n_train samples (launch's
    ``options``, besides the job, the report and the watch), going on after every lost
    worker (see the module docstring). Returns (what each worker of the last launch
    returned, by rank; the recoveries). Under MPI (ULFM, ``comm.ulfm``) this is one rank,
    which goes on with the survivors' communicator; ``became`` is called with its rank in
    it after each recovery (rank 0 then says what happens)."""
    reported: list = []  # every epoch's record, as rank 0 reported it, whatever the launch

    def collect(rec):
        reported.append(rec)
        if report is not None:
            report(rec)

    extras, events, world = dict(options["extras"]), [], job.world
    options = {k: v for k, v in options.items() if k not in ("workers", "extras")}
    n_batches = len(batch_bounds(n_train, job.batch_size))
    while True:
        began = time.perf_counter()
        try:
            with warnings.catch_warnings():
                if events:  # the first launch said it (oversubscription), once is enough
                    warnings.simplefilter("ignore", RuntimeWarning)
                per_rank = launch(
                    train_worker,
                    job,
                    **options,
                    workers=world,
                    extras=extras,
                    report=collect,
                    watch=watch,
                    elastic=True,
                )
        except WorkerError as err:
            after, snaps, short = regroup(err, world, job.config.min_workers, job.config.respawn)
            done = [res for res in err.results if res is not None]
            if done and not any(isinstance(res, Interrupted) for res in done):
                # lost after the run's last barrier: every step is done
                if done[0].get("history") is None:  # ... but not rank 0's result
                    raise WorkerError(
                        err.rank, err.cause + " (after the last step, with the result)"
                    ) from None
                _note(events, err, world, None, began)
                return done, _recovered(events, done)
            snap = max(snaps, key=lambda s: s["step"]) if snaps else None
            at = snap["step"] if snap else job.restore["step"] if job.restore else 0
            cause = _repeated(events, err, at)
            if any(c.startswith(DIVERGED) or f": {DIVERGED}" in c for c in err.lost.values()):
                # the run's own failure, on every worker alike: going on without one worker
                # redid it (from a step whose loss may print as inf, not nan: another text)
                # down to a single worker, whose error then came unwrapped
                cause = " (the run's own error, not a lost worker's)"
            if not snaps and len(err.lost) == world:
                cause = "; no worker left"
            if cause or short:
                raise WorkerError(err.rank, err.cause + (cause or short)) from None
            _recovered(events, snaps)
            shrunk = getattr(err, "mpi_world", None)
            if shrunk is not None:  # an MPI rank: the survivors' communicator, and its rank
                options["mpi_world"] = shrunk
                if became is not None:
                    became(shrunk.Get_rank())
            if snap is not None:
                # an MPI rank holds no launcher's records: every rank holds rank 0's history
                restore = _position(
                    snap, reported if shrunk is None else snap["history"], job, n_batches
                )
                extras.update(_arrays(snap))
                job = replace(job, restore=restore)
            event = _note(events, err, world, snap, began)
            event["step"] = job.restore["step"] if job.restore else 0
            world = event["world"][1] = after
            job = replace(job, world=world, config=replace(job.config, resume=None))
            say(
                f"dptrain: lost worker rank {', '.join(map(str, sorted(err.lost)))} at step "
                f"{event['step']} ({err.cause}): going on with {world} worker(s) from step "
                f"{event['step']} ("
                + (f"{len(err.lost)} new, respawned)" if job.config.respawn else "elastic)")
            )
            continue
        return per_rank, _recovered(events, per_rank)


def _position(snap: dict, reported: list, job, n_batches) -> dict:
    """Job.restore from a survivor's snapshot: its position, moved to the next epoch's start
    when its epoch is done and was reported (rank 0 evaluates it after every worker's last
    step: a survivor cannot tell), or past the end when that record stopped the run (tol)."""
    restore = {k: snap[k] for k in POSITION}
    restore.update(epoch_seconds=snap["epoch_seconds"], history=list(reported))
    epoch_done = n_batches is not None and snap["batch"] >= n_batches
    if epoch_done and len(reported) > snap["epoch"]:
        stopped = "stopped" in reported[-1]
        restore.update(
            epoch=job.config.epochs if stopped else snap["epoch"] + 1,
            batch=0,
            loss_sum=0.0,
            correct=0,
            epoch_seconds=0.0,
        )
    return restore


def _arrays(snap: dict) -> dict:
    """The launch's INIT_ extras that start every worker from a snapshot's arrays."""
    arrays = {INIT_PARAMS: snap["params"]}
    if snap["bn_state"].size:
        arrays[INIT_STATE] = snap["bn_state"]
    state = dict(snap["optimizer"])
    arrays[INIT_OPTIMIZER + "steps"] = np.array([state.pop("steps")], np.int64)
    arrays[INIT_OPTIMIZER + "velocity"] = snap["velocity"]
    arrays.update({INIT_OPTIMIZER + k: np.ascontiguousarray(a) for k, a in state.items()})
    return arrays


def _note(events: list, err: WorkerError, world: int, snap, began: float) -> dict:
    """The record of one recovery (its cost is filled in once a step is done again)."""
    event = {
        "lost": lost_record(err),
        "world": [world, world - len(err.lost)],
        "step": None if snap is None else snap["step"],  # the step redone first
        "epoch": None if snap is None else snap["epoch"] + 1,
        "launch_seconds": time.perf_counter() - began,
        "step_began": None if snap is None else snap["began"],
        "detected": None if snap is None else snap["caught"],
        "recovery_seconds": None,
    }
    events.append(event)
    return event


def _recovered(events: list, returns: list) -> list:
    """Fills in the last recovery's cost from what the workers of the next launch returned
    (a snapshot or a result: when their first step was done): from the start of the step
    the failure interrupted to the end of its redo, and of that, from the failure's
    detection (a survivor's stop) to the redo's end."""
    if not events or events[-1]["recovery_seconds"] is not None:
        return events
    walls = [r.get("first_step_wall") for r in returns if isinstance(r, dict)]
    walls = [w for w in walls if w is not None]
    last = events[-1]
    if walls and last["step_began"] is not None:
        end = min(walls)
        last["recovery_seconds"] = end - last["step_began"]
        last["after_detection_seconds"] = end - last["detected"]
    return events


def _repeated(events: list, err: WorkerError, step: int) -> str | None:
    """Why not to go on: the same error from the same step as the last recovery's (the run's
    own failure, on whichever workers run it, not a lost worker), else None."""
    if not events:
        return None
    last = events[-1]
    if last["step"] == step and err.cause in [x["cause"] for x in last["lost"]]:
        return (
            f"; the same failure again from step {step} after going on without the worker "
            f"(the run's own error, not a lost worker's)"
        )
    return None
