"""Every study preset runs in its reduced --quick form and writes its report files."""

import csv
import json
from pathlib import Path

import pytest

from dptrain import studies

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def data_env(monkeypatch):
    pytest.importorskip("matplotlib", reason="the study reports draw with matplotlib")
    if (SHARED_DATA / "mnist").is_dir():
        monkeypatch.setenv("DPTRAIN_DATA", str(SHARED_DATA))


FILES = {
    "mnist-mlp": [
        "speedup.png",
        "efficiency_vs_size.png",
        "time_vs_size.png",
        "breakdown.png",
        "summary.csv",
        "runs.csv",
        "sweep.json",
    ],
    "cifar10-cnn": [
        "speedup.png",
        "breakdown.png",
        "baseline_vs_distributed.png",
        "summary.csv",
        "sweep.json",
    ],
    "logreg-1m": ["speedup.png", "breakdown.png", "summary.csv", "sweep.json"],
    "mnist-softmax-scaled": ["speedup_layouts.png", "results.csv", "results.json"],
    "local-sgd": ["accuracy_vs_time_mlp.png", "phases_mlp.png", "results.csv", "results.json"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", studies.STUDIES)
def test_quick_study_writes_its_report(name, tmp_path):
    out = tmp_path / name
    res = studies.study(name, out, quick=True, log=lambda *a: None)
    report = (out / "report.md").read_text()
    assert report.startswith("# QUICK RUN - Study:")  # a quick run never passes for a study
    assert "**QUICK RUN**" in report and "| QUICK |" in report
    if name == "cifar10-cnn":  # no CIFAR-10 here: the stand-in, named
        assert "SYNTHETIC CIFAR-10-shaped data (synthetic-cifar10" in report
        assert (
            json.loads((out / "sweep.json").read_text())["config"]["dataset"] == "synthetic-cifar10"
        )
    if "†" in report:  # a speedup above the cores: explained
        assert studies.SUPERLINEAR_NOTE in report
    for section in ("## Configuration", "## Against the original", "## Figures"):
        assert section in report, f"{name}: no {section!r}"
    assert studies.ORIGINAL[name].split(":")[0][:20] in report
    for f in FILES[name]:
        path = out / f
        assert path.is_file() and path.stat().st_size > 0, f"{name}: {f} missing"
        if f.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert f"]({f})" in report
    if "summary.csv" in FILES[name]:
        rows = list(csv.DictReader(open(out / "summary.csv")))
        assert len(rows) == len(res["summary"]) >= 2
        assert {int(r["workers"]) for r in rows} >= {1, 2}
    elif name == "local-sgd":
        data = json.loads((out / "results.json").read_text())
        runs = {d["run"]: d for d in data}
        assert list(runs) == ["synchronous", "H=4", "H=4 after 1 epoch", "auto"]
        assert runs["synchronous"]["time_vs_synchronous"] == 1.0
        assert runs["synchronous"]["averages"] is None
        # 4000 samples in batches of 128: 32 steps an epoch, 3 epochs
        assert runs["H=4"]["averages"] == 3 * 8
        assert runs["H=4 after 1 epoch"]["averages"] == 32 + 2 * 8
        assert runs["auto"]["auto_periods"] and runs["auto"]["predicted_seconds"] is None
        for d in data:
            assert len(d["history"]) == 3 and d["train_seconds"] > 0
            assert (d["predicted_seconds"] is not None) == d["run"].startswith("H=")
        assert "| QUICK | H=4 |" in report and "largest error: mlp:" in report
        # the verdict follows the measured ratio (a quick run whose local runs were all slower
        # said "the gain is smaller")
        best = min(data[1:], key=lambda d: d["train_seconds"])["time_vs_synchronous"]
        gained = "The gain is smaller than AdaComm's 3x" in report
        assert gained == (best < 1) and gained != ("No local-SGD run gained time" in report)
    else:
        data = json.loads((out / "results.json").read_text())
        assert {d["pixels"] for d in data} == {784, 3136}
        assert all(d["seconds"] > 0 for d in data)


def test_unknown_study_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="study is 'imagenet'"):
        studies.study("imagenet", tmp_path)
