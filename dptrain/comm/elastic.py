"""A custom training loop that goes on after a lost worker, as Horovod Elastic's
``hvd.elastic.run`` and its ``State`` do: ``run_elastic(fn, state, workers=N)``.

``state`` (an ``ElasticState``) holds what the loop must carry past a failure: the
parameters, the optimizer's buffers, the step, the epoch. ``fn(comm, state)`` reads its
position from it, trains, and calls ``state.commit()`` after each step every worker completed
(after the exchange and the update): a commit is a copy, so commit as often as a step's
loss is worth. When a worker fails (raises, dies, or misses ``timeout``), the others stop at
their next collective; ``run_elastic`` starts the workers again, one fewer (or as many with
``respawn``), each with the state of the latest commit any survivor made, down to
``min_workers``. Every collective of the loop must be reached by every worker, as ever.
"""

from __future__ import annotations

import copy

import numpy as np

from .. import _core
from .base import Interrupted, WorkerError
from .launch import launch


class ElasticState:
    """Named values a loop carries past a lost worker (arrays are copied at each commit):
    ``ElasticState(params=p, step=0)``, then ``state.params``, ``state.step += 1``,
    ``state.commit()``. ``commits``: how many commits this state has seen (over every
    restart); ``recoveries``: after ``run_elastic``, one record per restart."""

    def __init__(self, **values):
        if not values:
            raise ValueError("ElasticState needs at least one value, e.g. ElasticState(step=0)")
        for name in values:
            if name.startswith("_") or name in ("commit", "commits", "recoveries"):
                raise ValueError(f"ElasticState: {name!r} is not a name a value may have")
        self.__dict__.update(values)
        self._names = tuple(values)
        self.commits = 0
        self.recoveries: list = []
        self._saved = self._copy()

    def _copy(self) -> dict:
        return {k: _copied(getattr(self, k)) for k in self._names}

    def commit(self) -> None:
        """Saves every value as it is now: a restart after a lost worker starts from here."""
        self._saved = self._copy()
        self.commits += 1

    @classmethod
    def _restored(cls, saved: dict, commits: int) -> "ElasticState":
        fresh = cls(**{k: _copied(v) for k, v in saved.items()})
        fresh.commits = commits
        return fresh


def _copied(value):
    return np.array(value, copy=True) if isinstance(value, np.ndarray) else copy.deepcopy(value)


def regroup(err: WorkerError, world: int, min_workers: int, respawn: bool):
    """After an elastic launch of `world` workers failed with `err`: (the next launch's
    workers: the survivors, or as many as before with respawn; the values the survivors'
    Interrupted hold, None left out; why not to go on, or None: fewer than min_workers
    left). Re-raises err when it lost no worker (not a failure an elastic run goes on
    from)."""
    if err.results is None or not err.lost:
        raise err
    left = world - len(err.lost)
    held = [r.value for r in err.results if isinstance(r, Interrupted) and r.value is not None]
    short = None
    if left < min_workers and not respawn:
        short = f"; {left} worker(s) left, fewer than min_workers={min_workers}"
    return (world if respawn else left), held, short


def lost_record(err: WorkerError) -> list:
    """An elastic recovery's record of the workers it lost: [{rank, cause}, ...]."""
    return [{"rank": r, "cause": c} for r, c in sorted(err.lost.items())]


class _Target:
    """A worker of one launch: fn on a state restored from the latest commit, its state's
    last commit handed home (an Interrupted) when the group stops under it. (A class, not a
    closure, so that it pickles for the 'spawn' start method where fn does.)"""

    def __init__(self, fn, saved: dict, commits: int):
        self.fn, self.saved, self.commits = fn, saved, commits

    def __call__(self, comm):
        state = ElasticState._restored(self.saved, self.commits)
        try:
            return self.fn(comm, state)
        except (_core.GroupAborted, TimeoutError) as exc:
            return Interrupted(
                (state.commits, state._saved), getattr(exc, "missing", ()), progress=state.commits
            )


def run_elastic(
    fn,
    state: ElasticState,
    *,
    workers: int,
    backend: str | None = None,
    min_workers: int = 1,
    respawn: bool = False,
    log=None,
    **options,
) -> list:
    """Runs ``fn(comm, state)`` on `workers` workers (thread or process backend, or MPI
    ranks under ULFM: see comm.ulfm; ``options`` are ``launch``'s: timeout, threads,
    extras, ...) and returns what each worker of the last launch returned, by rank; after a
    lost worker, runs them again from the latest commit (see the module docstring).
    ``state.recoveries`` then lists each restart (the lost ranks and causes, the commit, the
    workers before and after); ``log``: called with one line per restart (under MPI, on
    rank 0 of the survivors). WorkerError when fewer than ``min_workers`` would be left."""
    if not isinstance(state, ElasticState):
        raise TypeError(f"state must be a dptrain.comm.ElasticState, got {type(state).__name__}")
    if not 1 <= min_workers <= workers:
        raise ValueError(f"min_workers must be in [1, workers={workers}], got {min_workers}")
    saved, commits, world = state._saved, state.commits, workers
    speaks = True  # under MPI only rank 0 of the survivors logs
    while True:
        try:
            return launch(
                _Target(fn, saved, commits),
                workers=world,
                backend=backend,
                elastic=True,
                **options,
            )
        except WorkerError as err:
            after, held, short = regroup(err, world, min_workers, respawn)
            short = short or (None if held else "; no survivor held a commit")
            if short:
                raise WorkerError(err.rank, err.cause + short) from None
            commits, saved = max(held, key=lambda h: h[0])
            state.recoveries.append(
                {"lost": lost_record(err), "commit": commits, "world": [world, after]}
            )
            shrunk = getattr(err, "mpi_world", None)
            if shrunk is not None:  # an MPI rank: the survivors' communicator is the next world
                options["mpi_world"], speaks = shrunk, shrunk.Get_rank() == 0
            if log is not None and speaks:
                log(
                    f"dptrain: lost worker rank {', '.join(map(str, sorted(err.lost)))} "
                    f"({err.cause}): going on with {after} worker(s) from commit {commits}"
                )
            world = after
            state.__dict__.update({k: _copied(v) for k, v in saved.items()})
            state.commits, state._saved = commits, saved
