"""The Python-level boundary tests run again against the extension built with
AddressSanitizer and UndefinedBehaviorSanitizer (libasan preloaded into this interpreter,
leak detection off: CPython itself is not instrumented), so that a use after free or a heap
overflow at the C boundary fails a test instead of passing by luck."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _jobs import build_package

ROOT = Path(__file__).resolve().parent.parent
# the boundary's tests (marked `boundary`): every entry point with bad, aliased and changed
# arguments (each family's table-driven checks, _core_helpers.family_tests, and its own), the
# binding layer's (test_boundary.py), the memory-safety regressions and the fuzzer's CI batch


def _runtime(name: str) -> str | None:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    path = subprocess.run(
        [cc, f"-print-file-name={name}"], capture_output=True, text=True
    ).stdout.strip()
    return path if os.path.isabs(path) and Path(path).is_file() else None


pytestmark = [
    pytest.mark.build,
    pytest.mark.skipif(
        not (ROOT / "setup.py").is_file() or not (ROOT / "csrc").is_dir(),
        reason=f"no C sources at {ROOT} (installed package only)",
    ),
    pytest.mark.skipif(
        sys.platform != "linux" or _runtime("libasan.so") is None,
        reason="needs Linux and a C compiler with libasan",
    ),
]


def _asan_build_and_run(workdir, run) -> dict:
    """The background job (conftest): a copy of the dptrain package whose _core is built with
    ASan + UBSan, then the boundary's tests run against it (libasan preloaded). Returns each
    step's CompletedProcess ('build', 'probe', 'tests') and the package's directory."""
    lib = workdir / "asan-lib"
    # -O1 -g1, as csrc/tests' sanitizer build (AddressSanitizer's usual level; line tables
    # only, all a report's file:line frames need, at 0.6x full -g's compile time): setup.py
    # leaves out its -O3 when $CFLAGS names a level
    flags = (
        "-O1 -g1 -fsanitize=address,undefined -fno-omit-frame-pointer "
        "-fno-sanitize-recover=undefined"
    )
    env = dict(os.environ, CFLAGS=flags, LDFLAGS="-fsanitize=address,undefined")
    # the package's modules and data (the studies' templates too) around the ASan build
    steps = {"lib": lib, "build": build_package(lib, workdir / "asan-tmp", run, env)}
    if steps["build"].returncode != 0:
        return steps
    preload = ":".join(p for p in (_runtime("libasan.so"), _runtime("libubsan.so")) if p)
    env = dict(
        os.environ,
        PYTHONPATH=str(lib),
        LD_PRELOAD=preload,
        ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=0",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
    )
    steps["probe"] = run(
        [sys.executable, "-c", "import dptrain; print(dptrain._core.__file__)"],
        cwd=lib,
        env=env,
        timeout=120,
    )
    # --capture=sys: a sanitizer writes its report to fd 2 and exits; captured at the fd level
    # the report would be lost with the process
    steps["tests"] = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--capture=sys",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            ROOT,
            "-c",
            ROOT / "pyproject.toml",
            "-m",
            "boundary",
            ROOT / "tests",
        ],
        cwd=lib,
        env=env,
        timeout=1800,
    )
    return steps


@pytest.mark.background.with_args(_asan_build_and_run)
def test_the_boundary_tests_pass_under_asan(background):
    build = background["build"]
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    probe = background["probe"]
    assert probe.returncode == 0, probe.stderr
    # the ASan build
    assert probe.stdout.strip().startswith(str(background["lib"])), probe.stdout
    r = background["tests"]
    out = r.stdout + r.stderr
    assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out, out[-8000:]
    assert r.returncode == 0, out[-8000:]
