"""Workers that share memory: threads of one process, or processes mapping one segment.

The memory: one ``SharedSegment`` per run, nameless (a memfd), so nothing outlives a kill.
It holds a head (the world group's control block and a small slot per rank), the launcher's
read-only extras (e.g. the data set, written once before the workers start; not under the
'fork' start method, whose workers inherit the launcher's arrays), then an arena:
a sparse virtual range from which each worker's ``ShmComm`` hands out arrays. Every rank
allocates in the same order (allocation is collective), so every rank computes the same
offsets without talking; the pages are only backed when touched.

The collectives run in C (``_core.ShmGroup``): one call waits at a C barrier (spin, yield,
then futex), sums this rank's slice of every rank's array in rank order and writes it back,
and waits again. Each array from ``zeros`` has its group (its own control block and
schedule); a group is set up the first time the array is reduced: rank 0 initializes its
control block, then every rank meets at the world barrier. Every group waits also on the
world barrier's abort, so one ``abort`` stops every worker wherever it waits.

Failures: a worker that raises aborts the world (every other worker's next or current
collective raises ``GroupAborted`` at once), the launcher reports the first failure with its
rank; a process that dies without a word (SIGKILL) is noticed by the launcher, which aborts
the world itself; workers still computing are terminated a second later, and worker
processes die with their launcher.
"""

from __future__ import annotations

import ast
import math
import mmap
import os
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from .. import _core
from .._memmap import TRUNCATED_EXIT, memmap_region, open_region, truncated_file
from .base import (
    ALIGN,
    CollectiveMismatch,
    Communicator,
    Interrupted,
    WorkerError,
    _check_algorithm,
    check_flat,
    describe,
    filled_bytes,
    line_slice,
    mismatch_message,
    proc_stat,
    range_bytes,
    signature,
    signature_array,
)
from .placement import cpu_count

# The arena's virtual size: a sparse memfd, backed page by page as arrays are touched.
ARENA_BYTES = 1 << 36
# After a worker fails, the others get this long to leave on their own (a worker waiting in a
# collective leaves at once: the world is aborted); then they are terminated, and killed
# after as long again. A worker stuck in compute never holds the run hostage.
STOP_GRACE_S = 1.0
INTERRUPTED = 0xFFFFFFF0  # the abort code of a run stopped by Ctrl-C / SIGINT
TIMED_OUT = 0xFFFFFFFE  # ... of a group a worker's collective timed out in (dp_sync.h)
# An elastic launch waits this much longer than STOP_GRACE_S for the survivors of a failure:
# a survivor computing a long step returns only at its next collective
ELASTIC_WAIT_S = 10.0
SLOT_BYTES = 64  # the world group's per-rank buffer (a barrier needs one)


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class WaitPolicy:
    """How a worker waits at a barrier: spin, then yield, then sleep (see csrc/dp_sync.h).

    A wake-up through the kernel costs tens of microseconds on a time-shared VM, so workers
    never sleep early: they spin, then call sched_yield in a loop (which returns at once when
    nothing else wants the core, so it is a spin with a syscall in it), and only then sleep.
    - Processes on their own cores spin 200 us: a shorter spin hands the core to the kernel
      between the MLP's steps, and its wake-up then costs more than the spin.
    - Thread workers spin 10 us: a GIL hand-off can wake the other thread on the same core,
      and a long spin then holds that core from the thread it waits for; in training the
      two spins cost the same.
    - More workers than cores: the worker being waited for needs this core, so yield at once.
    (The measurements: bench/README.md, "Design measurements behind the comments".)
    """

    spin: float = 200e-6
    yield_time: float = 5e-3
    timeout: float = 0.0

    @classmethod
    def for_workers(
        cls, workers: int, threads: int = 1, timeout: float = 0.0, backend: str = "process"
    ) -> "WaitPolicy":
        """The policy for `workers` x `threads` on the CPUs this process may use (see above)."""
        cores = cpu_count()
        if workers * threads > cores:
            return cls(spin=2e-6, yield_time=0.05, timeout=timeout)
        if backend == "thread":
            return cls(spin=10e-6, timeout=timeout)
        return cls(timeout=timeout)


class SharedSegment:
    """nbytes of zeroed memory that worker processes share and that nothing names: a memfd
    (Linux) or a temporary file unlinked at once, mapped MAP_SHARED. The memory lives while a
    process maps it or holds its descriptor, so it is gone when the last one exits, whoever
    is killed and whenever: nothing is left in /dev/shm, and no resource tracker is needed.
    The file is sparse: only pages that are touched take memory.

    Passed to a worker as a Process argument: a forked child uses the inherited mapping; for
    'spawn' and 'forkserver' the descriptor is duplicated into the child while the arguments
    are pickled (multiprocessing.reduction.DupFd) and mapped there.
    """

    def __init__(self, nbytes: int, fd: int | None = None):
        self.nbytes = max(int(nbytes), 1)
        if fd is None:
            fd = _anonymous_fd("dptrain-shared")
            try:
                os.ftruncate(fd, self.nbytes)  # zero-filled, sparse
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
        except BufferError:  # a view still alive (e.g. in a traceback): the OS unmaps at exit
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
    os.unlink(path)  # nameless from here on
    return fd


class SegmentLayout:
    """Where things are in a run's segment: [world control | a slot per rank] [extras]
    [arena]. Plain values: it pickles to spawned workers."""

    def __init__(self, world: int, extras: dict | None = None):
        self.world = world
        self.control_bytes = _core.group_control_bytes(world)
        off = _round_up(self.control_bytes)
        self.slots = off
        off += world * SLOT_BYTES
        self.progress_at = off  # rank 0's progress (see Communicator.progress)
        off += ALIGN
        self.extras = {}
        for name, (shape, dtype) in (extras or {}).items():
            dt = np.dtype(dtype)
            self.extras[name] = (off, tuple(int(s) for s in shape), dt.str)
            off = _round_up(off + int(np.prod(shape, dtype=np.int64)) * dt.itemsize)
        self.arena = off
        self.nbytes = off + ARENA_BYTES

    def world_control(self, mem: np.ndarray) -> np.ndarray:
        return mem[: self.control_bytes]

    def slot(self, mem: np.ndarray, rank: int) -> np.ndarray:
        off = self.slots + rank * SLOT_BYTES
        return mem[off : off + SLOT_BYTES].view(np.float64)

    def progress(self, mem: np.ndarray) -> np.ndarray:
        return mem[self.progress_at : self.progress_at + 16].view(np.float64)

    def extra(self, mem: np.ndarray, name: str) -> np.ndarray:
        off, shape, dt = self.extras[name]
        dt = np.dtype(dt)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        return mem[off : off + n].view(dt).reshape(shape)

    def init(self, mem: np.ndarray) -> None:
        """Readies the world group (the launcher does this once, before any worker starts)."""
        _core.init_group_control(self.world_control(mem), self.world)

    def abort(self, mem: np.ndarray, code: int) -> None:
        """Aborts every group of the run (all of them also wait on the world's abort)."""
        _core.abort_group_control(self.world_control(mem), code)


class _Shared:
    """An allocation of the arena: one array per rank (``zeros``) or ``count`` arrays every
    rank sees (``shared_zeros``), their control block, and their group once set up."""

    __slots__ = ("arrays", "control", "algorithm", "group", "out", "out_group", "signatures")

    def __init__(self, arrays, control, algorithm):
        self.arrays = arrays
        self.control = control
        self.algorithm = algorithm
        self.group = None
        self.out = None  # reduce_sum_'s shared result and its group
        self.out_group = None
        self.signatures = {}  # (op, start, stop, scale, root) -> its signature (a hot call's)


class _Handle:
    """An all-reduce in flight on a communication thread."""

    __slots__ = ("done", "error")

    def __init__(self):
        self.done = threading.Event()
        self.error = None


class ShmComm(Communicator):
    """A worker of a group sharing one segment (threads or processes)."""

    def __init__(
        self, rank: int, layout: SegmentLayout, mem: np.ndarray, policy: WaitPolicy, backend: str
    ):
        self.rank = rank
        self.size = layout.world
        # this worker's place in the group that shares the segment (the same as rank and size
        # here; a subclass may share memory with only some of the ranks, e.g. one node's)
        self._local, self._peers = rank, layout.world
        self.backend = backend
        self._layout = layout
        self._mem = mem
        self._policy = policy
        self._next = layout.arena  # the arena's bump pointer, identical on every rank
        self._world_control = layout.world_control(mem)
        self.progress = layout.progress(mem)
        slots = [layout.slot(mem, r) for r in range(self._peers)]
        # two handles on the world barrier: one waits with the timeout; the other with none
        # (abort still ends it), for the waits on a peer doing the run's own work
        # (barrier_after_work)
        self._world, self._world_patient = (
            _core.ShmGroup(
                self._world_control,
                slots,
                rank,
                spin=policy.spin,
                yield_time=policy.yield_time,
                timeout=timeout,
            )
            for timeout in (policy.timeout, 0.0)
        )
        self._by_id: dict[int, _Shared] = {}  # id(array) -> its allocation (arrays held there)
        self._staging: dict[tuple, tuple] = {}  # (dtype, length) -> (allocation, this rank's array)
        self._sums: dict[tuple, object] = {}  # (id(out), id(arrays[0])) -> sum_into_'s group
        self._extras: dict[str, np.ndarray] = {}  # the launcher's arrays (threads, fork, files)
        self._comm_thread = None
        # every collective's signature, checked before it runs (_agree): a row of 8 int64 per
        # rank, in two parities (ShmGroup.agree)
        self._signatures = self._view(
            self._alloc(2 * self._peers * 64), 2 * self._peers * 8, np.dtype(np.int64)
        )
        self._parity = 0

    # ---- memory
    def _alloc(self, nbytes: int) -> int:
        off = self._next
        self._next = _round_up(off + max(int(nbytes), 1))
        if self._next > self._layout.nbytes:
            raise MemoryError(f"the shared arena of {ARENA_BYTES >> 30} GiB is full")
        return off

    def _view(self, off: int, length: int, dt: np.dtype) -> np.ndarray:
        return self._mem[off : off + length * dt.itemsize].view(dt)

    def zeros(self, length, dtype="float32", *, algorithm="native"):
        _check_algorithm(algorithm)
        dt, length = np.dtype(dtype), int(length)
        control = self._alloc(self._layout.control_bytes)
        arrays = [
            self._view(self._alloc(length * dt.itemsize), length, dt) for _ in range(self._peers)
        ]
        shared = _Shared(arrays, control, algorithm)
        self._by_id[id(arrays[self._local])] = shared
        return arrays[self._local]

    def shared_zeros(self, count, length, dtype="float32"):
        dt, length = np.dtype(dtype), int(length)
        control = self._alloc(self._layout.control_bytes)
        arrays = [
            self._view(self._alloc(length * dt.itemsize), length, dt) for _ in range(int(count))
        ]
        shared = _Shared(arrays, control, "native")
        for a in arrays:
            self._by_id[id(a)] = shared
        return arrays

    @property
    def layout(self) -> SegmentLayout:
        """Where things are in the run's segment."""
        return self._layout

    def extra(self, name: str, default=KeyError) -> np.ndarray:
        """An array the launcher shared with every worker (e.g. the data set): the launcher's
        own array for threads and forked processes (a forked worker's writes stay its own),
        a copy in the segment for spawned ones, a memory map of the same file for a view of
        one (see Communicator.extra)."""
        if name not in (self._extras or {}) and name in self._layout.extras:
            return self._layout.extra(self._mem, name)
        return super().extra(name, default)

    def _group(
        self,
        control_off: int,
        buffers,
        *,
        out=None,
        algorithm="native",
        timeout: float | None = None,
    ):
        """Sets up a group on a fresh control block: rank 0 readies it, then every rank
        meets at the world barrier, so nobody waits on it before it is ready. timeout: the
        policy's unless given."""
        control = self._view(control_off, self._layout.control_bytes, np.dtype(np.uint8))
        if self._local == 0:
            _core.init_group_control(control, self._peers)
        self._world.barrier()
        p = self._policy
        return _core.ShmGroup(
            control,
            buffers,
            self._local,
            out=out,
            spin=p.spin,
            yield_time=p.yield_time,
            timeout=p.timeout if timeout is None else timeout,
            algorithm=algorithm,
            world=self._world_control,
        )

    def _shared(self, array: np.ndarray) -> tuple[_Shared, np.ndarray]:
        """The allocation of an array from zeros (and the array itself), or of a staging array
        of the same dtype and length for any other array (copied in by the caller)."""
        shared = self._by_id.get(id(array))
        if shared is not None:
            return shared, array
        check_flat(array)
        key = (array.dtype.str, array.size)
        staged = self._staging.get(key)
        if staged is None:
            buf = self.zeros(array.size, array.dtype)
            staged = self._staging[key] = (self._by_id[id(buf)], buf)
        return staged

    def _ready(self, shared: _Shared):
        if shared.group is None:
            shared.group = self._group(shared.control, shared.arrays, algorithm=shared.algorithm)
        return shared.group

    # ---- every rank called the same collective with the same arguments
    def _agree(self, sig, group=None) -> float:
        """Waits for every rank at the world barrier with this collective's signature and
        raises CollectiveMismatch on every rank unless all of them passed the same one;
        returns the seconds waited. Called before the collective touches (or stages) an
        array: mismatched arrays would meet in different groups, or sum unlike values."""
        parity = self._parity
        self._parity = parity ^ 1
        if isinstance(sig, tuple):
            sig = signature_array(sig)
        waited = (group or self._world).agree(self._signatures, parity, sig)
        if waited is None:
            self._mismatch(parity)
        return waited

    def _mismatch(self, parity):
        rows = self._signatures.reshape(2, self._peers, 8)[parity].copy()
        raise CollectiveMismatch(mismatch_message(rows, self._peer_ranks()))

    def _peer_ranks(self) -> list[int]:
        """The world ranks of the workers sharing this segment, in their order."""
        return list(range(self._peers))

    def _signature(self, op, array, start=0, stop=None, scale=1.0, root=-1):
        """array's signature for op (an array not from zeros checked first: a bad one raises
        here, on its own rank, before the others are waited for; an array from zeros's kept,
        the training loop's calls being the same every step)."""
        shared = self._by_id.get(id(array))
        if shared is None:
            check_flat(array)
            return signature(op, array, start=start, stop=stop, scale=scale, root=root)
        key = (op, start, stop, scale, root)
        sig = shared.signatures.get(key)
        if sig is None:
            sig = shared.signatures[key] = signature_array(
                signature(
                    op, array, start=start, stop=stop, scale=scale, root=root, where=shared.control
                )
            )
        return sig

    # ---- collectives
    def allreduce_sum_(self, array, *, scale=1.0, start=0, stop=None):
        shared = self._by_id.get(id(array))
        group = shared.group if shared is not None else None
        sig = group and shared.signatures.get(("allreduce_sum_", start, stop, scale, -1))
        if sig is not None:  # the training loop's call: an array from zeros, every step
            waited = self._checked(group, sig, scale, start, stop, True)
            nbytes = range_bytes(array, start, stop)
            self._account("allreduce", nbytes, shared.algorithm, waited=waited)
            return
        waited = self._agree(
            self._signature("allreduce_sum_", array, start=start, stop=stop, scale=scale)
        )
        shared, buf = self._shared(array)
        group = self._ready(shared)
        if buf is not array:
            buf[start:stop] = array[start:stop]
        waited += group.allreduce(scale, start, stop)
        if buf is not array:
            array[start:stop] = buf[start:stop]
        self._account("allreduce", range_bytes(array, start, stop), shared.algorithm, waited=waited)

    def allreduce_async_(self, array, start=0, stop=None):
        """Queues the all-reduce on this worker's communication thread, which runs the C call
        (GIL released) while the caller goes on computing. ``array`` must come from
        ``zeros`` (it is reduced where it lies). Its signature is checked here, in the
        caller: every rank posts its buckets in the same order."""
        shared = self._async_shared(array)
        self._agree(self._signature("allreduce_async_", array, start=start, stop=stop))
        group = self._ready(shared)
        handle = self._post(lambda: group.allreduce(1.0, start, stop))
        # its wait overlaps compute: not counted as waiting
        self._account("allreduce", range_bytes(array, start, stop), shared.algorithm)
        return handle

    def _async_shared(self, array) -> _Shared:
        shared = self._by_id.get(id(array))
        if shared is None:
            raise ValueError(
                "allreduce_async_ needs an array from comm.zeros() (it is reduced "
                "in place while the caller computes)"
            )
        return shared

    def _post(self, work) -> _Handle:
        """Runs work() on this worker's communication thread (started on first use), in
        order; the handle says when it is done, and holds what it raised."""
        if self._comm_thread is None:
            import queue

            self._queue = queue.SimpleQueue()
            self._comm_thread = threading.Thread(
                target=self._comm_loop, daemon=True, name=f"dptrain-comm-{self._local}"
            )
            self._comm_thread.start()
        handle = _Handle()
        self._queue.put((handle, work))
        return handle

    def _comm_loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            handle, work = item
            try:
                work()
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
        # the world's abort wakes it; it exits on its own then (it is a daemon)
        if self._comm_thread is not None:
            self._queue.put(None)
            self._comm_thread.join(0.5)
            self._comm_thread = None

    def reduce_sum_(self, array, root=0):
        """The rank-order sum of every rank's array in a shared array (readable by root, and
        by everyone): the parameter server's reduce."""
        self._agree(self._signature("reduce_sum_", array, root=root))
        shared, buf = self._shared(array)
        if buf is not array:
            buf[:] = array
        if shared.out_group is None:
            out_off = self._alloc(buf.nbytes)
            shared.out = self._view(out_off, buf.size, buf.dtype)
            shared.out_group = self._group(
                self._alloc(self._layout.control_bytes), shared.arrays, out=shared.out
            )
        waited = shared.out_group.allreduce()
        self._account("reduce", array.nbytes, root=root, waited=waited)
        return shared.out

    def sum_into_(self, out, arrays, *, scale=1.0):
        waited = self._checked_sum("sum_into_", out, arrays, scale, True)
        self._account("allreduce", filled_bytes(arrays, self.size), waited=waited)

    def reduce_scatter_into_(self, out, arrays, *, scale=1.0):
        # the check's barrier, then this rank's slice: no exit barrier
        waited = self._checked_sum("reduce_scatter_into_", out, arrays, scale, False)
        self._account("allreduce", filled_bytes(arrays, self.size), waited=waited)
        return line_slice(out.size, out.itemsize, self._local, self._peers)

    def _checked_sum(self, op, out, arrays, scale, publish) -> float:
        """sum_into_'s group, after the check of every rank's call (one C call where the
        arrays are float: the check's barrier is the sum's entry)."""
        sig = self._sum_signature(op, out, arrays, scale)
        if out.dtype == np.uint16:  # bfloat16: the check, then the sum with its own entry
            waited = self._agree(sig)
            return waited + self._sum_group(out, arrays).allreduce(scale, publish=publish)
        return self._checked(self._sum_group(out, arrays), sig, scale, None, None, publish)

    def _checked(self, group, sig, scale, start, stop, publish) -> float:
        """The check of every rank's call (_agree), then group's all-reduce entered by its
        barrier, in one C call: thread workers hand the GIL over at every release."""
        parity = self._parity
        self._parity = parity ^ 1
        waited = group.checked_allreduce(
            self._world, self._signatures, parity, sig, scale, start, stop, publish
        )
        if waited is None:
            self._mismatch(parity)
        return waited

    def _sum_signature(self, op, out, arrays, scale):
        shared = self._by_id.get(id(out))
        if shared is None:
            return signature_array(signature(op, out, count=len(arrays), scale=scale))
        key = (op, len(arrays), scale)
        sig = shared.signatures.get(key)
        if sig is None:
            sig = shared.signatures[key] = signature_array(
                signature(op, out, count=len(arrays), scale=scale, where=shared.control)
            )
        return sig

    def _sum_group(self, out, arrays):
        """The group that sums `arrays` into `out` (made on first use: collective)."""
        key = (id(out), id(arrays[0]), len(arrays))
        group = self._sums.get(key)
        if group is None:
            if self._by_id.get(id(out)) is None or any(
                self._by_id.get(id(a)) is None for a in arrays
            ):
                raise ValueError("sum_into_ needs out and arrays from comm.shared_zeros()")
            group = self._sums[key] = self._group(
                self._alloc(self._layout.control_bytes), list(arrays), out=out
            )
        return group

    def broadcast_(self, array, root=0):
        waited = self._shared_broadcast(array, root)
        self._account("broadcast", array.nbytes, root=root, waited=waited)

    def _shared_broadcast(self, array, local_root: int) -> float:
        """array = the array of the sharing group's worker local_root; returns the seconds
        waited for the others."""
        waited = self._agree(self._signature("broadcast_", array, root=local_root))
        shared, buf = self._shared(array)
        group = self._ready(shared)
        if buf is not array and self._local == local_root:
            buf[:] = array
        waited += group.barrier()  # root's values are final
        if self._local != local_root:
            array[:] = shared.arrays[local_root]
        group.barrier()  # nobody changes root's copy while others read
        return waited

    def barrier(self):
        self._account("barrier", 0, waited=self._world_barrier(self._world, "barrier"))

    def barrier_after_work(self, worker=None):
        group = self._world if worker == self.rank else self._world_patient
        waited = self._world_barrier(group, "barrier_after_work", -1 if worker is None else worker)
        self._account("barrier", 0, waited=waited)

    def _world_barrier(self, group, op: str, root: int = -1) -> float:
        """A barrier of every rank on a handle of the world barrier (timed or patient), which
        checks that every rank called the same one; returns the seconds waited."""
        return self._agree(signature(op, root=root), group)

    def abort(self, code=1):
        self._world.abort(code)

    @property
    def aborted(self) -> int:
        """0, or the code the run was aborted with."""
        return self._world.aborted


# ------------------------------------------------------------------ launchers
def run_threads(
    world: int,
    target,
    *,
    policy: WaitPolicy | None = None,
    extras=None,
    join_timeout: float | None = None,
    grace: float = STOP_GRACE_S,
    watch=None,
    report=None,
    elastic: bool = False,
):
    """Runs target(comm) on `world` threads sharing one segment; returns their results by
    rank. ``extras`` (name -> array) are handed to every worker as they are (threads share
    memory): ``comm.extra(name)``. ``watch``: called once with rank 0's progress array
    (Communicator.progress) when the workers have started; ``report``: called, on the
    worker's thread, with what a worker passes to ``comm.report``.

    The first worker to raise aborts the world, so the others stop at their next collective;
    the error is re-raised as WorkerError naming its rank once every worker has left, or
    `grace` seconds after the failure at most: a thread stuck in compute cannot be stopped
    from outside, so it is left to finish its step in the background (it is a daemon, and
    its next collective raises) and the error says so. Ctrl-C (KeyboardInterrupt) aborts the
    world and is re-raised.

    elastic: a failure still raises WorkerError, but after waiting for the survivors (each
    returns an ``Interrupted``: see ``_elastic_error``), not for the ranks a survivor's
    timeout named missing (a stalled thread is left behind, as above).
    """
    policy = policy or WaitPolicy.for_workers(world, backend="thread")
    layout = SegmentLayout(world)
    holders = _Holders(SharedSegment(layout.nbytes))
    try:
        results, error = _join_threads(
            world,
            target,
            layout,
            holders,
            policy,
            extras,
            join_timeout,
            grace,
            watch,
            report,
            elastic,
        )
    finally:
        holders.release()  # every path: a result, a failure, Ctrl-C
    if error is not None:
        raise error
    return results


class _Holders:
    """Who holds a thread run's segment: the launcher and each worker thread started. The
    last to let go closes it, so that a thread still computing when the launcher gave up
    (it cannot be stopped from outside) closes it as it ends."""

    def __init__(self, segment: SharedSegment):
        self.segment, self.count, self.lock = segment, 1, threading.Lock()
        self.comms: list = []  # the workers' communicators: their views of the segment

    def hold(self) -> None:
        with self.lock:
            self.count += 1

    def release(self) -> None:
        with self.lock:
            self.count -= 1
            last = self.count == 0
        if last:
            # the views go first: a mapping with views cannot be closed, and it holds its
            # own descriptor of the segment until it is
            self.comms.clear()
            self.segment.close()


def _join_threads(
    world, target, layout, holders, policy, extras, join_timeout, grace, watch, report, elastic
):
    """run_threads' body: starts the threads and waits for them; returns (results, None),
    or (None, the error to raise) once its views of the segment are gone (a traceback
    through this frame would hold them, and the segment with them)."""
    mem = holders.segment.array()
    layout.init(mem)
    comms = holders.comms
    comms += [ShmComm(r, layout, mem, policy, "thread") for r in range(world)]
    for c in comms:
        c._extras, c._report = dict(extras or {}), report
    results = [None] * world
    failures: list[tuple[int, str]] = []
    lock = threading.Lock()
    failed = threading.Event()

    def body(rank):
        try:
            results[rank] = target(comms[rank])
            if isinstance(results[rank], Interrupted):
                failed.set()  # the group stopped under this worker: stop waiting for its missing
        except _core.GroupAborted:
            pass  # another worker failed first; it is reported
        except BaseException as exc:  # report, then stop the others
            with lock:
                failures.append((rank, describe(exc)))
            comms[rank].abort(rank + 1)
            failed.set()
        finally:
            comms[rank].close()
            holders.release()

    threads = [
        threading.Thread(target=body, args=(r,), name=f"dptrain-worker-{r}", daemon=True)
        for r in range(world)
    ]
    for t in threads:
        holders.hold()
        t.start()
    deadline = None if join_timeout is None else time.monotonic() + join_timeout
    try:
        if watch is not None:
            watch(comms[0].progress)
        given_up: set[int] = set()  # elastic: the ranks a survivor's timeout named missing
        while any(t.is_alive() for r, t in enumerate(threads) if r not in given_up):
            if failed.is_set():
                wait = grace + (ELASTIC_WAIT_S if elastic else 0.0)
                deadline = min(deadline or math.inf, time.monotonic() + wait)
                failed.clear()
                if elastic:
                    given_up |= _missing(results)
            if deadline is not None and time.monotonic() > deadline:
                break
            waited = [t for r, t in enumerate(threads) if t.is_alive() and r not in given_up]
            if waited:
                waited[0].join(0.05)
    except BaseException as exc:  # Ctrl-C, or the watch callback failed: stop the workers
        layout.abort(mem, INTERRUPTED)
        for t in threads:
            t.join(grace)
        return None, exc.with_traceback(None)
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    interrupted = any(isinstance(res, Interrupted) for res in results)
    if elastic and (failures or interrupted or stuck and deadline is not None):
        lost = {r: _late(policy) for r in _missing(results)}
        lost.update({r: "still computing when the others stopped" for r in stuck if r not in lost})
        lost.update(failures)  # a worker's own error says more than a survivor's view of it
        return None, _elastic_error(lost, results)
    if stuck and not failures:
        layout.abort(mem, world + 1)
        return None, WorkerError(stuck[0], "did not finish in time")
    if failures:
        rank, cause = min(failures)
        if stuck:
            cause += (
                f"; rank(s) {', '.join(map(str, stuck))} still computing {grace:g} s "
                f"later (a thread cannot be stopped from outside: it leaves at its next "
                f"collective)"
            )
        return None, WorkerError(rank, cause)
    code = comms[0].aborted
    if code == TIMED_OUT:  # a worker caught its collective's TimeoutError and went on
        return None, WorkerError(-1, "a collective timed out (a worker caught its TimeoutError)")
    if code:
        return None, WorkerError(code - 1, "aborted the group")
    return results, None


def _late(policy: WaitPolicy) -> str:
    """The cause of a rank another's collective timed out waiting for."""
    return f"did not arrive within the {policy.timeout:g} s timeout"


def _missing(results) -> set[int]:
    """The ranks the survivors' timeouts named missing (``Interrupted.missing``)."""
    return {r for res in results if isinstance(res, Interrupted) for r in res.missing}


def _elastic_error(lost: dict, results: list) -> WorkerError:
    """An elastic launch's failure: WorkerError naming the first lost rank, with every lost
    rank and cause (``lost``) and what each survivor returned (``results``; None for the
    lost). No rank lost (a survivor's timeout that named no one): the error of rank -1."""
    results = [None if r in lost else res for r, res in enumerate(results)]
    if not lost:
        return WorkerError(-1, "a collective timed out, yet no rank is missing", {}, results)
    first = min(lost)
    return WorkerError(first, lost[first], lost, results)


MAIN_GUARD_FIX = (
    "Put the call under a main guard, in the script:\n\n"
    '    if __name__ == "__main__":\n'
    "        ...  # the call that starts the run, indented\n"
)


def _main_file() -> str:
    """The main script's path; in a worker that imports it again, the file being run as
    __mp_main__ (its module has no __file__ before the import ends)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    frame = sys._getframe(1)
    while path is None and frame is not None:
        if frame.f_globals.get("__name__") == "__mp_main__":
            path = frame.f_code.co_filename
        frame = frame.f_back
    return path or "the main module"


def check_main_guard(method: str) -> None:
    """Refuses, before any worker starts, a run started at the top level of the main script,
    with no ``if __name__ == "__main__":`` around it, under a start method that imports that
    script again in every worker ('spawn', 'forkserver'; the default on macOS and, from
    Python 3.14, on Linux): each worker would run the script's call again. Under any start
    method it refuses the call made in such a worker, while it imports the script."""
    import multiprocessing as mp

    if getattr(mp.process.current_process(), "_inheriting", False):
        raise RuntimeError(
            f"this is a worker process importing the main script ({_main_file()}) again, "
            f"which starts a run of its own. {MAIN_GUARD_FIX}"
        )
    if method == "fork":
        return
    where = _unguarded_main_call()
    if where is not None:
        path, line = where
        import linecache

        call = linecache.getline(path, line).strip()
        raise RuntimeError(
            f"{path}, line {line} ({call}) starts worker processes with the '{method}' start "
            f"method, which imports the script again in every worker; the line runs at the "
            f"script's top level, so every worker would start a run of its own. "
            f"{MAIN_GUARD_FIX}"
        )


def _unguarded_main_call() -> tuple[str, int] | None:
    """(file, line) of the top-level statement of the main script that this call comes from,
    when no ``if`` holds it; None when an ``if`` does (a main guard, or a test this cannot
    read) or when there is no script (an interactive session, python -c, a notebook)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if not path or name.endswith("__main__"):  # a package's __main__: never imported again
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            break
        frame = frame.f_back
    if frame is None or os.path.realpath(frame.f_code.co_filename) != os.path.realpath(path):
        return None
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    return None if _inside_if(tree.body, frame.f_lineno) else (path, frame.f_lineno)


def _inside_if(statements, line: int) -> bool:
    """Whether an ``if`` holds the statement at ``line`` of these statements (searched down
    through the compound statements that hold it: try, with, for, while)."""
    for stmt in statements:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            if isinstance(stmt, ast.If):
                return True
            return any(
                _inside_if(getattr(stmt, field, None) or [], line)
                for field in ("body", "orelse", "finalbody", "handlers")
            )
    return False


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
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="dptrain-parent-watch").start()


def _process_main(rank, segment, layout, policy, target, args, conn, parent, inherited, mapped):
    """Entry point of a worker process: map the segment, run, send the result home.
    inherited: the extras this process got from its parent by fork, or None; mapped: the
    extras that are views of files, {name: (path, offset, shape, dtype)}, mapped here."""
    import signal

    # a forked worker inherits the command line's handlers of these (_signals.Terminated): here
    # they end the process, as the launcher's SIGTERM to a worker that will not stop expects
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    _die_with_parent(parent)
    conn.send(("started", rank, None))  # past the start method's bootstrapping (see below)
    # Ctrl-C in a terminal reaches the whole process group: the launcher alone handles it
    # (it aborts the run and stops everyone), so a worker neither dies on it half-way nor
    # prints a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        conn.send(
            _run_attached(rank, segment, layout, policy, target, args, conn, inherited, mapped)
        )
    finally:
        conn.close()
        segment.close()


def _run_attached(rank, segment, layout, policy, target, args, conn, inherited, mapped):
    comm = ShmComm(rank, layout, segment.array(), policy, "process")
    comm._extras = dict(inherited or {})
    for name in list(comm._extras) + list(layout.extras):
        _touch_pages(comm.extra(name))
    comm._extras.update({name: open_region(*where) for name, where in mapped.items()})
    comm._report = lambda record: conn.send(("report", rank, record))
    try:
        return ("ok", rank, target(comm, *args))
    except _core.GroupAborted:
        return ("aborted", rank, None)
    except BaseException as exc:
        comm.abort(rank + 1)
        return ("error", rank, describe(exc))
    finally:
        comm.close()


def _touch_pages(a: np.ndarray) -> None:
    """Maps the pages of an array into this process before the worker's code reads it: a
    spawned worker maps the segment afresh, and otherwise the first pass over the data (the
    training loop's first epoch, gathering its batches) would fault every page in, inside
    the timed steps; for an inherited array it is a quick pass over pages the fork already
    mapped. Memory maps of the user's files are not touched: they may be larger than RAM."""
    flat = a.reshape(-1).view(np.uint8)
    if flat.size:
        flat[::4096].sum()  # one read per 4 KiB page


def run_processes(
    world: int,
    target,
    args=(),
    *,
    policy: WaitPolicy | None = None,
    extras=None,
    start_method: str | None = None,
    grace: float = STOP_GRACE_S,
    watch=None,
    report=None,
    elastic: bool = False,
):
    """Runs target(comm, *args) in `world` processes sharing one new SharedSegment; returns
    the results by rank. ``extras`` (name -> array, e.g. the data set) reach every worker as
    ``comm.extra(name)``: under the 'fork' start method as the launcher's own arrays, which
    the workers inherit (no copy: the pages stay shared until written, and keep their size:
    a data set in 2 MB pages, where a memfd has 4 KB ones on a kernel whose shmem_enabled is
    never, as Debian's, and shuffled rows are gathered faster from large pages); under
    'spawn' and 'forkserver' copied once into the segment before the workers start (one
    copy, not one per worker). An extra that is a view of a memory-mapped file still found
    under its name (a user's .npy opened with mmap_mode) is mapped again by each worker
    instead (nothing copied: the page cache is shared, and a data set larger than RAM stays
    on disk).

    A worker that raises or dies stops the run at once: the world is aborted, the others get
    `grace` seconds to leave, then are terminated (and killed after as long again), and
    WorkerError names the first failed rank. Ctrl-C (KeyboardInterrupt) in the launcher does
    the same and is re-raised. Workers die with the launcher (PR_SET_PDEATHSIG), and the
    segment has no name, so nothing outlives a kill. target and args must be picklable for
    the 'spawn' start method (a module-level function and plain values). ``watch``, if
    given, is called once in this process with rank 0's progress array (see
    Communicator.progress) when the workers have started; ``report``, if given, is called
    in this process with what a worker passes to ``comm.report`` (sent through its pipe),
    while the workers run.

    elastic: a failure still raises WorkerError, after waiting for the survivors (each
    returns an ``Interrupted``: see ``_elastic_error``); the ranks a survivor's timeout names
    missing are killed at once (a stalled process may not take a SIGTERM).
    """
    import multiprocessing as mp
    from multiprocessing import connection

    policy = policy or WaitPolicy.for_workers(world, backend="process")
    ctx = mp.get_context(start_method)
    method = ctx.get_start_method()
    check_main_guard(method)
    # the process a worker's parent must be: this one, except under a fork server (whose
    # process is the parent; it exits when this one does)
    parent = None if ctx.get_start_method() == "forkserver" else os.getpid()
    given, extras, mapped = extras or {}, {}, {}
    for name, a in given.items():
        region = memmap_region(a)
        if region is None:
            extras[name] = a
        else:
            mapped[name] = (*region, a.shape, a.dtype.str)
    inherited = extras if ctx.get_start_method() == "fork" else None
    shared = {} if inherited is not None else extras
    layout = SegmentLayout(world, {k: (a.shape, a.dtype) for k, a in shared.items()})
    segment = SharedSegment(layout.nbytes)
    mem = None
    procs, conns = [], []
    failure, interrupted, given_up = None, False, False
    try:
        mem = segment.array()
        layout.init(mem)
        for name, a in shared.items():
            layout.extra(mem, name)[...] = a
        for r in range(world):
            parent_end, child_end = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_process_main,
                name=f"dptrain-worker-{r}",
                daemon=True,
                args=(
                    r,
                    segment,
                    layout,
                    policy,
                    target,
                    args,
                    child_end,
                    parent,
                    inherited,
                    mapped,
                ),
            )
            p.start()
            child_end.close()
            procs.append(p)
            conns.append(parent_end)
        results = [None] * world
        lost: dict[int, str] = {}  # elastic: every rank lost, and why
        started: set[int] = set()  # the ranks whose worker got past its bootstrapping
        pending = {c: r for r, c in enumerate(conns)}
        sentinels = {p.sentinel: r for r, p in enumerate(procs)}
        deadline = None
        if watch is not None:
            watch(layout.progress(mem))
        try:
            while pending and (deadline is None or time.monotonic() < deadline):
                ready = connection.wait(
                    list(pending) + list(sentinels), timeout=0.05 if deadline else 1.0
                )
                for obj in ready:
                    if obj in pending:
                        r = pending.pop(obj)
                        try:
                            status, rank, payload = obj.recv()
                        except EOFError:
                            status, rank, payload = "died", r, None
                        if status == "started":  # more to come from this worker
                            pending[obj] = r
                            started.add(rank)
                        elif status == "report":  # more to come from this worker
                            pending[obj] = r
                            if report is not None:
                                report(payload)
                        elif status == "ok":
                            results[rank] = payload
                            if elastic and isinstance(payload, Interrupted):
                                for m in payload.missing:  # stalled: SIGKILL reaches it
                                    if m not in lost and procs[m].is_alive():
                                        procs[m].kill()
                                    lost.setdefault(m, _late(policy))
                                if deadline is None:
                                    deadline = time.monotonic() + grace + ELASTIC_WAIT_S
                        elif status == "error" and failure is None:
                            failure = (rank, payload)
                        elif status == "error":
                            lost.setdefault(rank, payload)
                        elif status == "died" and failure is None and rank not in lost:
                            procs[rank].join(0.1)
                            failure = (
                                rank,
                                _exit_cause(procs[rank], rank in started, method, mapped),
                            )
                    elif obj in sentinels:
                        r = sentinels.pop(obj)
                        procs[r].join(0.1)
                        if procs[r].exitcode not in (0, None) and failure is None and r not in lost:
                            # died before reporting (SIGKILL, segfault, os._exit)
                            failure = (r, _exit_cause(procs[r], r in started, method, mapped))
                if failure is not None and (deadline is None or failure[0] not in lost):
                    lost.setdefault(*failure)
                    layout.abort(mem, failure[0] + 1)
                    wait = grace + (ELASTIC_WAIT_S if elastic else 0.0)
                    deadline = min(deadline or math.inf, time.monotonic() + wait)
        except KeyboardInterrupt:
            interrupted = True
            layout.abort(mem, INTERRUPTED)
            raise
        if elastic and (lost or any(isinstance(res, Interrupted) for res in results)):
            for r in pending.values():  # a survivor that never got back: lost too
                lost.setdefault(r, f"still running {grace + ELASTIC_WAIT_S:g} s after the failure")
            given_up = True  # the survivors are home: no one to wait for
            raise _elastic_error(lost, results)
        if failure is not None:
            left = [r for r in pending.values() if procs[r].is_alive()]
            if left:
                failure = (
                    failure[0],
                    failure[1] + f"; rank(s) {', '.join(map(str, left))} "
                    f"still running {grace:g} s later were terminated",
                )
            raise WorkerError(*failure)
        return results
    finally:
        _stop(procs, 0.0 if (failure or interrupted or given_up) else 10.0, grace)
        for c in conns:
            c.close()
        del mem  # every view of the mapping must go before close()
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


def _dead_fork_server() -> int | None:
    """The pid of multiprocessing's fork server when it has died, else None (alive, or none
    known: a private attribute of multiprocessing.forkserver, read defensively)."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if not isinstance(pid, int):
        return None
    # the workers' deaths are seen when the server's pipes close, a moment before the server
    # is a zombie: a dying server gets half a second to become one
    deadline = time.monotonic() + 0.5
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            return None
        # a zombie (this process is its parent and has not reaped it) is dead too
        fields = proc_stat(pid)
        if fields is None or fields[0] in ("Z", "X"):
            return pid
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)


def _exit_cause(p, started: bool = True, method: str = "fork", mapped=None) -> str:
    """Why a worker process ended without a word: its signal or exit code, and for one that
    died in the start method's bootstrapping (spawn, forkserver: it imports the main script
    again), the likeliest cause, the script running the training when imported. mapped:
    the extras the workers map ({name: (path, offset, shape, dtype)}): a worker ended by a
    truncated one (TRUNCATED_EXIT) is said to be."""
    mapped = mapped or {}
    code = p.exitcode
    server = _dead_fork_server() if method == "forkserver" else None
    if server is not None:  # the workers' parent: its death ends them (PR_SET_PDEATHSIG)
        return (
            f"the fork server (pid {server}) that started the workers died, and the workers "
            f"with it: the worker's exit (code {code}) is not its own failure"
        )
    if code is not None and not started and method != "fork":
        return (
            f"exited with code {code} while starting, before any of dptrain's code ran in it: "
            f"the '{method}' start method imports the main script ({_main_file()}) again in "
            f"every worker, and an error there (shown above) ends it; a script that starts "
            f"the run at its top level starts it again in every worker. {MAIN_GUARD_FIX}"
        )
    if code is None:
        return "stopped responding"
    if code == TRUNCATED_EXIT:
        return truncated_file(mapped.values()) or "a memory-mapped input file was truncated"
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"killed by signal {name}"
    return f"exited with code {code} without reporting"
