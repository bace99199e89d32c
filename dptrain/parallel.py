"""Workers and how they talk: one communicator interface, three transports.

Every transport gives each worker a ``Communicator`` with the same methods: ``rank``,
``size``, ``buffer(name)`` (this worker's flat array of a named role), ``allreduce_(name,
scale, start, stop)`` (in place, on that array), ``broadcast_(name, root)``, ``barrier()`` and
``abort(code)``. The training loop (dptrain.training) uses nothing else, so it does not know
whether it runs alone, on threads, on processes or on MPI ranks.

- ``LocalComm``: one worker, every collective is a no-op.
- ``ShmComm``: workers that share memory. Threads of this process, or processes mapping one
  nameless ``SharedSegment`` (a memfd). Each named role is one flat array per rank, laid
  out in one block of memory (``SharedLayout``); the all-reduce is one C call that waits at a
  C barrier, sums this rank's slice of every rank's array (in rank order) and writes it back
  into all of them, and waits again. Nothing is pickled on the hot path.
- ``MPIComm``: MPI ranks through mpi4py's buffer collectives (``Allreduce(IN_PLACE, ...)`` on
  the flat array), launched as ``mpiexec -n N python -m dptrain train --backend mpi ...``.

Failures: a worker that raises aborts its group (every other worker's next or current
collective raises ``GroupAborted`` at once) and the launcher reports the first failure with
its rank; a process that dies without a word (SIGKILL) is noticed by the launcher, which
aborts the group itself; workers still computing are terminated a second later, and worker
processes die with their launcher. The shared segment has no name, so nothing is left behind
after any kill.
"""
from __future__ import annotations

import abc
import math
import os
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np

from . import _core

BACKENDS = ("thread", "process", "mpi")
ALIGN = 64


class WorkerError(RuntimeError):
    """A worker failed; ``rank`` names it and ``cause`` says why."""

    def __init__(self, rank: int, cause: str):
        super().__init__(f"worker rank {rank} failed: {cause}")
        self.rank = rank
        self.cause = cause


# ------------------------------------------------------------------ communicators
class Communicator(abc.ABC):
    """The interface the training loop sees (see the module docstring). Every transport
    implements the abstract methods; the asynchronous pair defaults to the blocking call."""

    rank = 0
    size = 1
    backend = "sequential"
    # What this worker's collectives cost it so far (instance counters, read by the training
    # loop's step timers): seconds waited at a collective's entry for the slowest worker
    # (arrival skew, not transfer), collective calls, and bytes sent by the schedule.
    waited = 0.0
    calls = 0
    bytes_sent = 0
    _specs: dict = {}

    def _account(self, kind: str, name: str, start: int = 0, stop: int | None = None,
                 root: int = 0, waited: float = 0.0) -> None:
        """Counts one collective on role `name` (bytes: see collectives.bytes_sent)."""
        self.calls += 1
        self.waited += waited
        if self.size == 1:
            return
        key = (kind, name, start, stop, root)
        cache = self.__dict__.setdefault("_bytes_cache", {})
        nbytes = cache.get(key)
        if nbytes is None:                    # once per distinct collective: a dict hit after
            nbytes = cache[key] = self._bytes_of(kind, name, start, stop, root)
        self.bytes_sent += nbytes

    def _bytes_of(self, kind, name, start, stop, root) -> int:
        from .collectives import bytes_sent
        spec = self._specs.get(name)
        if spec is None:
            return 0
        n = len(range(*slice(start, stop).indices(spec.length)))
        nbytes = n * np.dtype(spec.dtype).itemsize * (spec.count or 1)
        algorithm = spec.algorithm if kind == "allreduce" else kind
        return bytes_sent(algorithm, self.size, nbytes, self.rank, root)

    @abc.abstractmethod
    def buffer(self, name: str) -> np.ndarray:
        """This worker's flat array of a role (or the role's single shared array)."""

    @abc.abstractmethod
    def buffers(self, name: str) -> list:
        """Every array of a role (one per rank, or the role's fixed count)."""

    @abc.abstractmethod
    def allreduce_(self, name: str, scale: float = 1.0, start: int = 0, stop: int | None = None):
        """In place: the role's arrays [start:stop] become scale * their sum over ranks."""

    @abc.abstractmethod
    def reduce_(self, name: str, root: int = 0) -> np.ndarray:
        """The sum of every rank's array of a role for root (parameter server); returns the
        array that holds it on root (its own buffer, or the role's ``reduce_into`` array)."""

    @abc.abstractmethod
    def broadcast_(self, name: str, root: int = 0) -> None:
        """Every rank's array of a role becomes root's."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Returns when every worker has called it."""

    @abc.abstractmethod
    def abort(self, code: int = 1) -> None:
        """Makes every worker's current and next collective fail (one failed worker stops all)."""

    def allreduce_async_(self, name: str, start: int = 0, stop: int | None = None):
        """Starts allreduce_(name, 1.0, start, stop) and returns a handle for wait_; every
        worker must start the same ranges in the same order."""
        self.allreduce_(name, 1.0, start, stop)
        return None

    def wait_(self, handles) -> None:
        """Waits for handles of allreduce_async_ (re-raising a failure of any of them)."""

    def close(self) -> None:
        """Releases what the communicator started (e.g. its communication thread)."""


class LocalComm(Communicator):
    """A single worker: buffers are plain arrays and collectives do nothing (but scale)."""

    def __init__(self, specs):
        self._specs = {s.name: s for s in specs}
        self._all = {s.name: [np.zeros(s.length, s.dtype) for _ in range(s.arrays(1))]
                     for s in specs}

    def buffer(self, name):
        return self._all[name][0]

    def buffers(self, name):
        return self._all[name]

    def allreduce_(self, name, scale=1.0, start=0, stop=None):
        into = self._specs[name].reduce_into
        if into:
            _core.sum_buffers(self._all[into][0], self._all[name], scale=scale, start=start,
                              stop=stop)
        elif scale != 1.0:
            self._all[name][0][start:stop] *= scale

    def reduce_(self, name, root=0):
        self.allreduce_(name)
        into = self._specs[name].reduce_into
        return self._all[into][0] if into else self._all[name][0]

    def broadcast_(self, name, root=0):
        pass

    def barrier(self):
        pass

    def abort(self, code=1):
        pass


@dataclass(frozen=True)
class BufferSpec:
    """A named role of flat arrays: one per rank (params, grads, velocity, stats), or a fixed
    ``count`` of them shared by all ranks (the gradient chunks of deterministic mode). With
    ``reduce_into``, the role's all-reduce writes the sum of its arrays, in index order, into
    that other role's (single) array instead of into every array. ``algorithm`` picks the
    role's all-reduce schedule (``collectives.ALGORITHMS`` less 'ps', which is a training-loop
    scheme): 'native' is the transport's own, 'ring'/'tree' the point-to-point schedules."""

    name: str
    length: int
    dtype: np.dtype
    count: int | None = None
    reduce_into: str | None = None
    algorithm: str = "native"

    def __post_init__(self):
        if self.algorithm not in ("native", "ring", "tree"):
            raise ValueError(f"{self.name}: algorithm is {self.algorithm!r}, expected 'native', "
                             f"'ring' or 'tree'")
        if self.algorithm != "native" and (self.count is not None or self.reduce_into):
            raise ValueError(f"{self.name}: algorithm {self.algorithm!r} needs one array per "
                             f"rank and no reduce_into")

    def arrays(self, world: int) -> int:
        return world if self.count is None else self.count


class SharedLayout:
    """Where everything lives in one block of memory shared by the workers.

    [one control block per role: the barrier and an arrival counter per worker, a 64-byte
    multiple] [role 0: rank 0 .. rank n-1] [role 1: ...] ...
    [extra arrays, e.g. the data set]. Every array starts on a 64-byte boundary, so ranks
    never share a cache line and SIMD loads are aligned.
    """

    def __init__(self, specs, world: int, extras: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.specs = list(specs)
        self.world = world
        off = 0
        self.controls = {}
        # the barrier plus one arrival counter per worker (a timeout names who did not arrive)
        self.control_bytes = _core.group_control_bytes(world)
        for s in self.specs:
            self.controls[s.name] = off
            off += self.control_bytes
        self.arrays = {}
        for s in self.specs:
            nbytes = s.length * np.dtype(s.dtype).itemsize
            for r in range(s.arrays(world)):
                self.arrays[(s.name, r)] = (off, (s.length,), np.dtype(s.dtype))
                off += -(-nbytes // ALIGN) * ALIGN
        self.extras = {}
        for name, (shape, dtype) in extras.items():
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            self.extras[name] = (off, tuple(shape), np.dtype(dtype))
            off += -(-nbytes // ALIGN) * ALIGN
        self.nbytes = max(off, ALIGN)

    def control(self, mem: np.ndarray, name: str) -> np.ndarray:
        """The control block (barrier and arrival counters) of a role's group."""
        off = self.controls[name]
        return mem[off:off + self.control_bytes]

    def array(self, mem: np.ndarray, name: str, rank: int) -> np.ndarray:
        off, shape, dtype = self.arrays[(name, rank)]
        return _view(mem, off, shape, dtype)

    def extra(self, mem: np.ndarray, name: str) -> np.ndarray:
        off, shape, dtype = self.extras[name]
        return _view(mem, off, shape, dtype)

    def init_controls(self, mem: np.ndarray) -> None:
        for s in self.specs:
            _core.init_group_control(self.control(mem, s.name), self.world)


def _view(mem, off, shape, dtype):
    n = int(np.prod(shape)) * dtype.itemsize
    return mem[off:off + n].view(dtype).reshape(shape)


def aligned_bytes(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of nbytes starting on a 64-byte boundary (process memory)."""
    raw = np.zeros(nbytes + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + nbytes]


@dataclass(frozen=True)
class WaitPolicy:
    """How a worker waits at a barrier: spin, then yield, then sleep (see csrc/dp_sync.h).

    A wake-up through the kernel costs 40-55 us on a time-shared VM, so workers never sleep
    early: they spin, then call sched_yield in a loop (which returns at once when nothing else
    wants the core, so it is a spin with a syscall in it), and only then sleep.
    - Processes on their own cores spin 200 us: measured on the 2-worker MNIST MLP, a 10 us
      spin made the run 27 % slower (median 0.334 s vs 0.262 s over 5 interleaved repeats).
    - Thread workers spin 10 us: a GIL hand-off can wake the other thread on the same core,
      and a 200 us spin then costs 405 us per all-reduce before the core is handed over
      (bench_allreduce.py); in training the two spins measured the same (0.262 vs 0.255 s).
    - More workers than cores: the worker being waited for needs this core, so yield at once.
    """

    spin: float = 200e-6
    yield_time: float = 5e-3
    timeout: float = 0.0

    @classmethod
    def for_workers(cls, workers: int, threads: int = 1, timeout: float = 0.0,
                    backend: str = "process") -> "WaitPolicy":
        cores = os.cpu_count() or 1
        if workers * threads > cores:
            return cls(spin=2e-6, yield_time=0.05, timeout=timeout)
        if backend == "thread":
            return cls(spin=10e-6, timeout=timeout)
        return cls(timeout=timeout)


class _Handle:
    """An all-reduce in flight on a communication thread."""

    __slots__ = ("done", "error")

    def __init__(self):
        self.done = threading.Event()
        self.error = None


class ShmComm(Communicator):
    """A worker of a group sharing one block of memory (threads or processes)."""

    def __init__(self, rank: int, layout: SharedLayout, mem: np.ndarray, policy: WaitPolicy,
                 backend: str):
        self.rank = rank
        self.size = layout.world
        self.backend = backend
        self._layout = layout
        self._mem = mem
        self._comm_thread = None
        self._specs = {s.name: s for s in layout.specs}
        self._all = {s.name: [layout.array(mem, s.name, r) for r in range(s.arrays(self.size))]
                     for s in layout.specs}
        self._groups = {}
        for s in layout.specs:
            if s.count is not None and not s.reduce_into:
                continue                  # shared arrays nobody reduces (e.g. a result)
            out = self._all[s.reduce_into][0] if s.reduce_into else None
            self._groups[s.name] = _core.ShmGroup(
                layout.control(mem, s.name), self._all[s.name], rank, out=out,
                spin=policy.spin, yield_time=policy.yield_time, timeout=policy.timeout,
                algorithm=s.algorithm)
        self._sync = self._groups[layout.specs[0].name]

    def buffer(self, name):
        bufs = self._all[name]
        return bufs[0] if self._specs[name].count == 1 else bufs[self.rank]

    def buffers(self, name):
        return self._all[name]

    @property
    def layout(self) -> SharedLayout:
        return self._layout

    @property
    def memory(self) -> np.ndarray:
        """The whole shared block (uint8) that the layout describes."""
        return self._mem

    def extra(self, name: str) -> np.ndarray:
        """A shared array besides the roles (e.g. the data set, written by the launcher)."""
        return self._layout.extra(self._mem, name)

    def allreduce_(self, name, scale=1.0, start=0, stop=None):
        waited = self._groups[name].allreduce(scale, start, stop)
        self._account("allreduce", name, start, stop, waited=waited)

    def allreduce_async_(self, name, start=0, stop=None):
        """Queues the all-reduce on this worker's communication thread, which runs the C call
        (GIL released) while the caller goes on computing."""
        if self._comm_thread is None:
            import queue
            self._queue = queue.SimpleQueue()
            self._comm_thread = threading.Thread(target=self._comm_loop, daemon=True,
                                                 name=f"dptrain-comm-{self.rank}")
            self._comm_thread.start()
        handle = _Handle()
        self._queue.put((handle, name, start, stop))
        self._account("allreduce", name, start, stop)   # its wait overlaps compute: not counted
        return handle

    def _comm_loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            handle, name, start, stop = item
            try:
                self._groups[name].allreduce(1.0, start, stop)
            except BaseException as exc:  # handed to the waiting worker
                handle.error = exc
            handle.done.set()

    def wait_(self, handles):
        for h in handles:
            if h is not None:
                h.done.wait()
        for h in handles:
            if h is not None and h.error is not None:
                raise h.error

    def close(self):
        # never wait long: after a failure the thread may still sit in a collective until
        # the group's abort wakes it; it exits on its own then (it is a daemon)
        if self._comm_thread is not None:
            self._queue.put(None)
            self._comm_thread.join(0.5)
            self._comm_thread = None

    def reduce_(self, name, root=0):
        """The rank-order sum of every rank's array into the role's shared reduce_into array
        (readable by root, and by everyone)."""
        into = self._specs[name].reduce_into
        if not into:
            raise ValueError(f"{name}: the layout gives this role no reduce_into array")
        waited = self._groups[name].allreduce()
        self._account("reduce", name, root=root, waited=waited)
        return self._all[into][0]

    def broadcast_(self, name, root=0):
        waited = self._sync.barrier()        # root's values are final
        if self.rank != root:
            self._all[name][self.rank][:] = self._all[name][root]
        self._sync.barrier()                 # nobody changes root's copy while others read
        self._account("broadcast", name, root=root, waited=waited)

    def barrier(self):
        self._account("barrier", "", waited=self._sync.barrier())

    def abort(self, code=1):
        # every role has its own barrier, and the others may be waiting in any of them
        for g in self._groups.values():
            g.abort(code)

    @property
    def aborted(self) -> int:
        return max(g.aborted for g in self._groups.values())


class MPIComm(Communicator):
    """An MPI rank: buffer collectives on NumPy arrays through mpi4py (never pickled)."""

    backend = "mpi"

    def __init__(self, specs, comm=None, measure_wait: bool = True):
        """measure_wait: enter each collective through MPI_Barrier and count the time spent
        in it as synchronization wait (MPI reports no arrival times; the barrier costs a few
        microseconds per collective on one machine). False: the wait stays inside the
        collective's time."""
        from mpi4py import MPI
        from . import collectives
        schedules = {"ring": collectives.ring_allreduce, "tree": collectives.tree_allreduce}
        self._reduce = {s.name: schedules[s.algorithm] for s in specs if s.algorithm in schedules}
        self._measure_wait = measure_wait
        self._MPI = MPI
        self._comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self._specs = {s.name: s for s in specs}
        self._flat, self._all = {}, {}
        for s in specs:
            k = 1 if s.count is None else s.count
            if k > 1 and k % self.size:
                raise ValueError(f"{s.name}: {k} shared arrays cannot be split evenly over "
                                 f"{self.size} MPI ranks (use a world size that divides {k})")
            self._flat[s.name] = np.zeros(k * s.length, s.dtype)
            self._all[s.name] = [self._flat[s.name][i * s.length:(i + 1) * s.length]
                                 for i in range(k)]

    def buffer(self, name):
        return self._all[name][0]

    def buffers(self, name):
        return self._all[name]

    def _entry_wait(self) -> float:
        if not self._measure_wait or self.size == 1:
            return 0.0
        t0 = time.perf_counter()
        self._comm.Barrier()
        return time.perf_counter() - t0

    def allreduce_(self, name, scale=1.0, start=0, stop=None):
        self._account("allreduce", name, start, stop, waited=self._entry_wait())
        spec = self._specs[name]
        if spec.reduce_into and spec.count is not None:
            # rank r filled arrays [r k / size, (r + 1) k / size): gather them all (exact
            # copies, no arithmetic), then every rank sums them in index order
            self._comm.Allgather(self._MPI.IN_PLACE, self._flat[name])
            _core.sum_buffers(self._all[spec.reduce_into][0], self._all[name], scale=scale,
                              start=start, stop=stop)
            return
        buf = self._all[name][0][start:stop]
        if name in self._reduce:
            self._reduce[name](self._comm, buf)
        else:
            self._comm.Allreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM)
        if scale != 1.0:
            buf *= scale

    def allreduce_async_(self, name, start=0, stop=None):
        if name in self._reduce:
            raise ValueError("overlap needs a non-blocking all-reduce: use allreduce='native' "
                             "with the mpi backend")
        self._account("allreduce", name, start, stop)
        return self._comm.Iallreduce(self._MPI.IN_PLACE, self._all[name][0][start:stop],
                                     op=self._MPI.SUM)

    def wait_(self, handles):
        reqs = [h for h in handles if h is not None]
        if reqs:
            self._MPI.Request.Waitall(reqs)

    def reduce_(self, name, root=0):
        """The sum of every rank's array, in root's own array (MPI_Reduce in place)."""
        self._account("reduce", name, root=root, waited=self._entry_wait())
        buf = self._all[name][0]
        if self.rank == root:
            self._comm.Reduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM, root=root)
        else:
            self._comm.Reduce(buf, None, op=self._MPI.SUM, root=root)
        return buf

    def broadcast_(self, name, root=0):
        self._account("broadcast", name, root=root, waited=self._entry_wait())
        self._comm.Bcast(self._all[name][0], root=root)

    def barrier(self):
        t0 = time.perf_counter()
        self._comm.Barrier()
        self._account("barrier", "", waited=time.perf_counter() - t0)

    def abort(self, code=1):
        self._comm.Abort(code)


# Launchers and the variable each sets to the world size in every process it starts.
MPI_LAUNCH_VARIABLES = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec"),
    ("PMI_SIZE", "an MPICH/Hydra or Intel MPI mpiexec"),
    ("PMIX_SIZE", "a PMIx launcher"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's mpiexec"),
    ("SLURM_STEP_NUM_TASKS", "Slurm's srun"),
)


def mpi_launch() -> tuple[str, int] | None:
    """(which launcher, world size) when this process was started by an MPI launcher, read
    from the environment without importing mpi4py (or starting MPI); None otherwise.
    Slurm is read from srun's step variable: an sbatch script itself is not an MPI rank."""
    for var, launcher in MPI_LAUNCH_VARIABLES:
        value = os.environ.get(var, "")
        if value.strip().isdigit():
            return f"{launcher} ({var}={value})", int(value)
    return None


def mpi_world_size() -> int | None:
    """The world size when this process was started by an MPI launcher, else None."""
    launch = mpi_launch()
    return launch[1] if launch else None


def resolve_backend(backend: str | None) -> tuple[str, str | None]:
    """The backend to run (and a note saying why, or None): backend=None picks 'mpi' when
    this process is one of several ranks started by an MPI launcher, else 'thread'. An
    explicit 'thread' or 'process' under such a launcher is refused: every rank would run
    its own copy of the whole training."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend is {backend!r}, expected one of {BACKENDS} (or None: "
                         f"MPI when started by an MPI launcher, else thread)")
    launch = mpi_launch()
    if launch is None or launch[1] <= 1 or backend == "mpi":
        return backend or "thread", None
    where, size = launch
    if backend is None:
        return "mpi", (f"started by {where} as one of {size} ranks: using the MPI backend "
                       f"(--backend mpi)")
    raise ValueError(f"this process was started by {where} as one of {size} ranks, but "
                     f"backend={backend!r} would make each rank run its own, separate "
                     f"training: use --backend mpi (backend='mpi'), or start one process "
                     f"without the MPI launcher")


# ------------------------------------------------------------------ launchers
# After a worker fails, the others get this long to leave on their own (a worker waiting in a
# collective leaves at once: the group is aborted); then they are terminated, and killed
# after as long again. A worker stuck in compute never holds the run hostage.
STOP_GRACE_S = 1.0
INTERRUPTED = 0xfffffff0        # the abort code of a group stopped by Ctrl-C / SIGINT


def run_threads(world: int, layout: SharedLayout, mem: np.ndarray, policy: WaitPolicy, target,
                join_timeout: float | None = None, grace: float = STOP_GRACE_S):
    """Runs target(comm) on `world` threads sharing `mem`; returns their results by rank.

    The first worker to raise aborts the group, so the others stop at their next collective;
    the error is re-raised as WorkerError naming its rank once every worker has left, or
    `grace` seconds after the failure at most: a thread stuck in compute cannot be stopped
    from outside, so it is left to finish its step in the background (it is a daemon, and
    its next collective raises) and the error says so. Ctrl-C (KeyboardInterrupt) aborts the
    group and is re-raised.
    """
    layout.init_controls(mem)
    comms = [ShmComm(r, layout, mem, policy, "thread") for r in range(world)]
    results = [None] * world
    failures: list[tuple[int, str]] = []
    lock = threading.Lock()
    failed = threading.Event()

    def body(rank):
        try:
            results[rank] = target(comms[rank])
        except _core.GroupAborted:
            pass                          # another worker failed first; it is reported
        except BaseException as exc:      # report, then stop the others
            with lock:
                failures.append((rank, describe(exc)))
            comms[rank].abort(rank + 1)
            failed.set()

    threads = [threading.Thread(target=body, args=(r,), name=f"dptrain-worker-{r}", daemon=True)
               for r in range(world)]
    for t in threads:
        t.start()
    deadline = None if join_timeout is None else time.monotonic() + join_timeout
    try:
        while any(t.is_alive() for t in threads):
            if failed.is_set():
                deadline = min(deadline or math.inf, time.monotonic() + grace)
                failed.clear()
            if deadline is not None and time.monotonic() > deadline:
                break
            next(t for t in threads if t.is_alive()).join(0.05)
    except KeyboardInterrupt:
        comms[0].abort(INTERRUPTED)
        for t in threads:
            t.join(grace)
        raise
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    if stuck and not failures:
        comms[0].abort(world + 1)
        raise WorkerError(stuck[0], "did not finish in time")
    if failures:
        rank, cause = min(failures)
        if stuck:
            cause += (f"; rank(s) {', '.join(map(str, stuck))} still computing {grace:g} s "
                      f"later (a thread cannot be stopped from outside: it leaves at its next "
                      f"collective)")
        raise WorkerError(rank, cause)
    if comms[0].aborted:
        raise WorkerError(comms[0].aborted - 1, "aborted the group")
    return results


def describe(exc: BaseException) -> str:
    """One line: the exception, its message and where it was raised."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


class SharedSegment:
    """nbytes of zeroed memory that worker processes share and that nothing names: a memfd
    (Linux) or a temporary file unlinked at once, mapped MAP_SHARED. The memory lives while a
    process maps it or holds its descriptor, so it is gone when the last one exits, whoever
    is killed and whenever: nothing is left in /dev/shm, and no resource tracker is needed.

    Passed to a worker as a Process argument: a forked child uses the inherited mapping; for
    'spawn' and 'forkserver' the descriptor is duplicated into the child while the arguments
    are pickled (multiprocessing.reduction.DupFd) and mapped there.
    """

    def __init__(self, nbytes: int, fd: int | None = None):
        import mmap
        self.nbytes = max(int(nbytes), 1)
        if fd is None:
            fd = _anonymous_fd("dptrain-shared")
            try:
                os.ftruncate(fd, self.nbytes)          # zero-filled
            except BaseException:
                os.close(fd)
                raise
        self.fd = fd
        self._map = mmap.mmap(fd, self.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def array(self) -> np.ndarray:
        """The whole segment as a uint8 array (a view: the segment must outlive it)."""
        return np.frombuffer(self._map, np.uint8, self.nbytes)

    def close(self) -> None:
        """Unmaps and closes this process's handle (the memory goes with the last one)."""
        try:
            self._map.close()
        except BufferError:      # a view still alive (e.g. in a traceback): the OS unmaps at exit
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __reduce__(self):
        from multiprocessing import reduction
        return _attach_segment, (reduction.DupFd(self.fd), self.nbytes)


def _attach_segment(dup, nbytes: int) -> SharedSegment:
    return SharedSegment(nbytes, fd=dup.detach())


def _anonymous_fd(name: str) -> int:
    """A file descriptor of an anonymous, zero-length, shareable file."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create(name, os.MFD_CLOEXEC)
    import tempfile
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix=name + "-", dir=base)
    os.unlink(path)                   # nameless from here on
    return fd


def _die_with_parent(parent: int | None) -> None:
    """Makes this worker process end when its parent does (a launcher killed with SIGKILL
    cannot stop its workers): PR_SET_PDEATHSIG on Linux, else a watchdog thread that polls
    the parent's pid twice a second. parent: the pid the parent must have (None: the one it
    has now)."""
    import signal
    parent = os.getppid() if parent is None else parent
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:     # PR_SET_PDEATHSIG
            if os.getppid() != parent:       # the parent died before prctl took effect
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="dptrain-parent-watch").start()


def _process_main(rank, segment, layout, policy, target, args, conn, parent):
    """Entry point of a worker process: map the segment, run, send the result home."""
    import signal
    _die_with_parent(parent)
    # Ctrl-C in a terminal reaches the whole process group: the launcher alone handles it
    # (it aborts the group and stops everyone), so a worker neither dies on it half-way nor
    # prints a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        conn.send(_run_attached(rank, segment, layout, policy, target, args))
    finally:
        conn.close()
        segment.close()


def _run_attached(rank, segment, layout, policy, target, args):
    comm = ShmComm(rank, layout, segment.array(), policy, "process")
    try:
        return ("ok", rank, target(comm, *args))
    except _core.GroupAborted:
        return ("aborted", rank, None)
    except BaseException as exc:
        comm.abort(rank + 1)
        return ("error", rank, describe(exc))


def run_processes(world: int, layout: SharedLayout, fill, policy: WaitPolicy, target, args=(),
                  start_method: str | None = None, grace: float = STOP_GRACE_S):
    """Runs target(comm, *args) in `world` processes sharing one new SharedSegment.

    fill(mem) writes the initial contents (data set, parameters) before the workers start.
    Returns the results by rank. A worker that raises or dies stops the run at once: the
    group is aborted, the others get `grace` seconds to leave, then are terminated (and
    killed after as long again), and WorkerError names the first failed rank. Ctrl-C
    (KeyboardInterrupt) in the launcher does the same and is re-raised. Workers die with the
    launcher (PR_SET_PDEATHSIG), and the segment has no name, so nothing outlives a kill.
    target and args must be picklable for the 'spawn' start method (a module-level function
    and plain values).
    """
    import multiprocessing as mp
    from multiprocessing import connection
    ctx = mp.get_context(start_method)
    # the process a worker's parent must be: this one, except under a fork server (whose
    # process is the parent; it exits when this one does)
    parent = None if ctx.get_start_method() == "forkserver" else os.getpid()
    segment = SharedSegment(layout.nbytes)
    mem = None
    procs, conns = [], []
    failure, interrupted = None, False
    try:
        mem = segment.array()
        layout.init_controls(mem)
        fill(mem)
        for r in range(world):
            parent_end, child_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_process_main, name=f"dptrain-worker-{r}", daemon=True,
                            args=(r, segment, layout, policy, target, args, child_end,
                                  parent))
            p.start()
            child_end.close()
            procs.append(p)
            conns.append(parent_end)
        results = [None] * world
        pending = {c: r for r, c in enumerate(conns)}
        sentinels = {p.sentinel: r for r, p in enumerate(procs)}
        deadline = None

        def abort_all(code):
            for s in layout.specs:
                _core.abort_group_control(layout.control(mem, s.name), code)

        try:
            while pending and (deadline is None or time.monotonic() < deadline):
                ready = connection.wait(list(pending) + list(sentinels),
                                        timeout=0.05 if deadline else 1.0)
                for obj in ready:
                    if obj in pending:
                        r = pending.pop(obj)
                        try:
                            status, rank, payload = obj.recv()
                        except EOFError:
                            status, rank, payload = "died", r, None
                        if status == "ok":
                            results[rank] = payload
                        elif status == "error" and failure is None:
                            failure = (rank, payload)
                        elif status == "died" and failure is None:
                            procs[rank].join(0.1)
                            failure = (rank, _exit_cause(procs[rank]))
                    elif obj in sentinels:
                        r = sentinels.pop(obj)
                        procs[r].join(0.1)
                        if procs[r].exitcode not in (0, None) and failure is None:
                            # died before reporting (SIGKILL, segfault, os._exit)
                            failure = (r, _exit_cause(procs[r]))
                if failure is not None and deadline is None:
                    abort_all(failure[0] + 1)
                    deadline = time.monotonic() + grace
        except KeyboardInterrupt:
            interrupted = True
            abort_all(INTERRUPTED)
            raise
        if failure is not None:
            left = [r for r in pending.values() if procs[r].is_alive()]
            if left:
                failure = (failure[0], failure[1] + f"; rank(s) {', '.join(map(str, left))} "
                           f"still running {grace:g} s later were terminated")
            raise WorkerError(*failure)
        return results
    finally:
        _stop(procs, 0.0 if (failure or interrupted) else 10.0, grace)
        for c in conns:
            c.close()
        del mem          # every view of the mapping (abort_all's too) must go before close()
        segment.close()


def _stop(procs, wait: float, grace: float) -> None:
    """Joins the worker processes for `wait` seconds in all, then terminates those left and,
    `grace` seconds later, kills them."""
    deadline = time.monotonic() + wait
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join(1.0)


def _exit_cause(p) -> str:
    code = p.exitcode
    if code is None:
        return "stopped responding"
    if code < 0:
        import signal
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"killed by signal {name}"
    return f"exited with code {code} without reporting"


def check_world(workers: int, batch_size: int, threads: int, backend: str) -> None:
    """Rejects configurations that cannot run, with the reason."""
    if backend not in BACKENDS + ("sequential",):
        raise ValueError(f"backend is {backend!r}, expected one of {BACKENDS}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if batch_size < workers:
        raise ValueError(f"batch_size={batch_size} is smaller than workers={workers}: every "
                         f"worker needs at least one sample of each global batch")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")


def oversubscription_warning(workers: int, threads: int) -> str | None:
    cores = os.cpu_count() or 1
    if workers * threads > cores:
        return (f"{workers} workers x {threads} threads = {workers * threads} exceeds the "
                f"{cores} cores of this machine: timings will reflect time-sharing")
    return None


def shard(start: int, stop: int, rank: int, world: int) -> tuple[int, int]:
    """Rank's contiguous share of positions [start, stop) of an epoch order (sizes differ by
    at most one; no padding, no duplicates)."""
    n = stop - start
    q, r = divmod(n, world)
    lo = start + rank * q + min(rank, r)
    return lo, lo + q + (1 if rank < r else 0)


__all__ = ["BACKENDS", "BufferSpec", "Communicator", "LocalComm", "MPIComm", "SharedLayout",
           "SharedSegment", "ShmComm", "WaitPolicy", "WorkerError", "check_world", "mpi_launch", "mpi_world_size",
           "resolve_backend",
           "run_processes", "run_threads", "shard"]
