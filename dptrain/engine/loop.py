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

from ..comm import LocalComm
from ..measure import timing
from ..models import model_from_spec, storage_dtype
from ..optim import lr_at, make_optimizer
from ..sampler import CHUNKS, BatchRows, batch_bounds, epoch_order, shard
from .checkpoint import load_checkpoint, load_optimizer_state, read_local_arrays, save_checkpoint
from .clip import GradClip
from .exchange import AllReduce, make_exchange
from .hooks import Hooks, hooks_for
from .job import Job
from .local import LocalSGD

DATA_NAMES = ("x_train", "y_train", "x_test", "y_test")  # a run's data, as launch's extras
INIT_PARAMS = "init_params"  # the extra holding the starting parameters of a user's model
INIT_STATE = "init_state"  # ... and its batch norms' running statistics
INIT_STEP = "init_step"  # ... and its dropout step count (int64 [step]): a fit continues it
# the extras holding a previous run's optimizer state that fit(optimizer_state=...) continues:
# INIT_OPTIMIZER + "steps" (one int64), + "velocity", + each of its state_dict()'s arrays
INIT_OPTIMIZER = "init_optimizer_"


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
    out["placement"] = comm.placement  # where launch placed this worker (its CPUs, pinned?)
    return out


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
    hooks = hooks or hooks_for(cfg, comm.rank)
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
    n_params = job.model["n_params"]
    bufs = exchange.buffers(comm, n_params, storage_dtype(job.model["dtype"]))
    net = model_from_spec(job.model, threads=cfg.threads, **bufs)
    if net.state.size:  # batch norm: its statistics are the global batch's
        exchange.batch_norm(comm, net, job.model, cfg.threads)
    opt = make_optimizer(net, job.lr, cfg)
    exchange.adopt(comm, opt)
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
    if job.resume and rank != 0:
        # every rank reads the position (the file is visible to all: one machine, or a shared
        # file system under MPI); parameters and momentum come from rank 0
        state.update(load_checkpoint(job.resume, job, None, n))
        state.update(loss_sum=0.0, correct=0)  # the epoch's sums so far count once, on 0
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
    # early stopping: rank 0 decides from the epochs' losses (those of a resumed run's history
    # too) and every rank learns its decision by the broadcast of `stop`
    plateau = None
    if cfg.tol is not None:
        stop = comm.zeros(1, np.float64)
        if rank == 0:
            plateau = Plateau(cfg.tol, cfg.n_iter_no_change)
            for rec in history:
                plateau.stalled(rec["train_loss"])
    for epoch in range(state["epoch"], cfg.epochs):
        rows.order = epoch_order(n, epoch, cfg.seed, cfg.shuffle)
        rows.epoch = epoch
        first_batch = state["batch"] if epoch == state["epoch"] else 0
        loss_sum, correct = (state["loss_sum"], state["correct"]) if first_batch else (0.0, 0)
        # every worker starts the epoch together, after rank 0's evaluation of the last one
        comm.barrier_after_work(0)
        exchange.epoch_start(epoch, first_batch, len(bounds))
        e0 = now()
        for b in range(first_batch, len(bounds)):
            hooks.step_start(rank, step)
            clock.begin(e0 if b == first_batch else now())
            net.step = step0 + step  # dropout's key (Model.loss_grad)
            batch_loss, batch_correct = exchange.gradient(comm, net, rows, *bounds[b], clock)
            exchange.update(comm, opt, lr_of(step))
            clock.record(timer, epoch, now())
            loss_sum += batch_loss
            correct += batch_correct
            step += 1
            if progress is not None:
                progress[0], progress[1] = step, total_steps
            if checkpoint_every and step % checkpoint_every == 0:
                # the epoch's loss so far, over all workers (this all-reduce is also the
                # barrier after which every update of this step is done)
                stats[0], stats[1] = loss_sum, correct
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
                        local=exchange.checkpoint_state() if job.local else None,
                    )
                comm.barrier_after_work(0)  # the next exchange does not wait out the write
        stats[0], stats[1] = loss_sum, correct
        comm.allreduce_sum_(stats)  # also the barrier that ends the epoch's timing
        e1 = now()
        timer.end(e1)
        epoch_seconds = e1 - e0
        train_seconds += epoch_seconds
        loss_sum, correct = float(stats[0]), int(round(stats[1]))
        if not math.isfinite(loss_sum):
            raise FloatingPointError(
                f"training diverged: the loss is {loss_sum} in epoch {epoch + 1} "
                f"(lr={job.lr}); try a smaller learning rate"
            )
        if rank == 0:
            v0 = now()
            test_loss, test_acc = net.evaluate(x_test, y_test) if len(x_test) else (None, None)
            eval_seconds += now() - v0
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
        if cfg.tol is not None:
            stop[0] = rank == 0 and "stopped" in history[-1]
            comm.broadcast_(stop, root=0)
            if stop[0]:
                break
    out = {
        "rank": rank,
        "steps": step,
        "stamps": timer.array(),
        "calls": comm.calls,
        "bytes_sent": comm.bytes_sent,
        "train_seconds": train_seconds,
        "node_members": comm.node_members,
        "exchange": type(exchange).__name__,
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
