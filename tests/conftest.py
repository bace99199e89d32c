"""Shared test helpers (pytest fixtures, available to every test module)."""

import glob
import os
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import pytest

# tests/_core_helpers.py, _runs.py and _jobs.py, which the test files import (with
# --import-mode=importlib pytest puts no test folder on sys.path itself)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _jobs import RUNNING, build_sdist, run_background  # noqa: E402
from _runs import SMALL, SMALL_FLAGS  # noqa: E402

JOIN_TIMEOUT_S = 60  # a deadlocked thread fails the test instead of hanging the run


def releases_gil(call, max_calls=200):
    """True if the main thread ran Python code while a worker thread was inside call().

    With a huge switch interval the worker is never preempted while it runs Python code, so
    the shared counter can only move between its reads `before` and `after` if call() itself
    released the GIL. The main thread counts in bursts and then blocks briefly (releasing the
    GIL) so that the worker can come back from its call. Nothing depends on timing: a loaded
    machine only makes it take more calls.
    """
    counter = [0]
    seen = []
    errors = []
    done = threading.Event()

    def worker():
        try:
            for _ in range(max_calls):
                before = counter[0]
                call()
                if counter[0] != before:
                    seen.append(counter[0] - before)
                    return
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        t = threading.Thread(target=worker, daemon=True)
        t.start()
        while not done.is_set():
            for _ in range(1000):
                counter[0] += 1
            done.wait(0.001)
    finally:
        sys.setswitchinterval(old)
    t.join(JOIN_TIMEOUT_S)
    if errors:
        raise errors[0]
    return bool(seen)


try:
    from dptrain import _core

    HAVE_ISAS = _core.build_info()["isas_available"]  # the kernel ISAs this CPU has
except ImportError:  # an unbuilt checkout: the tests that import _core say so
    HAVE_ISAS = ["generic"]
# DPTRAIN_TEST_ISAS=widest: the kernel tests on the widest ISA only (.ci/run's second pass,
# whose subject is the NumPy version, not the ISA builds the first pass tested)
ISA_PARAMS = HAVE_ISAS[-1:] if os.environ.get("DPTRAIN_TEST_ISAS") == "widest" else HAVE_ISAS


@pytest.fixture(params=ISA_PARAMS)
def isa(request):
    """Runs a test on each kernel ISA this CPU has (the GEMM and the vector kernels:
    csrc/dp_vec.h), forced with _core.set_isa; the previous ISA is restored after. The ISAs
    the CPU lacks are not parametrized: tests/test_isa.py skips once for each, naming it."""
    from dptrain import _core as core

    previous = core.set_isa(request.param)
    try:
        assert core.isa() == request.param
        yield request.param
    finally:
        core.set_isa(previous)


@pytest.fixture
def gil_probe():
    """releases_gil(call, max_calls=200) -> bool: the GIL-release probe above."""
    return releases_gil


REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def sdist(tmp_path_factory):
    """Path of an sdist of this checkout, built once per session as a release would build it:
    ``python -m build --sdist`` (isolated build environment)."""
    pytest.importorskip(
        "build",
        reason="building an sdist needs the build package (pip install build, or the test extra)",
    )
    if not (REPO_ROOT / "setup.py").is_file():
        pytest.skip(f"{REPO_ROOT} is not a dptrain checkout (no setup.py)")
    out = tmp_path_factory.mktemp("sdist")
    proc = build_sdist(out, partial(subprocess.run, capture_output=True, text=True))
    assert proc.returncode == 0, f"python -m build --sdist failed:\n{proc.stdout}\n{proc.stderr}"
    (path,) = out.glob("dptrain-*.tar.gz")
    return path


@pytest.fixture
def mpich_leftovers():
    """Removes what a test's aborted MPICH job left behind: after MPI_Abort, MPICH leaves its
    own /dev/shm/mpich_shm_* files (its shared windows and buffers; see the README) and its
    launcher, Hydra, its hwloc topology file, $TMPDIR/hydra_hwloc_xmlfile_* (a normal run
    removes both). Only files that appeared during the test are removed; a concurrent MPICH
    job's would be too, so such tests do not run beside other MPI jobs."""
    patterns = (
        "/dev/shm/mpich_shm_*",
        os.path.join(tempfile.gettempdir(), "hydra_hwloc_xmlfile_*"),
    )
    before = {p for pattern in patterns for p in glob.glob(pattern)}
    yield
    for path in {p for pattern in patterns for p in glob.glob(pattern)} - before:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------- MPI (the `mpi` marker)
NO_MPI = "mpi4py or mpiexec not installed (pip install 'dptrain[mpi]')"


def pytest_runtest_setup(item):
    """A test marked `mpi` starts ranks with mpiexec: it skips, saying why, where mpi4py or
    mpiexec is missing (pip install 'dptrain[mpi]')."""
    if item.get_closest_marker("mpi") is not None and _mpiexec() is None:
        pytest.skip(NO_MPI)


def _mpiexec():
    from dptrain.comm.mpi import find_mpiexec

    return find_mpiexec()


@pytest.fixture(scope="session")
def mpiexec():
    """The path of mpiexec (tests marked `mpi` skip without it)."""
    path = _mpiexec()
    if path is None:
        pytest.skip(NO_MPI)
    return path


# ---------------------------------------------------------------- the engine's small run
# tests/_runs.py's SMALL: what the transport, exchange, job and checkpoint tests train and
# compare.


@pytest.fixture(scope="session")
def train_small():
    """train_small(**options): dptrain.train of SMALL with these options changed."""
    import dptrain

    def run(**options):
        return dptrain.train(**{**SMALL, **options})

    return run


@pytest.fixture(scope="session")
def sequential(train_small):
    """SMALL on one worker: what N workers must equal."""
    return train_small()


@pytest.fixture(scope="session")
def deterministic_one(train_small):
    """SMALL on one worker in deterministic mode: what any world size must equal, bit for bit."""
    return train_small(deterministic=True)


@pytest.fixture
def mpi_weights(mpiexec, tmp_path):
    """mpi_weights(ranks, *flags): SMALL trained under mpiexec -n ranks (plus CLI flags); the
    saved weights."""

    def run(ranks, *extra):
        import dptrain

        weights = tmp_path / "w.npz"
        r = subprocess.run(
            [
                mpiexec,
                "-n",
                str(ranks),
                sys.executable,
                "-m",
                "dptrain",
                "train",
                *SMALL_FLAGS,
                "--backend",
                "mpi",
                "--save-weights",
                str(weights),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return dptrain.load_model(weights).params

    return run


# ---------------------------------------------------------------- background jobs
# A test whose work is long and self-contained (building the extension or the C tests with
# sanitizers and running them, installing an sdist into a fresh venv) carries
# @pytest.mark.background.with_args(job): job(workdir, run) is a function of its module that
# does that work, running its commands with run (tests/_jobs.run_background), and returns what the
# test asserts on. Every selected test's job starts as soon as the
# session's tests are collected, in a thread of this process (two at a time, their
# subprocesses niced and in sessions of their own, so that a test signalling its process
# group does not reach them), while the rest of the suite runs on the other core; the tests
# that own jobs run last, and the `background` fixture waits for the job's result (raising
# what the job raised). Nothing is skipped or shortened: the same work runs, overlapped.
_JOBS: dict = {}  # job function -> its Future
_POOL: list = []  # the jobs' thread pool and their directory, once started


def pytest_collection_modifyitems(config, items):
    # the tests that wait for a background job go last, so the job has had the whole run
    items.sort(key=lambda item: item.get_closest_marker("background") is not None)


def pytest_collection_finish(session):
    import concurrent.futures

    if session.config.option.collectonly:
        return
    jobs = []
    for item in session.items:
        mark = item.get_closest_marker("background")
        if mark is not None and mark.args[0] not in jobs and not _skipped(item):
            jobs.append(mark.args[0])
    if not jobs:
        return
    root = Path(tempfile.mkdtemp(prefix="dptrain-tests-background-"))
    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="tests-background")
    _POOL[:] = [pool, root]
    for i, job in enumerate(jobs):
        workdir = root / f"{i}-{job.__name__.strip('_')}"
        workdir.mkdir()
        _JOBS[job] = pool.submit(_timed, job, workdir)


_TIMES: dict = {}  # job function -> (seconds it ran, seconds its test waited for it)


def _timed(job, workdir):
    t0 = time.monotonic()
    try:
        return job(workdir, run_background)
    finally:
        _TIMES[job] = [time.monotonic() - t0, 0.0]


def pytest_terminal_summary(terminalreporter):
    """How long each background job ran, and how long its test waited for it at the end."""
    for job, (ran, waited) in _TIMES.items():
        terminalreporter.write_line(
            f"background job {job.__name__.strip('_')}: ran {ran:.0f} s, "
            f"its test waited {waited:.0f} s for it"
        )


def _skipped(item) -> bool:
    """Whether the item skips whatever happens (a skip mark, or a skipif whose condition is
    already True): its job is not started."""
    return any(
        m.name == "skip" or (m.name == "skipif" and m.args and m.args[0] is True)
        for m in item.iter_markers()
    )


def pytest_sessionfinish(session):
    """Jobs not started are dropped, running ones stopped (the session may end early: -x,
    Ctrl-C), and their directory removed."""
    if _POOL:
        import shutil
        import signal

        pool, root = _POOL
        for future in _JOBS.values():
            future.cancel()
        for proc in list(RUNNING):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pool.shutdown(wait=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def background(request, tmp_path):
    """The result of this test's background job (see above), waiting for it; run here when
    it was not started (the test selected some other way)."""
    job = request.node.get_closest_marker("background").args[0]
    future = _JOBS.get(job)
    if future is None:
        return job(tmp_path, run_background)
    t0 = time.monotonic()
    try:
        return future.result()
    finally:
        if job in _TIMES:
            _TIMES[job][1] += time.monotonic() - t0
