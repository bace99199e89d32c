"""The house style, held: the Python is formatted by ruff and passes its lint (the settings in
pyproject.toml), the C by clang-format (.clang-format). The tools' versions are pinned in the
test extra, since their output changes between releases; where one is missing, its test says
which and how to get it. To apply: `ruff format . && ruff check --fix .` and
`clang-format -i csrc/*.[ch] csrc/tests/*.c`."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
C_FILES = sorted([*ROOT.glob("csrc/*.c"), *ROOT.glob("csrc/*.h"), *ROOT.glob("csrc/tests/*.c")])

pytestmark = pytest.mark.skipif(
    not (ROOT / "pyproject.toml").is_file(),
    reason=f"no source tree at {ROOT} (installed package only)",
)


def _ruff(*args):
    pytest.importorskip("ruff", reason="needs ruff (pip install -e '.[test]')")
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_python_is_formatted():
    r = _ruff("format", "--check", "--diff", ".")
    assert r.returncode == 0, (
        f"ruff format would change these (run `ruff format .`):\n"
        f"{r.stdout[-4000:]}{r.stderr[-2000:]}"
    )


def test_python_passes_the_lint():
    r = _ruff("check", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_c_is_formatted():
    tool = shutil.which("clang-format")
    if tool is None:
        pytest.skip("needs clang-format (pip install -e '.[test]' installs the pinned one)")
    assert C_FILES, f"no C sources under {ROOT / 'csrc'}"
    r = subprocess.run(
        [tool, "--dry-run", "--Werror", *map(str, C_FILES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, (
        "clang-format would change these (clang-format -i "
        "csrc/*.[ch] csrc/tests/*.c):\n" + r.stderr[-4000:]
    )
