"""Scaling sweeps: every configuration timed and summarized, the baseline our own 1 worker,
the gap to the ideal decomposed; the progress bar."""

import csv
import io
import json

import pytest

from dptrain import cli
from dptrain.measure import sweep as sweep_mod
from dptrain.measure import timing
from dptrain.measure.progress import Progress, format_seconds

SMALL = dict(
    model="softmax",
    dataset="synthetic",
    sizes=(600, 1200),
    workers=(2, 3),
    backend="thread",
    repeat=2,
    epochs=1,
    batch_size=60,
    quiet=True,
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    (out / "traces").mkdir()
    (out / "traces" / "99999_8w.json").write_text("[]")  # an earlier sweep's, into this folder
    return out, sweep_mod.sweep(out=out, **SMALL)


def test_every_configuration_and_repeat_is_run_and_summarized(result):
    out, res = result
    runs, summary = res["runs"], res["summary"]
    assert len(runs) == 2 * 3 * 2  # sizes x workers (1 added) x repeats
    assert {(r["n_samples"], r["workers"]) for r in runs} == {
        (n, p) for n in (600, 1200) for p in (1, 2, 3)
    }
    assert len(summary) == 6
    for s in summary:
        mine = [r for r in runs if (r["n_samples"], r["workers"]) == (s["n_samples"], s["workers"])]
        times = sorted(r["train_seconds"] for r in mine)
        assert s["time"]["min"] == times[0] and s["time"]["max"] == times[-1]
        base = [
            r["train_seconds"]
            for r in runs
            if r["n_samples"] == s["n_samples"] and r["workers"] == 1
        ]
        t1 = sorted(base)[0] / 2 + sorted(base)[1] / 2  # median of 2
        assert s["speedup"]["max"] == pytest.approx(t1 / times[0])
        assert s["efficiency"]["median"] == pytest.approx(s["speedup"]["median"] / s["workers"])
        assert set(s["phases"]) == set(timing.PHASES)
        if s["workers"] > 1:
            assert s["ceiling_speedup"] > 0
            # the decomposition adds up to the gap between the median time and the ideal
            gap = sum(s["phases"].values()) - s["ideal_seconds"]
            assert sum(s["gap"].values()) == pytest.approx(gap, rel=1e-6, abs=1e-9)
    for r in runs:
        assert r["steps"] == -(-r["n_samples"] // 60)
        assert (r["independent_seconds"] is None) == (r["workers"] == 1)
        # phases are the mean over ranks, each rank's own loop time (rank 0's is the run's)
        mean_loop = sum(r["rank_train_seconds"]) / r["workers"]
        assert sum(r["phases"].values()) == pytest.approx(mean_loop, rel=0.02)
        assert r["rank_train_seconds"][0] == r["train_seconds"]
    assert res["machine"]["cores"] >= 1


def test_files_hold_the_same_rows(result):
    out, res = result
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(res["summary"]))
    rows = list(csv.DictReader(io.StringIO((out / "summary.csv").read_text())))
    assert len(rows) == len(res["summary"])
    assert float(rows[0]["time_median"]) == pytest.approx(res["summary"][0]["time"]["median"])
    assert len(list(csv.DictReader(open(out / "runs.csv")))) == len(res["runs"])
    trace = json.loads((out / "traces" / "1200_3w.json").read_text())
    assert {e["tid"] for e in trace["traceEvents"]} == {0, 1, 2}
    # an earlier sweep's trace is gone: `plot` drew the one with the most ranks as this
    # sweep's timeline (a new user's trial)
    assert not (out / "traces" / "99999_8w.json").exists()


def test_bad_sweeps_are_rejected():
    with pytest.raises(ValueError, match="backend is 'mpi'"):
        sweep_mod.sweep(backend="mpi", quiet=True)
    with pytest.raises(ValueError, match="repeat must be"):
        sweep_mod.sweep(repeat=0, quiet=True)
    with pytest.raises(ValueError, match="sizes must be positive"):
        sweep_mod.sweep(sizes=(0,), quiet=True)


def test_cli_sweep(tmp_path, capsys):
    from dptrain.cli import main

    rc = main(
        [
            "sweep",
            "--model",
            "logreg",
            "--dataset",
            "synthetic",
            "--sizes",
            "500",
            "--workers",
            "2",
            "--backend",
            "thread",
            "--repeat",
            "1",
            "--no-ceiling",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    assert "speedup" in captured.out and "sweep:" in captured.err and "2/2" in captured.err
    res = json.loads((tmp_path / "sweep.json").read_text())
    assert [s["workers"] for s in res["summary"]] == [1, 2]
    assert all(r["independent_seconds"] is None for r in res["runs"])


def test_progress_line_and_eta():
    buf = io.StringIO()
    with Progress(4, "demo", stream=buf) as bar:
        bar.update("a")
        bar.update("b")
        assert bar.done == 2
    last = buf.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("demo:") and "2/4" in last and last.rstrip("]").endswith("b")
    assert "<" in last  # tqdm's elapsed<remaining: the ETA
    assert format_seconds(75) == "1 min 15 s" and format_seconds(4000) == "1 h 06 min"
    quiet = io.StringIO()
    Progress(3, stream=quiet, quiet=True).update()
    assert quiet.getvalue() == ""
    with pytest.raises(ValueError, match="total must be"):
        Progress(-1)


def test_a_synthetic_stand_in_is_named_in_every_output(tmp_path, monkeypatch, capsys):
    """MNIST absent (no $DPTRAIN_DATA, an empty cache, no network): the sweep's JSON, CSV
    tables and printed table all say synthetic-mnist, never mnist."""
    from dptrain import data

    monkeypatch.delenv("DPTRAIN_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(data.mnist, "_fetch", lambda url, timeout: pytest.fail("tried to download"))
    out = tmp_path / "sweep"
    res = sweep_mod.sweep(
        "softmax",
        "mnist",
        sizes=(256,),
        workers=(2,),
        backend="thread",
        repeat=1,
        epochs=1,
        batch_size=64,
        ceiling=False,
        out=out,
        quick=True,
        allow_download=False,
    )
    assert res["config"]["dataset"] == "synthetic-mnist" and res["config"]["synthetic"]
    assert res["config"]["requested_dataset"] == "mnist" and res["config"]["quick"]
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["config"]["dataset"] == "synthetic-mnist"
    for table in ("runs.csv", "summary.csv"):
        rows = list(csv.DictReader(open(out / table)))
        assert rows and {r["dataset"] for r in rows} == {"synthetic-mnist"}, table
    printed = capsys.readouterr()
    assert "softmax on synthetic-mnist (SYNTHETIC DATA, QUICK RUN)" in printed.out
    assert "SYNTHETIC MNIST-shaped" in printed.err


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--model", "softmax", "--dataset", "synthetic", "--sizes", "600"],
        ["study", "mnist-mlp", "--quick"],
    ],
)
def test_an_out_that_cannot_be_written_is_one_line_naming_it_before_any_run(tmp_path, capsys, argv):
    # it was a bare "[Errno 30] Read-only file system: 'rofs/sw'" after the runs
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "results"
    assert cli.main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"dptrain: error: --out {out}: cannot write there (")
    assert err.count("\n") == 1, err


def test_an_interrupted_sweep_keeps_the_runs_it_finished(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM in the middle of a sweep lost every run done (no sweep.json; a new
    user's trial): they are written, and the file says the sweep was interrupted."""
    import dptrain.engine

    real, calls = dptrain.engine.train, []

    def train(**kw):
        calls.append(kw)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(**kw)

    monkeypatch.setattr(dptrain.engine, "train", train)
    with pytest.raises(KeyboardInterrupt):
        sweep_mod.sweep(out=tmp_path, **dict(SMALL, ceiling=False))
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert len(saved["runs"]) == 2
    assert saved["config"]["interrupted"] == "2 of 12 runs done"
    assert len(list(csv.DictReader(open(tmp_path / "runs.csv")))) == 2
