"""Every documented snippet runs: each ```bash, ```sh and ```python block of README.md and
docs/*.md is one test (its id: FILE:LINE of the opening fence), run as a user would type it,
so that a stale module name, option or file fails here.

How a block runs:

- in a fresh temporary directory (nothing is left behind), where the repository's
  ``examples/`` and ``bench/`` are linked, so that relative paths work;
- a shell block by ``bash -e -o pipefail`` (it stops at the first failing command), a python
  block by ``python -c``; this interpreter's directory comes first on PATH (``python``,
  ``mpiexec``);
- with no network: every HTTP(S) request goes to a closed local port, so nothing is ever
  downloaded, and the data cache is the temporary directory's;
- with MNIST where the command line would find it ($DPTRAIN_DATA, the cache) or in the
  shared data beside the checkout (``../shared/data/mnist``): $DPTRAIN_DATA names it, and
  $MNIST_DIR is the directory of its files. Without it, the command line trains on its
  announced synthetic stand-in.

A block that calls ``mpiexec`` is skipped, saying so, where MPI (mpiexec and mpi4py) is not
installed. Everything else a block needs is said in the Markdown, in HTML comments on the
lines just above its opening fence (invisible on GitHub):

- ``<!-- snippet: skip: REASON -->``: not run; the test is reported skipped with REASON
  (it needs a cluster, installs packages, ...).
- ``<!-- snippet: setup: NAME -->``: the prelude NAME (``PRELUDES`` below) runs first, in the
  same directory, and for a python block in the same script: it makes what the block takes
  from the text around it (arrays X, y; files X.npy; a sweep in results/).
- ``<!-- snippet: run with "OLD" as "NEW", "OLD2" as "NEW2" -->``: run with each OLD replaced
  by NEW (a directory that exists here, a smaller size); each OLD must occur in the block.
- ``<!-- snippet: needs: mnist -->``: skipped, saying so, where MNIST is not found.
- ``<!-- snippet: slow -->``: marked ``slow`` (``pytest -m "not slow"`` leaves it out).
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _mnist import find_mnist, mnist_places

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"bash": "shell", "sh": "shell", "python": "python"}
LINKED = ("examples", "bench")  # repository folders the snippets name by relative path
TIMEOUT_S = 300

FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->\s*$")
SUBSTITUTION = re.compile(r'"([^"]+)"\s+as\s+"([^"]*)"')

# What a block takes from the text around it, made by a few lines of Python.
PRELUDES = {
    # MNIST-shaped arrays: X (512 rows of 784 features), integer labels y (10 classes),
    # X_test / y_test, X_new, real regression targets; also saved as X.npy, y.npy and
    # arrays.npz (x_train, y_train) for the command line.
    "arrays": """
        import numpy as np
        _rng = np.random.default_rng(0)
        X = _rng.random((512, 784), dtype=np.float32)
        y = X[:, :10].argmax(axis=1).astype(np.int64)
        X_test, y_test, X_new = X[:128], y[:128], X[:8]
        targets = X[:, :4].sum(axis=1)
        np.save("X.npy", X)
        np.save("y.npy", y)
        np.savez("arrays.npz", x_train=X, y_train=y)
        """,
    # One batch for a step by hand: x (64 rows of 784 float32 features), integer labels y.
    "batch": """
        import numpy as np
        _rng = np.random.default_rng(0)
        x = _rng.random((64, 784), dtype=np.float32)
        y = _rng.integers(0, 10, 64)
        """,
    # A sweep in results/, as `python -m dptrain sweep ... --out results/` writes it: an MLP
    # on synthetic data, 3 sizes x 1, 2, 4 thread workers, enough for the model to fit.
    "sweep": """
        from dptrain.measure.sweep import sweep as _sweep
        _sweep("mlp", "synthetic", sizes=(512, 1024, 2048), workers=(1, 2, 4),
               backend="thread", repeat=1, ceiling=False, out="results", quiet=True)
        """,
}


class Snippet:
    """One fenced block: where it is, its language, its code and its markers."""

    def __init__(self, path: Path, line: int, language: str, code: str, markers: list):
        self.path, self.line, self.language, self.code = path, line, language, code
        self.skip = self.setup = None
        self.needs, self.slow, self.substitutions = [], False, []
        for text in markers:
            key, _, value = text.partition(":")
            key, value = key.strip(), value.strip()
            if key == "skip" and value:
                self.skip = value
            elif key == "setup" and value in PRELUDES:
                self.setup = value
            elif key == "needs" and value == "mnist":
                self.needs.append(value)
            elif key == "slow" and not value:
                self.slow = True
            elif text.startswith("run with ") and SUBSTITUTION.search(text):
                self.substitutions += SUBSTITUTION.findall(text)
            else:
                raise ValueError(
                    f"{self.where}: unknown snippet marker <!-- snippet: {text} -->"
                    f" (see tests/test_docs.py)"
                )

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def text(self) -> str:
        """The code as it runs here: every substitution made (each must apply)."""
        code = self.code
        for old, new in self.substitutions:
            assert old in code, f"{self.where}: 'run with \"{old}\"' but the block has no {old!r}"
            code = code.replace(old, new)
        return code


def snippets(path: Path) -> list:
    """The runnable blocks of one Markdown file, with the markers above each."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, language = i, m.group(1)
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if language in LANGUAGES:
            markers, j = [], start - 1
            while j >= 0 and (not lines[j].strip() or MARKER.match(lines[j])):
                if lines[j].strip():
                    markers.insert(0, MARKER.match(lines[j]).group(1))
                j -= 1
            found.append(
                Snippet(path, start + 1, language, "\n".join(lines[start + 1 : i]) + "\n", markers)
            )
        i += 1
    return found


def _params():
    out = []
    for path in DOCS:
        for s in snippets(path):
            marks = [pytest.mark.slow] if s.slow else []
            out.append(pytest.param(s, id=s.where, marks=marks))
    return out


def _snippet_path() -> str:
    """PATH for the snippets: this interpreter's directory first (its python, its mpiexec)."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _environment(tmp: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = _snippet_path()
    closed = "http://127.0.0.1:9"  # no network: nothing is downloaded
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = closed
    for name in ("no_proxy", "NO_PROXY"):
        env.pop(name, None)
    env["XDG_CACHE_HOME"] = str(tmp / ".cache")
    env.pop("DPTRAIN_DATA", None)
    mnist = find_mnist()
    if mnist is not None:
        env["DPTRAIN_DATA"] = str(mnist)
        env["MNIST_DIR"] = str(mnist)
    env["MPLBACKEND"] = "Agg"
    return env


def _has_mpi() -> bool:
    """mpiexec on the snippets' PATH, and mpi4py (found, not imported: no MPI start-up here)."""
    return (
        importlib.util.find_spec("mpi4py") is not None
        and shutil.which("mpiexec", path=_snippet_path()) is not None
    )


def _run(args, tmp: Path, env: dict, what: str):
    r = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, (
        f"{what} failed (exit {r.returncode})\n--- stdout\n"
        f"{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    )
    return r


@pytest.mark.parametrize("snippet", _params())
def test_documented_snippet_runs(snippet, tmp_path):
    if snippet.skip:
        pytest.skip(f"{snippet.where}: {snippet.skip}")
    if "mnist" in snippet.needs and find_mnist() is None:
        pytest.skip(
            f"{snippet.where}: needs MNIST, not found in "
            f"{', '.join(map(str, mnist_places()))}; nothing is downloaded here"
        )
    code = snippet.text()
    if re.search(r"\bmpiexec\b", code) and not _has_mpi():
        pytest.skip(f"{snippet.where}: needs MPI (mpiexec and mpi4py: pip install -e '.[mpi]')")
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    env = _environment(tmp_path)
    prelude = textwrap.dedent(PRELUDES[snippet.setup]) if snippet.setup else ""
    if snippet.language == "python":
        _run(
            [sys.executable, "-c", prelude + code],
            tmp_path,
            env,
            f"{snippet.where} (python)\n{code}",
        )
    else:
        if prelude:
            _run(
                [sys.executable, "-c", prelude],
                tmp_path,
                env,
                f"{snippet.where}: the prelude {snippet.setup!r}",
            )
        _run(
            ["bash", "-e", "-o", "pipefail", "-c", code],
            tmp_path,
            env,
            f"{snippet.where} (shell)\n{code}",
        )


def test_every_marker_stands_above_a_block():
    """A snippet marker that no block follows (the block moved, or changed language) is an
    error, not a silent no-op."""
    for path in DOCS:
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            if not MARKER.match(line):
                continue
            j = n + 1
            while j < len(lines) and (not lines[j].strip() or MARKER.match(lines[j])):
                j += 1
            m = FENCE.match(lines[j]) if j < len(lines) else None
            where = f"{path.relative_to(ROOT)}:{n + 1}"
            assert m and m.group(1) in LANGUAGES, (
                f"{where}: the marker {line.strip()} stands above no ```bash/```sh/```python block"
            )


def test_the_docs_have_snippets_and_markers_parse():
    """Collection found the documents' blocks, and every marker is one this file knows."""
    found = [s for path in DOCS for s in snippets(path)]
    assert len(found) >= 10, [s.where for s in found]
    assert {s.path.name for s in found} >= {"README.md", "perfmodel.md"}
