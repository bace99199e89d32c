"""What the background jobs of tests/conftest.py share (imported by name: conftest puts
tests/ on sys.path): running a command niced in a session of its own, and building the
extension into a package of its own, and building an sdist of the checkout."""

import fcntl
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNING: set = set()  # the background jobs' processes now running (conftest stops them)


def run_background(argv, *, timeout=None, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run for a background job: niced (the foreground tests keep their cores),
    in a session of its own (stopped with the session if it ends first), output captured as
    text; past timeout its process group is killed and TimeoutExpired raised."""
    proc = subprocess.Popen(
        ["nice", "-n", "10", *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    RUNNING.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        RUNNING.discard(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def build_package(lib: Path, build_temp: Path, run, env=None) -> subprocess.CompletedProcess:
    """The checkout's extension built by setup.py (with env's $CFLAGS, when given) into lib,
    and the rest of the dptrain package (its modules and data) copied around it: a package
    of its own to put first on PYTHONPATH. Returns the build's CompletedProcess."""
    build = run(
        [
            sys.executable,
            "setup.py",
            "-q",
            "build_ext",
            "--build-lib",
            lib,
            "--build-temp",
            build_temp,
        ],
        cwd=ROOT,
        env=env,
        timeout=900,
    )
    if build.returncode == 0:
        shutil.copytree(
            ROOT / "dptrain",
            lib / "dptrain",
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"),
        )
    return build


def build_sdist(outdir: Path, run) -> subprocess.CompletedProcess:
    """``python -m build --sdist`` of the checkout into outdir, as a release builds it (isolated
    build environment), by run (subprocess.run's signature, output captured). setuptools
    writes the release tree (dptrain-<version>/) and dptrain.egg-info/ inside the checkout, so
    two builds at once (the sdist fixture in one pytest process, the install-cell job in the
    other) delete each other's files: the build holds a lock on build/sdist.lock."""
    lock = ROOT / "build" / "sdist.lock"
    lock.parent.mkdir(exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return run(
            [sys.executable, "-m", "build", "--sdist", "--outdir", str(outdir), str(ROOT)],
            timeout=600,
        )
