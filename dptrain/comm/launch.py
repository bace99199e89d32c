"""Starting workers: ``launch(fn, workers=N, backend=...)`` runs ``fn(comm, *args)`` on every
worker of a transport and returns what each returned, by rank.

The same ``fn`` runs on threads of this process, on processes sharing memory, and on MPI ranks
(a script started with ``mpiexec -n N python script.py`` calls ``launch`` on every rank; the
world size comes from MPI). This is how a custom training loop goes data-parallel, the way
PyTorch DDP and Horovod users write one: the gradient of a flat buffer is one
``comm.allreduce_mean_(grads)``.
"""

from __future__ import annotations

import os
import sys
import warnings

from . import ulfm
from .base import LocalComm, WorkerError
from .hier import mpi_comm
from .mpi import (
    MPIComm,
    abort_job,
    bounded,
    interrupt_ends_rank,
    resolve_backend,
    timed_arrival,
    watch_node,
    world,
)
from .placement import MPINode, cpu_count, plan, usable_cpus
from .shm import WaitPolicy, run_processes, run_threads

# an elastic launch under an MPI that ends the job with any rank (see comm.ulfm)
ELASTIC_MPI_REFUSAL = (
    "elastic under MPI needs an MPI job that survives a lost rank (ULFM): Open MPI 5 "
    "started with `mpiexec --with-ft ulfm`; under any other MPI run the job under "
    "`python -m dptrain elastic -- mpiexec ...`, which restarts it from a checkpoint"
)


def oversubscription_warning(workers: int, threads: int, cores: int | None = None) -> str | None:
    """The warning for more workers x threads than `cores`, by default the CPUs this process
    may use (its affinity mask: a cgroup's, taskset's), or None."""
    cores = cores or cpu_count()
    if workers * threads > cores:
        return (
            f"{workers} workers x {threads} threads = {workers * threads} exceeds the "
            f"{cores} cores this process may use: timings will reflect time-sharing"
        )
    return None


def launch(
    fn,
    *args,
    workers: int | None = None,
    backend: str | None = None,
    timeout: float = 0.0,
    threads: int = 1,
    start_method: str | None = None,
    extras: dict | None = None,
    mpi_shm: bool | None = None,
    mpi_nodes: int = 0,
    watch=None,
    report=None,
    gather: str = "all",
    pin: bool | None = None,
    elastic: bool = False,
    mpi_world=None,
) -> list:
    """Runs ``fn(comm, *args)`` on every worker; returns their return values, by rank.

    backend: 'thread' (threads of this process), 'process' (processes sharing memory), 'mpi'
    (this process is one MPI rank, started by mpiexec), or None: 'mpi' when this process was
    started by an MPI launcher with several ranks, else 'thread'. workers: how many (thread
    and process; under MPI the world size, which workers may only confirm; default 1, or the
    MPI world size). ``comm`` is a ``dptrain.comm.Communicator``: ``rank``, ``size``,
    ``zeros(n)`` (an array reduced where it lies), ``allreduce_mean_(a)``,
    ``allreduce_sum_(a)``, ``broadcast_(a, root)``, ``barrier()``, ``extra(name)``,
    ``report(record)``.
    timeout > 0 makes a collective that waits longer fail (naming the ranks that did not
    arrive). threads: the threads each worker's C kernels use (it only tunes how workers
    wait). extras: arrays every worker reads with ``comm.extra(name)`` (threads: the arrays
    themselves; processes: inherited under the 'fork' start method, else copied once into
    shared memory, and a view of a memory-mapped file is mapped again by each worker; MPI:
    each rank passes its own). mpi_shm, mpi_nodes: under MPI, the ranks of each node reduce
    over shared memory (None: yes, unless $DPTRAIN_MPI_SHM=0) and k > 0 splits the ranks
    into k simulated nodes (``dptrain.comm.mpi_comm``). watch: called once, in this process,
    with rank 0's progress array (``comm.progress``) when the workers have started (under
    MPI on rank 0). report: called in this process with every record a worker passes to
    ``comm.report`` while the workers run (a worker process sends it home through its pipe;
    under MPI each rank is its own launching process). For 'process' with the 'spawn'
    start method, fn and args must pickle (a module-level function, plain values).

    A worker that raises stops every worker at once and raises ``WorkerError`` naming its
    rank (under MPI the failing rank prints its error and aborts the whole job). Under MPI
    every rank gets the list of every rank's return value (gathered once, at the end), or,
    with gather='root', rank 0 gets it and every other rank a list holding only its own.

    pin: each worker pins itself to CPUs of its own (``threads`` each, out of those this
    process may use) before fn runs, so that the threads it starts inherit them: True
    (refused with a ValueError when workers x threads exceed those CPUs), False, or None:
    where it helps (several worker processes or MPI ranks with enough CPUs; see
    ``comm.placement.plan``). Under MPI the ranks of a node share out its CPUs, and a
    binding the launcher gave is kept. ``comm.placement`` tells fn what it got
    (``Placement.describe``). One worker of the thread backend runs in the calling thread:
    pinned, it gets its mask back after.

    elastic (thread, process; MPI under ULFM, see ``comm.ulfm``): when a worker fails, the
    others are let finish: fn may catch the group's stop (``dptrain._core.GroupAborted``, or
    a collective's TimeoutError, whose ``missing`` names the ranks that did not arrive) and
    return ``Interrupted(state, missing, progress)``; the WorkerError raised then holds every
    lost rank (``lost``) and every survivor's return (``results``), from which the caller
    goes on (``dptrain.train``'s elastic runs do); under MPI also the survivors' shrunk
    communicator (``mpi_world``), to give the next launch as ``mpi_world``.
    """
    if gather not in ("all", "root"):
        raise ValueError(f"gather is {gather!r}, expected 'all' or 'root'")
    backend, note = resolve_backend(backend)
    if elastic and backend == "mpi" and not ulfm.available():
        raise ValueError(ELASTIC_MPI_REFUSAL)
    if backend == "mpi":
        return _launch_mpi(
            fn,
            args,
            note,
            workers=workers,
            timeout=timeout,
            threads=threads,
            extras=extras,
            mpi_shm=mpi_shm,
            mpi_nodes=mpi_nodes,
            watch=watch,
            report=report,
            gather=gather,
            pin=pin,
            elastic=elastic,
            comm_world=mpi_world,
        )
    workers = 1 if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    placement = plan(workers, threads, pin, usable_cpus(), backend)
    warning = oversubscription_warning(workers, threads)
    if warning:
        warnings.warn(warning, RuntimeWarning, stacklevel=2)
    policy = WaitPolicy.for_workers(workers, threads, timeout, backend)
    if backend == "thread":
        if workers == 1:  # no one to talk to: no shared segment, no thread
            comm = LocalComm(extras, report)
            if watch is not None:
                watch(comm.progress)
            # the caller's own thread: pinned, it gets its mask back after
            mask = os.sched_getaffinity(0) if placement.pinned else None
            try:
                return [_placed(comm, fn, args, placement)]
            finally:
                if mask is not None:
                    os.sched_setaffinity(0, mask)
                comm.close()
        return run_threads(
            workers,
            lambda comm: _placed(comm, fn, args, placement),
            policy=policy,
            extras=extras,
            watch=watch,
            report=report,
            elastic=elastic,
        )
    return run_processes(
        workers,
        _placed,
        (fn, args, placement),
        policy=policy,
        extras=extras,
        start_method=start_method,
        watch=watch,
        report=report,
        elastic=elastic,
    )


def _launch_mpi(
    fn,
    args,
    note,
    *,
    workers,
    timeout,
    threads,
    extras,
    mpi_shm,
    mpi_nodes,
    watch,
    report,
    gather,
    pin,
    elastic=False,
    comm_world=None,
) -> list:
    """launch's MPI rank: this process runs fn once, as its rank (of comm_world: by default
    MPI's world; an elastic launch's survivors give the communicator they shrank to)."""
    comm_world = world() if comm_world is None else comm_world
    size, rank = comm_world.Get_size(), comm_world.Get_rank()
    if note and rank == 0:
        print(f"dptrain: {note}", file=sys.stderr, flush=True)
    if workers not in (None, size):
        raise ValueError(
            f"under MPI the number of workers is the world size set by "
            f"mpiexec -n (here {size}), but workers={workers} was asked for: "
            f"launch with mpiexec -n {workers}"
        )
    watch_node(rank)  # (MPICH: a rank gone without a word is named by its node's watcher)
    if elastic:
        return _launch_ulfm(
            fn, args, comm_world, threads, pin, extras, watch, report, gather, timeout
        )
    interrupt_ends_rank()  # Ctrl-C from here on: every rank leaves at once, with 130
    # every rank's start-up (its data loaded) is done, or named within the timeout
    timed_arrival(comm_world, "start-up", timeout)
    with bounded("the communicator's set-up", timeout, rank):
        comm = _set_up(
            comm_world,
            threads,
            pin,
            lambda: mpi_comm(
                comm_world, shm=mpi_shm, nodes=mpi_nodes or None, timeout=timeout, threads=threads
            ),
            extras,
            report,
            watch,
        )
    try:
        mine = fn(comm, *args)
        # every rank got here (rank 0's last evaluation is work), or is named in time
        timed_arrival(comm_world, "the end", timeout, after_work_of=0)
        with bounded("the end", timeout, rank):
            comm.free()  # collective: every rank got here; the results are copies
    except BaseException as exc:
        # the other ranks wait in a collective this rank will never join (MPI_Abort ends
        # every rank; MPICH then leaves its own /dev/shm/mpich_shm_* segment behind, see
        # the README)
        abort_job(comm_world, rank, exc)
        raise
    with bounded("the end (the results' gather)", timeout, rank):
        if gather == "root":
            got = comm_world.gather(mine, root=0)
            return got if rank == 0 else [mine if r == rank else None for r in range(size)]
        return comm_world.allgather(mine)


def _launch_ulfm(
    fn, args, comm_world, threads, pin, extras, watch, report, gather, timeout
) -> list:
    """launch's elastic MPI rank (comm.ulfm): fn on a flat, failure-aware MPIComm, whose
    collectives wait at most `timeout` seconds (0: without a limit) for a rank; the
    start-up and the end wait in ULFM's own fault-tolerant calls."""
    from mpi4py import MPI

    comm_world.Set_errhandler(MPI.ERRORS_RETURN)  # (mpi4py's default: said, not assumed)
    comm = _set_up(
        comm_world,
        threads,
        pin,
        lambda: MPIComm(comm_world, elastic=True, timeout=timeout),
        extras,
        report,
        watch,
    )
    try:
        return ulfm.run_once(comm_world, fn, args, comm, gather, timeout)
    finally:
        comm._comm.close()  # (its watch's thread)


def _set_up(comm_world, threads, pin, make, extras, report, watch):
    """An MPI rank's communicator (make()), made after the rank is placed on its node's CPUs
    (the communicator's threads inherit the mask), with what launch gave the workers."""
    node = MPINode.of(comm_world)
    placement = node.plan(threads, pin)
    placement.pin(node.rank)
    comm = make()
    comm._extras, comm._report = dict(extras or {}), report
    comm.placement = placement.describe()
    if watch is not None and comm.rank == 0:
        watch(comm.progress)
    return comm


def _placed(comm, fn, args, placement):
    """A worker's start: it pins itself (before fn builds anything that starts threads),
    records where it runs, and runs fn."""
    placement.pin(comm.rank)
    comm.placement = placement.describe()
    return fn(comm, *args)


__all__ = ["WorkerError", "launch", "oversubscription_warning"]
