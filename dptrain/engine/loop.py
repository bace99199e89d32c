"""The training loop of one worker, the same on every transport.

    for each epoch:        a seeded order of the training set (sampler.epoch_order)
        for each batch:    the global batch's positions [start, stop)
            loss = exchange.gradient(...)    this worker's share, computed and exchanged
            exchange.update(opt, lr)         the same SGD step on every worker
            timer.step(...)                  where the step's time went

The loop knows nothing of transports (``comm`` is a ``dptrain.comm.Communicator``), of how
the gradient is exchanged (``engine.exchange``), or of injected faults and stragglers
(``Hooks``, given from outside). It returns the worker's timings; rank 0 also returns the
per-epoch history and the final parameters.
"""
from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager

import numpy as np

from .. import _core
from .._aligned import aligned_empty
from ..config import TrainConfig
from ..measure import timing
from ..models import model_from_spec, storage_dtype
from ..optim import SGD, lr_at
from ..comm import LocalComm
from ..sampler import CHUNKS, batch_bounds, epoch_order, shard
from .checkpoint import load_checkpoint, save_checkpoint
from .exchange import AllReduce, make_exchange
from .job import Job


class Hooks:
    """What wraps the loop from outside; the default does nothing."""

    def step_start(self, rank: int, step: int) -> None:
        """Called before each step."""

    def computed(self, rank: int) -> None:
        """Called when a step's compute is done, before its exchange."""


class Injection(Hooks):
    """Faults and stragglers, to study failures and synchronization: worker `fault[0]` fails
    at step `fault[1]` (raise, or SIGKILL itself); worker `straggle[0]` computes `straggle[1]`
    ms longer every step; every worker computes U(0, straggle_random_ms) ms longer (seeded).
    The delays are sleeps: the core stays free."""

    def __init__(self, config: TrainConfig, rank: int):
        self.fault = config.fault
        self.fixed = (config.straggle[1] / 1e3
                      if config.straggle and config.straggle[0] == rank else 0.0)
        self.spread = config.straggle_random_ms / 1e3
        self.rng = np.random.default_rng([config.seed, rank, 0x57a6])

    def step_start(self, rank, step):
        if self.fault and self.fault[0] == rank and self.fault[1] == step:
            if self.fault[2] == "kill":
                import signal
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault on rank {rank} at step {step}")

    def computed(self, rank):
        delay = self.fixed + (self.rng.uniform(0.0, self.spread) if self.spread else 0.0)
        if delay:
            time.sleep(delay)


def hooks_for(config: TrainConfig, rank: int) -> Hooks:
    """The hooks a config asks for (none unless faults or stragglers are injected)."""
    if config.fault or config.straggle or config.straggle_random_ms:
        return Injection(config, rank)
    return Hooks()


class StepClock:
    """The phase boundaries of one step (perf_counter), marked by the exchange strategy:
    start ─data─ b ─compute─ c ─exchange─ d ─update─ e; and the seconds the exchange waited
    at its collectives' entry (read from the communicator)."""

    __slots__ = ("comm", "hooks", "rank", "start", "data_seconds", "t_data", "t_compute",
                 "t_exchange", "waited_before")

    def __init__(self, comm, hooks: Hooks):
        self.comm, self.hooks, self.rank = comm, hooks, comm.rank

    def begin(self, t: float) -> None:
        self.start, self.data_seconds, self.t_data = t, 0.0, None

    def data_done(self) -> None:
        """The batch is gathered (strategies that gather once)."""
        self.t_data = time.perf_counter()

    @contextmanager
    def data(self):
        """Times one of several gathers (strategies that gather per chunk)."""
        t0 = time.perf_counter()
        yield
        self.data_seconds += time.perf_counter() - t0

    def computed(self) -> None:
        self.hooks.computed(self.rank)              # an injected straggler computes longer
        self.t_compute = time.perf_counter()
        self.waited_before = self.comm.waited

    def exchanged(self) -> None:
        self.t_exchange = time.perf_counter()

    def record(self, timer: timing.StepTimer, epoch: int, t_update: float) -> None:
        t_data = self.t_data if self.t_data is not None else self.start + self.data_seconds
        timer.step(epoch, self.start, t_data, self.t_compute, self.t_exchange, t_update,
                   self.comm.waited - self.waited_before)


class BatchRows:
    """(x, y) of positions [lo, hi) of an epoch's order: gathered into reused buffers
    (``_core.gather_rows``, GIL released, so thread workers gather at the same time), or
    contiguous slices (no copy) when the order is the data set's own."""

    def __init__(self, x, y, rows: int, shuffle: bool):
        self.x, self.y, self.shuffle = x, y, shuffle
        self.xb = aligned_empty((rows,) + x.shape[1:], x.dtype)
        self.yb = aligned_empty((rows,) + y.shape[1:], y.dtype)
        self.order = None

    def __call__(self, lo: int, hi: int):
        if self.shuffle:
            bx, by = self.xb[:hi - lo], self.yb[:hi - lo]
            _core.gather_rows(self.x, self.order[lo:hi], bx)
            _core.gather_rows(self.y, self.order[lo:hi], by)
            return bx, by
        return self.x[lo:hi], self.y[lo:hi]


DATA_NAMES = ("x_train", "y_train", "x_test", "y_test")   # a run's data, as launch's extras
INIT_PARAMS = "init_params"      # the extra holding the starting parameters of a user's model


def train_worker(comm, job: Job) -> dict:
    """What every worker of a run executes (``dptrain.comm.launch``'s fn): the training loop
    on the run's data and starting parameters, which the launcher gave as extras (the data
    set under ``DATA_NAMES``; the parameters of a model the user built under
    ``INIT_PARAMS``, when there is one)."""
    x, y, x_test, y_test = (comm.extra(name) for name in DATA_NAMES)
    return run_worker(comm, job, x, y, x_test, y_test,
                      init_params=comm.extra(INIT_PARAMS, None))


def uncoupled_worker(comm, job: Job) -> dict:
    """One of N workers that never talk (``Job.uncoupled``): after one start barrier (so that
    all run at the same moment), a 1-worker run on this rank's 1/N of the training set.
    Evaluation uses one test row: it is outside the timed loop and only has to exist."""
    x, y, x_test, y_test = (comm.extra(name) for name in DATA_NAMES)
    comm.barrier()
    lo, hi = shard(0, len(x), comm.rank, comm.size)
    out = run_worker(LocalComm(), job.uncoupled(), x[lo:hi], y[lo:hi], x_test[:1], y_test[:1])
    return {"train_seconds": out["train_seconds"]}


def run_worker(comm, job: Job, x, y, x_test, y_test, *, hooks: Hooks | None = None,
               init_params=None) -> dict:
    """The training loop of one worker (see the module docstring). init_params: the starting
    parameters (a model the user built), else the model's seeded initialization. Rank 0
    reports each epoch's record (``comm.report``: the launcher prints it) and returns the
    history and the final parameters. (The launcher closes the communicator after.)"""
    cfg = job.config
    hooks = hooks or hooks_for(cfg, comm.rank)
    rank = comm.rank
    exchange = make_exchange(cfg) if job.coupled else AllReduce()
    n_params = job.model["n_params"]
    bufs = exchange.buffers(comm, n_params, storage_dtype(job.model["dtype"]))
    net = model_from_spec(job.model, threads=cfg.threads, **bufs)
    opt = SGD(net, job.lr, momentum=cfg.momentum, dampening=cfg.dampening,
              weight_decay=cfg.weight_decay, nesterov=cfg.nesterov)
    stats = comm.zeros(2, np.float64)
    state = {"step": 0, "epoch": 0, "batch": 0, "loss_sum": 0.0, "correct": 0, "history": [],
             "train_seconds": 0.0, "eval_seconds": 0.0}
    n = len(x)
    if rank == 0:
        if job.resume:
            state.update(load_checkpoint(job.resume, job, net, n))
        elif init_params is not None:
            net.params[:] = init_params
        else:
            net.reset_parameters()          # the seeded init, into the exchanged buffer
    if job.resume:
        # every rank reads the position (the file is visible to all: one machine, or a shared
        # file system under MPI); parameters and momentum come from rank 0
        if rank != 0:
            state.update(load_checkpoint(job.resume, job, None, n))
            state.update(loss_sum=0.0, correct=0)   # the epoch's sums so far count once, on 0
        comm.broadcast_(net.velocity, root=0)
    comm.broadcast_(net.params, root=0)
    opt.steps = state["step"]

    bounds = batch_bounds(n, job.batch_size)
    total_steps = cfg.epochs * len(bounds)
    parts = CHUNKS if job.deterministic else comm.size
    rows = BatchRows(x, y, -(-min(job.batch_size, n) // parts), cfg.shuffle)
    timer = timing.StepTimer()
    clock = StepClock(comm, hooks)
    progress = comm.progress if rank == 0 else None
    history = state["history"]
    train_seconds, eval_seconds, step = state["train_seconds"], state["eval_seconds"], state["step"]
    now = time.perf_counter
    for epoch in range(state["epoch"], cfg.epochs):
        rows.order = epoch_order(n, epoch, cfg.seed, cfg.shuffle)
        first_batch = state["batch"] if epoch == state["epoch"] else 0
        loss_sum, correct = (state["loss_sum"], state["correct"]) if first_batch else (0.0, 0)
        comm.barrier()                    # every worker starts the epoch together
        e0 = now()
        for b in range(first_batch, len(bounds)):
            hooks.step_start(rank, step)
            clock.begin(e0 if b == first_batch else now())
            batch_loss, batch_correct = exchange.gradient(comm, net, rows, *bounds[b], clock)
            exchange.update(comm, opt, lr_at(step, total_steps, job.lr, cfg.lr_schedule,
                                             job.warmup_steps))
            clock.record(timer, epoch, now())
            loss_sum += batch_loss
            correct += batch_correct
            step += 1
            if progress is not None:
                progress[0], progress[1] = step, total_steps
            if job.checkpoint_every and step % job.checkpoint_every == 0:
                # the epoch's loss so far, over all workers (this all-reduce is also the
                # barrier after which every update of this step is done)
                stats[0], stats[1] = loss_sum, correct
                comm.allreduce_sum_(stats)
                if rank == 0:
                    save_checkpoint(cfg.checkpoint, job, net, step=step, epoch=epoch,
                                    batch=b + 1, loss_sum=float(stats[0]),
                                    correct=int(round(stats[1])), history=history,
                                    train_seconds=train_seconds + now() - e0,
                                    eval_seconds=eval_seconds)
        stats[0], stats[1] = loss_sum, correct
        comm.allreduce_sum_(stats)        # also the barrier that ends the epoch's timing
        e1 = now()
        timer.end(e1)
        epoch_seconds = e1 - e0
        train_seconds += epoch_seconds
        loss_sum, correct = float(stats[0]), int(round(stats[1]))
        if not math.isfinite(loss_sum):
            raise FloatingPointError(
                f"training diverged: the loss is {loss_sum} in epoch {epoch + 1} "
                f"(lr={job.lr}); try a smaller learning rate")
        if rank == 0:
            v0 = now()
            test_loss, test_acc = net.evaluate(x_test, y_test) if len(x_test) else (None, None)
            eval_seconds += now() - v0
            rec = {"epoch": epoch + 1, "train_loss": loss_sum / n,
                   "train_accuracy": None if net.loss == "mse" else correct / n,
                   "test_loss": test_loss, "test_accuracy": test_acc, "seconds": epoch_seconds}
            history.append(rec)
            comm.report(rec)
    out = {"rank": rank, "steps": step, "stamps": timer.array(), "calls": comm.calls,
           "bytes_sent": comm.bytes_sent, "train_seconds": train_seconds,
           "node_members": comm.node_members}
    if rank == 0:
        out.update(history=history, eval_seconds=eval_seconds,
                   params=net.params.copy(), velocity=net.velocity.copy())
    return out
