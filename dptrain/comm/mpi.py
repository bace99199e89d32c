"""MPI ranks through mpi4py: buffer collectives on NumPy arrays, never pickled objects.

``mpiexec -n N python -m dptrain train`` (or any script calling ``dptrain.launch``) starts N
ranks; each gets an ``MPIComm``. The all-reduce is ``Allreduce(IN_PLACE)`` on the flat array,
or the ring / tree schedule of ``algorithms`` for arrays allocated with that algorithm.

Also here: reading from the environment whether this process was started by an MPI launcher
(without importing mpi4py), and picking the backend from it (``resolve_backend``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager

import numpy as np

from .._signals import Terminated
from . import ulfm
from .base import (
    BACKENDS,
    CollectiveMismatch,
    Communicator,
    _check_algorithm,
    aligned_zeros,
    check_flat,
    describe,
    filled_bytes,
    mismatch_message,
    range_bytes,
    signature,
    signature_array,
)

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
        raise ValueError(
            f"backend is {backend!r}, expected one of {BACKENDS} (or None: "
            f"MPI when started by an MPI launcher, else thread)"
        )
    launch = mpi_launch()
    if launch is None or launch[1] <= 1 or backend == "mpi":
        return backend or "thread", None
    where, size = launch
    if backend is None:
        return "mpi", (
            f"started by {where} as one of {size} ranks: using the MPI backend (--backend mpi)"
        )
    raise ValueError(
        f"this process was started by {where} as one of {size} ranks, but "
        f"backend={backend!r} would make each rank run its own, separate "
        f"training: use backend='mpi', or start one process "
        f"without the MPI launcher"
    )


def find_mpiexec() -> str | None:
    """The path of mpiexec (or mpirun) when mpi4py is importable too, else None: what a script
    needs to start MPI ranks of dptrain."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("mpi4py") is None:
        return None
    return shutil.which("mpiexec") or shutil.which("mpirun")


def allreduce_in_place(comm, buf, algorithm: str = "native") -> None:
    """buf (1-D, contiguous) = its sum over the ranks of the mpi4py communicator comm, in
    place: MPI_Allreduce ('native'), or the ring or tree schedule of ``algorithms``."""
    from mpi4py import MPI

    from . import algorithms

    if algorithm == "ring":
        algorithms.ring_allreduce(comm, buf)
    elif algorithm == "tree":
        algorithms.tree_allreduce(comm, buf)
    else:
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)


def mpi_agree(comm, sig) -> float:
    """Every rank of comm called the same collective with the same arguments (its signature,
    base.signature): one small all-reduce of the signature and its negation (MAX: every rank
    then knows the largest and the smallest of each value), which also waits for every rank;
    returns the seconds it took. Otherwise CollectiveMismatch on every rank, naming each
    rank's arguments (gathered only then)."""
    from mpi4py import MPI

    mine = sig.copy() if isinstance(sig, np.ndarray) else signature_array(sig)
    both = np.concatenate([mine, -mine])
    t0 = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, both, op=MPI.MAX)
    waited = time.perf_counter() - t0
    if np.array_equal(both[:8], mine) and np.array_equal(-both[8:], mine):
        return waited
    rows = np.empty((comm.Get_size(), 8), np.int64)
    comm.Allgather(mine, rows)
    raise CollectiveMismatch(mismatch_message(rows, range(comm.Get_size())))


def world(timeout: float = 0.0):
    """mpi4py's COMM_WORLD, or a RuntimeError that says what to install. timeout > 0: MPI's
    start-up (MPI_Init, at the first import of mpi4py.MPI) waits for every rank of the job to
    start it, for ever where one is stalled or died before it, and holds the GIL meanwhile:
    a C thread ends this rank with a line that says so after `timeout` seconds."""
    rank = next((os.environ[v] for v in RANK_VARIABLES if v in os.environ), "?")
    first = "mpi4py.MPI" not in sys.modules
    # Open MPI 5's UCX one-sided component prints an error per rank and window for the node's
    # shared windows (hier) where it cannot serve them, 3 per rank and run here; they are
    # within a node, which UCX is not needed for. (A user's own choice is kept.)
    os.environ.setdefault("OMPI_MCA_osc", "^ucx")
    try:
        with bounded("MPI's start-up (MPI_Init)", timeout if first else 0.0, rank):
            from mpi4py import MPI
    except ImportError as exc:
        raise RuntimeError(
            "backend 'mpi' needs mpi4py and an MPI library: pip install 'dptrain[mpi]'"
        ) from exc
    return MPI.COMM_WORLD


@contextmanager
def bounded(what: str, timeout: float, rank="?"):
    """Around a blocking MPI call that waits for every rank (MPI_Init, a collective of the
    start-up or the end), which holds the GIL and would wait for ever for a rank that is
    stalled or gone: after `timeout` seconds (0: never) a C thread ends this rank with a line
    that says so (exit code 1; the launcher then ends the job)."""
    if timeout <= 0:
        yield
        return
    from .. import _core

    tell_watcher("armed")
    _core._exit_later(
        timeout,
        f"dptrain: error: {what} on rank {rank} did not end within {timeout:g} s (--timeout): "
        f"a rank of the job is stalled, or died before it\n",
    )
    try:
        yield
    finally:
        _core._exit_later_cancel()
        tell_watcher("disarmed")


# where the launchers put a rank's number before MPI_Init (MPICH/Hydra's PMI, Open MPI's,
# Slurm's)
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


# Seconds a failing rank waits between printing why and MPI_Abort. The launcher forwards a
# rank's output through its own proxy process, and an abort that reaches the launcher first
# ends the job with the line never forwarded: with MPICH's Hydra here, 1 run in 80 of a
# 4-rank job under load lost the whole of the failing rank's stderr (Flux and Chapel report
# the same of theirs). The other ranks wait in a collective meanwhile.
ABORT_GRACE_SECONDS = 0.5


ARRIVAL_TAG = 0x7D7A  # timed_arrival's messages (a tag of their own on the world)


def timed_arrival(comm, what: str, timeout: float, after_work_of: int | None = None) -> None:
    """Every rank of comm meets here (a barrier), each waiting at most `timeout` seconds for
    the others (after_work_of: a rank whose lateness is work, e.g. rank 0 evaluating the last
    epoch: waited for without a limit, the others then within `timeout` of it); 0: a plain
    barrier. MPI's own collectives wait for ever, so a rank stalled in its start-up or at
    the end would hold the job: here each rank tells every other one it arrived, and a rank
    that times out names the ranks it did not hear from and aborts the job (the lowest such
    rank at once; the others a moment later, in case it is gone too)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if timeout <= 0 or size == 1:
        comm.Barrier()
        return
    mark = np.array([rank], np.int64)
    sends = [comm.Isend(mark, dest=d, tag=ARRIVAL_TAG) for d in range(size) if d != rank]
    got = {src: np.zeros(1, np.int64) for src in range(size) if src != rank}
    pending = {src: comm.Irecv(buf, source=src, tag=ARRIVAL_TAG) for src, buf in got.items()}
    deadline = None if after_work_of in pending else time.monotonic() + timeout
    while pending:
        for src in [s for s, req in pending.items() if req.Test()]:
            del pending[src]
            if src == after_work_of:
                deadline = time.monotonic() + timeout
        if pending and deadline is not None and time.monotonic() > deadline:
            missing = sorted(pending)
            if rank != min(set(range(size)) - set(missing)):  # the lowest arrived rank names
                time.sleep(3 * ABORT_GRACE_SECONDS)  # ... and aborts after one grace
            who = ", ".join(map(str, missing))
            abort_job(
                comm,
                rank,
                TimeoutError(
                    f"{what} on rank {rank} timed out after {timeout:g} s waiting for the other "
                    f"{size - 1} ranks: rank{'s' if len(missing) > 1 else ''} {who} did not "
                    f"arrive"
                ),
            )
        time.sleep(0.001)
    for req in sends:
        req.Wait()


_HELD = []  # first_on_node's sockets: held until this process ends


def node_socket_name(what: str) -> str:
    """The abstract Unix socket name of `what` for this node's ranks of this job (those
    that share a parent: the launcher's proxy): first_on_node's election, the watcher's."""
    return f"\0dptrain-{what}-{os.getuid()}-{os.getppid()}"


def first_on_node(what: str) -> bool:
    """True in the first rank of this node (the ranks that share a parent: the launcher's
    proxy) to call it with `what`, False in the others: the name of an abstract Unix socket
    (Linux) is held by one process at a time and goes with it, so nothing is left behind.
    Elsewhere: True in rank 0. For one line where every rank would say the same (Ctrl-C
    reaches them all), said by whichever rank gets there first, even where rank 0 is stuck
    in a blocking call."""
    if not sys.platform.startswith("linux"):
        return next((os.environ[v] for v in RANK_VARIABLES if v in os.environ), "0") == "0"
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(node_socket_name(what))
    except OSError:
        sock.close()
        return False
    _HELD.append(sock)
    return True


_WATCHED = []  # watch_node's connection: held until this process ends


def watch_node(rank: int) -> None:
    """Under MPICH's Hydra (which kills every rank with the first, by SIGKILL: no handler
    runs): this rank reports to its node's watcher (comm.watch), started here by the first
    rank of the node to get here, so that a rank gone without a word is named by rank. Once
    per process; nothing elsewhere (Open MPI's launcher names a killed rank itself)."""
    import atexit
    import socket
    import subprocess

    if _WATCHED or "PMI_SIZE" not in os.environ or not sys.platform.startswith("linux"):
        return
    name = node_socket_name("watch")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)  # the first rank of the node: it starts the watcher
        listener.listen(256)
        subprocess.Popen(
            [sys.executable, "-S", "-I", os.path.join(os.path.dirname(__file__), "watch.py")]
            + [str(listener.fileno())],
            pass_fds=[listener.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of the launcher's reach
        )
    except OSError:  # another rank of the node got there first
        pass
    finally:
        listener.close()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + 5.0
    while True:
        try:
            conn.connect(name)
            break
        except OSError:  # its watcher is not listening yet
            if time.monotonic() > deadline:
                conn.close()
                return
            time.sleep(0.005)
    conn.sendall(f"rank {rank} pid {os.getpid()}\n".encode())
    _WATCHED.append(conn)
    atexit.register(tell_watcher, "done")


def tell_watcher(word: str) -> None:
    """Tells this node's watcher (watch_node) how this rank ends: 'done' (normally), 'said'
    (it said why itself: a failure, an interrupt), 'armed' / 'disarmed' (a C timer that
    ends it with a line of its own is set / cleared). Nothing where there is none."""
    for conn in _WATCHED:
        try:
            conn.sendall(word.encode() + b"\n")
        except OSError:
            pass


INTERRUPTED_LINE = "dptrain: interrupted: every rank was stopped"


def interrupt_ends_rank() -> None:
    """Ctrl-C ends this MPI rank at once with 130, in C, wherever it is
    (_core._exit_on_interrupt), the first rank of the node saying INTERRUPTED_LINE (cli's
    Ctrl-C line). Ctrl-C reaches every rank (the terminal's process group, or the launcher
    forwarding it), and a rank blocked in C (a collective, the results' gather,
    MPI_Finalize) runs no Python handler: once one rank had left on its KeyboardInterrupt,
    MPICH's launcher killed the blocked ones (SIGKILL) and the job ended with 9, not 130.
    Linux only (the election is an abstract socket); nothing elsewhere or with one rank (an
    elastic job keeps Python's handler: its ranks go on past a lost one)."""
    from .. import _core

    if not sys.platform.startswith("linux") or (mpi_world_size() or 1) < 2:
        return
    fd = _WATCHED[0].fileno() if _WATCHED else -1
    name = node_socket_name("interrupted").encode()
    line = (INTERRUPTED_LINE + "\n").encode()
    _core._exit_on_interrupt(line, name, fd, _hydra_pmi_fd(), _local_ranks())


def _local_ranks() -> int:
    """How many ranks of the job run on this node, from the launcher's environment (MPICH's
    Hydra, Open MPI), or 0: unknown."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        try:
            return max(0, int(os.environ[var]))
        except (KeyError, ValueError):
            pass
    return 0


def _hydra_pmi_fd() -> int:
    """The descriptor of this rank's PMI-1 socket to MPICH's launcher (Hydra's proxy, this
    process's parent, names it in PMI_FD), or -1: another launcher (Slurm's srun speaks PMI-2
    or PMIx there, Open MPI its own), or none. The interrupt handler says 'finalized' on it
    (mod_guard.c: else the proxy SIGKILLs the node's ranks still leaving)."""
    try:  # (the handler checks at its time that the descriptor is still a socket)
        fd = int(os.environ["PMI_FD"])
        with open(f"/proc/{os.getppid()}/comm") as f:
            parent = f.read().strip()
    except (KeyError, ValueError, OSError):
        return -1
    return fd if parent == "hydra_pmi_proxy" else -1


def abort_job(comm_world, rank: int, exc: BaseException) -> None:
    """A rank's failure under MPI: print which rank failed and why (stderr), give the
    launcher a moment to forward it, then MPI_Abort the whole job (exit status 130 for an
    interrupt, else 1). The other ranks wait in a collective this rank will never join, so
    nothing short of the abort stops them.

    A rank woken by another's abort of their shared memory (GroupAborted: that rank failed
    first, or was interrupted, and said so) prints nothing: a line of its own would name it as
    failed, e.g. the late rank that the first one timed out waiting for. It aborts after twice
    the grace, so that the first rank's line and exit status come first."""
    from .. import _core
    from .shm import INTERRUPTED

    woken = isinstance(exc, _core.GroupAborted)
    interrupted = isinstance(exc, KeyboardInterrupt) or (
        woken and tuple(exc.args[1:2]) == (INTERRUPTED,)
    )
    # Ctrl-C reaches every rank (the launcher forwards it): the first to handle it says it
    # SIGTERM or SIGHUP, stopping a run as Ctrl-C does (a singleton MPI run)
    signum = (exc.signum if isinstance(exc, Terminated) else signal.SIGINT) if interrupted else 0
    if not woken and (not interrupted or first_on_node("interrupted")):
        how = "interrupted" if signum == signal.SIGINT else "stopped"
        name = signal.Signals(signum).name if interrupted else ""
        cause = f"{how} ({name})" if interrupted else f"failed: {describe(exc)}"
        print(
            f"dptrain: worker rank {rank} {cause}; aborting all {comm_world.Get_size()} MPI ranks",
            file=sys.stderr,
            flush=True,
        )
    tell_watcher("said")
    try:
        time.sleep(ABORT_GRACE_SECONDS * (2 if woken else 1))
    except KeyboardInterrupt:  # a second Ctrl-C: abort at once
        pass
    code = 128 + signum if interrupted else 1
    comm_world.Abort(code)
    # MPICH's MPI_Abort can return in the calling rank before the launcher kills it: leave
    # now, or the exception goes on up and prints the failure a second time
    os._exit(code)


class MPIComm(Communicator):
    """An MPI rank: buffer collectives on NumPy arrays through mpi4py (never pickled)."""

    backend = "mpi"

    def __init__(
        self, comm=None, measure_wait: bool = True, elastic: bool = False, timeout: float = 0.0
    ):
        """measure_wait: enter each collective through MPI_Barrier and count the time spent
        in it as synchronization wait (MPI reports no arrival times; the barrier costs a few
        microseconds per collective on one machine). False: the wait stays inside the
        collective's time. elastic (under ULFM, see comm.ulfm): a collective that a lost rank
        stops raises ulfm.RanksLost (a GroupAborted) on every rank, as does one that waits
        longer than timeout seconds (> 0; the waits for a rank's own work, barrier_after_work,
        are not timed)."""
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = comm if comm is not None else MPI.COMM_WORLD
        self._elastic = elastic
        self._timeout = timeout if elastic else 0.0
        if elastic:
            self._comm = ulfm.FailureAware(self._comm, self._timeout)
        self._measure_wait = measure_wait
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self.progress = np.zeros(2)
        self._algorithm: dict[int, tuple[str, np.ndarray]] = {}  # id(array) -> schedule
        self._shared: dict[int, np.ndarray] = {}  # id(arrays[0]) -> their flat buffer

    def zeros(self, length, dtype="float32", *, algorithm="native"):
        _check_algorithm(algorithm)
        a = aligned_zeros(int(length), dtype)
        if algorithm != "native":
            self._algorithm[id(a)] = (algorithm, a)
        return a

    def shared_zeros(self, count, length, dtype="float32"):
        count, length = int(count), int(length)
        flat = aligned_zeros(count * length, dtype)
        arrays = [flat[i * length : (i + 1) * length] for i in range(count)]
        self._shared[id(arrays[0])] = flat
        return arrays

    def _entry_wait(self, op, array=None, **kw) -> float:
        """Every rank called op with the same arguments (mpi_agree): the collective's entry,
        where the wait for the slowest rank is spent (0 unless measure_wait)."""
        if self.size == 1:
            return 0.0
        if array is not None and op != "sum_into_":  # sum_into_'s may be bfloat16 bits
            check_flat(array)
        waited = mpi_agree(self._comm, signature(op, array, **kw))
        return waited if self._measure_wait else 0.0

    def allreduce_sum_(self, array, *, scale=1.0, start=0, stop=None):
        schedule = self._algorithm.get(id(array), ("native", None))[0]
        waited = self._entry_wait("allreduce_sum_", array, start=start, stop=stop, scale=scale)
        self._account("allreduce", range_bytes(array, start, stop), schedule, waited=waited)
        buf = array[start:stop]
        allreduce_in_place(self._comm, buf, schedule)
        if scale != 1.0:
            buf *= scale

    def allreduce_async_(self, array, start=0, stop=None):
        if id(array) in self._algorithm:
            raise ValueError(
                "overlap needs a non-blocking all-reduce: use allreduce='native' "
                "with the mpi backend"
            )
        self._entry_wait("allreduce_async_", array, start=start, stop=stop)  # not a wait
        self._account("allreduce", range_bytes(array, start, stop))
        return self._comm.Iallreduce(self._MPI.IN_PLACE, array[start:stop], op=self._MPI.SUM)

    def wait_(self, handles):
        reqs = [h for h in handles if h is not None]
        if reqs and self._elastic:
            ulfm.wait_all(self._comm._comm, reqs)
        elif reqs:
            self._MPI.Request.Waitall(reqs)

    def reduce_sum_(self, array, root=0):
        """The sum of every rank's array, in root's own array (MPI_Reduce in place)."""
        waited = self._entry_wait("reduce_sum_", array, root=root)
        self._account("reduce", array.nbytes, root=root, waited=waited)
        if self.rank == root:
            self._comm.Reduce(self._MPI.IN_PLACE, array, op=self._MPI.SUM, root=root)
        else:
            self._comm.Reduce(array, None, op=self._MPI.SUM, root=root)
        return array

    def sum_into_(self, out, arrays, *, scale=1.0):
        """Rank r filled arrays [r k / size, (r + 1) k / size): gather them all (exact copies,
        no arithmetic), then every rank sums them in index order."""
        from .. import _core

        flat = self._shared.get(id(arrays[0]))
        if flat is None:
            raise ValueError("sum_into_ needs arrays from comm.shared_zeros()")
        waited = self._entry_wait("sum_into_", out, count=len(arrays), scale=scale)
        self._account("allreduce", filled_bytes(arrays, self.size), waited=waited)
        count, length = len(arrays), arrays[0].size
        if count % self.size:  # rank r's arrays [r k // size, (r + 1) k // size): uneven
            first = [r * count // self.size * length for r in range(self.size + 1)]
            sizes = [hi - lo for lo, hi in zip(first, first[1:])]
            self._comm.Allgatherv(self._MPI.IN_PLACE, [flat, (sizes, first[:-1])])
        else:
            self._comm.Allgather(self._MPI.IN_PLACE, flat)
        _core.sum_buffers(out, arrays, scale=scale)

    def broadcast_(self, array, root=0):
        waited = self._entry_wait("broadcast_", array, root=root)
        self._account("broadcast", array.nbytes, root=root, waited=waited)
        self._comm.Bcast(array, root=root)

    def barrier(self):
        self._barrier(self._comm)

    def barrier_after_work(self, worker=None):
        # an elastic launch's timeout: the others wait for `worker` without it (working, not
        # late); `worker` itself waits with it (a peer late for it is lost)
        self._barrier(
            self._comm if worker == self.rank else getattr(self._comm, "untimed", self._comm)
        )

    def _barrier(self, comm):
        waited = mpi_agree(comm, signature("barrier")) if self.size > 1 else 0.0
        self._account("barrier", 0, waited=waited)

    def broadcast_object(self, value, root=0):
        """root's value (anything that pickles, small), on every rank (MPI_Bcast of its
        pickle): what an elastic run's ranks must all hold, e.g. rank 0's epoch records."""
        return self._comm.bcast(value, root=root)

    def abort(self, code=1):
        self._comm.Abort(code)
