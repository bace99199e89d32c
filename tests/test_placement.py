"""Where the workers run (dptrain.comm.placement): pinning each worker to CPUs of its own
(pin), refused or skipped where the CPUs are too few, within the mask the process was given
(taskset, a cgroup, an MPI launcher's binding), and workers='auto' / threads='auto'.

Every expectation comes from this machine's usable CPUs (os.sched_getaffinity): the tests
pass on 1 core as on 16, and those that need two CPUs skip on one."""

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

import dptrain
from dptrain.cli import main
from dptrain.comm import launch
from dptrain.comm.placement import (
    AUTO,
    MPINode,
    allowed_cpus,
    auto_split,
    can_pin,
    plan,
    usable_cpus,
)
from dptrain.config import OptionError, TrainConfig, cli_message

CPUS = sorted(allowed_cpus())
NCPU = len(CPUS)
# pinning and /proc: Linux (elsewhere placement pins nothing: see the test that fakes that)
PINS = pytest.mark.skipif(not can_pin(), reason="needs sched_setaffinity and /proc (Linux)")
TWO = pytest.mark.skipif(NCPU < 2 or not can_pin(), reason="needs 2 usable CPUs, and Linux")
SMALL = dict(
    model="softmax",
    dataset="synthetic",
    n_samples=2000,
    batch_size=100,
    epochs=1,
    quiet=True,
)
SMALL_ARGS = ["train", "--model", "softmax", "--dataset", "synthetic", "--n-samples", "2000"]
SMALL_ARGS += ["--batch-size", "100", "--epochs", "1", "--no-progress"]


def allowed_by_proc(tid: int | None = None) -> set:
    """A thread's CPUs as the kernel lists them (/proc: Cpus_allowed_list), read without
    sched_getaffinity: the independent check."""
    path = f"/proc/self/task/{tid or threading.get_native_id()}/status"
    with open(path) as f:
        text = next(line for line in f if line.startswith("Cpus_allowed_list:"))
    cpus = set()
    for part in text.split(":", 1)[1].strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def every_thread_allowed() -> dict:
    """{thread id: its CPUs} of every thread of this process, from /proc."""
    return {int(t): allowed_by_proc(int(t)) for t in os.listdir("/proc/self/task")}


# ---------------------------------------------------------------- the plan, on given CPUs
def test_the_plan_gives_each_worker_threads_cpus_of_its_own():
    p = plan(3, 2, True, [0, 1, 2, 3, 4, 5, 6, 7])
    assert p.pinned and p.cpus == ((0, 1), (2, 3), (4, 5))
    assert plan(2, 1, True, [4, 6, 5]).cpus == ((4,), (6,))  # in usable_cpus' order, no other


def test_by_default_processes_are_pinned_and_thread_workers_are_not():
    assert plan(2, 1, None, [0, 1], "process").pinned and plan(2, 1, None, [0, 1], "mpi").pinned
    p = plan(2, 1, None, [0, 1], "thread")
    assert not p.pinned and p.reason == "not pinned: thread workers (pin=True pins them)"
    assert plan(2, 1, True, [0, 1], "thread").cpus == ((0,), (1,))


def test_by_default_a_run_that_leaves_cpus_free_is_not_pinned():
    # two 2-worker runs on 8 CPUs would both be pinned to CPUs 0 and 1
    p = plan(2, 1, None, list(range(8)))
    assert not p.pinned and "2 of the 8 CPUs" in p.reason and "pin=True pins" in p.reason
    assert plan(4, 2, None, list(range(8))).cpus == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert plan(2, 1, True, list(range(8))).cpus == ((0,), (1,))


def test_the_plan_refuses_pin_true_and_skips_by_default_when_the_cpus_are_too_few():
    with pytest.raises(ValueError, match=r"^pin=True .* 3 worker\(s\) x 2 thread\(s\) = 6 CPUs"):
        plan(3, 2, True, [0, 1, 2, 3])
    p = plan(3, 2, None, [0, 1, 2, 3])
    assert not p.pinned and "6 CPUs, but this process may use 4 (CPUs 0-3)" in p.reason
    assert not plan(2, 1, False, [0, 1]).pinned and "pin=False" in plan(2, 1, False, [0]).reason
    # one worker: pinned only when asked (several runs of one worker would all take CPU 0)
    assert not plan(1, 1, None, [0, 1]).pinned and plan(1, 2, True, [0, 1]).cpus == ((0, 1),)


def test_where_the_os_cannot_pin_nothing_is_pinned_and_pin_true_is_refused(monkeypatch):
    # macOS: no sched_setaffinity; the CPUs are the machine's
    monkeypatch.delattr(os, "sched_setaffinity")
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert usable_cpus() == [0, 1, 2] and TrainConfig(workers=AUTO).split() == (3, 1)
    p = plan(2, 1, None, [0, 1, 2])
    assert not p.pinned and "cannot pin" in p.reason and p.describe()["cpus"] == [0, 1, 2]
    with pytest.raises(ValueError, match="^pin=True: this OS cannot pin"):
        plan(2, 1, True, [0, 1, 2])
    r = dptrain.train(**SMALL, workers=2, backend="thread")
    assert r["placement"]["cpus"] == [[0, 1, 2]] * 2 and not r["placement"]["pinned"]


def test_the_reasons_name_the_usable_cpus_as_ranges():
    assert "(CPUs 0-3,8,10-11)" in plan(5, 2, None, [0, 1, 2, 3, 8, 10, 11]).reason


def test_mpi_ranks_share_out_their_common_mask_and_keep_a_launchers_binding():
    shared = MPINode(1, 2, [[0, 1, 2, 3], [0, 1, 2, 3]])
    assert not shared.bound and shared.cpus == 4 and shared.threads() == 2
    assert shared.plan(2, None).cpus == ((0, 1), (2, 3))
    with pytest.raises(ValueError, match="^pin=True"):
        shared.plan(3, True)
    bound = MPINode(0, 2, [[4, 5], [6, 7]])  # mpiexec -bind-to core:2
    assert bound.bound and bound.cpus == 4 and bound.threads() == 2
    for pin in (None, True):
        p = bound.plan(8, pin)  # never refused or re-pinned: the launcher's binding stands
        assert not p.pinned and "kept the binding the MPI launcher gave" in p.reason


@PINS
def test_usable_cpus_are_this_process_mask_one_per_core_first():
    cpus = usable_cpus()
    assert sorted(cpus) == CPUS
    cores = [open(f"/sys/devices/system/cpu/cpu{c}/topology/core_id").read() for c in cpus]
    packages = [
        open(f"/sys/devices/system/cpu/cpu{c}/topology/physical_package_id").read() for c in cpus
    ]
    first = len(set(zip(packages, cores)))
    assert len(set(zip(packages[:first], cores[:first]))) == first  # no core twice up front


@pytest.mark.parametrize(
    "workers, threads, cores, want",
    [
        (AUTO, 1, 16, (16, 1)),
        (AUTO, 4, 16, (4, 4)),
        (AUTO, 3, 2, (1, 3)),
        (4, AUTO, 16, (4, 4)),
        (32, AUTO, 16, (32, 1)),
        (AUTO, AUTO, 16, (16, 1)),
        (AUTO, AUTO, 1, (1, 1)),
    ],
)
def test_auto_split(workers, threads, cores, want):
    assert auto_split(workers, threads, cores) == want


# ---------------------------------------------------------------- launch pins its workers
def _where(comm):
    """A worker's CPUs: as sched_getaffinity and as /proc read them, and what launch said."""
    return sorted(os.sched_getaffinity(0)), sorted(allowed_by_proc()), comm.placement


@TWO
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_launch_pins_each_worker_to_a_distinct_cpu(backend):
    before = allowed_by_proc()
    got = launch(_where, workers=2, backend=backend, pin=True)
    (a, a_proc, a_said), (b, b_proc, b_said) = got
    assert len(a) == len(b) == 1 and a != b and set(a + b) <= set(CPUS)
    assert (a_proc, b_proc) == (a, b)
    assert a_said == {"pinned": True, "cpus": a, "reason": a_said["reason"]} and b_said["pinned"]
    assert allowed_by_proc() == before  # the launching thread keeps its own mask


@TWO
def test_one_worker_in_the_calling_thread_gets_its_mask_back():
    before = allowed_by_proc()
    (cpus, _, said), *_ = launch(_where, workers=1, backend="thread", threads=2, pin=True)
    assert said["pinned"] and cpus == sorted(usable_cpus()[:2])
    assert allowed_by_proc() == before


def _team_threads(comm):
    """Builds a model with a C thread team of 2 (as the training loop does, after pinning);
    returns the worker's CPUs and those of every thread of its process."""
    model = dptrain.MLP([8, 4, 2], threads=2)  # noqa: F841 (its team lives while it does)
    return sorted(os.sched_getaffinity(0)), every_thread_allowed()


@TWO
def test_a_workers_thread_team_inherits_its_cpus():
    # a worker process of 2 threads pinned to 2 CPUs: the team's threads, created with the
    # model, are held to those 2 (one worker: the process's threads are the worker's own)
    [(mine, threads)] = launch(_team_threads, workers=1, backend="process", threads=2, pin=True)
    assert len(mine) == 2 and len(threads) >= 2
    assert all(cpus == set(mine) for cpus in threads.values()), threads


@PINS
@pytest.mark.filterwarnings("ignore:.*exceeds the")
def test_launch_refuses_pin_true_past_the_cpus_and_skips_by_default():
    with pytest.raises(ValueError, match="pin=True"):
        launch(_where, workers=NCPU + 1, backend="thread", pin=True)
    got = launch(_where, workers=NCPU + 1, backend="thread")
    assert all(not said["pinned"] and "not pinned" in said["reason"] for *_, said in got)
    assert all(cpus == CPUS for cpus, *_ in got)


# ---------------------------------------------------------------- a training run
@TWO
def test_a_runs_workers_are_pinned_before_they_build_their_model(monkeypatch):
    """The result's placement against what each worker's thread had when it built its model
    (recorded inside the worker, from /proc)."""
    from dptrain.engine import loop

    seen, build = {}, loop.model_from_spec

    def recording(spec, **kw):
        seen[threading.get_native_id()] = allowed_by_proc()
        return build(spec, **kw)

    monkeypatch.setattr(loop, "model_from_spec", recording)
    r = dptrain.train(**SMALL, workers=2, backend="thread", pin=True)
    placed = r["placement"]
    assert placed["pinned"] and r["config"]["pin"] is True
    assert sorted(map(sorted, seen.values())) == sorted(placed["cpus"])
    assert len({tuple(c) for c in placed["cpus"]}) == 2 and all(len(c) == 1 for c in placed["cpus"])


@TWO
def test_the_cli_result_and_last_line_say_where_the_workers_ran(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = SMALL_ARGS + ["--workers", "2", "--backend", "process", "--pin", "--out", str(out)]
    assert main(args) == 0
    placed = json.loads(out.read_text())["placement"]
    assert placed["pinned"] and len({tuple(c) for c in placed["cpus"]}) == 2
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("placement: pinned") and "CPUs by rank: " in last, last
    assert main(SMALL_ARGS + ["--workers", "2", "--no-pin", "--out", str(out)]) == 0
    placed = json.loads(out.read_text())["placement"]
    assert not placed["pinned"] and placed["cpus"] == [CPUS, CPUS]
    assert "pin=False" in placed["reason"]


@PINS
def test_the_cli_refuses_pin_past_the_cpus_naming_the_flag(capsys):
    assert main(SMALL_ARGS + ["--workers", str(NCPU + 1), "--pin"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dptrain: error: --pin gives each worker") and "\n" == err[-1], err
    assert err.count("\n") == 1


@PINS
@pytest.mark.filterwarnings("ignore:.*exceeds the")
def test_by_default_too_few_cpus_run_unpinned_and_say_so():
    r = dptrain.train(**SMALL, workers=NCPU + 1, backend="thread")
    assert not r["placement"]["pinned"]
    assert f"this process may use {NCPU}" in r["placement"]["reason"]


def test_an_uncoupled_run_reports_its_placement():
    r = dptrain.train(**SMALL, workers=NCPU, backend="process", uncoupled=True)
    assert r["placement"]["pinned"] is (NCPU > 1 and can_pin())


# ---------------------------------------------------------------- a narrower mask: taskset
def _cli(*args, prefix=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [*prefix, sys.executable, "-m", "dptrain", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@PINS
@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset not installed")
def test_a_taskset_mask_is_respected(tmp_path):
    last = CPUS[-1]
    taskset = ("taskset", "-c", str(last))
    out = tmp_path / "r.json"
    # auto: one worker for the one CPU; pinned on request, to that CPU and no other
    r = _cli(*SMALL_ARGS, "--workers", "auto", "--pin", "--out", str(out), prefix=taskset)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    assert got["config"]["workers"] == 1 and got["config"]["auto"] == ["workers"]
    assert got["placement"]["cpus"] == [[last]] and got["placement"]["pinned"]
    assert "--workers auto: 1 (of the 1 CPUs this process may use" in r.stdout
    # two processes on one CPU: not pinned by default, and said; refused with --pin
    args = (*SMALL_ARGS, "--workers", "2", "--backend", "process", "--out", str(out))
    r = _cli(*args, prefix=taskset)
    assert r.returncode == 0, r.stderr
    placed = json.loads(out.read_text())["placement"]
    assert placed["cpus"] == [[last], [last]] and not placed["pinned"]
    assert "may use 1 (CPUs " in placed["reason"]
    r = _cli(*args, "--pin", prefix=taskset)
    assert r.returncode == 1 and r.stderr.startswith("dptrain: error: --pin "), r.stderr


# ---------------------------------------------------------------- workers / threads auto
def test_auto_is_chosen_from_the_usable_cpus_and_recorded(tmp_path):
    r = dptrain.train(**SMALL, workers="auto", backend="thread")
    assert (r["config"]["workers"], r["config"]["threads"]) == (NCPU, 1)
    assert r["config"]["auto"] == ["workers"]
    r = dptrain.train(**SMALL, workers=1, threads="auto")
    assert (r["config"]["workers"], r["config"]["threads"]) == (1, NCPU)
    assert r["config"]["auto"] == ["threads"]
    assert TrainConfig(workers=AUTO, threads=AUTO).split(16) == (16, 1)
    assert dptrain.train(**SMALL)["config"]["auto"] == []


def test_auto_is_said_in_the_first_lines(capsys):
    assert main(SMALL_ARGS + ["--workers", "auto", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("dptrain: softmax") and f"{NCPU} worker(s)" in lines[0]
    assert lines[1].startswith(f"dptrain: --workers auto: {NCPU} (of the {NCPU} CPUs"), lines[1]


@pytest.mark.parametrize("flag", ["--workers", "--threads"])
@pytest.mark.parametrize("value", ["0", "-2", "foo", "1.5"])
def test_bad_counts_name_their_flag(capsys, flag, value):
    with pytest.raises(SystemExit) as info:
        main(SMALL_ARGS + [flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: expected a positive integer or auto, got {value!r}" in err


@pytest.mark.parametrize("name", ["workers", "threads"])
def test_bad_counts_in_the_api_name_the_option(name):
    with pytest.raises(OptionError, match=rf"^{name} must be a positive integer or 'auto'") as e:
        TrainConfig(**{name: "many"})
    assert cli_message(e.value).startswith(f"--{name} must be")
    for bad in ("yes", 1):
        with pytest.raises(OptionError, match="^pin must be True, False or None"):
            TrainConfig(pin=bad)


# ---------------------------------------------------------------- MPI ranks
def _mpi_run(mpiexec, tmp_path, *launcher_flags, extra=()):
    out = tmp_path / "r.json"
    cmd = [mpiexec, "-n", "2", *launcher_flags, sys.executable, "-m", "dptrain"]
    r = subprocess.run(
        [*cmd, *SMALL_ARGS, "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r.stdout


@TWO
@pytest.mark.mpi
def test_mpi_ranks_share_out_the_node_and_keep_a_launchers_binding(mpiexec, tmp_path):
    got, _ = _mpi_run(mpiexec, tmp_path, extra=["--workers", "auto", "--threads", "auto"])
    assert (got["config"]["workers"], got["config"]["threads"]) == (2, NCPU // 2)
    placed = got["placement"]
    assert placed["pinned"] and len({tuple(c) for c in placed["cpus"]}) == 2
    # the launcher bound each rank to a core: kept as it is, and said
    got, stdout = _mpi_run(mpiexec, tmp_path, "-bind-to", "core", extra=["--pin"])
    placed = got["placement"]
    assert not placed["pinned"] and "kept the binding the MPI launcher gave" in placed["reason"]
    assert [len(c) for c in placed["cpus"]] == [1, 1] and placed["cpus"][0] != placed["cpus"][1]
    assert stdout.splitlines()[-1].startswith("placement: not re-pinned")


def test_a_sweep_refuses_threads_auto(capsys):
    # its runs have 1 to several workers: 'auto' would change the threads from run to run
    assert main(["sweep", "--threads", "auto", "--quiet"]) == 1
    assert capsys.readouterr().err.startswith("dptrain: error: --threads auto divides the CPUs")
