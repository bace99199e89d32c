"""Local SGD (engine.local.LocalSGD; TrainConfig's sync_every, local_after, replicas,
local_momentum, outer_lr, outer_momentum):

- K replicas give bitwise-identical weights on 1, 2 and K workers (thread, process,
  mpiexec), also with the outer optimizer and Adam;
- averaging every step (the state too) is synchronous SGD up to rounding (1e-6 relative),
  and sync_every=1 runs as synchronous SGD, bit for bit;
- the averages fall where the period, the epochs' ends and local_after put them, and the
  breakdown shows them: an average phase (and sync_wait) only in the steps that end in one,
  no communication; the trace and the timeline draw the average after the update;
- local_momentum: reset leaves no momentum at an average, local keeps each replica's;
- sync_every='auto' records choices that follow its rule, in the result and the trace;
- a run resumed from its checkpoint ends bitwise equal to an uninterrupted one;
- fit, the estimators (sync_every=) and comm.average_ for launch users;
- bad combinations are refused, naming the option.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _mnist import find_mnist, mnist_mark
from _runs import SMALL, as_flags

import dptrain
from dptrain.cli import main
from dptrain.comm import WorkerError, launch
from dptrain.engine.local import AUTO_COSTLY, AUTO_FALLING, AUTO_MAX
from dptrain.measure import timing

ROOT = Path(__file__).resolve().parent.parent
LOCAL = dict(SMALL, sync_every=3, replicas=4)
STEPS_PER_EPOCH = 11  # SMALL: 1030 samples in batches of 100


def _state(r):
    return [r["params"], r.model.velocity] + [
        v for _, v in sorted(r["optimizer_state"].items()) if isinstance(v, np.ndarray)
    ]


@pytest.mark.parametrize(
    "options",
    [
        {},
        dict(outer_lr=0.7, outer_momentum=0.5, local_after=1),
        dict(optimizer="adam", lr=0.01, local_momentum="reset"),
    ],
    ids=["plain", "outer", "adam-reset"],
)
@pytest.mark.filterwarnings("ignore:.*exceeds the")
def test_k_replicas_give_the_same_bits_on_any_number_of_workers(options):
    runs = [
        dptrain.train(**dict(LOCAL, **options), workers=w, backend=b)
        for w, b in [(1, "thread"), (2, "thread"), (4, "thread"), (2, "process"), (4, "process")]
    ]
    assert all(r["exchange"] == "LocalSGD" for r in runs)
    for r in runs[1:]:
        for got, want in zip(_state(r), _state(runs[0])):
            assert np.array_equal(got, want)
        assert r["train_loss"] == runs[0]["train_loss"]
    # and the replicas matter: 2 replicas are another algorithm
    other = dptrain.train(**dict(LOCAL, **options, replicas=2), workers=2)
    assert not np.array_equal(other["params"], runs[0]["params"])


@pytest.mark.mpi
def test_k_replicas_under_mpiexec_give_the_thread_runs_bits(mpiexec, tmp_path):
    flags = as_flags(dict(LOCAL, outer_lr=0.7, outer_momentum=0.5))
    subprocess.run(
        [mpiexec, "-n", "2", sys.executable, "-m", "dptrain", "train", *flags]
        + ["--save-weights", str(tmp_path / "mpi.npz")],
        check=True,
        cwd=ROOT,
        timeout=180,
        capture_output=True,
    )
    want = dptrain.train(**LOCAL, outer_lr=0.7, outer_momentum=0.5, workers=1)
    got = np.load(tmp_path / "mpi.npz")
    assert np.array_equal(got["params"], want["params"])


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("float64", 1e-12)])
@pytest.mark.parametrize("workers", [1, 2])
def test_averaging_every_step_is_synchronous_sgd_up_to_rounding(dtype, tol, workers):
    opts = dict(SMALL, dtype=dtype, nesterov=True, weight_decay=1e-3, workers=workers)
    sync = dptrain.train(**opts, backend="thread")
    # local_after covering the run: the replicas average after every step
    local = dptrain.train(**opts, sync_every=4, local_after=2, replicas=2, backend="thread")
    assert sync["exchange"] == "AllReduce" and local["exchange"] == "LocalSGD"
    scale = np.abs(sync["params"]).max()
    assert np.abs(local["params"] - sync["params"]).max() <= tol * scale
    assert local["train_loss"] == pytest.approx(sync["train_loss"], rel=10 * tol)
    # rounding, not the same computation: the mean of 2 updates, not the update of a mean
    assert local["local_sgd"]["averages"] == 2 * STEPS_PER_EPOCH


@pytest.mark.parametrize("deterministic", [False, True])
def test_sync_every_1_runs_as_synchronous_sgd_bit_for_bit(deterministic):
    opts = dict(SMALL, deterministic=deterministic, workers=2, backend="thread")
    sync = dptrain.train(**opts)
    one = dptrain.train(**opts, sync_every=1, replicas=4)
    assert one["exchange"] == sync["exchange"] != "LocalSGD" and one["local_sgd"] is None
    for got, want in zip(_state(one), _state(sync)):
        assert np.array_equal(got, want)
    if deterministic:  # and on any number of workers, as synchronous SGD is
        alone = dptrain.train(**dict(opts, workers=1), sync_every=1, replicas=4)
        assert np.array_equal(alone["params"], sync["params"])
    # an outer optimizer or another momentum policy makes H = 1 another algorithm
    for other in (dict(outer_lr=0.7), dict(local_momentum="reset")):
        r = dptrain.train(**opts, sync_every=1, replicas=2, **other)
        assert r["exchange"] == "LocalSGD" and r["local_sgd"]["averages"] == 2 * STEPS_PER_EPOCH


@pytest.mark.parametrize(
    "options, averages",
    [
        (dict(sync_every=3), 2 * 4),  # steps 3, 6, 9 and the epoch's last (11), twice
        (dict(sync_every=4, local_after=1), STEPS_PER_EPOCH + 3),  # then 4, 8, 11
        (dict(sync_every=64), 2),  # only the epochs' ends
    ],
)
def test_the_averages_fall_where_the_period_and_the_epochs_put_them(options, averages):
    r = dptrain.train(**dict(SMALL, replicas=2, **options), workers=2, backend="thread")
    assert r["local_sgd"]["averages"] == averages
    ph = r["step_times"].phases()  # (ranks, steps, phases)
    column = dict(zip(timing.PHASES, np.moveaxis(ph, 2, 0)))
    assert not column["communication"].any()  # no gradient exchange: an average instead
    has = (column["average"] > 0).all(axis=0)
    assert (has == (column["average"] > 0).any(axis=0)).all()  # every rank averages together
    assert not column["sync_wait"][:, ~has].any()  # waits only where there is a collective
    assert has.sum() == averages
    assert has[STEPS_PER_EPOCH - 1] and has[-1]  # every epoch ends with one
    if options.get("sync_every") == 3 and "local_after" not in options:
        assert list(np.flatnonzero(has[:STEPS_PER_EPOCH]) + 1) == [3, 6, 9, 11]


def test_the_trace_and_the_timeline_draw_the_average_after_the_update():
    pytest.importorskip("matplotlib")
    from dptrain.measure import plots

    r = dptrain.train(**dict(SMALL, sync_every=4, replicas=2, epochs=1), workers=2)
    b = r["breakdown"]
    assert b["phase_seconds"]["average"] > 0 and b["phase_seconds"]["communication"] == 0
    assert b["compute_to_communication"] > 0  # the average is the exchange it divides by
    trace = r["step_times"].chrome_trace()
    slices = [e for e in trace["traceEvents"] if e.get("cat") == "phase"]
    for rank in (0, 1):
        steps = {}
        for e in slices:
            if e["tid"] == rank:
                steps.setdefault(e["args"]["step"], []).append(e)
        averaged = [i for i, es in steps.items() if "average" in {e["name"] for e in es}]
        assert averaged == [3, 7, 10]  # after steps 4, 8 and the epoch's last (11)
        for i in averaged:
            at = {e["name"]: e for e in steps[i]}
            update, average = at["update"], at["average"]
            assert update["ts"] + update["dur"] <= average["ts"] + 1e-3  # in the order it ran
            assert "communication" not in at
            # the slices tile the step: each starts where the one before it ends
            ordered = sorted(steps[i], key=lambda e: e["ts"])
            for a, c in zip(ordered, ordered[1:]):
                assert c["ts"] == pytest.approx(a["ts"] + a["dur"], abs=1e-3)
    from matplotlib.colors import to_rgba
    from matplotlib.container import BarContainer

    fig = plots.plot_timeline(trace)

    bars = {c.get_label(): c for c in fig.axes[0].containers if isinstance(c, BarContainer)}
    drawn = bars[plots.PHASE_LABELS["average"]].patches  # the steps the figure shows
    assert drawn and all(p.get_facecolor() == to_rgba(plots.PHASE_COLORS["average"]) for p in drawn)


def test_local_momentum_reset_and_local():
    base = dict(SMALL, sync_every=3, replicas=2, workers=2, backend="thread")
    reset = dptrain.train(**base, local_momentum="reset")
    assert not reset.model.velocity.any()  # the run ends with an average, which zeroes it
    avg = dptrain.train(**base)
    local = dptrain.train(**base, local_momentum="local")
    assert avg.model.velocity.any() and local.model.velocity.any()
    # one replica's own momentum is not the average of the two
    assert not np.array_equal(local.model.velocity, avg.model.velocity)
    assert not np.array_equal(reset["params"], avg["params"])


def test_sync_every_auto_records_choices_that_follow_its_rule(tmp_path):
    trace = tmp_path / "t.json"
    r = dptrain.train(
        **dict(SMALL, epochs=4, sync_every="auto", replicas=2),
        workers=2,
        backend="thread",
        straggle_random_ms=1.0,
        trace=trace,
    )
    rec = r["local_sgd"]
    assert rec["sync_every"] == "auto" and rec["choices"]
    last, period = None, 2
    for c in rec["choices"]:
        assert c["was"] == period and 1 <= c["sync_every"] <= AUTO_MAX
        if last is None:
            assert c["sync_every"] == period
        elif c["loss"] < last * (1 - AUTO_FALLING):
            grow = c["average_share"] > AUTO_COSTLY and period < AUTO_MAX
            assert c["sync_every"] == (min(2 * period, AUTO_MAX) if grow else period)
        else:
            assert c["sync_every"] == max(period // 2, 1)
        last, period = c["loss"], c["sync_every"]
    assert rec["period"] == period
    meta = json.loads(trace.read_text())["otherData"]
    assert meta["local_sgd"]["choices"] == rec["choices"]


@pytest.mark.parametrize(
    "options",
    [dict(sync_every=3, outer_lr=0.8, outer_momentum=0.6), dict(sync_every="auto")],
    ids=["outer", "auto"],
)
def test_a_resumed_local_run_ends_bitwise_equal_to_an_uninterrupted_one(tmp_path, options):
    opts = dict(SMALL, epochs=3, replicas=2, workers=2, backend="thread", **options)
    whole = dptrain.train(**opts)
    ckpt = tmp_path / "run.npz"
    with pytest.raises((WorkerError, RuntimeError), match="injected fault"):
        dptrain.train(**opts, checkpoint=ckpt, fault=(1, 2 * STEPS_PER_EPOCH + 4, "raise"))
    resumed = dptrain.train(**opts, resume=ckpt)
    for got, want in zip(_state(resumed), _state(whole)):
        assert np.array_equal(got, want)
    # auto's choices (the periods; their losses and shares are measured) continue the
    # checkpointed ones
    periods = [(c["epoch"], c["batch"], c["sync_every"]) for c in whole["local_sgd"]["choices"]]
    assert [
        (c["epoch"], c["batch"], c["sync_every"]) for c in resumed["local_sgd"]["choices"]
    ] == periods
    with pytest.raises(ValueError, match="sync_every=1, but this run has sync_every="):
        sync_ckpt = tmp_path / "sync.npz"
        dptrain.train(**dict(SMALL, epochs=1), checkpoint=sync_ckpt)
        dptrain.train(**dict(SMALL, epochs=1, sync_every=3), resume=sync_ckpt)


@pytest.mark.filterwarnings("ignore:.*has not converged")
def test_fit_and_the_estimators_take_sync_every():
    from sklearn.datasets import load_digits

    from dptrain.sklearn import MLPClassifier

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    kw = dict(
        hidden_layer_sizes=(32,), learning_rate_init=0.01, max_iter=10, random_state=0, workers=2
    )
    fitted = [
        MLPClassifier(**kw, sync_every=4, engine_options={"replicas": 4}).fit(X, y)
        for _ in range(2)
    ]
    one = MLPClassifier(**dict(kw, workers=1), sync_every=4, engine_options={"replicas": 4})
    one.fit(X, y)
    assert np.array_equal(fitted[0].model_.params, one.model_.params)
    assert np.array_equal(fitted[0].model_.params, fitted[1].model_.params)
    assert fitted[0].score(X, y) > 0.8
    with pytest.raises(ValueError, match="sync_every must be a positive integer"):
        MLPClassifier(**kw, sync_every=0).fit(X, y)


def _launch_average(comm):
    a = np.full(5, float(comm.rank + 1))
    comm.average_(a)
    return a


def test_comm_average_is_the_mean_over_the_ranks():
    for backend in ("thread", "process"):
        out = launch(_launch_average, workers=3, backend=backend)
        for a in out:
            assert np.array_equal(a, np.full(5, 2.0))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(sync_every=0), "sync_every must be a positive integer"),
        (dict(sync_every="often"), "sync_every must be a positive integer"),
        (dict(local_after=1), "local_after: local_after=1 set"),
        (dict(outer_momentum=0.9), "outer_momentum: outer_momentum=0.9 set"),
        (dict(sync_every=4, outer_momentum=1.0), r"outer_momentum must be in \[0, 1\)"),
        (dict(sync_every=4, outer_lr=0), "outer_lr must be > 0"),
        (dict(sync_every=4, local_momentum="keep"), "local_momentum is 'keep'"),
        (dict(sync_every=4, overlap=True), "cannot run with overlap=True"),
        (dict(sync_every=4, allreduce="ring"), "cannot run with allreduce='ring'"),
        (dict(sync_every=4, shard_update=True), "cannot run with shard_update=True"),
        (dict(sync_every=4, comm_dtype="bfloat16"), "cannot run with comm_dtype='bfloat16'"),
        (
            dict(sync_every=4, checkpoint="c.npz", checkpoint_every=5),
            "cannot run with checkpoint_every=5",
        ),
        (
            dict(sync_every=4, local_momentum="local", checkpoint="c.npz"),
            "local_momentum='local' keeps a momentum per replica",
        ),
        (dict(sync_every=4, replicas=3, workers=2), "replicas=3 cannot be split evenly"),
    ],
)
def test_bad_local_options_are_refused_naming_them(options, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message):
        dptrain.train(**dict(SMALL, **options))


def test_the_cli_runs_local_sgd_and_refuses_bad_text(capsys):
    loud = {k: v for k, v in SMALL.items() if k != "quiet"}
    assert main(["train", *as_flags(dict(loud, sync_every=3, replicas=2)), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "local SGD: 2 replicas, an average every 3 steps: 8 averages in 22 steps" in out
    breakdown = next(line for line in out.splitlines() if line.startswith("time per step"))
    assert " average " in breakdown and "communication 0%" in breakdown
    assert main(["train", *as_flags(loud), "--no-progress"]) == 0
    assert " average " not in capsys.readouterr().out  # synchronous SGD has none
    with pytest.raises(SystemExit) as exc:
        main(["train", "--sync-every", "often"])
    assert exc.value.code == 2
    assert "--sync-every is 'often'" in capsys.readouterr().err


MNIST_DIR, needs_mnist = find_mnist(), mnist_mark()


@pytest.mark.slow
@needs_mnist
def test_bench_local_sgd_runs_and_reports_its_targets(tmp_path):
    """bench/bench_local_sgd.py --quick on a slice of MNIST: every configuration ran, and the
    targets table is printed from those runs (a benchmark: no figure is held to a value)."""
    out = tmp_path / "lsgd.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_local_sgd.py"), "--quick"]
        + ["--limit", "3000", "--epochs", "1", "--data-dir", str(MNIST_DIR), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    names = [row["configuration"] for row in rows]
    assert names[:4] == ["sync", "H=8 K=2 after 1", "auto", "auto after 1"]
    for row in rows:
        (run,) = row["runs"]
        assert 0 < run["accuracy"] <= 1 and run["train_seconds"] > 0
        assert (run["averages"] is None) == (row["configuration"] == "sync")
    assert "H=8 after 1: sync_wait / sync's" in r.stdout and "targets" in r.stdout
