"""Failure paths give back what a run holds: after many failing and interrupted fits on the
thread and the process transport, this process holds as many file descriptors and shared
segments (memfd mappings) as before."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import dptrain
from dptrain.comm import WorkerError
from dptrain.engine import loop
from dptrain.engine.hooks import Hooks

pytestmark = [
    pytest.mark.slow,  # 100+ fits in a subprocess of their own per test
    pytest.mark.skipif(
        not Path("/proc/self/fd").is_dir(),
        reason="counts /proc/self/fd and /proc/self/maps (Linux)",
    ),
]

FITS = 50
SEGMENT = "dptrain-shared"  # the memfd's name (comm.shm.SharedSegment)


def _held() -> tuple[int, int, int]:
    """(open descriptors, descriptors of a shared segment, mappings of one) of this process,
    once its worker threads have ended (a thread the launcher gave up on, still computing,
    lets go of the segment as it ends)."""
    for t in threading.enumerate():
        if t.name.startswith("dptrain-worker-"):
            t.join(60)
    fds = os.listdir("/proc/self/fd")
    segment_fds = 0
    for fd in fds:
        try:
            segment_fds += SEGMENT in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed since
            pass
    maps = Path("/proc/self/maps").read_text().count(SEGMENT)
    return len(fds), segment_fds, maps


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 2, 64)


class _Interrupt(Hooks):
    """Ctrl-C during a run: rank 1 sends SIGINT to the launching process at its first step
    (from a worker thread the signal reaches the main thread; from a worker process, its
    parent), then gives the launcher time to stop the run before it goes on. It first waits
    for the launcher to have started every worker: Python drops an exception that a signal
    handler raises inside an at-fork handler (the launcher forking the last worker)."""

    def __init__(self, rank: int, launcher: int):
        self.rank, self.launcher = rank, launcher

    def step_start(self, rank, step):
        if rank == 1 and step == 1:
            time.sleep(0.1)
            os.kill(self.launcher, signal.SIGINT)
            time.sleep(0.2)


def _fit(backend: str, **options):
    X, y = _data()
    model = dptrain.MLP([4, 8, 2])
    return dptrain.fit(
        model, X, y, epochs=2, batch_size=16, workers=2, backend=backend, quiet=True, **options
    )


# the failing runs: fit options, and what the failure says
FAILURES = {
    "fault": (dict(fault=(1, 1, "raise")), "injected fault on rank 1"),
    "diverged": (dict(lr=1e30), "training diverged"),
    # rank 1 still computing when the run is given up on, 1 s after the failure (a thread
    # cannot be stopped: it lets go of the segment as it ends)
    "late": (dict(straggle=(1, 1500), timeout=0.05), "rank 1 did not arrive"),
}


def count_around_failures(backend: str, case: str) -> str:
    """The check itself, in a process of its own (see _in_a_fresh_process): warm, count,
    fail FITS times (3 for a late rank; `interrupted`: Ctrl-C at rank 1's step 1), count
    again. Returns "" when the counts are the same, else what differs."""
    _fit(backend)  # warm: what the first run loads for good (the extension, its threads)
    if case == "interrupted":
        launcher = os.getpid()
        loop.hooks_for = lambda config, rank, **_: _Interrupt(rank, launcher)
        options, expected, message = {}, KeyboardInterrupt, ""
    else:
        (options, message), expected = FAILURES[case], WorkerError
    before = _held()
    for i in range(3 if case == "late" else FITS):
        try:
            _fit(backend, **options)
        except expected as exc:
            if message not in str(exc):
                return f"fit {i} failed otherwise: {exc}"
        else:
            return f"fit {i} did not fail"
    after = _held()
    return "" if after == before else f"(descriptors, segment fds, mappings) {before} -> {after}"


def _in_a_fresh_process(backend: str, case: str) -> None:
    """count_around_failures in a Python process of its own: the suite's process also runs
    its background jobs (tests/conftest.py), whose threads open and close descriptors of
    their own while these fits run."""
    proc = subprocess.run(
        [sys.executable, __file__, backend, case], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stdout + proc.stderr


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("case", list(FAILURES))
def test_failing_fits_release_descriptors_and_segments(backend, case):
    _in_a_fresh_process(backend, case)


@pytest.mark.signals  # SIGINT to the fits' process
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_interrupted_fits_release_descriptors_and_segments(backend):
    _in_a_fresh_process(backend, "interrupted")


if __name__ == "__main__":
    print(count_around_failures(*sys.argv[1:]) or "same")
