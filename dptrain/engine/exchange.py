"""How a step's gradient is computed and made the global batch's: one object per strategy.

Every strategy allocates the buffers it exchanges (through the communicator, so that they lie
where the transport reduces them in place), computes this worker's share of the global
batch's gradient, exchanges it, and applies the update:

- ``AllReduce``: the whole flat gradient in one all-reduce (or in buckets, last layer first),
  with the transport's own schedule or the ring / tree;
- ``Overlap``: buckets all-reduced while backward is still running (a communication thread on
  shared memory, MPI_Iallreduce under MPI);
- ``Deterministic``: the global batch cut into CHUNKS fixed chunks by position, each chunk's
  gradient computed alone and the chunks summed in chunk order: nothing depends on which
  worker computed what, so any world size up to CHUNKS gives bitwise-identical weights;
- ``ShardedUpdate`` (workers sharing memory, TrainConfig's shard_update): the parameters and
  the optimizer's state held once in shared memory, each worker summing and updating its slice;
- ``engine.local.LocalSGD`` (TrainConfig's sync_every, replicas): no gradient exchange; K
  replicas take local steps and average their parameters every H steps;
- ``ParameterServer``: the gradients summed on rank 0, which alone updates and broadcasts the
  parameters;
- ``Bf16AllReduce``: each worker rounds its share's gradient to bfloat16 into a shared slot of
  its own; the slots are summed in rank order in float32 and the sum is rounded to bfloat16
  (``comm.sum_into_``), which every worker widens back to float32 for the update: half the
  bytes of a float32 all-reduce, both ways. ``Deterministic(bf16=True)`` rounds each chunk's
  gradient, and the chunks' sum, the same way. (TrainConfig's ``comm_dtype="bfloat16"``, for
  any float32 or bfloat16 model.)

The worker's share: worker r of N takes its contiguous share of each global batch
(``sampler.shard``) and computes the gradient of (sum of its samples' losses) / (global batch
size); the all-reduced SUM of the workers' gradients is then exactly the global batch's mean
gradient, also for an uneven last batch.

A strategy reports its phase boundaries to the step's ``clock`` (``data``, ``computed``,
``exchanged``), which the training loop turns into the step's timings.
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from .. import _core
from ..comm.base import aligned_zeros
from ..models import model_from_spec
from ..sampler import CHUNKS, shard


def gradient_buckets(n_params: int, itemsize: int, bucket_kb: float) -> list[tuple[int, int]]:
    """[(start, stop), ...] of the flat gradient in buckets of about bucket_kb, LAST layer
    first (the flat layout is first layer first, and backward produces the last layer's
    gradient first); one bucket (the whole buffer) when bucket_kb is 0."""
    if bucket_kb <= 0:
        return [(0, n_params)]
    per = max(1, int(bucket_kb * 1024) // itemsize)
    return [(max(0, stop - per), stop) for stop in range(n_params, 0, -per)]


class Tally:
    """An elastic run's epoch sums (loss, correct) as every worker can know them after each
    step, so that the survivors of a lost worker hold them too: before its step's exchange,
    each worker writes its running sums of the epoch into its row of a shared table; after
    it (the exchange is a collective: every row is written), the table summed in rank order
    is the epoch's sums through that step, read where needed (a snapshot, the epoch's end,
    a checkpoint). Two tables, by the step's parity: a worker a step ahead writes the other
    one, and none can be two steps ahead of one that has not passed the step (it would have
    to pass an exchange that worker has not entered)."""

    def __init__(self, comm):
        self.table = comm.shared_zeros(2 * comm.size, 2, np.float64)
        self.rank, self.size = comm.rank, comm.size
        self.mine = np.zeros(2)  # this worker's running sums of the epoch
        self.parity = 0

    def start_epoch(self, loss: float = 0.0, correct: float = 0.0) -> None:
        """A new epoch (or one resumed: loss, correct: its sums so far, on one worker only)."""
        self.mine[:] = loss, correct

    def add(self, loss: float, correct: float) -> None:
        """This worker's share of the step, before the step's exchange."""
        self.mine += loss, correct
        self.table[self.parity * self.size + self.rank][:] = self.mine

    def read(self, parity: int) -> tuple[float, int]:
        """The epoch's sums over every worker through the last step of that parity whose
        exchange is done."""
        rows = self.table[parity * self.size : (parity + 1) * self.size]
        loss = correct = 0.0
        for row in rows:  # in rank order: the same bits on every worker
            loss += row[0]
            correct += row[1]
        return float(loss), int(round(correct))


class MPITally(Tally):
    """Tally for MPI ranks, which share no memory: each step's sums over every rank, by an
    all-reduce of the two values (besides the step's exchange: one more small collective
    per step of an elastic MPI run)."""

    def __init__(self, comm):
        from mpi4py import MPI

        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.table = np.zeros((2, 2))  # by the step's parity: the sums through that step
        self.mine = np.zeros(2)
        self.sums = np.zeros(2)
        self.parity = 0
        self._MPI = MPI

    def add(self, loss: float, correct: float) -> None:
        self.mine += loss, correct
        self.sums[:] = self.mine
        self.comm._comm.Allreduce(self._MPI.IN_PLACE, self.sums, op=self._MPI.SUM)
        self.table[self.parity] = self.sums

    def read(self, parity: int) -> tuple[float, int]:
        loss, correct = self.table[parity]
        return float(loss), int(round(correct))


def tally_for(comm) -> Tally:
    """An elastic run's Tally on comm's transport."""
    return MPITally(comm) if comm.backend == "mpi" else Tally(comm)


class Exchange:
    """The strategy interface (see the module docstring). ``clip``: the run's GradClip
    (engine.clip; TrainConfig's clip_norm), or None. ``tally``: an elastic run's ``Tally``,
    or None."""

    clip = None
    tally = None

    def _tallied(self, loss: float, correct: int) -> tuple[float, int]:
        """This worker's share of the step, added to the elastic run's tally (before the
        exchange: see Tally)."""
        if self.tally is not None:
            self.tally.add(loss, correct)
        return loss, correct

    def buffers(self, comm, n_params: int, dtype) -> dict:
        """Allocates the model's flat buffers (and the strategy's own): {'params', 'grads',
        'velocity'} arrays for the model to live on."""
        self.n_params, self.dtype = n_params, np.dtype(dtype)
        return {
            "params": comm.zeros(n_params, dtype),
            "grads": self._grads(comm),
            "velocity": comm.zeros(n_params, dtype),
        }

    def _grads(self, comm):
        return comm.zeros(self.n_params, self.dtype)

    def gradient(self, comm, model, rows, start: int, stop: int, clock) -> tuple[float, int]:
        """The gradient of global batch positions [start, stop) into ``self.grads`` (exchanged:
        every worker holds the global batch's mean gradient). ``rows(lo, hi)`` returns the
        (x, y) of positions [lo, hi). Returns this worker's (loss sum, correct count)."""
        raise NotImplementedError

    def update(self, comm, opt, lr: float) -> None:
        """The optimizer step from the exchanged gradient (clipped where the run clips)."""
        opt.step(lr, grads=self.clip(self.grads) if self.clip else self.grads)

    def adopt(self, comm, opt) -> None:
        """Places the optimizer's own state (Adam's moments) where the strategy needs it."""

    def publish(self, comm, array) -> None:
        """Every rank's array (the parameters, the velocity) becomes rank 0's."""
        comm.broadcast_(array, root=0)

    def ready(self, comm, opt, position=None, arrays=None) -> None:
        """The model and the optimizer are set up (published, resumed): a strategy's own
        start (local SGD's replicas; position/arrays: its record in a resumed checkpoint)."""

    def epoch_start(self, epoch: int, batch: int, batches: int) -> None:
        """The loop starts (or resumes) epoch `epoch` at batch `batch` of `batches`."""

    def batch_norm(self, comm, net, spec: dict, threads: int) -> None:
        """The model (``net``, built from ``spec`` on ``threads`` threads) has batch norm,
        whose statistics are the global batch's: each worker's per-channel sums all-reduced
        inside the engine's sweep."""
        if comm.size > 1:
            allreduce_batch_norm(comm, net)

    @staticmethod
    def _share(comm, model, rows, start, stop, clock) -> tuple[float, int]:
        """This worker's share of the batch into ``model.grads`` (zeroed first), scaled by
        1 / (global batch); the clock marks the data and the compute phases."""
        lo, hi = shard(start, stop, comm.rank, comm.size)
        x, y = rows(lo, hi)
        clock.data_done()
        model.zero_grad()
        loss, correct = model.loss_grad(x, y, 1.0 / (stop - start), row0=lo - start)
        clock.computed()
        return loss, correct


def allreduce_batch_norm(comm, net) -> None:
    """Batch norm over the global batch: each worker's per-channel sums (forward: of x and x^2,
    and the count; backward: of dy and dy xhat) all-reduced inside the engine's sweep, so
    every worker normalizes by the same statistics (PyTorch's SyncBatchNorm, always on)."""
    held = comm.zeros(net.state.size + 1, np.float64)  # a batch norm's 2 C + 1 at most

    def exchange(buf):
        k = len(buf)
        held[:k] = buf
        comm.allreduce_sum_(held, start=0, stop=k)
        buf[:] = held[:k]

    net._net.set_exchange(exchange)


class AllReduce(Exchange):
    """Compute this worker's share, then all-reduce the flat gradient (in buckets)."""

    def __init__(self, algorithm: str = "native", bucket_kb: float = 0.0):
        self.algorithm, self.bucket_kb = algorithm, bucket_kb

    def _grads(self, comm):
        return comm.zeros(self.n_params, self.dtype, algorithm=self.algorithm)

    def gradient(self, comm, model, rows, start, stop, clock):
        loss, correct = self._tallied(*self._share(comm, model, rows, start, stop, clock))
        grads = self.grads = model.grads
        for lo, hi in gradient_buckets(grads.size, grads.itemsize, self.bucket_kb):
            comm.allreduce_sum_(grads, start=lo, stop=hi)  # one collective per bucket
        clock.exchanged()
        return loss, correct


class Overlap(Exchange):
    """Backward layer by layer, last first; a bucket's all-reduce starts as soon as every
    layer it covers is done, and runs while the next layers are computed."""

    def __init__(self, bucket_kb: float):
        self.bucket_kb = bucket_kb

    def gradient(self, comm, model, rows, start, stop, clock):
        lo, hi = shard(start, stop, comm.rank, comm.size)
        x, y = rows(lo, hi)
        clock.data_done()
        model.zero_grad()
        loss, correct = model.forward_loss(x, y, 1.0 / (stop - start), row0=lo - start)
        grads = self.grads = model.grads
        buckets = gradient_buckets(grads.size, grads.itemsize, self.bucket_kb)
        starts = [lo for lo, _ in model.layer_slices()]
        handles, k = [], 0
        for layer in reversed(range(len(starts))):
            model.backward_layer(layer)
            while k < len(buckets) and buckets[k][0] >= starts[layer]:
                handles.append(comm.allreduce_async_(grads, *buckets[k]))
                k += 1
        clock.computed()
        comm.wait_(handles)  # the communication backward did not hide
        clock.exchanged()
        return loss, correct


class Bf16AllReduce(Exchange):
    """Compute this worker's share in float32, round it to bfloat16 into this worker's shared
    slot, then sum every worker's slot in rank order in float32 into the gradient every
    worker reads."""

    def buffers(self, comm, n_params, dtype):
        bufs = super().buffers(comm, n_params, dtype)
        self.slots = comm.shared_zeros(comm.size, n_params, np.uint16)  # bfloat16 bits
        self.sum = comm.shared_zeros(1, n_params, np.uint16)[0]  # their sum, bfloat16
        self.grads = aligned_zeros(n_params, dtype)  # ... widened
        return bufs

    def gradient(self, comm, model, rows, start, stop, clock):
        loss, correct = self._tallied(*self._share(comm, model, rows, start, stop, clock))
        _core.to_bf16(model.grads, self.slots[comm.rank])  # the exchange's own cost
        comm.sum_into_(self.sum, self.slots)
        _core.from_bf16(self.sum, self.grads)
        clock.exchanged()
        return loss, correct


class Deterministic(Exchange):
    """CHUNKS fixed chunks of the global batch, each computed alone into its own shared
    array, summed in chunk order into the gradient every worker reads. bf16: each chunk's
    gradient is computed in float32 and rounded to bfloat16 into its shared array.

    With batch norm a chunk cannot be computed alone: its forward needs the global batch's
    statistics. Each of the worker's chunks is then swept by a model of its own, all at once
    (``ChunkSweeps``), and each batch norm's totals are summed over the chunks in chunk order,
    so they too are the same bits whatever the number of workers."""

    def __init__(self, bf16: bool = False):
        self.bf16 = bf16
        self.sweeps = None

    def buffers(self, comm, n_params, dtype):
        bufs = super().buffers(comm, n_params, dtype)
        self.chunks = comm.shared_zeros(CHUNKS, n_params, np.uint16 if self.bf16 else dtype)
        # the chunks' ordered sum (bf16: in bfloat16, widened into grads for the update)
        self.sum = comm.shared_zeros(1, n_params, np.uint16)[0] if self.bf16 else None
        self.grads = (
            aligned_zeros(n_params, dtype)
            if self.bf16
            else comm.shared_zeros(1, n_params, dtype)[0]
        )
        self.mine = range(comm.rank * CHUNKS // comm.size, (comm.rank + 1) * CHUNKS // comm.size)
        self.work = aligned_zeros(n_params, dtype) if self.bf16 else None  # a chunk, float32
        return bufs

    def batch_norm(self, comm, net, spec, threads):
        # where each chunk's gradient is computed: its shared array, or (bf16) a float32 one
        into = {
            c: aligned_zeros(self.n_params, self.dtype) if self.bf16 else self.chunks[c]
            for c in self.mine
        }
        self.sweeps = ChunkSweeps(comm, net, spec, threads, self.mine, into)

    def gradient(self, comm, model, rows, start, stop, clock):
        if self.sweeps is not None:
            loss, correct = self.sweeps.gradient(model, rows, start, stop, clock)
            if self.bf16:
                for c, into in zip(self.mine, self.sweeps.into):
                    _core.to_bf16(into, self.chunks[c])
        else:
            loss, correct = 0.0, 0
            for c in self.mine:
                with clock.data():
                    lo, hi = shard(start, stop, c, CHUNKS)
                    x, y = rows(lo, hi)
                into = self.work if self.bf16 else self.chunks[c]
                _core.zero_(into)
                cl, cc = model.loss_grad(x, y, 1.0 / (stop - start), grads=into, row0=lo - start)
                if self.bf16:
                    _core.to_bf16(into, self.chunks[c])
                loss += cl
                correct += cc
        clock.computed()
        self._tallied(loss, correct)
        if self.bf16:
            comm.sum_into_(self.sum, self.chunks)  # the chunks, summed in chunk order
            _core.from_bf16(self.sum, self.grads)
        else:
            comm.sum_into_(self.grads, self.chunks)
        clock.exchanged()
        return loss, correct


class ChunkSweeps:
    """Deterministic mode with batch norm: each of this worker's chunks swept by a model of its
    own (the worker's model for the first, on the worker's thread; one more model per chunk,
    on the same parameters, each on a thread of its own), all at once. Each batch norm's
    per-chunk totals (forward: the sums of x and x^2 and the count; backward: of dy and
    dy xhat) meet in one shared array per chunk; the worker's thread sums the CHUNKS arrays
    in chunk order (``comm.sum_into_``, across the workers) and every chunk normalizes by
    that sum. A chunk's totals depend only on its rows, and their sum only on the chunk
    order, so the statistics, the running statistics and the gradients are the same bits on
    any number of workers.

    A failure in any chunk's sweep (or the exchange's: a worker gone) breaks the chunks'
    barrier, so the others stop too; the step raises once every chunk's thread is done."""

    def __init__(self, comm, net, spec, threads, mine, into):
        self.comm, self.mine = comm, list(mine)
        self.models = [net] + [
            model_from_spec(
                spec, threads=threads, params=net.params, grads=into[c], velocity=net.velocity
            )
            for c in self.mine[1:]
        ]
        self.into = [into[c] for c in self.mine]
        width = net.state.size + 1  # a batch norm's 2 C + 1 at most
        self.totals = comm.shared_zeros(CHUNKS, width, np.float64)
        self.total = comm.shared_zeros(1, width, np.float64)[0]
        self.barrier = threading.Barrier(len(self.mine))
        for i, (c, m) in enumerate(zip(self.mine, self.models)):
            m._net.set_exchange(self._exchanger(c, i == 0))
        self.pool = None
        if len(self.mine) > 1:
            self.pool = ThreadPoolExecutor(len(self.mine) - 1, thread_name_prefix="dptrain-chunk")
            weakref.finalize(self, self.pool.shutdown, wait=False)

    def _exchanger(self, c: int, leader: bool):
        def exchange(buf):
            k = len(buf)
            self.totals[c][:k] = buf
            self.barrier.wait()  # every chunk of this worker has written its totals
            if leader:
                self.comm.sum_into_(self.total, self.totals)  # in chunk order, all workers
            self.barrier.wait()
            buf[:] = self.total[:k]

        return exchange

    def gradient(self, net, rows, start, stop, clock):
        with clock.data():  # the worker's chunks are consecutive: one gather
            bounds = [shard(start, stop, c, CHUNKS) for c in self.mine]
            first = bounds[0][0]
            x, y = rows(first, bounds[-1][1])
        scale = 1.0 / (stop - start)
        for m in self.models[1:]:
            m.step = net.step  # dropout's key
            m.state[:] = net.state  # the running statistics: each chunk's model updates its own

        def sweep(i):
            lo, hi = bounds[i]
            _core.zero_(self.into[i])
            try:
                return self.models[i].loss_grad(
                    x[lo - first : hi - first],
                    y[lo - first : hi - first],
                    scale,
                    grads=self.into[i],
                    row0=lo - start,
                )
            except BaseException:
                self.barrier.abort()  # the other chunks must not wait for this one
                raise

        futures = [self.pool.submit(sweep, i) for i in range(1, len(self.mine))]
        failure = None
        try:
            results = [sweep(0)]
        except BaseException as exc:
            failure, results = exc, []
        wait(futures)
        for f in futures:
            exc = f.exception()
            if exc is None:
                results.append(f.result())
            elif failure is None or isinstance(failure, threading.BrokenBarrierError):
                failure = exc  # the chunk that failed first, not one the barrier stopped
        if failure is not None:
            raise failure
        loss, correct = 0.0, 0
        for cl, cc in results:  # in chunk order
            loss += cl
            correct += cc
        return loss, correct


class ShardedUpdate(Exchange):
    """The all-reduce and the update split over the workers (workers sharing memory): the
    parameters, the velocity and the optimizer's own state live once, in shared memory; each
    worker writes its share of the gradient into a shared slot, sums its slice of every slot
    in rank order (the native all-reduce's sum, so the same bits) and updates that slice of
    the parameters and the state; a barrier then publishes them to every worker.

    Against AllReduce, each of N workers updates 1/N of the parameters instead of all of them,
    from a slice of the gradient it has just summed (in its cache) instead of a gradient the
    other workers wrote, and the sum is written once instead of into N buffers; the
    parameters are read from shared memory by the next step's forward. (TrainConfig's
    shard_update.)"""

    def buffers(self, comm, n_params, dtype):
        self.n_params, self.dtype = n_params, np.dtype(dtype)
        self.slots = comm.shared_zeros(comm.size, n_params, dtype)  # each worker's gradient
        self.grads = comm.shared_zeros(1, n_params, dtype)[0]  # their sum
        return {
            "params": comm.shared_zeros(1, n_params, dtype)[0],
            "grads": self.slots[comm.rank],
            "velocity": comm.shared_zeros(1, n_params, dtype)[0],
        }

    def gradient(self, comm, model, rows, start, stop, clock):
        loss, correct = self._share(comm, model, rows, start, stop, clock)
        self.part = comm.reduce_scatter_into_(self.grads, self.slots)  # this worker's slice
        clock.exchanged()
        return loss, correct

    def update(self, comm, opt, lr):
        grads = self.grads
        if self.clip:  # the whole gradient's norm: every slice summed first
            comm.barrier()
            grads = self.clip(self.grads, part=self.part)
        opt.step(lr, grads=grads, part=self.part)
        # every slice summed and updated before any worker reads the parameters (or the sum:
        # the next step's slots are written only after this)
        comm.barrier()

    def adopt(self, comm, opt):
        for name, own in opt._own().items():
            shared = comm.shared_zeros(1, own.size, own.dtype)[0]
            shared[:] = own  # the same values on every rank
            setattr(opt, name, shared)

    def publish(self, comm, array):
        comm.barrier()  # one array for all: rank 0's writes are everyone's after a barrier


class ParameterServer(Exchange):
    """The gradients' sum to rank 0, which alone updates, then sends the parameters out."""

    def gradient(self, comm, model, rows, start, stop, clock):
        loss, correct = self._share(comm, model, rows, start, stop, clock)
        self.grads = comm.reduce_sum_(model.grads, root=0)  # the gradients' sum, for rank 0
        clock.exchanged()
        self.params = model.params
        return loss, correct

    def update(self, comm, opt, lr):
        if comm.rank == 0:
            opt.step(lr, grads=self.clip(self.grads) if self.clip else self.grads)
        else:
            opt.steps += 1
        comm.broadcast_(self.params, root=0)


def make_exchange(config, comm=None) -> Exchange:
    """The strategy a TrainConfig asks for (on comm, the run's communicator: ShardedUpdate
    where its workers share memory)."""
    bf16 = config.comm_dtype == "bfloat16"
    if config.deterministic:
        return Deterministic(bf16)
    if bf16:  # the config allows it with the native all-reduce only
        return Bf16AllReduce()
    if config.allreduce == "ps":
        return ParameterServer()
    if config.overlap:
        return Overlap(config.bucket_kb)
    if config.shard_update and comm is not None and comm.size > 1:  # the config checked the rest
        if comm.backend not in ("thread", "process"):  # e.g. MPI chosen by the launcher
            raise ValueError(
                f"shard_update=True needs workers sharing memory (backend thread or process); "
                f"this run's workers are {comm.backend} ranks"
            )
        return ShardedUpdate()
    return AllReduce(config.allreduce, config.bucket_kb)
