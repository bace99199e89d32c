"""Workers sharing memory (dptrain.comm.shm): how the launcher's arrays reach worker
processes (inherited, copied once, or mapped again from their file), and what a worker
reports home while it runs."""

import operator
import os
import time

import numpy as np
import pytest

from dptrain import launch


def _extras_as_seen(comm):
    """A forked worker's view of the launcher's extras: where x lies, its sum, which extras
    the segment holds."""
    x = comm.extra("x")
    return x.ctypes.data, float(x.sum()), sorted(comm.layout.extras)


def test_process_workers_get_the_extras_inherited_or_copied():
    """Under fork a worker reads the launcher's own array, inherited at its address (no copy
    in the segment); under spawn a copy in the segment. Either way the same values. (The
    spawned workers' targets are picklable callables from the standard library: a function
    of this module would have to be imported there, and tests/ is not a package.)"""
    import operator

    from dptrain.comm.shm import run_processes

    x = np.arange(3000, dtype=np.float64).reshape(100, 30)
    for address, total, in_segment in run_processes(
        2, _extras_as_seen, extras={"x": x}, start_method="fork"
    ):
        assert address == x.ctypes.data and total == float(x.sum()) and in_segment == []
    for seen in run_processes(
        2, operator.methodcaller("extra", "x"), extras={"x": x}, start_method="spawn"
    ):
        np.testing.assert_array_equal(seen, x)
    for layout in run_processes(
        2, operator.attrgetter("layout.extras"), extras={"x": x}, start_method="spawn"
    ):
        assert sorted(layout) == ["x"]


def _report_then_wait_for_the_launcher(comm, flag):
    """Rank 0 reports, then waits (30 s at most) until the launcher's callback has run."""
    if comm.rank != 0:
        return None
    comm.report({"epoch": 1, "rank": comm.rank})
    deadline = time.monotonic() + 30
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            return "the launcher did not get the report while the worker ran"
        time.sleep(0.005)
    return "seen"


@pytest.mark.parametrize("backend, workers", [("process", 2), ("thread", 2), ("thread", 1)])
def test_a_report_reaches_the_launcher_while_the_worker_runs(tmp_path, backend, workers):
    flag, got = tmp_path / "reported", []

    def received(record):
        got.append(record)
        flag.touch()

    results = launch(
        _report_then_wait_for_the_launcher,
        str(flag),
        workers=workers,
        backend=backend,
        start_method="fork",
        report=received,
    )
    assert results[0] == "seen" and got == [{"epoch": 1, "rank": 0}]


def _what_the_worker_reads(comm):
    x = comm.extra("x")
    return type(x).__name__, getattr(x, "filename", None), float(x.sum()), comm.extra("y", 7)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_memory_mapped_extra_is_mapped_again_not_copied(tmp_path, start_method):
    """A view of a .npy opened with mmap_mode reaches each worker as a memory map of the same
    file (nothing copied into the segment), whatever the start method. (The spawned workers'
    targets are picklable callables from the standard library.)"""
    path = tmp_path / "x.npy"
    np.save(path, np.arange(1000, dtype=np.float32).reshape(100, 10))
    x = np.load(path, mmap_mode="r")[10:60]  # a view of the file, at an offset
    options = dict(workers=2, backend="process", start_method=start_method, extras={"x": x})
    if start_method == "fork":
        for seen in launch(_what_the_worker_reads, **options):
            assert seen == ("memmap", str(path), float(x.sum()), 7)
        return
    for seen in launch(operator.methodcaller("extra", "x"), **options):
        np.testing.assert_array_equal(seen, x)
    for in_segment in launch(operator.attrgetter("layout.extras"), **options):
        assert in_segment == {}


def test_an_extra_that_was_not_given_is_named():
    def reads(comm):
        with pytest.raises(
            KeyError,
            match="no extra array named 'y' was given to launch "
            r"\(extras: x\)",
        ):
            comm.extra("y")
        return comm.extra("y", None)

    for backend, workers in (("thread", 1), ("thread", 2), ("process", 2)):
        assert (
            launch(
                reads,
                workers=workers,
                backend=backend,
                start_method="fork",
                extras={"x": np.ones(3)},
            )
            == [None] * workers
        )
