"""Failure paths give back what a run holds: after many failing and interrupted fits on the
thread and the process transport, this process holds as many file descriptors and shared
segments (memfd mappings) as before."""

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import dptrain
from dptrain.comm import WorkerError
from dptrain.engine import loop
from dptrain.engine.hooks import Hooks

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd and /proc/self/maps (Linux)"
)

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


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize(
    "options, error",
    [
        (dict(fault=(1, 1, "raise")), "injected fault on rank 1"),
        (dict(lr=1e30), "training diverged"),
        # rank 1 still computing when the run is given up on, 1 s after the failure (a
        # thread cannot be stopped: it lets go of the segment as it ends)
        (dict(straggle=(1, 1500), timeout=0.05), "rank 1 did not arrive"),
    ],
    ids=["fault", "diverged", "late"],
)
def test_failing_fits_release_descriptors_and_segments(backend, options, error):
    _fit(backend)  # warm: what the first run loads for good (the extension, its threads)
    before = _held()
    for _ in range(FITS if "straggle" not in options else 3):
        with pytest.raises(WorkerError, match=error):
            _fit(backend, **options)
    assert _held() == before


@pytest.mark.signals  # SIGINT to this process
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_interrupted_fits_release_descriptors_and_segments(backend, monkeypatch):
    _fit(backend)
    launcher = os.getpid()
    monkeypatch.setattr(loop, "hooks_for", lambda config, rank: _Interrupt(rank, launcher))
    before = _held()
    for _ in range(FITS):
        with pytest.raises(KeyboardInterrupt):
            _fit(backend)
    assert _held() == before
