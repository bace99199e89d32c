"""The notebooks' install cell, run as Colab runs it: in a fresh Python where dptrain is
missing. Pointed at an sdist it installs dptrain; with no source and an index without
dptrain it stops with a short message naming DPTRAIN_SOURCE, not a traceback."""

import json
import os
import re
import subprocess
import venv
from pathlib import Path

import pytest
from _jobs import build_sdist

pytestmark = pytest.mark.build

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
ASSIGNMENT = re.compile(r'^DPTRAIN_SOURCE = ""$', re.MULTILINE)


def install_cell() -> str:
    """The first code cell, the same in every notebook."""
    cells = []
    for path in NOTEBOOKS:
        book = json.loads(path.read_text())
        first = next(c for c in book["cells"] if c["cell_type"] == "code")
        cells.append("".join(first["source"]))
    assert cells and all(c == cells[0] for c in cells), "the notebooks' install cells differ"
    cell = cells[0]
    assert len(ASSIGNMENT.findall(cell)) == 1, 'no line DPTRAIN_SOURCE = "" in the cell'
    magic = [line for line in cell.splitlines() if line.lstrip().startswith(("%", "!"))]
    assert not magic, f"the install cell must be plain Python, has {magic}"
    return cell


def cell_script(tmp_path: Path, source: str) -> Path:
    """The install cell as a script, DPTRAIN_SOURCE set as a user would set it."""
    script = tmp_path / "install_cell.py"
    script.write_text(ASSIGNMENT.sub(lambda _: f"DPTRAIN_SOURCE = {source!r}", install_cell()))
    return script


def fresh_venv(path: Path) -> Path:
    """A new virtual environment with pip and nothing else (no system site-packages)."""
    # symlinks, as `python -m venv` makes them on POSIX: a copied interpreter is written by
    # this process, and a subprocess forked meanwhile by another thread (the other background
    # job) holds the copy's descriptor open until it execs, so that running the copy failed
    # with ETXTBSY ("Text file busy", once in CI)
    builder = venv.EnvBuilder(with_pip=True, system_site_packages=False, symlinks=os.name != "nt")
    builder.create(path)
    return path / "bin" / "python"


def clean_env(**extra) -> dict:
    """This process's environment without what would let the fresh Python see another dptrain."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    }
    return {**env, **extra}


def _install_from_an_sdist(workdir, run) -> dict:
    """The background job (conftest): an sdist of this checkout, a fresh venv, then the
    install cell pointed at the sdist, run as Colab runs it; each step's CompletedProcess."""
    steps = {"sdist_build": build_sdist(workdir / "sdist", run)}
    if steps["sdist_build"].returncode != 0:
        return steps
    (sdist,) = (workdir / "sdist").glob("dptrain-*.tar.gz")
    python = fresh_venv(workdir / "venv")
    outside = workdir / "elsewhere"
    outside.mkdir()
    env = clean_env()
    steps.update(sdist=sdist, venv=workdir / "venv")
    steps["absent"] = run([python, "-c", "import dptrain"], cwd=outside, env=env)
    steps["install"] = run(
        [python, cell_script(workdir, str(sdist))], cwd=outside, env=env, timeout=900
    )
    steps["check"] = run(
        [
            python,
            "-c",
            "import dptrain, matplotlib; print(dptrain.__version__); print(dptrain.__file__)",
        ],
        cwd=outside,
        env=env,
    )
    steps["flag"] = run([python, "-m", "dptrain", "--version"], cwd=outside, env=env)
    # importable now: the cell installs nothing, so even a wrong source is never read
    steps["again"] = run(
        [python, cell_script(workdir, str(workdir / "missing.tar.gz"))], cwd=outside, env=env
    )
    return steps


@pytest.mark.background.with_args(_install_from_an_sdist)
def test_install_cell_installs_dptrain_from_an_sdist(background):
    pytest.importorskip(
        "build",
        reason="building an sdist needs the build package (pip install build, or the test extra)",
    )
    steps = background
    build = steps["sdist_build"]
    assert build.returncode == 0, f"python -m build --sdist failed:\n{build.stdout}\n{build.stderr}"
    absent = steps["absent"]
    assert absent.returncode != 0, "dptrain is importable in the fresh venv before installing"

    proc = steps["install"]
    assert proc.returncode == 0, f"install cell failed:\n{proc.stdout}\n{proc.stderr}"

    check = steps["check"]
    assert check.returncode == 0, check.stderr
    version, where = check.stdout.split()
    assert f"dptrain-{version}.tar.gz" == steps["sdist"].name
    assert Path(where).is_relative_to(steps["venv"]), where
    flag = steps["flag"]
    assert flag.stdout.strip() == f"dptrain {version}", flag.stderr

    again = steps["again"]
    assert again.returncode == 0, again.stderr
    assert "nothing installed" in again.stdout


@pytest.fixture(scope="module")
def python_without_dptrain(tmp_path_factory):
    return fresh_venv(tmp_path_factory.mktemp("venv"))


def offline_index_env(tmp_path: Path) -> dict:
    """pip reads no config file and sees one index: an empty local folder (no dptrain)."""
    index = tmp_path / "empty-index"
    index.mkdir()
    env = {k: v for k, v in clean_env().items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": index.as_uri()}


def test_install_cell_without_a_source_stops_with_what_to_set(python_without_dptrain, tmp_path):
    proc = subprocess.run(
        [python_without_dptrain, cell_script(tmp_path, "")],
        cwd=tmp_path,
        env=offline_index_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out, out
    assert "installing dptrain failed" in proc.stderr and "DPTRAIN_SOURCE" in proc.stderr, out
    assert "No matching distribution found for dptrain" in proc.stderr, "pip's own tail is missing"


def test_install_cell_with_a_missing_file_says_so(python_without_dptrain, tmp_path):
    missing = tmp_path / "dptrain-0.2.0.tar.gz"
    proc = subprocess.run(
        [python_without_dptrain, cell_script(tmp_path, str(missing))],
        cwd=tmp_path,
        env=offline_index_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (
        f"DPTRAIN_SOURCE is {str(missing)!r}, which is neither a URL nor an existing file"
        in proc.stderr
    ), proc.stderr
