"""Elastic runs (--elastic): a worker lost mid-run (raised, killed, stalled past --timeout)
costs the step it was in; the others go on with one worker fewer from the last completed step,
and with --deterministic the weights are the same bits as a run that lost no one."""

import os
import warnings

import numpy as np
import pytest
from _runs import ELASTIC_MPI_FLAGS

import dptrain
from dptrain.comm import Interrupted, WorkerError, launch
from dptrain.config import parse_layers

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 4 workers on 2 CPUs

# 8 steps an epoch; the faults land mid-epoch 2 unless a test says otherwise
RUN = dict(
    dataset="synthetic",
    n_samples=1024,
    n_features=20,
    epochs=2,
    batch_size=128,
    workers=4,
    hidden=(32,),
    seed=5,
    quiet=True,
)


def train(**options):
    return dptrain.train("mlp", **{**RUN, **options})


@pytest.fixture(scope="module")
def uninterrupted():
    """The deterministic run that lost no one (its bits do not depend on the backend)."""
    return train(deterministic=True, backend="thread")


@pytest.mark.parametrize(
    "backend, kind",
    [
        ("thread", "raise"),
        ("thread", "stop"),
        ("process", "raise"),
        ("process", "kill"),
        ("process", "stop"),
    ],
)
def test_lost_worker_costs_a_step_not_the_bits(uninterrupted, backend, kind):
    lines = []
    r = train(
        deterministic=True,
        backend=backend,
        elastic=True,
        fault=(2, 11, kind),
        timeout=1.0,
        quiet=False,
        progress=False,
        log=lines.append,
    )
    assert np.array_equal(r["params"], uninterrupted["params"])  # the same bits
    assert [h["train_loss"] for h in r.history] == pytest.approx(
        [h["train_loss"] for h in uninterrupted.history], rel=1e-12
    )
    (event,) = r["elastic"]
    # from the step rank 2 never joined (11), or the one before it where every survivor saw
    # the abort before that step's (complete) exchange ended
    step = event["step"]
    assert event["world"] == [4, 3] and step in (10, 11) and event["epoch"] == 2
    assert [x["rank"] for x in event["lost"]] == [2]
    cause = event["lost"][0]["cause"]
    if kind == "stop":
        assert "did not arrive within the 1 s timeout" in cause
    else:
        assert ("SIGKILL" if kind == "kill" else "injected fault on rank 2 at step 11") in cause
    # from the interrupted step's start to its redo's end: the timeout, then well under 1 s
    assert 0 < event["recovery_seconds"] < 1.0 + (1.0 if kind == "stop" else 0.0) + 2.0
    said = [x for x in lines if "lost worker" in x]
    assert said == [
        f"dptrain: lost worker rank 2 at step {step} ({cause}): going on with 3 worker(s) "
        f"from step {step} (elastic)"
    ]
    assert any(
        x.startswith(f"elastic: lost rank 2 at step {step} (4 -> 3 workers, ") for x in lines
    )
    assert r.breakdown["elastic"]["final_workers"] == 3
    assert r["config"]["elastic"] is True


def test_respawn_replaces_the_lost_worker(uninterrupted):
    lines = []
    r = train(
        deterministic=True,
        backend="process",
        elastic=True,
        respawn=True,
        fault=(1, 6, "kill"),
        quiet=False,
        progress=False,
        log=lines.append,
    )
    assert np.array_equal(r["params"], uninterrupted["params"])
    assert r["elastic"][0]["world"] == [4, 4]
    assert r.breakdown["elastic"]["final_workers"] == 4
    step = r["elastic"][0]["step"]
    assert step in (5, 6)  # (see the first test)
    assert any(f"going on with 4 worker(s) from step {step} (1 new, respawned)" in x for x in lines)


def test_rank_0_lost_and_a_fault_at_an_epoch_boundary(uninterrupted):
    # rank 0 evaluates and reports: the new rank 0 takes over; step 8 opens epoch 2
    r = train(deterministic=True, backend="thread", elastic=True, fault=(0, 8, "raise"))
    assert np.array_equal(r["params"], uninterrupted["params"])
    assert len(r.history) == 2
    assert r.history[1]["train_loss"] == pytest.approx(uninterrupted.history[1]["train_loss"])
    assert r["elastic"][0]["step"] in (7, 8)  # (see the first test)


def test_without_deterministic_equal_to_rounding():
    base = dict(backend="process", workers=3)
    ref = train(**base)
    r = train(**base, elastic=True, fault=(1, 5, "kill"))
    assert r["elastic"][0]["world"] == [3, 2]
    np.testing.assert_allclose(r["params"], ref["params"], rtol=1e-5, atol=1e-6)


def test_adam_batch_norm_dropout_bitwise():
    # every state a step carries: Adam's moments and step count, the running statistics,
    # dropout's masks (keyed by the step)
    layers = parse_layers("dense:32,batchnorm,relu,dropout:0.2,dense:2")
    opts = dict(deterministic=True, backend="thread", layers=layers, optimizer="adam")
    ref = train(**opts)
    r = train(**opts, elastic=True, fault=(3, 12, "raise"))
    assert np.array_equal(r["params"], ref["params"])
    assert np.array_equal(r.model.state, ref.model.state)
    assert np.array_equal(r.optimizer_state["exp_avg_sq"], ref.optimizer_state["exp_avg_sq"])


def test_fewer_than_min_workers_fails_naming_the_rank():
    with pytest.raises(
        WorkerError,
        match=r"worker rank 1 failed: .*injected.*1 worker\(s\) "
        r"left, fewer than min_workers=2",
    ):
        train(workers=2, backend="thread", elastic=True, min_workers=2, fault=(1, 3, "raise"))


def test_the_runs_own_error_is_not_a_lost_worker():
    # every worker diverges alike: the run fails (once more on fewer workers at most), with
    # the divergence named, instead of going on down to one worker
    with pytest.raises(WorkerError, match="training diverged"):
        train(backend="thread", elastic=True, lr=1e6, epochs=1)


def test_fit_elastic_continues_the_users_model():
    X, y = np.random.default_rng(0).normal(size=(512, 10)), np.arange(512) % 3
    ref_model = dptrain.MLP([10, 16, 3], seed=1)
    model = dptrain.MLP([10, 16, 3], seed=1)
    kw = dict(epochs=2, batch_size=64, workers=4, backend="thread", deterministic=True)
    dptrain.fit(ref_model, X, y, quiet=True, **kw)
    r = dptrain.fit(model, X, y, quiet=True, elastic=True, fault=(1, 9, "raise"), **kw)
    assert np.array_equal(model.params, ref_model.params)
    assert model.step == ref_model.step  # dropout's count moved on by every step, once
    assert r["elastic"][0]["world"] == [4, 3]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(elastic=True, overlap=True), "not with overlap=True"),
        (dict(elastic=True, sync_every=4), "local SGD"),
        (dict(elastic=True, shard_update=True), "shard_update=True"),
        (dict(min_workers=2), "give elastic=True"),
        (dict(respawn=True), "give elastic=True"),
        (dict(elastic=True, min_workers=5), "min_workers=5 is more than workers=4"),
        (dict(fault=(1, 3, "stop")), "give a timeout"),
    ],
)
def test_refused_before_any_work(options, message):
    with pytest.raises(ValueError, match=message):
        train(backend="thread", **options)


def test_launch_elastic_hands_home_the_survivors():
    """A launch user's own loop: survivors catch the group's stop and return what they hold;
    the WorkerError carries the lost ranks and each survivor's Interrupted."""
    from dptrain import _core

    def fn(comm):
        a = comm.zeros(4)
        try:
            for step in range(50):
                if comm.rank == 1 and step == 7:
                    raise RuntimeError("rank 1 gives up")
                a[:] = 1.0
                comm.allreduce_sum_(a)
        except _core.GroupAborted:
            return Interrupted({"step": step})
        return "finished"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(WorkerError) as info:
            launch(fn, workers=3, backend="thread", elastic=True)
    err = info.value
    assert err.rank == 1 and "rank 1 gives up" in err.lost[1]
    assert err.results[1] is None
    survivors = [err.results[r] for r in (0, 2)]
    assert all(isinstance(s, Interrupted) for s in survivors)
    # a survivor leaves the collective rank 1 never joined (step 7), or the one before it
    # (complete, but the abort seen before its end)
    assert {s.value["step"] for s in survivors} <= {6, 7}


def test_timeout_names_the_missing_ranks():
    import time

    def fn(comm):
        a = comm.zeros(4)
        if comm.rank == 2:
            while not comm.aborted:
                time.sleep(0.01)
            return None
        try:
            comm.allreduce_sum_(a)
        except TimeoutError as exc:
            return Interrupted(None, exc.missing)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(WorkerError) as info:
            launch(fn, workers=3, backend="thread", timeout=0.3, elastic=True)
    assert info.value.lost == {2: "did not arrive within the 0.3 s timeout"}


# ------------------------------------------------------------------ under MPI: a restart
MPI_RUN = [*ELASTIC_MPI_FLAGS, "--deterministic", "--quiet"]


@pytest.mark.mpi
@pytest.mark.parametrize("fault", ["1:10:raise", "2:5:kill", "3:12:stop"])
def test_mpi_job_restarted_on_fewer_ranks_keeps_the_bits(mpiexec, tmp_path, fault, uninterrupted):
    import subprocess
    import sys

    weights = tmp_path / "w.npz"
    r = subprocess.run(
        [sys.executable, "-m", "dptrain", "elastic", "--every", "4", "--", mpiexec, "-n", "4"]
        + [sys.executable, "-m", "dptrain", "train", *MPI_RUN, "--timeout", "2"]
        + ["--inject-fault", fault, "--save-weights", str(weights)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    step = int(fault.split(":")[1])
    restarted = [x for x in r.stderr.splitlines() if x.startswith("dptrain elastic:")]
    assert len(restarted) == 1, r.stderr
    assert "the job on 4 ranks failed" in restarted[0]
    assert f"restarting it on 3 ranks from step {step // 4 * 4} " in restarted[0]
    with np.load(weights) as f:  # the bits of the run that lost no one (any world size)
        assert np.array_equal(f["params"], uninterrupted["params"])


FAKE_MPIEXEC = """#!{python}
import os, signal, sys, time
def said(signum, frame):
    open(os.path.join(os.path.dirname(__file__), "got"), "w").write(signal.Signals(signum).name)
    sys.exit(128 + signum)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, said)
open(os.path.join(os.path.dirname(__file__), "started"), "w").write(" ".join(sys.argv))
time.sleep(60)
"""


@pytest.mark.signals
@pytest.mark.parametrize("signame, code", [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
def test_a_signal_to_the_supervisor_alone_reaches_the_job(tmp_path, signame, code):
    """kill, a scheduler's SIGTERM or a closed terminal's SIGHUP to the supervisor alone (not
    its process group): the job gets the signal too and ends, and the supervisor ends with
    128 + the signal, its temporary checkpoint directory removed. Before, a SIGTERM left the
    job running with no one to wait for it, and Ctrl-C waited 10 s, then killed it."""
    import signal
    import subprocess
    import sys
    import time

    fake = tmp_path / "bin" / "mpiexec"  # an MPI launcher that says which signal it got
    fake.parent.mkdir()
    fake.write_text(FAKE_MPIEXEC.format(python=sys.executable))
    fake.chmod(0o755)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dptrain", "elastic", "--", str(fake), "-n", "2"]
        + [sys.executable, "-m", "dptrain", "train"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not (fake.parent / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    assert "--checkpoint " + str(scratch) in (fake.parent / "started").read_text()
    os.kill(proc.pid, getattr(signal, signame))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert (fake.parent / "got").read_text() == signame
    assert list(scratch.iterdir()) == []  # the supervisor's checkpoint directory
    if signame != "SIGINT":
        assert f"dptrain elastic: {signame}: the job was stopped, not restarted" in err


def test_supervisor_refuses_what_it_cannot_restart(tmp_path):
    from dptrain.engine.restart import next_size, supervise

    with pytest.raises(ValueError, match="starting with mpiexec or mpirun"):
        supervise(["python", "-m", "dptrain", "train"])
    with pytest.raises(ValueError, match="rank count as mpiexec -n N"):
        supervise(["mpiexec", "python", "-m", "dptrain", "train"])
    with pytest.raises(ValueError, match="no dptrain train in the command"):
        supervise(["mpiexec", "-n", "2", "python", "script.py"])
    with pytest.raises(ValueError, match="adds --resume itself"):
        supervise(["mpiexec", "-n", "2", "python", "-m", "dptrain", "train", "--resume", "x"])
    assert [next_size(n, True) for n in (8, 4, 2)] == [7, 3, 1]
    assert [next_size(n, False) for n in (8, 3)] == [7, 2]


def test_estimator_elastic_through_engine_options():
    from sklearn.datasets import load_digits

    from dptrain.sklearn import MLPClassifier

    X, y = load_digits(return_X_y=True)
    kw = dict(hidden_layer_sizes=(32,), max_iter=3, workers=4, backend="thread", random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter: not converged
        ref = MLPClassifier(**kw, engine_options=dict(deterministic=True)).fit(X, y)
        est = MLPClassifier(
            **kw, engine_options=dict(deterministic=True, elastic=True, fault=(1, 20, "raise"))
        ).fit(X, y)
    assert np.array_equal(est.model_.params, ref.model_.params)
    assert ref.recoveries_ == [] and len(est.recoveries_) == 1
    assert est.recoveries_[0]["world"] == [4, 3] and est.recoveries_[0]["step"] in (19, 20)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_run_elastic_a_custom_loop_goes_on_from_its_last_commit(backend):
    """A launch user's loop with an ElasticState: every worker adds its rank's share of a
    step's integer sum, so the result does not depend on the world size; rank 2 fails at
    step 5 in the first launch (4 workers) only."""
    from dptrain.comm import ElasticState, run_elastic

    def loop(comm, state):
        buf = comm.zeros(3, np.float64)
        while state.step < 12:
            if comm.size == 4 and comm.rank == 2 and state.step == 5:
                raise RuntimeError("rank 2 fails")
            lo, hi = comm.rank * 12 // comm.size, (comm.rank + 1) * 12 // comm.size
            buf[:] = sum(range(lo, hi)) * (state.step + 1)
            comm.allreduce_sum_(buf)
            state.total += buf  # the same on every worker
            state.step += 1
            state.commit()
        return state.total.copy()

    state = ElasticState(total=np.zeros(3), step=0)
    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_elastic(loop, state, workers=4, backend=backend, log=lines.append)
    assert len(out) == 3
    expected = 66.0 * sum(range(1, 13))  # sum(0..11) times each step's factor
    assert all(np.array_equal(o, np.full(3, expected)) for o in out)
    (event,) = state.recoveries
    assert event["world"] == [4, 3] and event["commit"] in (4, 5)
    assert "rank 2 fails" in event["lost"][0]["cause"] and len(lines) == 1


def test_checkpoints_of_an_elastic_run_hold_the_epochs_sums(tmp_path, uninterrupted):
    """Checkpoints written after a recovery hold the epoch's sums over every worker (the
    tally's, not a sum over the workers left) and resume as ever."""
    import json

    def position(path):
        with np.load(path) as f:
            return json.loads(str(f["position"]))

    opts = dict(deterministic=True, backend="thread", checkpoint_every=12)
    train(**opts, checkpoint=tmp_path / "plain.npz")
    r = train(**opts, checkpoint=tmp_path / "el.npz", elastic=True, fault=(1, 9, "raise"))
    assert np.array_equal(r["params"], uninterrupted["params"])
    plain, el = position(tmp_path / "plain.npz"), position(tmp_path / "el.npz")
    assert el["step"] == plain["step"] == 12
    assert el["loss_sum"] == pytest.approx(plain["loss_sum"], rel=1e-12)
    assert el["correct"] == plain["correct"]
