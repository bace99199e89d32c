"""The C kernels built into a plain C program (no Python) and run under AddressSanitizer,
LeakSanitizer and UndefinedBehaviorSanitizer, then again at -O3 with the SIMD clones, and
built for 64-bit ARM and run there under user-mode QEMU (the generic path, NEON on ARM)."""

import os
import shutil
from pathlib import Path

import pytest

C_TESTS = Path(__file__).resolve().parents[1] / "csrc" / "tests"

pytestmark = [
    pytest.mark.build,
    pytest.mark.skipif(
        not (C_TESTS / "Makefile").is_file(),
        reason=f"no C test sources at {C_TESTS} (installed package only)",
    ),
    pytest.mark.skipif(
        shutil.which("make") is None or shutil.which("cc") is None,
        reason="needs `make` and a C compiler (`cc`) on PATH",
    ),
]


def _make(target: str, *flags: str, timeout: float = 600):
    """The background job (conftest) that builds and runs one make target of the C tests."""

    # beside the suite, at nice 10 on 2 cores, a program can take several times its own
    # time: its watchdog (csrc/tests/test_watchdog.h; 120 s for test_core) waits about as
    # long as the job may run, rather than calling a starved run a hang (a CI run did)
    env = {**os.environ, "DP_TEST_WATCHDOG_S": str(int(timeout) - 60)}

    def make(workdir, run):
        return run(["make", "-s", "-j2", *flags, "-C", C_TESTS, target], timeout=timeout, env=env)

    make.__name__ = f"make_{target.replace('-', '_')}"
    return make


# -j2: the test programs build (and where the target allows, run) at once
MAKE_CHECK, MAKE_O3 = _make("check"), _make("check-O3")
MAKE_AARCH64 = _make("check-aarch64", "-O", timeout=900)  # -O: each program's output whole


@pytest.mark.parametrize(
    "target",
    [
        pytest.param("check", marks=pytest.mark.background.with_args(MAKE_CHECK)),
        pytest.param("check-O3", marks=pytest.mark.background.with_args(MAKE_O3)),
    ],
)
def test_c_kernels(target, background):
    r = background
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert " 0 failed" in out, out[-3000:]


ARM_TOOLS = ("aarch64-linux-gnu-gcc", "qemu-aarch64")


@pytest.mark.skipif(
    any(shutil.which(t) is None for t in ARM_TOOLS),
    reason="needs a 64-bit ARM cross compiler and user-mode QEMU on PATH "
    f"({', '.join(ARM_TOOLS)}: Debian's gcc-aarch64-linux-gnu and "
    "qemu-user; .ci/run installs them)",
)
@pytest.mark.background.with_args(MAKE_AARCH64)
def test_c_kernels_on_aarch64(background):
    # the wheels are built for aarch64 too (pyproject.toml's cibuildwheel archs): the C tests
    # compiled there with -Werror, and run
    r = background
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "GEMM generic (NEON)" in out, out[-3000:]
    assert out.count(" passed, 0 failed") == 2, out[-3000:]
