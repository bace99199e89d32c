"""Local SGD (periodic model averaging), as an exchange strategy of the training loop.

K replicas of the model (TrainConfig's ``replicas``; one per worker by default), each with
its own parameters and optimizer state; worker r of N runs replicas [r K / N, (r + 1) K / N)
one after the other. At every step replica k takes its shard k of K of the global batch
(``sampler.shard``, by position: the same rows whoever runs it) and one optimizer step on
its own gradient, scaled as K / (global batch) so that the replicas' mean gradient is the
global batch's. Every H steps (``sync_every``; and at the end of every epoch, where the run
evaluates and checkpoints one model) the replicas' parameters are averaged: each replica's
parameters lie in a slot of ``comm.shared_zeros`` and ``comm.sum_into_`` sums the K slots in
replica order, whatever worker filled them, so **the weights depend on K and H, not on the
number of workers that run the replicas**.

The average is applied by an outer optimizer (DiLoCo, Douillard et al. 2023): delta = anchor
- average (anchor: the parameters at the last average), b = mu b + delta, anchor -= lr
(delta + mu b) (Nesterov); outer lr 1 and momentum 0 (the defaults) are plain averaging,
taken as the average itself. The optimizer's state (SGD's momentum, Adam's moments) is
averaged too, kept per replica, or reset to zero (``local_momentum``). With an average
every step and the state averaged, SGD's replicas are synchronous SGD up to rounding (the
mean of K updates instead of the update of the mean gradient): ``sync_every`` 1 with plain
averaging is not local SGD at all (``TrainConfig.local``) and runs as synchronous SGD.

Batch norm: each replica normalizes by its own shard's statistics (the replicas step alone:
a replica is a model of its own between averages, as a DDP worker without SyncBatchNorm is),
and each average also averages the replicas' running statistics, in replica order.

``local_after`` E: synchronous (an average every step, plain) for the first E epochs, then
local: post-local SGD (Lin et al. 2020). ``sync_every='auto'`` chooses H every AUTO_WINDOW
steps from the window's training loss and the share of its time the averages took (see
``LocalSGD._choose``), every rank from the same all-reduced figures; every choice is
recorded (``LocalSGD.record``: the result's ``local_sgd`` and the trace).

A step's timings: the average is the step's ``average`` phase, and its wait at the
collective's entry the step's sync_wait (``StepClock.averaged``; it runs after the replicas'
updates, and the trace draws it there).
"""

from __future__ import annotations

import time

import numpy as np

from .._aligned import ALIGN, aligned_zeros
from ..comm.placement import AUTO
from ..config import SYNC_EVERY_MAX
from ..models import model_from_spec
from ..optim import make_optimizer
from ..sampler import shard
from .exchange import Exchange

AUTO_START = 2  # sync_every auto's first period
AUTO_MAX = SYNC_EVERY_MAX  # ... and its longest
AUTO_WINDOW = 50  # steps between two of its choices (also at each epoch's end)
AUTO_FALLING = 0.01  # the window's mean loss below the last one's by this share: still falling
AUTO_COSTLY = 0.02  # the averages took more than this share of the window's time


class LocalSGD(Exchange):
    """See the module docstring. ``job``: the run's Job (its config, model spec, replicas)."""

    def __init__(self, job, comm):
        cfg = job.config
        self.job, self.cfg = job, cfg
        self.k = job.replicas
        per = self.k // comm.size
        self.mine = range(comm.rank * per, (comm.rank + 1) * per)
        self.auto = cfg.sync_every == AUTO
        self.period = AUTO_START if self.auto else cfg.sync_every
        self.plain = cfg.outer_lr == 1.0 and cfg.outer_momentum == 0.0
        self.averages = 0  # averages done
        self.average_seconds = 0.0
        self.choices: list[dict] = []  # sync_every auto's, in order
        self.since = 0  # local steps since the last average
        self.epoch, self.batch, self.batches = 0, 0, 0
        self.window = np.zeros(4)  # auto: loss sum, samples, average seconds, seconds
        self.window_steps, self.window_t0 = 0, None
        self.last_loss = None  # auto: the last window's mean loss
        self.states = None  # batch norm: every replica's running statistics, in slots of K

    # ---- buffers: every replica's state in a slot of K, the sum's output beside them
    def buffers(self, comm, n_params, dtype):
        self.n_params, self.dtype = n_params, np.dtype(dtype)
        n, k = n_params, self.k
        if self.cfg.local_momentum == "average":
            # the parameters and the velocity side by side in one slot (the velocity on a
            # cache line of its own): an average is one sum (one entry and one exit barrier)
            # and one copy back per replica, not two of each
            stride = n + (-n * self.dtype.itemsize) % ALIGN // self.dtype.itemsize
            self.fused = comm.shared_zeros(k, stride + n, dtype)
            self.fused_mean = comm.shared_zeros(1, stride + n, dtype)[0]
            self.slots = {
                "params": [a[:n] for a in self.fused],
                "velocity": [a[stride:] for a in self.fused],
            }
            self.mean = self.fused_mean[:n]
            self.velocity_mean = self.fused_mean[stride:]
        else:
            self.fused = None
            self.slots = {name: comm.shared_zeros(k, n, dtype) for name in ("params", "velocity")}
            self.mean = comm.shared_zeros(1, n, dtype)[0]  # one sum at a time, in place
        self.grads_of = [aligned_zeros(n_params, dtype) for _ in self.mine]
        self.anchor = aligned_zeros(n_params, dtype)  # the parameters at the last average
        self.outer = None if self.plain else aligned_zeros(n_params, dtype)  # its momentum
        # auto's window figures, all-reduced (allocated here: zeros is collective)
        self.figures = comm.zeros(4, np.float64) if self.auto else None
        first = self.mine[0]
        return {
            "params": self.slots["params"][first],
            "grads": self.grads_of[0],
            "velocity": self.slots["velocity"][first],
        }

    def batch_norm(self, comm, net, spec, threads):
        """No exchange inside the sweep (each replica's statistics are its shard's); slots
        for the replicas' running statistics, averaged with the parameters."""
        self.states = comm.shared_zeros(self.k, net.state.size, np.float64)
        self.state_mean = comm.shared_zeros(1, net.state.size, np.float64)[0]

    def adopt(self, comm, opt):
        """The loop's model and optimizer are this worker's first replica; builds the others
        on their slots, and moves every replica's own optimizer state (Adam's second moment)
        into slots of its own."""
        job = self.job
        self.nets, self.opts = [opt.model], [opt]
        self.mean_of = {}  # each of the optimizer's own states: its sum's output
        for i, k in enumerate(self.mine[1:], 1):
            net = model_from_spec(
                job.model,
                threads=self.cfg.threads,
                params=self.slots["params"][k],
                grads=self.grads_of[i],
                velocity=self.slots["velocity"][k],
            )
            self.nets.append(net)
            self.opts.append(make_optimizer(net, job.lr, self.cfg))
        for name, own in opt._own().items():
            slots = self.slots[name] = comm.shared_zeros(self.k, own.size, own.dtype)
            self.mean_of[name] = comm.shared_zeros(1, own.size, own.dtype)[0]
            for o, k in zip(self.opts, self.mine):
                slots[k][:] = getattr(o, name)
                setattr(o, name, slots[k])

    def publish(self, comm, array):
        """Rank 0's array (the first replica's parameters or velocity) to every rank, through
        the anchor (a slot is one of K arrays summed together, not a broadcast's buffer)."""
        self.anchor[:] = array
        comm.broadcast_(self.anchor, root=0)
        array[:] = self.anchor

    def ready(self, comm, opt, position: dict | None = None, arrays: dict | None = None):
        """After the loop set up the first replica (its parameters, velocity, optimizer
        state: the same on every rank): every replica of this worker starts from it, and the
        anchor is its parameters. position/arrays: a resumed checkpoint's ``local_sgd``
        record and its outer momentum."""
        first = self.opts[0]
        for net, o in zip(self.nets[1:], self.opts[1:]):
            net.params[:] = first.model.params
            net.velocity[:] = first.model.velocity
            net.state[:] = first.model.state  # batch norm's running statistics
            o.load_state_dict(first.state_dict())
        self.anchor[:] = first.model.params
        if position:
            self.period = position["period"]
            self.last_loss = position["last_loss"]
            self.averages = position["averages"]
            self.choices = list(position["choices"])
        if self.outer is not None and arrays and "outer_momentum" in arrays:
            self.outer[:] = arrays["outer_momentum"]

    # ---- a step
    def epoch_start(self, epoch: int, batch: int, batches: int) -> None:
        """The loop starts (or resumes) epoch `epoch` at batch `batch` of `batches`."""
        self.epoch, self.batch, self.batches = epoch, batch, batches
        self.since = 0  # an epoch starts from an average: the previous one ended with one
        self.window[:] = 0.0
        self.window_steps, self.window_t0 = 0, time.perf_counter()

    def gradient(self, comm, model, rows, start, stop, clock):
        loss, correct = 0.0, 0
        scale = self.k / (stop - start)  # each replica's mean: their mean is the batch's
        for net, k in zip(self.nets, self.mine):
            with clock.data():
                lo, hi = shard(start, stop, k, self.k)
                x, y = rows(lo, hi)
            net.zero_grad()
            net.step = model.step  # dropout's key: the step's, on every replica
            cl, cc = net.loss_grad(x, y, scale, row0=lo - start)
            loss += cl
            correct += cc
        clock.computed()
        self.clock, self.samples = clock, stop - start
        self.step_loss = loss
        return loss, correct

    def update(self, comm, opt, lr):
        for o, k in zip(self.opts, self.mine):  # each replica clips its own gradient
            grads = self.clip(o.model.grads, count=k == 0) if self.clip else None
            o.step(lr, grads=grads)
        updated = time.perf_counter()
        self.batch += 1
        self.since += 1
        synchronous = self.epoch < self.cfg.local_after
        due = synchronous or self.since >= self.period or self.batch == self.batches
        if due:
            self._average(comm, plain=synchronous or self.plain)
        self.clock.averaged(updated, due)
        if self.auto and not synchronous:
            self.window[0] += self.step_loss
            self.window[1] += self.samples
            self.window[2] += self.clock.t_exchange - self.clock.t_compute
            self.window_steps += 1
            if self.since == 0 and (self.window_steps >= AUTO_WINDOW or self.batch == self.batches):
                self._choose(comm)

    def _average(self, comm, plain: bool) -> None:
        """The replicas' parameters (and the optimizer's state, by local_momentum) averaged
        in replica order; every replica of this worker continues from the result."""
        t0 = time.perf_counter()
        scale = 1.0 / self.k
        mean = self.mean
        fused = self.fused is not None
        if fused:  # the parameters' and the velocity's means in one sum
            comm.sum_into_(self.fused_mean, self.fused, scale=scale)
        else:
            comm.sum_into_(mean, self.slots["params"], scale=scale)
        if not plain:  # the outer Nesterov step on the average's delta from the anchor
            delta = np.subtract(self.anchor, mean, out=self.grads_of[0])
            mu, b = self.cfg.outer_momentum, self.outer
            b *= mu
            b += delta
            delta += mu * b
            delta *= self.cfg.outer_lr
            self.anchor -= delta
        elif not self.plain:  # a synchronous epoch's average: the outer step's next anchor
            self.anchor[:] = mean
        # every replica continues from the result (the shared mean is only read: a rank
        # still reading it may be behind; the next sum's entry barrier waits for them all)
        for k in self.mine:
            if fused and plain:
                self.fused[k][:] = self.fused_mean
                continue
            self.slots["params"][k][:] = mean if plain else self.anchor
            if fused:
                self.slots["velocity"][k][:] = self.velocity_mean
        if self.states is not None:  # batch norm's running statistics, in replica order
            for net, k in zip(self.nets, self.mine):
                self.states[k][:] = net.state
            comm.sum_into_(self.state_mean, self.states, scale=scale)
            for net in self.nets:
                net.state[:] = self.state_mean
        policy = self.cfg.local_momentum
        for name, slots in self.slots.items():
            if name == "params" or (name == "velocity" and fused) or policy == "local":
                continue
            if policy == "average":
                comm.sum_into_(self.mean_of[name], slots, scale=scale)
            for k in self.mine:
                if policy == "average":
                    slots[k][:] = self.mean_of[name]
                else:
                    slots[k].fill(0)
        self.since = 0
        self.averages += 1
        self.average_seconds += time.perf_counter() - t0

    def _choose(self, comm) -> None:
        """sync_every auto (AdaComm-like, Wang & Joshi 2019): after a window of steps, from
        the window's mean training loss and the share of its time the averages took (the
        sums of every rank, all-reduced: each rank makes the same choice), double H while
        the loss falls by more than AUTO_FALLING and the averages cost more than AUTO_COSTLY
        of the time; halve it when the loss stops falling (a shorter period lowers the
        error floor); else keep it."""
        now = time.perf_counter()
        self.window[3] = now - self.window_t0
        figures = self.figures
        figures[:] = self.window
        comm.allreduce_sum_(figures)
        loss = figures[0] / max(figures[1], 1.0)
        cost = figures[2] / figures[3] if figures[3] > 0 else 0.0
        old = self.period
        if self.last_loss is None:
            why = "first window"
        elif loss < self.last_loss * (1 - AUTO_FALLING):
            if cost > AUTO_COSTLY and old < AUTO_MAX:
                self.period = min(2 * old, AUTO_MAX)
                why = "loss falling, averages costly: doubled"
            else:
                why = "loss falling" + (", averages cheap" if cost <= AUTO_COSTLY else "")
        else:
            self.period = max(old // 2, 1)
            why = "loss not falling: halved" if old > 1 else "loss not falling"
        self.choices.append(
            {
                "epoch": self.epoch,
                "batch": self.batch,
                "loss": float(loss),
                "average_share": float(cost),
                "sync_every": self.period,
                "was": old,
                "why": why,
            }
        )
        self.last_loss = float(loss)
        self.window[:] = 0.0
        self.window_steps, self.window_t0 = 0, time.perf_counter()

    # ---- what the run records and checkpoints
    def record(self) -> dict:
        """The result's ``local_sgd`` field."""
        cfg = self.cfg
        return {
            "replicas": self.k,
            "sync_every": cfg.sync_every,
            "local_after": cfg.local_after,
            "local_momentum": cfg.local_momentum,
            "outer_lr": cfg.outer_lr,
            "outer_momentum": cfg.outer_momentum,
            "averages": self.averages,
            "average_seconds": self.average_seconds,
            "period": self.period,
            "choices": self.choices,
        }

    def checkpoint_state(self) -> tuple[dict, dict]:
        """(position, arrays) that a checkpoint holds to resume bitwise: the auto state and
        the outer momentum."""
        position = {
            "period": self.period,
            "last_loss": self.last_loss,
            "averages": self.averages,
            "choices": self.choices,
        }
        arrays = {} if self.outer is None else {"outer_momentum": self.outer}
        return position, arrays
