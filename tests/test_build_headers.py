"""The C extension builds from source against NumPy 1.x headers, and works.

pip builds dptrain in an isolated environment with NumPy 2 headers (NPY_TARGET_VERSION 1.25,
so one build serves NumPy 1.25 and later). A user building from source next to an older
NumPy (`python setup.py build_ext`, or pip without build isolation) compiles against NumPy
1.x headers instead: this test does that, then trains with the result. It runs in CI's
oldest-NumPy pass; with NumPy 2 installed, the build it would check is the one every other
test already uses, so it skips."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from _jobs import build_package

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.build,
    pytest.mark.numpy1_headers,
    pytest.mark.skipif(
        not (ROOT / "setup.py").is_file() or not (ROOT / "csrc").is_dir(),
        reason=f"no C sources at {ROOT} (installed package only)",
    ),
    pytest.mark.skipif(
        int(np.__version__.split(".")[0]) >= 2,
        reason=f"NumPy {np.__version__}: NumPy 2 headers are what pip's build "
        f"and every other test use; this checks NumPy 1.x headers "
        f"(CI's oldest-NumPy pass)",
    ),
]


def _build_and_train(workdir, run) -> dict:
    """The background job (conftest): the extension built against this NumPy's headers into
    a package of its own, then a short training with it; each step's CompletedProcess."""
    lib = workdir / "lib"
    # -O1: what is checked is that every source compiles against these headers and the
    # module they make imports and trains; -O3's optimizer adds nothing to that, and -O1
    # compiles in about half the time (this build runs inside CI's last pass)
    env = dict(os.environ, CFLAGS="-O1")
    steps = {"lib": lib, "build": build_package(lib, workdir / "build", run, env)}
    if steps["build"].returncode != 0:
        return steps
    probe = (
        "import numpy, dptrain\n"
        "info = dptrain.build_info()\n"
        "r = dptrain.train(model='mlp', hidden=(8,), dataset='synthetic', n_samples=600, "
        "epochs=1, workers=2, backend='thread', quiet=True)\n"
        "print(dptrain._core.__file__, numpy.__version__, info['numpy_build_api'], "
        "r['final_test_accuracy'], sep='|')\n"
    )
    steps["run"] = run(
        [sys.executable, "-c", probe],
        cwd=lib,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib)},
    )
    return steps


@pytest.mark.background.with_args(_build_and_train)
def test_the_extension_builds_against_numpy_1_headers_and_trains(background):
    r = background["build"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = background["run"]
    assert run.returncode == 0, run.stderr[-3000:]
    so, version, api, accuracy = run.stdout.splitlines()[-1].split("|")
    assert so.startswith(str(background["lib"])), so  # this build, not the installed one
    assert version == np.__version__
    # NumPy 1.x headers have no NPY_FEATURE_VERSION_STRING: build_info gives the C API version
    assert api.startswith("C API 0x"), api
    assert float(accuracy) > 0.6
