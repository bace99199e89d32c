"""What the command line writes, read as a log file (Slurm's output file holds stdout and
stderr together): no progress bar where stderr is not a terminal, warnings as one line with
no source line (none under --quiet), refusals before the run's header and any warning, and
a resumed run that says where it resumed."""

import io
import os
import sys

import pytest
from _runs import SMALL, as_flags

from dptrain import cli
from dptrain.measure.progress import Progress, StepBar

# the suite ignores this warning (pyproject.toml): these tests need to see it
OVERSUBSCRIBED = pytest.mark.filterwarnings("always:.*exceeds the .* cores:RuntimeWarning")
LOUD = as_flags({k: v for k, v in SMALL.items() if k != "quiet"})  # SMALL, printing


def _train(capsys, *flags):
    rc = cli.main(["train", *LOUD, "--epochs", "1", *flags])
    out, err = capsys.readouterr()
    return rc, out, err


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_no_step_bar_where_stderr_is_not_a_terminal(capsys):
    rc, out, err = _train(capsys)
    assert rc == 0 and out.startswith("dptrain: mlp") and "epoch 1/1" in out
    assert "\r" not in out + err and "training:" not in err, err


def test_a_terminal_still_gets_the_step_bar(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    bar = StepBar()
    lines = []
    bar.above(lines.append, "epoch 1/1")
    bar.close()
    assert lines == ["epoch 1/1"] and "training:" in terminal.getvalue()


def test_a_notebook_still_gets_its_widget(monkeypatch):
    """Jupyter's and Colab's stderr is no terminal, but tqdm.auto draws a widget there."""
    import tqdm.auto

    from dptrain.measure.progress import live_bar

    widget = type("tqdm_notebook", (), {"__module__": "tqdm.notebook"})
    assert not live_bar(io.StringIO())
    monkeypatch.setattr(tqdm.auto, "tqdm", type("tqdm", (widget,), {}))
    assert live_bar(io.StringIO())


def test_a_sweep_writes_whole_lines_where_its_stream_is_not_a_terminal():
    log = io.StringIO()
    with Progress(3, "sweep", stream=log) as bar:
        bar.update("first")
        bar.update("second")
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 2, log.getvalue()
    assert lines[0].startswith("sweep:") and "1/3" in lines[0] and "first" in lines[0]
    terminal = _Terminal()
    with Progress(3, "sweep", stream=terminal) as bar:
        bar.update("first")
    assert "\r" in terminal.getvalue()  # a terminal's bar is redrawn in place


@OVERSUBSCRIBED
def test_a_warning_is_one_line_without_a_source_line(capsys, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # one usable CPU
    rc, out, err = _train(capsys, "--threads", "2")
    assert rc == 0, err
    assert err.splitlines() == [
        "dptrain: warning: 1 workers x 2 threads = 2 exceeds the 1 cores this process may use: "
        "timings will reflect time-sharing"
    ], err
    rc, out, err = _train(capsys, "--threads", "2", "--quiet")
    assert rc == 0 and out == "" and err == "", err


@OVERSUBSCRIBED
def test_a_refusal_comes_before_the_header_and_any_warning(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # --threads 2 would warn
    rc, out, err = _train(capsys, "--threads", "1000")
    assert rc == 1 and out == "", out
    assert err == "dptrain: error: --threads must be in [1, 256], got 1000\n", err
    # a refusal found late (a checkpoint of another run) still comes before both
    ckpt = tmp_path / "run.npz"
    rc, out, err = _train(capsys, "--checkpoint", str(ckpt), "--checkpoint-every", "5")
    assert rc == 0 and ckpt.is_file(), err
    rc, out, err = _train(capsys, "--threads", "2", "--resume", str(ckpt), "--batch-size", "50")
    assert rc == 1 and out == "", out
    assert err.startswith("dptrain: error: ") and "warning" not in err, err
    assert len(err.splitlines()) == 1, err


def test_resume_says_where_it_resumed(capsys, tmp_path):
    ckpt = tmp_path / "run.npz"
    # 11 steps per epoch of SMALL: die in the second epoch, after the checkpoint of step 15
    rc = cli.main(
        ["train", *LOUD, "--checkpoint", str(ckpt), "--checkpoint-every", "5"]
        + ["--inject-fault", "0:17:raise"]
    )
    assert rc == 1 and ckpt.is_file()
    capsys.readouterr()
    rc = cli.main(["train", *LOUD, "--resume", str(ckpt)])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[1] == f"dptrain: resumed from {ckpt} at epoch 2, step 15", out
    assert out[2].startswith("epoch 2/2"), out


@pytest.mark.parametrize("flag", ["--no-progress", "--quiet"])
def test_no_bar_when_asked_for_none_either(capsys, monkeypatch, flag):
    monkeypatch.setattr("sys.stderr", _Terminal())
    rc = cli.main(["train", *LOUD, "--epochs", "1", flag])
    assert rc == 0 and "training:" not in sys.stderr.getvalue()
