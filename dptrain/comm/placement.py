"""Where the workers run: each worker (a process, an MPI rank, or a worker thread) pinned to
CPUs of its own, and the number of workers and threads chosen for the machine.

The CPUs are those this process may use (``os.sched_getaffinity``: the mask a cgroup, taskset
or Slurm gave it), never others. A worker pins itself, before it builds its model, so that
the C kernels' thread team, created with the model, inherits its mask: a worker with
``threads=T`` gets T CPUs of its own. Physical cores come first (one CPU of each), their SMT
siblings after, so that workers share no core while there are cores enough.

What a worker does with its place (``Placement.describe``) goes into the run's result: its
CPUs as the worker itself read them once pinned, and why it was pinned or not.

Under an MPI launcher, the ranks of a node share out that node's CPUs by their rank on the
node; a launcher that already bound each rank (``mpiexec -bind-to core``, ``srun
--cpu-bind=cores``: the ranks' masks differ) keeps its binding.

Left out on purpose: NUMA memory policy (first touch after pinning places a worker's own
buffers near it) and CPU lists of the user's (taskset, or the launcher's binding, do that).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

AUTO = "auto"


def can_pin() -> bool:
    """Whether this OS lets a thread choose its CPUs (Linux; not macOS)."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def allowed_cpus() -> set:
    """The CPUs the calling thread may run on: its affinity mask, or every CPU where the OS
    keeps none (macOS)."""
    return os.sched_getaffinity(0) if can_pin() else set(range(os.cpu_count() or 1))


def usable_cpus(allowed=None) -> list[int]:
    """The CPUs this process may run on (or those of `allowed`), one CPU of each physical
    core first (by core, in CPU order), then the other SMT threads of those cores."""
    allowed = sorted(allowed_cpus() if allowed is None else allowed)
    first, siblings, seen = [], [], set()
    for cpu in allowed:
        core = _core_of(cpu)
        (siblings if core in seen else first).append(cpu)
        seen.add(core)
    return first + siblings


def _core_of(cpu: int):
    """(package, core) of a CPU from sysfs, or the CPU itself where sysfs does not say."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(base + "physical_package_id") as f, open(base + "core_id") as g:
            return int(f.read()), int(g.read())
    except (OSError, ValueError):
        return cpu


def auto_split(workers, threads, cores: int) -> tuple[int, int]:
    """(workers, threads) with 'auto' replaced for `cores` usable CPUs: workers='auto' is one
    worker per core (cores // threads with threads given), threads='auto' is cores //
    workers, both at least 1; both 'auto' is one worker per core with one thread each
    (processes scale better than one worker's threads)."""
    if workers == AUTO:
        workers = max(1, cores // (1 if threads == AUTO else threads))
    if threads == AUTO:
        threads = max(1, cores // workers)
    return workers, threads


@dataclass(frozen=True)
class Placement:
    """Where each of `workers` workers runs: ``cpus[r]`` the CPUs worker r pins itself to,
    or None for all (not pinned; ``reason`` says why)."""

    cpus: tuple | None
    reason: str

    @property
    def pinned(self) -> bool:
        return self.cpus is not None

    def pin(self, rank: int) -> None:
        """Pins the calling thread (and the threads it creates later) to worker rank's CPUs;
        nothing when not pinned. Called by the worker itself, before it builds its model."""
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus[rank])

    def describe(self) -> dict:
        """What a worker reports of its place: pinned or not, why, and the CPUs it may run on
        as it reads them itself."""
        return {
            "pinned": self.pinned,
            "cpus": sorted(allowed_cpus()),
            "reason": self.reason,
        }


def plan(
    workers: int, threads: int, pin: bool | None, cpus: list[int], backend: str = "process"
) -> Placement:
    """The placement of `workers` workers of `threads` threads each on `cpus` (usable_cpus()
    order). pin: True pins (refusing, with a ValueError naming pin, more workers x threads
    than CPUs), False does not, None pins where it helps: several worker processes or MPI
    ranks that fill the CPUs, each with CPUs of its own; not thread workers, which ran slower
    pinned (bench/README.md, "Pinning"), nor a run that leaves CPUs free (another run beside
    it would be pinned onto the same CPUs)."""
    need, have = workers * threads, len(cpus)
    if pin is False:
        return Placement(None, "not pinned (pin=False)")
    if not can_pin():
        if pin:
            raise ValueError("pin=True: this OS cannot pin threads to CPUs (no sched_setaffinity)")
        return Placement(None, "not pinned: this OS cannot pin threads to CPUs")
    if need > have:
        what = (
            f"{workers} worker(s) x {threads} thread(s) = {need} CPUs, but this process may "
            f"use {have} (CPUs {_cpu_list(cpus)})"
        )
        if pin:
            raise ValueError(
                f"pin=True gives each worker's threads CPUs of their own: {what}; use fewer "
                f"workers or threads, or leave pinning out"
            )
        return Placement(None, f"not pinned: {what}")
    if pin is None and workers == 1:
        return Placement(None, "not pinned: one worker (pin=True pins it)")
    if pin is None and backend == "thread":
        return Placement(None, "not pinned: thread workers (pin=True pins them)")
    if pin is None and need < have:
        # a run pins from the first usable CPU on: two runs that share a machine would
        # share those CPUs and leave the others idle, where the OS spreads unpinned ones
        return Placement(
            None,
            f"not pinned: {need} of the {have} CPUs this process may use (another run could be "
            f"pinned onto the same ones; pin=True pins)",
        )
    chunks = tuple(tuple(sorted(cpus[r * threads : (r + 1) * threads])) for r in range(workers))
    return Placement(chunks, f"pinned: {threads} CPU(s) of its own per worker")


def _cpu_list(cpus) -> str:
    """'0-3,8' for CPUs 0, 1, 2, 3, 8."""
    runs = []  # [first, last] of each run of consecutive CPUs
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass(frozen=True)
class MPINode:
    """This rank's node, as its ranks see it: this rank's rank on it, its ranks, and the CPUs
    each may use (their affinity masks, by rank on the node)."""

    rank: int
    size: int
    masks: list

    @classmethod
    def of(cls, world) -> "MPINode":
        """The node of this rank of the mpi4py communicator world (collective on world)."""
        from mpi4py import MPI

        node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
        try:
            masks = node.allgather(sorted(allowed_cpus()))
            return cls(node.Get_rank(), node.Get_size(), masks)
        finally:
            node.Free()

    @property
    def bound(self) -> bool:
        """Whether the launcher bound the ranks itself: their masks differ."""
        return any(m != self.masks[0] for m in self.masks)

    @property
    def cpus(self) -> int:
        """How many CPUs the node's ranks may use between them."""
        return len(set().union(*self.masks))

    def plan(self, threads: int, pin: bool | None) -> Placement:
        """The Placement of the node's ranks, of `threads` threads each (see plan): the ranks
        share out the CPUs they all may use, or keep the launcher's binding."""
        if self.bound:
            return Placement(None, "not re-pinned: kept the binding the MPI launcher gave")
        return plan(self.size, threads, pin, usable_cpus(self.masks[self.rank]), "mpi")

    def threads(self) -> int:
        """threads='auto' on this node: the CPUs the launcher bound this rank to, or the
        node's CPUs divided among its ranks (at least 1)."""
        mine = len(self.masks[self.rank])
        return mine if self.bound else max(1, mine // self.size)


def cpu_count() -> int:
    """The number of CPUs this process may use (its affinity mask; os.cpu_count() counts the
    machine's)."""
    return len(allowed_cpus())


def summary(described: list) -> dict:
    """The run's placement from every worker's ``Placement.describe()`` (by rank): pinned
    (all of them), each rank's CPUs, and why (each distinct reason once)."""
    described = [d or {} for d in described]
    reasons = dict.fromkeys(d.get("reason") for d in described if d.get("reason"))
    return {
        "pinned": bool(described) and all(d.get("pinned") for d in described),
        "cpus": [d.get("cpus") for d in described],
        "reason": "; ".join(reasons) or None,
    }


def summary_line(placed: dict) -> str:
    """One line: how the workers were placed and each rank's CPUs."""
    cpus = " | ".join(_cpu_list(c) if c else "?" for c in placed["cpus"])
    return f"placement: {placed['reason']}; CPUs by rank: {cpus}"
