"""The training loop of one worker, the same on every transport.

    for each epoch:        a seeded order of the training set (sampler.epoch_order)
        for each batch:    the global batch's positions [start, stop)
            loss = exchange.gradient(...)    this worker's share, computed and exchanged
            exchange.update(opt, lr)         the same SGD step on every worker
            timer.step(...)                  where the step's time went

The loop knows nothing of transports (``comm`` is a ``dptrain.comm.Communicator``), of how
the gradient is exchanged (``engine.exchange``), or of injected faults and stragglers
(``engine.hooks``, given from outside); a step's phases are marked by
``measure.timing.StepClock`` and its batch gathered by ``sampler.BatchRows``. It returns the
worker's timings; rank 0 also returns the per-epoch history and the final parameters.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .. import _core
from .._memmap import truncation_named
from ..comm import Interrupted, LocalComm
from ..measure import timing
from ..models import model_from_spec, storage_dtype
from ..optim import lr_at, make_optimizer
from ..sampler import CHUNKS, BatchRows, batch_bounds, epoch_order, shard
from .checkpoint import load_checkpoint, load_optimizer_state, read_local_arrays, save_checkpoint
from .clip import GradClip
from .exchange import AllReduce, make_exchange, tally_for
from .hooks import Hooks, hooks_for
from .job import Job
from .local import LocalSGD

DATA_NAMES = ("x_train", "y_train", "x_test", "y_test")  # a run's data, as launch's extras
INIT_PARAMS = "init_params"  # the extra holding the starting parameters of a user's model
INIT_STATE = "init_state"  # ... and its batch norms' running statistics
INIT_STEP = "init_step"  # ... and its dropout step count (int64 [step]): a fit continues it
# the start of the divergence error's text: every worker raises it at the same step (the loss
# is all-reduced), so an elastic run never takes it for a lost worker
DIVERGED = "training diverged"
# the extras holding a previous run's optimizer state that fit(optimizer_state=...) continues:
# INIT_OPTIMIZER + "steps" (one int64), + "velocity", + each of its state_dict()'s arrays
INIT_OPTIMIZER = "init_optimizer_"
# where an elastic run goes on (Job.restore's plain values besides the history): the epoch,
# the batches of it done, the steps done, the epoch's sums over every worker so far, the
# seconds of training and of evaluation so far, and of the epoch so far
POSITION = (
    "epoch",
    "batch",
    "step",
    "loss_sum",
    "correct",
    "train_seconds",
    "eval_seconds",
)


class Plateau:
    """scikit-learn's stopping rule for its stochastic solvers: an epoch improves when its
    training loss is below the best so far by more than tol; training stops once more than
    ``patience`` epochs in a row have not."""

    def __init__(self, tol: float, patience: int):
        self.tol, self.patience = tol, patience
        self.best, self.without = math.inf, 0

    def stalled(self, loss: float) -> bool:
        """Counts one more epoch's loss; True when training should stop."""
        self.without = self.without + 1 if loss > self.best - self.tol else 0
        self.best = min(self.best, loss)
        return self.without > self.patience


def train_worker(comm, job: Job) -> dict:
    """What every worker of a run executes (``dptrain.comm.launch``'s fn): the training loop
    on the run's data and starting parameters, which the launcher gave as extras (the data
    set under ``DATA_NAMES``; the parameters of a model the user built under
    ``INIT_PARAMS``, when there is one)."""
    x, y, x_test, y_test = (comm.extra(name) for name in DATA_NAMES)
    # a user's .npy cut short under the run: named (a worker process's by its launcher)
    with truncation_named((x, y, x_test, y_test), say=comm.backend != "process"):
        out = run_worker(
            comm,
            job,
            x,
            y,
            x_test,
            y_test,
            init_params=comm.extra(INIT_PARAMS, None),
            init_state=comm.extra(INIT_STATE, None),
            init_step=comm.extra(INIT_STEP, None),
        )
    if not isinstance(out, Interrupted):  # (an elastic run's survivor hands home its state)
        out["placement"] = comm.placement  # where launch placed this worker (its CPUs, pinned?)
    return out


def _epoch_sums(done: dict, tally) -> tuple[float, int]:
    """The sums (loss, correct) over every worker of the epoch of `done`, through its last
    completed step: from the tally's table of that step's parity where this launch ran a
    step of that epoch (no worker can have written that table again: it would have had to
    pass the next step's exchange), else those the epoch started from, or ended with."""
    epoch, first, base = done.get("opened", (None, 0, None))
    if done["epoch"] == epoch:
        return tally.read((done["step"] - 1) & 1) if done["batch"] > first else base
    return done["loss_sum"], done["correct"]


def _snapshot(done: dict, net, opt, held_state, tally) -> dict:
    """A survivor's state at the last step every worker completed (``done``): the position
    (POSITION, the epoch's seconds so far, rank 0's history), the parameters, the optimizer's
    state (its state_dict and the velocity), the running statistics; when the group stopped
    (``caught``) and when the interrupted step began (``began``), in wall-clock seconds."""
    snap = {k: done[k] for k in POSITION + ("epoch_seconds", "began")}
    snap["loss_sum"], snap["correct"] = _epoch_sums(done, tally)
    snap.update(
        caught=time.time(),
        first_step_wall=done.get("first_step_wall"),
        history=list(done["history"]),
        params=net.params.copy(),
        velocity=net.velocity.copy(),
        bn_state=held_state.copy(),
        optimizer=opt.state_dict(),
    )
    return snap


def continued_state(comm, opt) -> dict | None:
    """The optimizer state (a state_dict, plus "velocity") that the launcher gave for this run
    to continue (INIT_OPTIMIZER extras), or None."""
    steps = comm.extra(INIT_OPTIMIZER + "steps", None)
    if steps is None:
        return None
    names = [k for k in opt.state_dict() if k != "steps"] + ["velocity"]
    found = {k: comm.extra(INIT_OPTIMIZER + k, None) for k in names}
    return {"steps": int(steps[0]), **{k: a for k, a in found.items() if a is not None}}


def uncoupled_worker(comm, job: Job) -> dict:
    """One of N workers that never talk (``Job.uncoupled``): after one start barrier (so that
    all run at the same moment), a 1-worker run on this rank's 1/N of the training set.
    Evaluation uses one test row: it is outside the timed loop and only has to exist."""
    x, y, x_test, y_test = (comm.extra(name) for name in DATA_NAMES)
    comm.barrier_after_work(None)  # every worker's start-up is work, not lateness
    lo, hi = shard(0, len(x), comm.rank, comm.size)
    out = run_worker(LocalComm(), job.uncoupled(), x[lo:hi], y[lo:hi], x_test[:1], y_test[:1])
    return {"train_seconds": out["train_seconds"], "placement": comm.placement}


def run_worker(
    comm,
    job: Job,
    x,
    y,
    x_test,
    y_test,
    *,
    hooks: Hooks | None = None,
    init_params=None,
    init_state=None,
    init_step=None,
) -> dict:
    """The training loop of one worker (see the module docstring). init_params: the starting
    parameters (a model the user built), else the model's seeded initialization; the
    optimizer continues a previous run's state where the launcher gave one (INIT_OPTIMIZER
    extras: fit's optimizer_state). Rank 0 reports each epoch's record (``comm.report``: the
    launcher prints it) and returns the history, the final parameters and the optimizer's
    state. (The launcher closes the communicator after.)"""
    cfg = job.config
    restore = job.restore  # an elastic run going on after a lost worker: where, and its state
    hooks = hooks or hooks_for(cfg, comm.rank, faults=restore is None)
    hooks.bind(comm)
    # dropout's step key continues a user's model's count (a second fit, partial_fit draws
    # new masks); the run's own step (the schedule's, checkpoints') starts at 0 as ever
    step0 = 0 if init_step is None else int(init_step[0])
    rank = comm.rank
    if job.local:
        exchange = LocalSGD(job, comm)
    else:
        exchange = make_exchange(cfg, comm) if job.coupled else AllReduce()
    if cfg.clip_norm is not None:
        exchange.clip = GradClip(cfg.clip_norm)
    elastic = cfg.elastic and comm.size > 1
    n_params = job.model["n_params"]
    bufs = exchange.buffers(comm, n_params, storage_dtype(job.model["dtype"]))
    net = model_from_spec(job.model, threads=cfg.threads, **bufs)
    if net.state.size:  # batch norm: its statistics are the global batch's
        exchange.batch_norm(comm, net, job.model, cfg.threads)
    opt = make_optimizer(net, job.lr, cfg)
    exchange.adopt(comm, opt)
    # (after the model's buffers: they lie where they do without --elastic)
    tally = exchange.tally = tally_for(comm) if elastic else None
    stats = comm.zeros(2, np.float64)
    state = {
        "step": 0,
        "epoch": 0,
        "batch": 0,
        "loss_sum": 0.0,
        "correct": 0,
        "history": [],
        "train_seconds": 0.0,
        "eval_seconds": 0.0,
    }
    n = len(x)
    if rank == 0:
        if job.resume:
            state.update(load_checkpoint(job.resume, job, net, n))
        elif init_params is not None:
            net.params[:] = init_params
        else:
            net.reset_parameters()  # the seeded init, into the exchanged buffer
    if init_state is not None and not job.resume:  # a user's model: its running statistics
        net.state[:] = init_state
    if job.resume and net.state.size:  # the running statistics: rank 0's, on every rank
        held = comm.zeros(net.state.size, np.float64)
        if rank == 0:
            held[:] = net.state
        comm.broadcast_(held, 0)
        net.state[:] = held
    if restore is not None:  # every rank: the position, and the epoch's sums (over all ranks)
        state.update({k: restore[k] for k in POSITION})
        state["history"] = list(restore["history"])
    if job.resume and rank != 0:
        # every rank reads the position (the file is visible to all: one machine, or a shared
        # file system under MPI); parameters and momentum come from rank 0
        state.update(load_checkpoint(job.resume, job, None, n))
        state["sums"] = state["loss_sum"], state["correct"]  # (an elastic run's, on every rank)
        state.update(loss_sum=0.0, correct=0)  # the epoch's sums so far count once, on 0
    bounds = batch_bounds(n, job.batch_size)
    total_steps = cfg.epochs * len(bounds)

    def lr_of(step: int) -> float:
        return lr_at(
            step,
            total_steps,
            job.lr,
            cfg.lr_schedule,
            job.warmup_steps,
            steps_per_epoch=len(bounds),
            gamma=cfg.lr_gamma,
            step_epochs=cfg.lr_step_epochs,
        )

    # the most rows one call of rows() gathers: a worker's share, a chunk, a replica's shard
    parts = job.replicas if job.local else CHUNKS if job.deterministic else comm.size
    # deterministic mode with batch norm sweeps all of a worker's chunks at once
    together = -(-CHUNKS // comm.size) if job.deterministic and net.state.size else 1
    augment = None
    if cfg.augmentation is not None:
        pad, flip = cfg.augmentation
        shape = tuple(job.model["input_shape"])
        augment = dict(shape=shape, pad=pad, flip=flip, seed=cfg.seed)
    rows = BatchRows(x, y, together * -(-min(job.batch_size, n) // parts), cfg.shuffle, augment)
    timer = timing.StepTimer()
    clock = timing.StepClock(comm, hooks)
    progress = comm.progress if rank == 0 else None
    history = state["history"]
    train_seconds, eval_seconds, step = state["train_seconds"], state["eval_seconds"], state["step"]
    now = time.perf_counter
    checkpoint_every = job.checkpoint_every
    wrote_checkpoint = False
    # early stopping: rank 0 decides from the epochs' losses (those of a resumed run's history
    # too) and every rank learns its decision by the broadcast of `stop`
    plateau = None
    if cfg.tol is not None:
        stop = comm.zeros(1, np.float64)
        if rank == 0:
            plateau = Plateau(cfg.tol, cfg.n_iter_no_change)
            for rec in history:
                plateau.stalled(rec["train_loss"])
    # an elastic run: the epoch's sums so far over every worker, on every rank (a resumed
    # rank other than 0 counts none of them itself)
    sums0 = state.get("sums", (state["loss_sum"], state["correct"]))
    # an elastic run's survivors go on from `done`: the last step every worker completed
    done = dict(ready=False, began=time.time())
    held_state = net.state.copy() if elastic else None  # ... and its running statistics
    # the epoch's time before: an elastic recovery's, or a checkpoint's (rank 0 read it)
    offset = restore["epoch_seconds"] if restore is not None else state.get("epoch_seconds", 0.0)
    try:
        # every rank's start-up (its data mapped, its model built, a checkpoint read) is work,
        # not lateness: --timeout counts none of it
        comm.barrier_after_work(None)
        if job.resume:
            exchange.publish(comm, net.velocity)
            load_optimizer_state(job.resume, opt, state["step"])  # Adam's own moments, every rank
        elif (continued := continued_state(comm, opt)) is not None:
            net.velocity[:] = continued.pop("velocity")  # every rank got the same extras
            opt.load_state_dict(continued)
        exchange.publish(comm, net.params)
        exchange.ready(
            comm,
            opt,
            state.get("local_sgd"),
            read_local_arrays(job.resume, job.model["n_params"], net.params.dtype)
            if job.resume and job.local
            else None,
        )
        if elastic:
            held_state[:] = net.state
            done.update(
                ready=True,
                step=step,
                epoch=state["epoch"],
                batch=state["batch"],
                loss_sum=sums0[0],
                correct=sums0[1],
                train_seconds=train_seconds,
                eval_seconds=eval_seconds,
                epoch_seconds=offset,
                history=history,
            )

        for epoch in range(state["epoch"], cfg.epochs):
            rows.order = epoch_order(n, epoch, cfg.seed, cfg.shuffle)
            rows.epoch = epoch
            first_batch = state["batch"] if epoch == state["epoch"] else 0
            loss_sum, correct = (state["loss_sum"], state["correct"]) if first_batch else (0.0, 0)
            if tally is not None:  # the epoch's sums so far, over every worker, count on rank 0
                base = sums0 if first_batch else (0.0, 0)
                tally.start_epoch(*(base if rank == 0 else (0.0, 0)))
                done["opened"] = (epoch, first_batch, base)
            if epoch != state["epoch"]:
                offset = 0.0
            # every worker starts the epoch together, after rank 0's evaluation of the last one
            comm.barrier_after_work(0)
            exchange.epoch_start(epoch, first_batch, len(bounds))
            e0 = now()
            for b in range(first_batch, len(bounds)):
                hooks.step_start(rank, step)
                clock.begin(e0 if b == first_batch else now())
                net.step = step0 + step  # dropout's key (Model.loss_grad)
                if tally is not None:
                    tally.parity = step & 1
                batch_loss, batch_correct = exchange.gradient(comm, net, rows, *bounds[b], clock)
                exchange.update(comm, opt, lr_of(step))
                clock.record(timer, epoch, now())
                loss_sum += batch_loss
                correct += batch_correct
                step += 1
                if elastic:  # no collective since the exchange: every worker completed it
                    held_state[:] = net.state
                    spent = now() - e0
                    done.update(
                        epoch=epoch,
                        batch=b + 1,
                        step=step,
                        train_seconds=train_seconds + spent,
                        epoch_seconds=offset + spent,
                        began=time.time(),
                    )
                    done.setdefault("first_step_wall", done["began"])  # a recovery's end
                if progress is not None:
                    progress[0], progress[1] = step, total_steps
                # ... and at the run's last step where this run wrote none: a checkpoint
                # named is written (an interval longer than the run wrote none, silently)
                if checkpoint_every and (
                    step % checkpoint_every == 0
                    or (cfg.checkpoint and step == total_steps and not wrote_checkpoint)
                ):
                    wrote_checkpoint = True
                    # the epoch's loss so far, over all workers (this all-reduce is also the
                    # barrier after which every update of this step is done)
                    stats[0], stats[1] = loss_sum, correct
                    if elastic:  # every worker holds the sums: a barrier is enough
                        comm.barrier()
                        stats[0], stats[1] = _epoch_sums(done, tally)
                    else:
                        comm.allreduce_sum_(stats)
                    if rank == 0:
                        save_checkpoint(
                            cfg.checkpoint,
                            job,
                            net,
                            optimizer=opt,
                            step=step,
                            epoch=epoch,
                            batch=b + 1,
                            loss_sum=float(stats[0]),
                            correct=int(round(stats[1])),
                            history=history,
                            train_seconds=train_seconds + now() - e0,
                            eval_seconds=eval_seconds,
                            epoch_seconds=offset + now() - e0,
                            local=exchange.checkpoint_state() if job.local else None,
                        )
                    comm.barrier_after_work(0)  # the next exchange does not wait out the write
            stats[0], stats[1] = loss_sum, correct
            if elastic:  # every worker holds the sums: a barrier ends the epoch's timing
                comm.barrier()
                stats[0], stats[1] = _epoch_sums(done, tally)
                done["loss_sum"], done["correct"] = float(stats[0]), int(stats[1])
            else:
                comm.allreduce_sum_(stats)  # also the barrier that ends the epoch's timing
            e1 = now()
            timer.end(e1)
            epoch_seconds = offset + e1 - e0
            train_seconds += e1 - e0
            done["train_seconds"] = train_seconds
            loss_sum, correct = float(stats[0]), int(round(stats[1]))
            if not math.isfinite(loss_sum):
                raise FloatingPointError(
                    f"{DIVERGED}: the loss is {loss_sum} in epoch {epoch + 1} "
                    f"(lr={job.lr}); try a smaller learning rate"
                )
            if rank == 0:
                v0 = now()
                test_loss, test_acc = net.evaluate(x_test, y_test) if len(x_test) else (None, None)
                eval_seconds += now() - v0
                done["eval_seconds"] = eval_seconds
                rec = {
                    "epoch": epoch + 1,
                    "train_loss": loss_sum / n,
                    "train_accuracy": None if net.loss == "mse" else correct / n,
                    "test_loss": test_loss,
                    "test_accuracy": test_acc,
                    "seconds": epoch_seconds,
                }
                if plateau is not None and plateau.stalled(rec["train_loss"]):
                    rec["stopped"] = (
                        f"stopped after epoch {epoch + 1}: the training loss has not fallen by "
                        f"tol={cfg.tol:g} for {plateau.patience + 1} epochs in a row"
                    )
                history.append(rec)
                comm.report(rec)
            if elastic and comm.backend == "mpi":  # rank 0 may be the rank lost: all hold it
                rec, eval_seconds = comm.broadcast_object(
                    (history[-1], eval_seconds) if rank == 0 else None
                )
                if rank != 0:
                    history.append(rec)
                    done["eval_seconds"] = eval_seconds
            if cfg.tol is not None:
                stop[0] = rank == 0 and "stopped" in history[-1]
                comm.broadcast_(stop, root=0)
                if stop[0]:
                    break
        hooks.step_start(rank, step)  # (a fault injected at the step after the last: the end)
        if elastic:  # a failure in rank 0's last evaluation is a lost worker too
            comm.barrier_after_work(0)
    except (_core.GroupAborted, TimeoutError) as exc:
        if not elastic:
            raise
        # another worker failed (or, TimeoutError, missed a collective): this one stops at
        # once and hands home its state at the last completed step (the group is aborted:
        # by the failure, or by the timeout itself)
        return Interrupted(
            _snapshot(done, net, opt, held_state, tally) if done["ready"] else None,
            getattr(exc, "missing", ()),
            progress=done.get("step", -1),
        )
    out = {
        "rank": rank,
        "steps": step,
        "stamps": timer.array(),
        "calls": comm.calls,
        "bytes_sent": comm.bytes_sent,
        "train_seconds": train_seconds,
        "node_members": comm.node_members,
        "exchange": type(exchange).__name__,
        "first_step_wall": done.get("first_step_wall"),
    }
    if job.local:
        out["local_sgd"] = exchange.record()
    if exchange.clip is not None:
        out["grad_clip"] = exchange.clip.record()
    if rank == 0:
        out.update(
            history=history,
            eval_seconds=eval_seconds,
            params=net.params.copy(),
            velocity=net.velocity.copy(),
            bn_state=net.state.copy(),
            optimizer_state=opt.state_dict(),
        )
    return out
