"""No result lost, every bad file a clear error: output paths are checked before the first
step; checkpoints are written atomically and durably, stale temporaries are cleaned, and a
damaged, foreign or impossible checkpoint given to resume is one error naming the file."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _runs import SMALL, SMALL_FLAGS

import dptrain
from dptrain import cli
from dptrain import comm as parallel


@pytest.fixture(scope="module")
def checkpoint(train_small, tmp_path_factory):
    """A good checkpoint of SMALL, written at step 15 (epoch 1, batch 4)."""
    path = tmp_path_factory.mktemp("ckpt") / "run.npz"
    with pytest.raises(RuntimeError, match="injected fault"):
        train_small(checkpoint=path, checkpoint_every=5, fault=(0, 17, "raise"))
    return path


# ---------------------------------------------------------------- output paths
@pytest.mark.parametrize("arg", ["out", "save_weights", "trace", "steps_csv", "checkpoint"])
def test_an_unwritable_output_fails_before_training(train_small, tmp_path, arg):
    t0 = time.monotonic()
    with pytest.raises(
        ValueError,
        match=rf"{arg}=.*the directory .*missing.* does not exist "
        rf"\(checked before training",
    ):
        train_small(
            **{arg: tmp_path / "missing" / "f.out"},
            checkpoint_every=5 if arg == "checkpoint" else 0,
            epochs=50,
        )
    assert time.monotonic() - t0 < 5  # 50 epochs would take far longer
    with pytest.raises(ValueError, match=rf"{arg}=.* is a directory"):
        train_small(**{arg: tmp_path}, checkpoint_every=5 if arg == "checkpoint" else 0)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux)")
def test_a_directory_that_nobody_can_write_is_refused(train_small):
    """/proc's directories refuse file creation even to root (permission bits would not)."""
    with pytest.raises(ValueError, match=r"save_weights=.*cannot write in '/proc/self'"):
        train_small(save_weights="/proc/self/weights.npz")


def test_cli_unwritable_steps_csv_fails_first(tmp_path, capsys):
    rc = cli.main(
        [
            "train",
            "--dataset",
            "synthetic",
            "--n-samples",
            "500",
            "--model",
            "logreg",
            "--epochs",
            "1",
            "--steps-csv",
            str(tmp_path / "no" / "steps.csv"),
        ]
    )
    assert rc == 1 and "error: --steps-csv " in capsys.readouterr().err


def test_steps_csv_is_written_bytrain_small(train_small, tmp_path):
    r = train_small(steps_csv=tmp_path / "steps.csv", epochs=1)
    lines = (tmp_path / "steps.csv").read_text().splitlines()
    assert len(lines) == 1 + r["steps"]


# ---------------------------------------------------------------- writing
def test_no_temporary_is_left_and_stale_ones_are_removed(train_small, tmp_path):
    path = tmp_path / "c.npz"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    stale = tmp_path / f"c.npz.tmp-{dead}.npz"  # a writer killed mid-write left it
    stale.write_bytes(b"half a checkpoint")
    other = tmp_path / "other.npz.tmp-1.npz"  # another file's: not ours to remove
    other.write_bytes(b"x")
    train_small(checkpoint=path, checkpoint_every=4, epochs=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz", "other.npz.tmp-1.npz"]


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_stopped_run_leaves_no_temporary_of_its_checkpoint(train_small, tmp_path, backend):
    """A run that stops (a failure, Ctrl-C) while a checkpoint is being written: the
    writer's temporary (a killed worker's; a thread's that the interrupt left; here one
    planted under this process's own id) is removed as the run ends, the checkpoint whole.
    Ctrl-C left one in 2 or 3 of 5 runs of a new user's trial."""
    import os

    path = tmp_path / "c.npz"
    mine = tmp_path / f"c.npz.tmp-{os.getpid()}.npz"  # write_atomically's own: left alone
    mine.write_bytes(b"half a checkpoint")
    with pytest.raises(RuntimeError, match="injected fault"):
        train_small(
            checkpoint=path, checkpoint_every=5, fault=(0, 17, "raise"), workers=2, backend=backend
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz"]


def test_a_kill_while_writing_leaves_the_previous_checkpoint_whole(tmp_path):
    """SIGKILL at random moments of a run that checkpoints every step: whatever is left at
    the path always reads as a whole checkpoint."""
    path = tmp_path / "c.npz"
    code = (
        f"import dptrain; dptrain.train(model='mlp', hidden=(64,), dataset='synthetic', "
        f"n_samples=20000, n_features=64, epochs=20, batch_size=50, quiet=True, "
        f"checkpoint={str(path)!r}, checkpoint_every=1)"
    )
    for delay in (1.5, 2.0, 2.6):
        proc = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(delay)
        proc.kill()
        proc.wait()
        if path.exists():
            with np.load(path) as f:
                assert {"params", "velocity", "position", "format"} <= set(f.files)
                json.loads(str(f["position"]))
    assert path.exists(), "no checkpoint was written at all"


# ---------------------------------------------------------------- reading
def _damaged(tmp_path, checkpoint, how):
    data = checkpoint.read_bytes()
    p = tmp_path / f"{how}.npz"
    if how == "truncated":
        p.write_bytes(data[: len(data) // 2])
    elif how == "bit-flipped":
        b = bytearray(data)
        b[len(b) // 3] ^= 0x10
        p.write_bytes(bytes(b))
    elif how == "empty":
        p.write_bytes(b"")
    elif how == "not a checkpoint":
        np.savez(p, weights=np.zeros(3))
    elif how == "a .npy array":
        np.save(p.with_suffix(".npy"), np.zeros(3))
        p = p.with_suffix(".npy")
    elif how == "text":
        p.write_text("hello")
    return p


@pytest.mark.parametrize(
    "how", ["truncated", "bit-flipped", "empty", "not a checkpoint", "a .npy array", "text"]
)
def test_a_damaged_checkpoint_is_one_clear_error(train_small, tmp_path, checkpoint, how):
    p = _damaged(tmp_path, checkpoint, how)
    with pytest.raises(ValueError, match=rf"checkpoint {p}") as info:
        train_small(resume=p)
    assert type(info.value) is ValueError
    assert "Traceback" not in str(info.value)


def _rewritten(tmp_path, checkpoint, name, **change):
    with np.load(checkpoint) as f:
        arrays = {k: f[k] for k in f.files}
    position = json.loads(str(arrays["position"]))
    for key, value in change.items():
        if key in ("params", "velocity", "format"):
            arrays[key] = value
        else:
            position[key] = value
    arrays["position"] = np.array(json.dumps(position))
    p = tmp_path / name
    np.savez(p, **arrays)
    return p


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(velocity=np.float32(0.0)), r"velocity has dtype float32 and shape \(\), expected"),
        (dict(params=np.zeros(7, np.float32)), r"params has dtype float32 and shape \(7,\)"),
        (dict(params=np.zeros(225, np.float64)), r"params has dtype float64"),
        (dict(step=10_000), r"step 10000 at epoch 1, batch 4 is impossible"),
        (dict(epoch=5, step=59), r"is impossible for 2 epoch\(s\) of 11 steps"),
        (dict(batch=-1), r"impossible"),
        (dict(history=[]), r"history has 0 epoch record\(s\), expected 1"),
        (dict(loss_sum=float("nan")), r"running sums are impossible"),
        (dict(step="15"), r"position field 'step' is '15', expected int"),
        (dict(format=np.int64(9)), r"has format"),
    ],
)
def test_an_impossible_checkpoint_is_refused(train_small, tmp_path, checkpoint, change, message):
    p = _rewritten(tmp_path, checkpoint, "bad.npz", **change)
    with pytest.raises(ValueError, match=message):
        train_small(resume=p)


def test_the_good_checkpoint_still_resumes(train_small, checkpoint):
    assert train_small(resume=checkpoint)["steps"] == 22


def test_cli_resume_of_a_damaged_file_prints_one_error(tmp_path, checkpoint, capsys):
    p = _damaged(tmp_path, checkpoint, "truncated")
    rc = cli.main(
        [
            "train",
            *SMALL_FLAGS,
            "--resume",
            str(p),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and f"checkpoint {p} cannot be read" in err


# ---------------------------------------------------------------- hyper-parameters
@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(momentum=1.5), r"momentum must be in \[0, 1\), got 1\.5"),
        (dict(momentum=1.0), r"momentum must be in \[0, 1\), got 1\.0"),
        (dict(momentum=-0.1), r"momentum must be a finite number >= 0"),
        (dict(dampening=2.0), r"dampening must be in \[0, 1\], got 2\.0"),
        (dict(lr=float("nan")), r"lr must be a finite number >=? 0"),  # train: > 0
        (dict(weight_decay=float("inf")), r"weight_decay must be a finite number"),
        (dict(lr="0.1"), r"lr must be a finite number >=? 0, got '0.1'"),
    ],
)
def test_bad_optimizer_settings_are_refused_before_training(train_small, kw, message):
    with pytest.raises(ValueError, match=message):
        train_small(**kw)
    model = dptrain.MLP([4, 3])
    with pytest.raises(ValueError, match=message):
        dptrain.SGD(model, **{"lr": 0.1, **kw})


def test_cli_momentum_above_one_exits_with_the_value(capsys):
    rc = cli.main(
        [
            "train",
            "--dataset",
            "synthetic",
            "--n-samples",
            "500",
            "--model",
            "logreg",
            "--epochs",
            "1",
            "--momentum",
            "1.5",
        ]
    )
    assert rc == 1 and "momentum must be in [0, 1), got 1.5" in capsys.readouterr().err


def test_a_batch_larger_than_the_data_set_says_so(train_small):
    with pytest.warns(
        UserWarning,
        match=r"batch_size=2000 is larger than the 1030 training "
        r"samples",
    ):
        train_small(batch_size=2000, epochs=1)


@pytest.mark.parametrize(
    "workers, backend, deterministic",
    [(1, "thread", True), (2, "thread", True), (2, "process", False), (4, "thread", False)],
)
def test_a_resumed_run_ends_bitwise_equal_to_an_uninterrupted_one(
    train_small, tmp_path, workers, backend, deterministic
):
    kw = dict(workers=workers, backend=backend, deterministic=deterministic)
    whole = train_small(**kw)
    ckpt = tmp_path / "run.ckpt.npz"
    # 11 steps per epoch: die in the second epoch, after the checkpoint of step 15
    with pytest.raises((parallel.WorkerError, RuntimeError), match="injected fault"):
        train_small(checkpoint=ckpt, checkpoint_every=5, fault=(0, 17, "raise"), **kw)
    assert ckpt.is_file()
    resumed = train_small(resume=ckpt, **kw)
    assert np.array_equal(resumed["params"], whole["params"])
    assert resumed["train_loss"] == pytest.approx(whole["train_loss"], rel=1e-6)
    assert [h["epoch"] for h in resumed["epochs"]] == [1, 2]


def test_a_checkpoint_path_alone_writes_one_at_every_epochs_end(train_small, tmp_path):
    """--checkpoint without --checkpoint-every: a checkpoint at the end of each epoch (11
    steps), so that a run killed in its second epoch resumes from the first's end."""
    whole = train_small()
    ckpt = tmp_path / "run.npz"
    with pytest.raises(RuntimeError, match="injected fault"):
        train_small(checkpoint=ckpt, fault=(0, 17, "raise"))
    assert ckpt.is_file()
    with np.load(ckpt) as f:
        assert json.loads(str(f["position"]))["step"] == 11
    resumed = train_small(resume=ckpt)
    assert np.array_equal(resumed["params"], whole["params"])


def test_resume_refuses_a_checkpoint_of_another_run(train_small, tmp_path):
    ckpt = tmp_path / "c.npz"
    train_small(checkpoint=ckpt, checkpoint_every=3)
    with pytest.raises(ValueError, match="batch_size=100, but this run has batch_size=50"):
        train_small(resume=ckpt, batch_size=50)
    with pytest.raises(ValueError, match="no checkpoint file"):
        train_small(resume=tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="checkpoint_every needs a checkpoint path"):
        train_small(checkpoint_every=3)


def test_cli_resume_of_a_header_declaring_2_to_the_40_values_prints_one_error(
    tmp_path, checkpoint, capsys
):
    """A params header declaring 2^40 values is refused from the header (no MemoryError)."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)}
    )
    p = tmp_path / "huge.npz"
    with zipfile.ZipFile(checkpoint) as src, zipfile.ZipFile(p, "w") as out:
        for name in src.namelist():
            raw = header.getvalue() + b"\0" * 64 if name == "params.npy" else src.read(name)
            out.writestr(name, raw)
    rc = cli.main(["train", *SMALL_FLAGS, "--resume", str(p)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1, err
    assert f"checkpoint {p}: params has dtype float32 and shape (1099511627776,)" in err


# ---------------------------------------------------------------- the data set's identity
def test_a_checkpoint_resumes_only_on_its_data_set(train_small, checkpoint):
    with pytest.raises(ValueError, match=r"n_train=1030, but this run has n_train=1500"):
        train_small(resume=checkpoint, n_samples=1500)
    assert train_small(resume=checkpoint)["steps"] == 22


def test_the_same_size_of_other_data_does_not_resume(tmp_path):
    rng = np.random.default_rng(1)
    X, y = rng.random((200, 4), dtype=np.float32), np.arange(200) % 3
    path = tmp_path / "run.npz"
    options = dict(model="softmax", epochs=2, batch_size=20, quiet=True, checkpoint=str(path))
    with pytest.raises(RuntimeError, match="injected fault"):
        dptrain.train(X=X, y=y, checkpoint_every=5, fault=(0, 12, "raise"), **options)
    with pytest.raises(ValueError, match=r"data_fingerprint="):
        dptrain.train(X=X[::-1].copy(), y=y, resume=str(path), **options)
    assert dptrain.train(X=X, y=y, resume=str(path), **options)["steps"] == 20


def test_cli_resume_on_other_data_is_one_line(tmp_path, checkpoint, capsys):
    flags = [f for f in SMALL_FLAGS]
    flags[flags.index("--n-samples") + 1] = str(SMALL["n_samples"] + 970)
    rc = cli.main(["train", *flags, "--resume", str(checkpoint)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "n_train=2000" in err, err


def test_a_checkpoint_interval_longer_than_the_run_still_writes_one_at_its_end(
    train_small, tmp_path
):
    """--checkpoint-every past the run's last step wrote no checkpoint, and said nothing (a
    new user's trial): the run's last step writes one, whatever the interval. Resumed, it
    is the finished run."""
    path = tmp_path / "run.npz"
    whole = train_small(checkpoint=path, checkpoint_every=10_000)
    assert path.is_file()
    again = train_small(resume=path)
    assert np.array_equal(again["params"], whole["params"])


def test_a_resumed_epoch_counts_its_time_before_the_checkpoint(train_small, tmp_path):
    """A run resumed in the middle of an epoch reported that epoch's time as the part after
    the resume alone, over all its samples (a new user's trial: 0.00 s and 9 million
    samples/s for a checkpoint at an epoch's end). The checkpoint keeps the epoch's time so
    far, and the resumed epoch's record adds it."""
    path = tmp_path / "run.npz"
    with pytest.raises(RuntimeError, match="injected fault"):
        train_small(checkpoint=path, checkpoint_every=12, fault=(0, 14, "raise"))
    with np.load(path) as z:
        position = json.loads(str(z["position"][()]))
    assert position["epoch"] == 1 and position["epoch_seconds"] > 0
    resumed = train_small(resume=path)
    assert resumed.history[1]["seconds"] > position["epoch_seconds"]
