"""bench/bench_scale.py (issue 34's scaling benchmark) runs end to end on a tiny slice, and its
JSON holds what its tables say: every configuration at N = 1 and 2 (or the reason it was left
out), positive figures, and speedups, shares of the ceiling and phase shares that follow from
the samples per second it reports. A benchmark, so no figure is held to a value."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dptrain.measure.timing import PHASES

pytestmark = pytest.mark.slow  # about 15 s: some 15 short training runs, MPI and torch's

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_scale.py"
CONFIGS = (
    "ceiling",
    "ceiling pinned",
    "process",
    "mpi",
    "thread",
    "threads",
    "DDP gloo",
    "torch threads",
)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale") / "scale.json"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--workers", "1,2", "--workloads", "mlp"]
    r = subprocess.run(
        cmd + ["--limit", "2048", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"{' '.join(cmd)} exited with {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return json.loads(out.read_text()), r.stdout


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9)


def test_every_configuration_ran_or_says_why(quick_run):
    result, stdout = quick_run
    cfg = result["config"]
    assert result["benchmark"] == "scale"
    assert cfg["workers"] == [1, 2] and cfg["repeats"] == 1 and cfg["limit"] == 2048
    assert list(cfg["workloads"]) == ["mlp"]
    data = cfg["workloads"]["mlp"]["data"]
    assert ("SYNTHETIC" in data["describe"]) == data["synthetic"]
    rows = {(r["workers"], r["config"]): r for r in result["rows"]}
    for n in (1, 2):
        for c in CONFIGS:
            assert (n, c) in rows or f"{c} x{n}" in cfg["skipped"], (n, c)
            if (n, c) in rows:
                assert rows[(n, c)]["failed"] == 0, rows[(n, c)]["errors"]
    assert ("process" in stdout) and ("targets" in stdout)
    # 16 workers are not reached here: every target at 16 says so
    for goal in result["config"]["targets"]:
        if "16" in goal["target"]:
            assert goal["verdict"].startswith("not measured"), goal


def test_figures_are_positive_and_follow_from_the_runs(quick_run):
    result, _ = quick_run
    plans = result["config"]["workloads"]["mlp"]["plans"]
    rows = {(r["workers"], r["config"]): r for r in result["rows"]}
    for (n, c), row in rows.items():
        plan = plans[str(n)]
        sps = row["samples_per_second"]
        assert 0 < sps["min"] <= sps["median"] <= sps["max"], (n, c)
        for run in row["runs"]:
            assert run["train_seconds"] > 0 and run["steps"] == plan["steps"], (n, c)
            assert close(run["samples_per_second"], run["samples"] / run["train_seconds"])
        if c in ("ceiling", "ceiling pinned"):
            for run in row["runs"]:
                assert len(run["member_seconds"]) == n
                assert close(run["train_seconds"], max(run["member_seconds"]))
                assert run["samples"] == plan["global_batch"] * plan["steps"]
        base = rows.get((1, c))
        if base:
            assert close(row["speedup"], sps["median"] / base["samples_per_second"]["median"])
        ceilings = [
            rows[(n, k)]["samples_per_second"]["median"]
            for k in ("ceiling", "ceiling pinned")
            if (n, k) in rows
        ]
        assert close(row["of_ceiling"], sps["median"] / max(ceilings))
        if c in ("process", "mpi", "thread", "threads"):
            shares = row["phase_shares"]
            assert set(shares) == set(PHASES) and all(v >= 0 for v in shares.values())
            assert math.isclose(sum(shares.values()), 1.0, rel_tol=1e-6)
            assert len(row["stragglers"]["patterns"]) == len(row["runs"])
    # the weak-scaling plan: 128 samples per worker per step
    assert [plans[k]["global_batch"] for k in ("1", "2")] == [128, 256]


def test_bad_options_are_one_line_errors(tmp_path):
    for args, words in (
        (["--workers", "1,x"], "--workers"),
        (["--workloads", "mlp,resnet"], "--workloads"),
        (["--configs", "process,gpu"], "--configs"),
        (["--train-arg=--no-such-option"], "--train-arg"),
        (["--limit", "100", "--workloads", "mlp", "--workers", "1"], "--limit"),
    ):
        r = subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
        )
        assert r.returncode != 0 and words in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr, (args, r.stderr)


def test_configs_picks_the_configurations_and_train_arg_reaches_them(tmp_path):
    out = tmp_path / "scale.json"
    args = ["--quick", "--workers", "1,2", "--workloads", "mlp", "--limit", "1024"]
    args += ["--configs", "process,thread", "--train-arg=--shard-update", "--json", str(out)]
    r = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert {row["config"] for row in result["rows"]} == {"process", "thread"}
    assert result["config"]["skipped"]["mpi x2"] == "not in --configs"
    assert all(row["failed"] == 0 for row in result["rows"])
