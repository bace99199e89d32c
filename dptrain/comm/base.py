"""The communicator: what a worker sees of the others, the same on every transport.

A worker's ``Communicator`` has a ``rank`` and the group's ``size``, allocates the flat arrays
that it exchanges (``zeros``, ``shared_zeros``: collective, so every rank calls them in the
same order), and runs the collectives on flat NumPy arrays, in place:

- ``allreduce_sum_(a, scale=1, start=0, stop=None)`` / ``allreduce_mean_(a)`` / ``average_(a)``
  (the mean, for local SGD in your own loop);
- ``allreduce_async_(a, start, stop)`` + ``wait_(handles)`` (overlap with compute);
- ``reduce_sum_(a, root)``: every rank's ``a`` summed for root (a parameter server);
- ``sum_into_(out, arrays, scale)``: shared arrays summed in index order (a fixed order that
  does not depend on which rank wrote which array: deterministic mode);
- ``broadcast_(a, root)``, ``barrier()``, ``abort(code)``.

Any array works; arrays from ``zeros`` are reduced where they lie (shared memory: no copy),
others go through a staging copy. Nothing is pickled on the hot path. The transports are in
``local`` (one worker), ``shm`` (threads or processes sharing memory), ``mpi`` (MPI ranks,
flat) and ``hier`` (MPI ranks sharing memory inside each node: the MPI backend's default);
``launch`` starts workers on any of them.

A communicator also counts what its collectives cost this worker (``waited``: seconds spent
at a collective's entry waiting for the slowest worker, ``calls``, ``bytes_sent`` by the
schedule's volume), which the training loop's step timer reads.
"""

from __future__ import annotations

import abc
import os
import sysconfig
import traceback

import numpy as np

from .._aligned import ALIGN, aligned_zeros  # noqa: F401  (re-exported: the transports')
from .algorithms import ALLREDUCE_SCHEDULES
from .algorithms import bytes_sent as _schedule_bytes

BACKENDS = ("thread", "process", "mpi")  # the transports of more than one worker


class WorkerError(RuntimeError):
    """A worker failed; ``rank`` names it and ``cause`` says why. From an elastic launch
    (``launch(..., elastic=True)``) also ``lost``: {rank: cause} of every worker lost (failed,
    or named missing by a survivor's timeout), and ``results``: what each worker returned (an
    ``Interrupted`` from a survivor; None from a lost worker)."""

    def __init__(self, rank: int, cause: str, lost: dict | None = None, results=None):
        super().__init__(f"worker rank {rank} failed: {cause}")
        self.rank = rank
        self.cause = cause
        self.lost = {rank: cause} if lost is None else dict(lost)
        self.results = results


class Interrupted:
    """What a worker of an elastic launch returns when its group stopped under it (another
    worker failed; or this one's collective timed out, naming the ranks in ``missing``):
    ``value``, whatever the worker saved to go on from (its state at its last completed
    step). The launcher then raises WorkerError with every survivor's Interrupted.
    ``progress``: how far on the value is (a step or commit count): where each survivor holds
    its own, an MPI launch hands every survivor the value furthest on (comm.ulfm)."""

    def __init__(self, value, missing=(), progress: int = 0):
        self.value, self.missing, self.progress = value, tuple(missing), progress


class CollectiveMismatch(ValueError):
    """The ranks called one collective with different arrays (length, dtype, range), another
    root, another scale, or another collective altogether: raised on every rank, before any
    array is touched, naming what each rank passed."""


# A collective's signature: what every rank must pass alike, 8 integers (the shared-memory
# transports compare them in C: ShmGroup.agree; MPI in one small all-reduce). op: an index of
# SIGNATURE_OPS; dtype: of _DTYPE_CODES (0: none); length, start, stop: the array's and the
# range's (sum_into_: each array's length, and 0 and the number of arrays); root (-1: none);
# scale (its float64 bits); where: the array's allocation (-1: an array not from zeros)
SIGNATURE_OPS = (
    "allreduce_sum_",
    "allreduce_async_",
    "reduce_sum_",
    "sum_into_",
    "reduce_scatter_into_",
    "broadcast_",
    "barrier",
    "barrier_after_work",
)
_DTYPE_CODES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.uint16): 3}
_DTYPE_NAMES = {code: dt.name for dt, code in _DTYPE_CODES.items()}


def signature(op, array=None, *, start=0, stop=None, root=-1, scale=1.0, where=-1, count=None):
    """The 8 values of a collective's signature (see SIGNATURE_OPS)."""
    if array is None:
        return (SIGNATURE_OPS.index(op), 0, 0, 0, 0, root, float(scale), where)
    n = array.size
    if count is not None:
        start, stop = 0, count
    else:
        start, stop, _ = slice(start, stop).indices(n)
    return (
        SIGNATURE_OPS.index(op),
        _DTYPE_CODES.get(array.dtype, 0),
        n,
        start,
        stop,
        root,
        float(scale),
        where,
    )


def signature_array(sig) -> np.ndarray:
    """A signature as the 8 int64 that ShmGroup.agree compares (the scale as its bits)."""
    out = np.array(sig[:6] + (0, sig[7]), np.int64)
    out[6] = np.float64(sig[6]).view(np.int64)
    return out


def mismatch_message(rows, ranks) -> str:
    """The error of a collective whose signatures differ: rows[i] is rank ranks[i]'s."""
    parts = []
    # two arrays from zeros, yet not the same one: their allocations tell them apart
    places = len({int(row[7]) for row in rows if row[7] >= 0}) > 1
    for rank, row in zip(ranks, rows):
        op, dt, n, start, stop, root, scale_bits, where = (int(v) for v in row)
        what = SIGNATURE_OPS[op] if 0 <= op < len(SIGNATURE_OPS) else f"collective {op}"
        text = f"rank {rank}: {what}"
        if dt:
            text += f" of a {_DTYPE_NAMES.get(dt, '?')} array of length {n}"
            if what in ("sum_into_", "reduce_scatter_into_"):
                text += f" (x {stop} arrays)"
            elif (start, stop) != (0, n):
                text += f" [{start}:{stop}]"
            if where >= 0:
                text += (
                    f" from comm.zeros() (allocation {where})" if places else " from comm.zeros()"
                )
        if root >= 0:
            text += f", root {root}"
        scale = float(np.array(scale_bits, np.int64).view(np.float64))
        if scale != 1.0:
            text += f", scale {scale:g}"
        parts.append(text)
    return (
        "the ranks called a collective with different arguments (every rank must pass the "
        "same length, dtype and range, the same root and scale, in the same order): "
        + "; ".join(parts)
    )


def describe(exc: BaseException) -> str:
    """One line: the exception, its message and, where the user's code raised it (a layer or
    a callback of theirs, or a library it called), where: a place inside dptrain, or inside a
    library that dptrain called, tells the user nothing they could change."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        place = _place(frame.filename)
        if place != "library":  # the innermost frame of dptrain's or of the user's code
            if place == "user":
                where = f" (at {frame.filename}:{frame.lineno})"
            break
    return f"{type(exc).__name__}: {exc}{where}"


_DPTRAIN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARIES = tuple(
    os.path.realpath(sysconfig.get_paths()[k]) + os.sep
    for k in ("stdlib", "platstdlib", "purelib", "platlib")
)


def _place(filename: str) -> str:
    """'dptrain', 'library' (Python's own or an installed package) or 'user'."""
    real = os.path.realpath(filename)
    if real.startswith(os.path.realpath(_DPTRAIN)):
        return "dptrain"
    if filename.startswith("<frozen") or real.startswith(_LIBRARIES):
        return "library"
    return "user"


def line_slice(n: int, itemsize: int, rank: int, size: int) -> tuple[int, int]:
    """Rank's [lo, hi) of n elements among size ranks: whole 64-byte lines, as even as lines
    go (the slice a rank sums in the shared-memory collectives: csrc/dp_sync.c's dp_slice)."""
    line = 64 // itemsize
    q, r = divmod(-(-n // line), size)
    l0 = rank * q + min(rank, r)
    l1 = l0 + q + (1 if rank < r else 0)
    return min(l0 * line, n), min(l1 * line, n)


def proc_stat(pid: int) -> list | None:
    """The fields of /proc/PID/stat after the command's name (the state first, then the
    parent's pid, ...), or None where it cannot be read (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def check_flat(array, what: str = "array") -> np.ndarray:
    """array, if it is a writeable C-contiguous 1-D float ndarray (what the collectives
    reduce in place); else a ValueError/TypeError naming what is wrong."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray, got {type(array).__name__}")
    if array.dtype not in (np.float32, np.float64):
        raise TypeError(f"{what} has dtype {array.dtype}, expected float32 or float64")
    if array.ndim != 1 or not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(
            f"{what} must be a writeable, C-contiguous 1-D array (got shape "
            f"{array.shape}); reshape(-1) a contiguous array, outside the loop"
        )
    return array


class Communicator(abc.ABC):
    """The interface every transport implements (see the module docstring)."""

    rank = 0
    size = 1
    backend = "sequential"
    # what this worker's collectives cost it so far (read by the training loop's step timer)
    waited = 0.0
    calls = 0
    bytes_sent = 0
    # rank 0's progress, [steps done, steps in all], which the launching process reads to
    # draw a live bar (shared memory where the workers are processes)
    progress: np.ndarray
    # the ranks of each node that share memory (hierarchical MPI), else None
    node_members: list | None = None
    # where launch placed this worker: pinned or not, its CPUs, why (placement.describe)
    placement: dict | None = None
    # what launch gave the workers: its extras (name -> array) and its report callback
    _extras: dict | None = None
    _report = None

    # ---- what the launcher gave the workers
    def extra(self, name: str, default=KeyError) -> np.ndarray:
        """An array the launcher shared with every worker (``launch``'s extras, e.g. the data
        set; under MPI this rank's own), or ``default`` when there is none of that name (a
        KeyError naming it unless a default is given)."""
        extras = self._extras or {}
        if name in extras:
            return extras[name]
        if default is KeyError:
            raise KeyError(
                f"no extra array named {name!r} was given to launch (extras: "
                f"{', '.join(sorted(extras)) or 'none'})"
            )
        return default

    def report(self, record) -> None:
        """Hands ``record`` (small, picklable: an epoch's losses, say) to the launching
        process, where ``launch``'s ``report`` callback receives it while the workers run (a
        worker process sends it through its pipe home); nothing when launch was given none."""
        if self._report is not None:
            self._report(record)

    # ---- memory (collective: every rank calls these in the same order, same arguments)
    @abc.abstractmethod
    def zeros(self, length: int, dtype="float32", *, algorithm: str = "native") -> np.ndarray:
        """A new zeroed flat array of this rank, placed where this transport reduces it in
        place; ``algorithm`` ('native', 'ring' or 'tree') is the schedule of its all-reduce."""

    @abc.abstractmethod
    def shared_zeros(self, count: int, length: int, dtype="float32") -> list:
        """``count`` zeroed flat arrays for ``sum_into_``: on shared memory every rank sees the
        same arrays; under MPI each rank holds its own copies, and ``sum_into_`` gathers them
        (rank r fills arrays [r count / size, (r + 1) count / size))."""

    # ---- collectives
    @abc.abstractmethod
    def allreduce_sum_(
        self, array: np.ndarray, *, scale: float = 1.0, start: int = 0, stop: int | None = None
    ) -> None:
        """In place on every rank: array[start:stop] = scale * its sum over the ranks."""

    def allreduce_mean_(self, array: np.ndarray) -> None:
        """In place on every rank: array = its mean over the ranks."""
        self.allreduce_sum_(array, scale=1.0 / self.size)

    def average_(self, array: np.ndarray) -> None:
        """In place on every rank: array = its mean over the ranks. Local SGD in a function
        of your own under ``launch``: each rank takes H steps on its own data, then
        ``comm.average_(model.params)`` (and the velocity, to average the momentum too);
        ``train(sync_every=H)`` does this with replicas whose result does not depend on the
        number of ranks."""
        self.allreduce_mean_(array)

    def allreduce_async_(self, array: np.ndarray, start: int = 0, stop: int | None = None):
        """Starts allreduce_sum_(array, start=start, stop=stop) and returns a handle for
        ``wait_``; every rank must start the same ranges in the same order."""
        self.allreduce_sum_(array, start=start, stop=stop)
        return None

    def wait_(self, handles) -> None:
        """Waits for handles of allreduce_async_ (re-raising a failure of any of them)."""

    @abc.abstractmethod
    def reduce_sum_(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        """The sum over the ranks of ``array`` (from ``zeros``) for root: returns the array
        that holds it on root (on shared memory a shared array, readable by every rank)."""

    @abc.abstractmethod
    def sum_into_(self, out: np.ndarray, arrays: list, *, scale: float = 1.0) -> None:
        """out = scale * (arrays[0] + arrays[1] + ...), summed in index order, for every rank
        (``out`` and ``arrays`` from ``shared_zeros``). uint16 arrays (out and all of
        ``arrays``) hold bfloat16 values: summed in float32, the sum rounded to bfloat16 (half
        the bytes of float32 arrays)."""

    def reduce_scatter_into_(self, out: np.ndarray, arrays: list, *, scale: float = 1.0):
        """``sum_into_``, of which only this rank's slice of out is sure to be summed when it
        returns (on shared memory the others may still be in progress: a barrier later
        publishes them); returns that slice, (lo, hi) (``line_slice``)."""
        self.sum_into_(out, arrays, scale=scale)
        return line_slice(out.size, out.itemsize, self.rank, self.size)

    @abc.abstractmethod
    def broadcast_(self, array: np.ndarray, root: int = 0) -> None:
        """Every rank's array becomes root's."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Returns when every worker has called it."""

    def barrier_after_work(self, worker: int | None = None) -> None:
        """A barrier after rank ``worker`` did the run's own work while the others waited
        (rank 0's evaluation, its checkpoint write or read; None: every rank's start-up,
        data and model): the others wait for it however long it takes, since it is working,
        not late, so a timeout does not count that wait; ``worker`` itself waits with the
        timeout (a peer late for it is named). Collective, as ``barrier``."""
        self.barrier()  # no timeout on this transport: every barrier is one

    @abc.abstractmethod
    def abort(self, code: int = 1) -> None:
        """Makes every worker's current and next collective fail (one failed worker stops
        all)."""

    def close(self) -> None:
        """Releases what the communicator started (e.g. its communication thread)."""

    def free(self) -> None:
        """Collective, at the end of a run that went well (``launch`` calls it on every rank):
        releases the memory behind this communicator's arrays where the transport owns it per
        rank (hierarchical MPI's shared windows); every array from ``zeros`` is gone or copied
        by then."""
        self.close()

    # ---- accounting
    def _account(
        self, kind: str, nbytes: int, algorithm: str = "native", root: int = 0, waited: float = 0.0
    ) -> None:
        """Counts one collective of `kind` on nbytes per rank (bytes: algorithms.bytes_sent)."""
        self.calls += 1
        self.waited += waited
        if self.size == 1:
            return
        key = (kind, nbytes, algorithm, root)
        cache = self.__dict__.setdefault("_bytes_cache", {})
        sent = cache.get(key)
        if sent is None:  # once per distinct collective: a dict hit after
            sent = cache[key] = self._bytes_of(kind, nbytes, algorithm, root)
        self.bytes_sent += sent

    def _bytes_of(self, kind: str, nbytes: int, algorithm: str, root: int) -> int:
        """Bytes this worker sends in one collective of `kind` on nbytes per rank."""
        schedule = algorithm if kind == "allreduce" else kind
        return _schedule_bytes(schedule, self.size, nbytes, self.rank, root)


def filled_bytes(arrays, size: int) -> int:
    """The bytes of the arrays one rank of `size` fills for sum_into_ (rank r fills arrays
    [r k / size, (r + 1) k / size)): what it contributes to the sum, as an all-reduce's
    payload per rank."""
    return sum(a.nbytes for a in arrays) // max(size, 1)


def range_bytes(array: np.ndarray, start: int, stop: int | None) -> int:
    """Bytes of array[start:stop]."""
    return len(range(*slice(start, stop).indices(array.size))) * array.itemsize


class LocalComm(Communicator):
    """A single worker: arrays live in process memory and collectives do nothing (but scale)."""

    def __init__(self, extras: dict | None = None, report=None):
        self.progress = np.zeros(2)
        self._extras, self._report = dict(extras or {}), report

    def zeros(self, length, dtype="float32", *, algorithm="native"):
        _check_algorithm(algorithm)
        return aligned_zeros(int(length), dtype)

    def shared_zeros(self, count, length, dtype="float32"):
        return [aligned_zeros(int(length), dtype) for _ in range(int(count))]

    def allreduce_sum_(self, array, *, scale=1.0, start=0, stop=None):
        if scale != 1.0:
            array[start:stop] *= scale
        self._account("allreduce", range_bytes(array, start, stop))

    def reduce_sum_(self, array, root=0):
        self._account("reduce", array.nbytes, root=root)
        return array

    def sum_into_(self, out, arrays, *, scale=1.0):
        from .. import _core

        _core.sum_buffers(out, arrays, scale=scale)
        self._account("allreduce", filled_bytes(arrays, self.size))

    def broadcast_(self, array, root=0):
        self._account("broadcast", array.nbytes, root=root)

    def barrier(self):
        self._account("barrier", 0)

    def abort(self, code=1):
        pass


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALLREDUCE_SCHEDULES:
        raise ValueError(f"algorithm is {algorithm!r}, expected one of {ALLREDUCE_SCHEDULES}")
