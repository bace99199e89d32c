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

from .base import BACKENDS, LocalComm, WorkerError
from .hier import mpi_comm
from .mpi import abort_job, resolve_backend, world
from .shm import WaitPolicy, run_processes, run_threads


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
    """The warning for more workers x threads than this machine has cores, or None."""
    cores = os.cpu_count() or 1
    if workers * threads > cores:
        return (f"{workers} workers x {threads} threads = {workers * threads} exceeds the "
                f"{cores} cores of this machine: timings will reflect time-sharing")
    return None


def launch(fn, *args, workers: int | None = None, backend: str | None = None,
           timeout: float = 0.0, threads: int = 1, start_method: str | None = None,
           extras: dict | None = None) -> list:
    """Runs ``fn(comm, *args)`` on every worker; returns their return values, by rank.

    backend: 'thread' (threads of this process), 'process' (processes sharing memory), 'mpi'
    (this process is one MPI rank, started by mpiexec), or None: 'mpi' when this process was
    started by an MPI launcher with several ranks, else 'thread'. workers: how many (thread
    and process; under MPI the world size, which workers may only confirm; default 1, or the
    MPI world size). ``comm`` is a ``dptrain.comm.Communicator``: ``rank``, ``size``,
    ``zeros(n)`` (an array reduced where it lies), ``allreduce_mean_(a)``,
    ``allreduce_sum_(a)``, ``broadcast_(a, root)``, ``barrier()``.
    timeout > 0 makes a collective that waits longer fail (naming the ranks that did not
    arrive). threads: the threads each worker's C kernels use (it only tunes how workers
    wait). extras: arrays every worker reads with ``comm.extra(name)`` (processes: inherited
    under the 'fork' start method, else copied once into shared memory). For 'process' with
    the 'spawn' start method, fn and args must pickle (a module-level function, plain
    values).

    A worker that raises stops every worker at once and raises ``WorkerError`` naming its
    rank (under MPI the failing rank prints its error and aborts the whole job). Under MPI
    every rank gets the list of every rank's return value (gathered once, at the end).
    """
    backend, note = resolve_backend(backend)
    if backend == "mpi":
        comm_world = world()
        size = comm_world.Get_size()
        if note and comm_world.Get_rank() == 0:
            print(f"dptrain: {note}", file=sys.stderr, flush=True)
        if workers not in (None, size):
            raise ValueError(f"under MPI the number of workers is the world size set by "
                             f"mpiexec -n (here {size}), but workers={workers} was asked for")
        comm = mpi_comm(comm_world, timeout=timeout, threads=threads)
        try:
            mine = fn(comm, *args)
        except BaseException as exc:
            abort_job(comm_world, comm.rank, exc)
            raise
        return comm_world.allgather(mine)
    workers = 1 if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    warning = oversubscription_warning(workers, threads)
    if warning:
        warnings.warn(warning, RuntimeWarning, stacklevel=2)
    policy = WaitPolicy.for_workers(workers, threads, timeout, backend)
    if backend == "thread":
        if workers == 1 and not extras:
            return [fn(LocalComm(), *args)]
        return run_threads(workers, lambda comm: fn(comm, *args), policy=policy, extras=extras)
    return run_processes(workers, _call, (fn, args), policy=policy, extras=extras,
                         start_method=start_method)


def _call(comm, fn, args):
    return fn(comm, *args)


__all__ = ["WorkerError", "check_world", "launch", "oversubscription_warning"]
