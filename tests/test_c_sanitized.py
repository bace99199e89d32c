"""The C kernels built into a plain C program (no Python) and run under AddressSanitizer,
LeakSanitizer and UndefinedBehaviorSanitizer, then again at -O3 with the SIMD clones."""
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
