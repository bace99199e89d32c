"""Where the time goes: per-step, per-rank phases, sync wait apart from transfer, traces,
calls and bytes, the tables and their exports."""

import json

import numpy as np
import pytest

import dptrain
from dptrain.measure import timing

SMALL = dict(
    model="mlp",
    hidden=(32,),
    dataset="synthetic",
    n_samples=2000,
    n_features=16,
    epochs=2,
    batch_size=100,
    lr=0.05,
    quiet=True,
)


def _train(**kw):
    args = dict(SMALL)
    args.update(kw)
    return dptrain.train(**args)


@pytest.mark.parametrize(
    "backend, workers", [("thread", 1), ("thread", 2), ("process", 2), ("process", 3)]
)
def test_the_phases_of_every_rank_add_up_to_its_training_time(backend, workers):
    r = _train(workers=workers, backend=backend)
    st = r["step_times"]
    assert st.ranks == workers and st.steps == r["steps"] == 40
    walls = st.step_seconds().sum(axis=1)
    phases = st.phases()
    assert (phases >= 0).all()
    np.testing.assert_allclose(phases.sum(axis=2), st.step_seconds(), rtol=1e-9, atol=1e-12)
    b = r["breakdown"]
    # every rank's steps cover its own training loop (timed separately, epoch by epoch)
    assert b["rank_train_seconds"][0] == r["train_seconds"]
    for rank, wall in enumerate(walls):
        assert wall == pytest.approx(b["rank_train_seconds"][rank], rel=0.02), f"rank {rank}"
    assert set(b["phase_seconds"]) == set(timing.PHASES)
    assert len(r["rank_phase_seconds"]) == workers
    assert b["step_seconds"]["p50"] <= b["step_seconds"]["p90"] <= b["step_seconds"]["p99"]
    assert b["timer_seconds_per_step"] > 0 and 0 < b["timer_fraction"] < 1
    assert b["steal_fraction"] is None or 0 <= b["steal_fraction"] <= 1


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_straggler_shows_up_as_the_others_sync_wait_not_as_transfer(backend):
    r = _train(workers=2, backend=backend, straggle=(1, 10.0), epochs=1)
    per_rank = r["rank_phase_seconds"]
    steps = r["steps"]
    # rank 0 waits about 10 ms per step for rank 1; rank 1 hardly waits
    assert per_rank[0]["sync_wait"] > 0.7 * 0.010 * steps, per_rank
    assert per_rank[1]["sync_wait"] < 0.3 * per_rank[0]["sync_wait"], per_rank
    assert per_rank[1]["compute"] > 0.010 * steps
    # the transfer itself stays small next to the wait
    assert per_rank[0]["communication"] < 0.3 * per_rank[0]["sync_wait"], per_rank


def test_random_stragglers_are_seeded_and_validated():
    r = _train(workers=2, backend="thread", straggle_random_ms=2.0, epochs=1)
    assert r["config"]["straggle_random_ms"] == 2.0
    assert sum(p["sync_wait"] for p in r["rank_phase_seconds"]) > 0
    with pytest.raises(ValueError, match="straggle must be"):
        _train(workers=2, backend="thread", straggle=(2, 1.0))
    with pytest.raises(ValueError, match="straggle_random_ms"):
        _train(straggle_random_ms=-1)


@pytest.mark.parametrize("algorithm", ["native", "ring", "tree", "ps"])
def test_collective_calls_and_bytes_follow_the_schedule(algorithm):
    from dptrain.comm.algorithms import bytes_sent

    workers = 2
    r = _train(workers=workers, backend="thread", allreduce=algorithm, epochs=1)
    b, steps = r["breakdown"], r["steps"]
    m = b["param_bytes"]
    # per step: the gradient exchange (+ the parameter server's broadcast); per epoch one
    # stats all-reduce and one barrier; once: the start-up barrier and the parameters'
    # broadcast from rank 0
    per_step = 2 if algorithm == "ps" else 1
    assert b["collective_calls"] == steps * per_step + 2 + 2
    grad = (
        bytes_sent("reduce", workers, m, 1) + bytes_sent("broadcast", workers, m, 0)
        if algorithm == "ps"
        else bytes_sent(algorithm, workers, m)
    )
    # rank 0 sends the most under ps (the broadcast); the max over ranks is reported
    expected = (
        max(steps * grad + (m if algorithm != "ps" else 0), steps * grad)
        + bytes_sent("native", workers, 16)
        + m * (algorithm == "ps")
    )
    if algorithm == "ps":
        expected = steps * (workers - 1) * m + bytes_sent("native", workers, 16) + m
    assert b["bytes_sent"] == expected
    assert b["bytes_sent_per_epoch"] == expected


def test_the_sharded_schedule():
    """Per step the gradient's sum (each rank its slice: an all-reduce's payload) and the
    barrier that publishes the updated slices; the start-up publishes rank 0's parameters with
    a barrier (no broadcast: one array for all)."""
    from dptrain.comm.algorithms import bytes_sent

    r = _train(workers=2, backend="thread", epochs=1, shard_update=True)
    b, steps, m = r["breakdown"], r["steps"], r["breakdown"]["param_bytes"]
    assert r["exchange"] == "ShardedUpdate"
    assert b["collective_calls"] == 2 * steps + 2 + 2
    assert b["bytes_sent"] == steps * bytes_sent("native", 2, m) + bytes_sent("native", 2, 16)


def test_bytes_sent_by_schedule():
    from dptrain.comm.algorithms import bytes_sent

    assert bytes_sent("ring", 1, 1000) == 0
    assert bytes_sent("ring", 4, 1000) == 1500
    assert bytes_sent("tree", 4, 1000) == 2000
    # 3 workers: rank 0 folds in rank 2's buffer and sends it the result back
    assert [bytes_sent("tree", 3, 1000, r) for r in range(3)] == [2000, 1000, 1000]
    assert bytes_sent("broadcast", 4, 1000, 0) == 3000 and bytes_sent("broadcast", 4, 1000, 1) == 0
    assert bytes_sent("reduce", 4, 1000, 0) == 0 and bytes_sent("reduce", 4, 1000, 3) == 1000
    with pytest.raises(ValueError, match="algorithm is 'gossip'"):
        bytes_sent("gossip", 2, 10)


def test_trace_is_valid_chrome_json_with_a_track_per_rank(tmp_path):
    path = tmp_path / "trace.json"
    r = _train(workers=3, backend="process", trace=path, epochs=1)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in slices} <= set(timing.PHASES)
    for rank in range(3):
        mine = [e for e in slices if e["tid"] == rank]
        assert {e["args"]["step"] for e in mine} == set(range(r["steps"]))
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in mine)
        # slices of one rank do not overlap (up to float rounding of microseconds)
        mine.sort(key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(mine, mine[1:]))
        assert {"compute", "communication"} <= {e["name"] for e in mine}
    assert trace["otherData"]["workers"] == 3


def test_tables_and_exports_agree(tmp_path):
    r = _train(workers=2, backend="thread")
    st = r["step_times"]
    steps, epochs = st.per_step(), st.per_epoch()
    assert len(steps) == 2 * st.steps and len(epochs) == 2 * 2
    for rank in range(2):
        for e in (1, 2):
            row = next(x for x in epochs if x["rank"] == rank and x["epoch"] == e)
            mine = [x for x in steps if x["rank"] == rank and x["epoch"] == e]
            assert row["steps"] == len(mine) == 20
            for p in timing.PHASES + ("seconds",):
                assert row[p] == pytest.approx(sum(x[p] for x in mine), rel=1e-9)
    text = st.to_csv(tmp_path / "s.csv")
    assert (tmp_path / "s.csv").read_text() == text
    header = ["rank", "step", "epoch", "seconds", *timing.PHASES, "last_rank"]
    assert text.splitlines()[0] == ",".join(header)
    assert len(text.splitlines()) == 1 + len(steps)
    again = timing.StepTimes.from_dict(json.loads(st.to_json()))
    assert again.summary() == st.summary()
    pd = pytest.importorskip("pandas", reason="pandas is optional (to_pandas)")
    df = st.to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == len(steps)
    assert df.groupby("rank")["compute"].sum().tolist() == pytest.approx(
        [p["compute"] for p in r["rank_phase_seconds"]]
    )
    with pytest.raises(ValueError, match="per is 'rank'"):
        st.to_csv(per="rank")


def test_step_times_rejects_ragged_ranks_and_nothing():
    with pytest.raises(ValueError, match="at least one rank"):
        timing.StepTimes([])
    with pytest.raises(ValueError, match="same number of steps"):
        timing.StepTimes([np.zeros((3, 9)), np.zeros((2, 9))])
    with pytest.raises(ValueError, match=r"must be \(steps, 9\), got shape \(3, 7\)"):
        timing.StepTimes([np.zeros((3, 7))])


def test_stamps_without_the_average_column_read_as_steps_without_one():
    # a step: data 1, compute 2, exchange 3 (0.5 of it waiting), update 1, other 1
    row = [10.0, 11.0, 13.0, 16.0, 17.0, 18.0, 0.5, 0.0]
    old = timing.StepTimes([np.array([row])])  # the 8 columns of files before the phase
    new = timing.StepTimes([np.array([row + [1.0]])])  # the same step, an average
    want = dict(zip(timing.PHASES, old.phases()[0, 0]))
    assert want == dict(
        data=1, compute=2, communication=2.5, sync_wait=0.5, update=1, other=1, average=0
    )
    got = dict(zip(timing.PHASES, new.phases()[0, 0]))
    assert got == dict(want, communication=0.0, average=2.5)
    assert (
        timing.StepTimes.from_dict(json.loads(old.to_json())).phases().tolist()
        == old.phases().tolist()
    )


def test_steal_reading():
    before = timing.read_steal()
    if before is None:
        pytest.skip("no /proc/stat on this system: steal time is reported as None")
    assert timing.steal_fraction(before, before) is None
    assert timing.steal_fraction((0, 100), (5, 200)) == pytest.approx(0.05)


def test_cli_writes_trace_and_steps_csv(tmp_path, capsys):
    from dptrain.cli import main

    rc = main(
        [
            "train",
            "--model",
            "softmax",
            "--dataset",
            "synthetic",
            "--n-samples",
            "1000",
            "--epochs",
            "1",
            "--workers",
            "2",
            "--backend",
            "thread",
            "--straggle",
            "1:1",
            "--trace",
            str(tmp_path / "t.json"),
            "--steps-csv",
            str(tmp_path / "s.csv"),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "time per step: p50" in out and "sync_wait" in out
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert (tmp_path / "s.csv").read_text().startswith("rank,step,epoch")
    assert main(["train", "--straggle", "x", "--dataset", "synthetic"]) == 1
    assert "--straggle is 'x'" in capsys.readouterr().err
