"""Communication and transports: the communicator every worker sees, the three transports
behind it (shared memory for threads and processes, MPI), the exchange algorithms, and
``launch``, which starts workers on any of them. See ``base`` for the interface."""

from .algorithms import ALGORITHMS, ALLREDUCE_SCHEDULES, bytes_sent
from .base import (
    BACKENDS,
    CollectiveMismatch,
    Communicator,
    Interrupted,
    LocalComm,
    WorkerError,
    describe,
)
from .elastic import ElasticState, run_elastic
from .hier import HierComm, mpi_comm
from .launch import launch, oversubscription_warning
from .mpi import MPIComm, mpi_launch, mpi_world_size, resolve_backend
from .shm import SharedSegment, ShmComm, WaitPolicy, run_processes, run_threads

__all__ = [
    "ALGORITHMS",
    "ALLREDUCE_SCHEDULES",
    "BACKENDS",
    "CollectiveMismatch",
    "Communicator",
    "ElasticState",
    "HierComm",
    "Interrupted",
    "LocalComm",
    "MPIComm",
    "SharedSegment",
    "ShmComm",
    "WaitPolicy",
    "WorkerError",
    "bytes_sent",
    "describe",
    "launch",
    "mpi_comm",
    "mpi_launch",
    "mpi_world_size",
    "oversubscription_warning",
    "resolve_backend",
    "run_elastic",
    "run_processes",
    "run_threads",
]
