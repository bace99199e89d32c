"""The C kernels built into a plain C program (no Python) and run under AddressSanitizer,
LeakSanitizer and UndefinedBehaviorSanitizer, then again at -O3 with the SIMD clones, and
built for 64-bit ARM and run there under user-mode QEMU (the generic path, NEON on ARM)."""
import shutil
import subprocess
from pathlib import Path

import pytest

C_TESTS = Path(__file__).resolve().parents[1] / "csrc" / "tests"

pytestmark = [
    pytest.mark.skipif(not (C_TESTS / "Makefile").is_file(),
                       reason=f"no C test sources at {C_TESTS} (installed package only)"),
    pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None,
                       reason="needs `make` and a C compiler (`cc`) on PATH"),
]


@pytest.mark.parametrize("target", ["check", "check-O3"])
def test_c_kernels(target):
    # -j2: the two test programs build at once (each compiles every kernel)
    r = subprocess.run(["make", "-s", "-j2", "-C", str(C_TESTS), target], capture_output=True,
                       text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert " 0 failed" in out, out[-3000:]


ARM_TOOLS = ("aarch64-linux-gnu-gcc", "qemu-aarch64")


@pytest.mark.skipif(any(shutil.which(t) is None for t in ARM_TOOLS),
                    reason="needs a 64-bit ARM cross compiler and user-mode QEMU on PATH "
                           f"({', '.join(ARM_TOOLS)}: Debian's gcc-aarch64-linux-gnu and "
                           "qemu-user; .ci/run installs them)")
def test_c_kernels_on_aarch64():
    # the wheels are built for aarch64 too (pyproject.toml's cibuildwheel archs): the C tests
    # compiled there with -Werror, and run
    r = subprocess.run(["make", "-s", "-j2", "-O", "-C", str(C_TESTS), "check-aarch64"],
                       capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "GEMM generic (NEON)" in out, out[-3000:]
    assert out.count(" passed, 0 failed") == 2, out[-3000:]
