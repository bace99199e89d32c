"""What a release ships: the sdist holds everything the build needs, one version string is
seen everywhere, the cibuildwheel test command works, and a source tree imported without its
built extension says what to run."""

import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import dptrain

pytestmark = pytest.mark.build  # builds an sdist and a source tree of its own

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = Path(dptrain.__file__).resolve().parent


def sdist_version(path: Path) -> str:
    m = re.fullmatch(r"dptrain-(.+)\.tar\.gz", path.name)
    assert m, f"sdist name {path.name} is not dptrain-VERSION.tar.gz"
    return m.group(1)


def test_sdist_holds_every_source_the_build_needs(sdist):
    top = f"dptrain-{sdist_version(sdist)}/"
    with tarfile.open(sdist) as tar:
        names = {n[len(top) :] for n in tar.getnames() if n.startswith(top)}
    needed = {
        "pyproject.toml",
        "setup.cfg",
        "setup.py",
        "README.md",
        "LICENSE",
        "dptrain/_version.py",
    }
    needed |= {f"csrc/{p.name}" for p in (REPO_ROOT / "csrc").glob("*.[ch]")}
    needed |= {
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / "dptrain").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert any(n.endswith(".c") for n in needed) and any(n.endswith(".h") for n in needed)
    assert not needed - names, f"{sdist.name} lacks {sorted(needed - names)}"
    built = [n for n in names if n.endswith((".so", ".pyd", ".o"))]
    assert not built, f"{sdist.name} carries build outputs {built}"


def test_every_subpackage_is_a_regular_package():
    """setup.cfg's `packages = find:` ships only directories with an __init__.py: one
    without (a namespace package, which imports fine from the checkout) would be missing from
    every installed copy."""
    for d in sorted(
        p.parent for p in (REPO_ROOT / "dptrain").rglob("*.py") if "__pycache__" not in p.parts
    ):
        assert (d / "__init__.py").is_file(), f"{d.relative_to(REPO_ROOT)} has no __init__.py"


def test_one_version_string(sdist):
    assert dptrain.__version__ == sdist_version(sdist)
    top = f"dptrain-{sdist_version(sdist)}"
    with tarfile.open(sdist) as tar:
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    assert f"\nVersion: {dptrain.__version__}\n" in pkg_info


def test_version_flag_prints_the_version(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dptrain", "--version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"dptrain {dptrain.__version__}"


def test_cibuildwheel_config_and_its_test_command(tmp_path):
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        cibw = tomllib.load(f)["tool"]["cibuildwheel"]
    assert cibw["build"] == ["cp310-*", "cp311-*", "cp312-*", "cp313-*"]
    assert {"*-musllinux_*", "pp*", "*-win32", "*_i686"} <= set(cibw["skip"])
    assert cibw["linux"]["archs"] == ["x86_64", "aarch64"]
    assert cibw["macos"]["archs"] == ["x86_64", "arm64"]
    # the wheel's test command, run here against the dptrain under test
    env = dict(
        os.environ,
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    proc = subprocess.run(
        cibw["test-command"], shell=True, cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"{cibw['test-command']}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith(f"dptrain {dptrain.__version__} ")


def copy_source_tree(dest: Path) -> Path:
    """dest/dptrain holding the package's .py files and no built extension."""
    (dest / "dptrain").mkdir()
    for p in PACKAGE_DIR.glob("*.py"):
        shutil.copy(p, dest / "dptrain" / p.name)
    return dest / "dptrain"


def import_dptrain_in(cwd: Path) -> subprocess.CompletedProcess:
    # -S: no site-packages, so that only cwd's dptrain can be found (an editable install's
    # finder would otherwise lend it the checkout's built _core)
    return subprocess.run(
        [sys.executable, "-S", "-c", "import dptrain"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )


def test_source_tree_without_built_core_says_what_to_run(tmp_path):
    package = copy_source_tree(tmp_path)
    proc = import_dptrain_in(tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"ImportError: dptrain is being imported from the source tree "
        f"{package}, whose C extension dptrain._core is not built"
    ), last
    assert f"run `pip install -e .` in {tmp_path}" in last
    assert "circular import" not in last
    # Python's own error stays chained above it
    assert "cannot import name '_core'" in proc.stderr
    assert "The above exception was the direct cause" in proc.stderr


def test_built_but_broken_core_keeps_its_own_error(tmp_path):
    package = copy_source_tree(tmp_path)
    (package / f"_core{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"not a library")
    proc = import_dptrain_in(tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and "source tree" not in last, last
