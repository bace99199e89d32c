"""A script that starts a process-transport run without ``if __name__ == "__main__":`` under
the 'spawn' or 'forkserver' start method (each worker imports the script again) gets an error
that names the missing main guard and shows the two-line fix, not "worker rank 1 failed:
exited with code 1 without reporting"."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = [
    pytest.mark.slow,  # scripts started under spawn and forkserver
    pytest.mark.skipif(sys.platform == "win32", reason="forkserver is POSIX only"),
]

SETUP = """\
import numpy as np
import dptrain

X = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
y = (X[:, 0] > 0).astype(np.int64)
"""
CALL = (
    "dptrain.fit(dptrain.MLP([4, 8, 2]), X, y, epochs=1, batch_size=16, workers=2, "
    'backend="process", start_method={method!r}, quiet=True)'
)
FIX = 'if __name__ == "__main__":\n        ...  # the call that starts the run, indented'


def _run(tmp_path, body: str, method: str):
    script = tmp_path / "train_script.py"
    script.write_text(SETUP + textwrap.dedent(body).format(call=CALL.format(method=method)))
    r = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    return r, script


def _refused(tmp_path, body: str, method: str):
    """The script's run, which failed with the fix shown (not the bare exit code)."""
    r, script = _run(tmp_path, body, method)
    assert r.returncode == 1
    assert FIX in r.stderr, r.stderr
    assert "without reporting" not in r.stderr
    return r, script


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize(
    "body, line",
    [
        ("{call}\n", 6),  # at the top level
        ("def main():\n    {call}\n\n\nmain()\n", 10),  # in a function called there
        ("try:\n    {call}\nfinally:\n    pass\n", 7),  # in a compound statement there
    ],
    ids=["top-level", "function", "try"],
)
def test_an_unguarded_call_is_refused_before_any_worker_starts(tmp_path, method, body, line):
    r, script = _refused(tmp_path, body, method)
    assert f"{script}, line {line} (" in r.stderr, r.stderr
    assert f"the '{method}' start method, which imports the script again" in r.stderr


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_that_imports_an_unguarded_script_is_named(tmp_path, method):
    # an `if` that is no main guard: the launcher cannot tell, the workers do
    r, script = _refused(tmp_path, "if X.size:\n    {call}\n", method)
    assert "worker rank" in r.stderr and "while starting" in r.stderr, r.stderr
    assert f"imports the main script ({script}) again" in r.stderr
    # and each worker said so itself, naming the script
    assert f"importing the main script ({script}) again, which starts a run" in r.stderr


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_guarded_script_trains(tmp_path, method):
    r, _ = _run(tmp_path, 'if __name__ == "__main__":\n    {call}\n    print("trained")\n', method)
    assert r.returncode == 0, r.stderr
    assert "trained" in r.stdout
