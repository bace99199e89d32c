"""Outputs that would overwrite an input or each other are refused before anything is read
or written, naming both options; numeric options out of range are refused naming the
option (the API's TrainConfig and the command line alike). (A checkpoint resumes only on
its own data set: tests/test_checkpoints.py.)"""

import re

import numpy as np
import pytest

from dptrain import cli
from dptrain import config as config_module
from dptrain.config import TrainConfig


# ---------------------------------------------------------------- outputs against outputs
@pytest.mark.parametrize(
    "options, first, second",
    [
        (dict(out="P", save_weights="P"), "out (--out)", "save_weights (--save-weights)"),
        (dict(out="P.npz", save_weights="P"), "out (--out)", "save_weights (--save-weights)"),
        (dict(checkpoint="P", trace="P"), "checkpoint (--checkpoint)", "trace (--trace)"),
        (dict(steps_csv="sub/../P", out="P"), "out (--out)", "steps_csv (--steps-csv)"),
        (dict(out="link", trace="P"), "out (--out)", "trace (--trace)"),
    ],
)
def test_two_outputs_naming_one_file_are_refused(tmp_path, options, first, second):
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "P")
    paths = {k: str(tmp_path / v) for k, v in options.items()}
    message = re.escape(f"{first} and {second} both name {tmp_path}/P")
    with pytest.raises(ValueError, match=message):
        TrainConfig(**paths)


def test_an_output_over_the_checkpoint_to_resume_is_refused(tmp_path):
    ckpt = str(tmp_path / "run.npz")
    assert TrainConfig(resume=ckpt, checkpoint=ckpt).checkpoint == ckpt  # goes on writing it
    with pytest.raises(
        ValueError,
        match=r"save_weights \(--save-weights\) names .*run.npz, the file that resume "
        r"\(--resume\) reads",
    ):
        TrainConfig(resume=ckpt, save_weights=str(tmp_path / "run"))


@pytest.mark.parametrize(
    "flags, names",
    [
        (["--out", "{P}", "--save-weights", "{P}"], ("--out", "--save-weights")),
        (["--checkpoint", "{X}", "--train-x", "{X}"], ("--checkpoint", "--train-x")),
        (["--trace", "{Y}", "--train-y", "{Y}"], ("--trace", "--train-y")),
    ],
)
def test_cli_refuses_an_output_over_an_input_or_another_output(tmp_path, capsys, flags, names):
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, np.random.default_rng(0).random((40, 3), dtype=np.float32))
    np.save(y, np.arange(40) % 2)
    before = x.read_bytes(), y.read_bytes()
    paths = {"P": str(tmp_path / "p"), "X": str(x), "Y": str(y)}
    given = [f.format(**paths) for f in flags]
    if "--train-x" not in given:
        given += ["--train-x", str(x)]
    if "--train-y" not in given:
        given += ["--train-y", str(y)]
    rc = cli.main(["train", "--model", "softmax", "--epochs", "1", "--quiet", *given])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1, err
    assert all(name in err for name in names), err
    assert (x.read_bytes(), y.read_bytes()) == before
    assert not (tmp_path / "p").exists() and not (tmp_path / "p.npz").exists()


# ---------------------------------------------------------------- numeric ranges
@pytest.mark.parametrize(
    "options, message",
    [
        (dict(lr=0), r"lr must be a finite number > 0, got 0"),
        (dict(lr=0.0), r"lr must be a finite number > 0"),
        (dict(seed=-1), r"seed must be an integer >= 0, got -1"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**options)


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--lr", "0", "argument --lr: expected a finite number > 0, got '0'"),
        ("--seed", "-1", "argument --seed: expected an integer >= 0, got '-1'"),
    ],
)
def test_cli_out_of_range_values_name_the_option(capsys, flag, value, message):
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "--dataset", "synthetic", flag, value])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_huge_hidden_width_is_refused_with_the_memory_it_needs(monkeypatch, capsys):
    monkeypatch.setattr(config_module, "memory_bytes", lambda: 16 * 10**9)
    with pytest.raises(ValueError) as info:
        TrainConfig(hidden=(10**9,))
    text = str(info.value)
    assert "hidden=(1000000000,) needs at least" in text
    assert "4,000,000,002 parameters" in text and "more than this machine's 16 GB" in text
    assert TrainConfig(hidden=(4096, 4096)).hidden == (4096, 4096)
    rc = cli.main(["train", "--dataset", "synthetic", "--hidden", "1000000000", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "--hidden (1000000000,) needs at least" in err
