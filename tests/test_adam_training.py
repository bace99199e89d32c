"""Adam and AdamW in the engine: TrainConfig's optimizer, betas and eps (checked by name, the
other optimizer's options refused), the CLI's flags, dptrain.fit, N workers equal to one
(deterministic mode, bit for bit), and a resumed run equal to an uninterrupted one, bit for
bit, on the thread and process transports."""

import numpy as np
import pytest
from _runs import SMALL

import dptrain
from dptrain import cli
from dptrain import comm as parallel
from dptrain.config import TrainConfig

ADAM = dict(optimizer="adam", lr=0.01)


@pytest.fixture(scope="module")
def adam_one(train_small):
    """SMALL with Adam on one worker, deterministic mode: what any world size must equal."""
    return train_small(**ADAM, deterministic=True)


# ---------------------------------------------------------------- the options
def test_the_default_is_still_sgd_and_the_defaults_are_pytorchs():
    c = TrainConfig()
    assert (c.optimizer, c.lr, c.betas, c.eps) == ("sgd", 0.1, (0.9, 0.999), 1e-8)
    assert TrainConfig(optimizer="adam").lr == 1e-3  # PyTorch's default for Adam
    assert TrainConfig(optimizer="adamw", lr=0.5).lr == 0.5
    # PyTorch's AdamW decays by default, its Adam and SGD do not
    assert TrainConfig().weight_decay == TrainConfig(optimizer="adam").weight_decay == 0.0
    assert TrainConfig(optimizer="adamw").weight_decay == 1e-2
    assert TrainConfig(optimizer="adamw", weight_decay=0).weight_decay == 0.0
    assert TrainConfig(optimizer="adam", betas=[0.8, 0.99]).betas == (0.8, 0.99)


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(optimizer="lamb"), r"optimizer is 'lamb', expected one of \('sgd', 'adam'"),
        (dict(optimizer="rmsprop", betas=(0.8, 0.9)), "betas=.* is adam and adamw's"),
        (dict(optimizer="rmsprop", nesterov=True), "nesterov=True is not an option of optim"),
        (dict(optimizer="adam", rms_alpha=0.9), "rms_alpha=0.9 is not an option of optimizer="),
        (dict(centered=True), "centered=True is not an option of optimizer='sgd'"),
        (dict(optimizer="rmsprop", rms_alpha=1.5), r"alpha must be in \[0, 1\), got 1.5"),
        (dict(optimizer="rmsprop", rms_alpha=1), r"alpha must be in \[0, 1\), got 1: at 1 the"),
        (dict(optimizer="rmsprop", eps=0), "eps must be > 0, got 0: a parameter whose gradient"),
        (dict(optimizer="rmsprop", momentum=1.0), r"momentum must be in \[0, 1\)"),
        (dict(optimizer="adam", momentum=0.5), "momentum=0.5 is not an option of optimizer='adam'"),
        (dict(optimizer="adamw", nesterov=True), "nesterov=True is not an option of optimizer="),
        (dict(optimizer="adam", dampening=0.1), "dampening=0.1 is not an option of optimizer="),
        (dict(betas=(0.8, 0.9)), r"betas=\(0.8, 0.9\) is not an option of optimizer='sgd'"),
        (dict(eps=1e-6), "eps=1e-06 is not an option of optimizer='sgd'"),
        (dict(optimizer="adam", betas=(0.9, 1.0)), r"betas\[1\] must be a number in \[0, 1\)"),
        (dict(optimizer="adam", betas=0.9), "betas must be a pair"),
        (dict(optimizer="adam", eps=-1.0), "eps must be a finite number >= 0"),
    ],
)
def test_bad_optimizer_options_are_refused_by_name(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        TrainConfig(**kwargs)


def test_cli_flags(tmp_path, capsys):
    out = tmp_path / "r.json"
    flags = ["train", "--model", "softmax", "--dataset", "synthetic", "--n-samples", "600"]
    flags += ["--epochs", "1", "--quiet", "--out", str(out)]
    rc = cli.main(flags + ["--optimizer", "adamw", "--betas", "0.8", "0.99", "--eps", "1e-6"])
    assert rc == 0, capsys.readouterr().err
    import json

    config = json.loads(out.read_text())["config"]
    assert (config["optimizer"], config["betas"], config["eps"]) == ("adamw", [0.8, 0.99], 1e-6)
    assert cli.main(flags + ["--optimizer", "adam", "--nesterov"]) == 1
    assert "--nesterov is not an option of --optimizer adam" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(flags + ["--optimizer", "adam", "--betas", "0.9", "x"])
    assert exit_info.value.code == 2
    assert "--betas takes two numbers in [0, 1), got 'x'" in capsys.readouterr().err


# ---------------------------------------------------------------- training
@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_fit_with_adam_trains(optimizer):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 8))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    model = dptrain.MLP((8, 16, 2), seed=0)
    r = dptrain.fit(model, X, y, optimizer=optimizer, lr=0.01, batch_size=32, epochs=4, quiet=True)
    losses = [h["train_loss"] for h in r.history]
    assert losses[-1] < 0.8 * losses[0], losses


def test_the_optimizer_changes_the_run(train_small, adam_one):
    """optimizer= reaches the loop: the same run with SGD (its own learning rate) and AdamW
    (decoupled decay) ends elsewhere."""
    sgd = train_small(deterministic=True)
    adamw = train_small(optimizer="adamw", lr=0.01, weight_decay=0.1, deterministic=True)
    assert not np.array_equal(adam_one["params"], sgd["params"])
    assert not np.array_equal(adam_one["params"], adamw["params"])


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("workers", [2, 3])
def test_adam_weights_are_bitwise_identical_for_any_world_size(
    train_small, adam_one, backend, workers
):
    r = train_small(**ADAM, deterministic=True, workers=workers, backend=backend)
    assert np.array_equal(r["params"], adam_one["params"]), (
        f"{backend} x {workers}: max difference {np.abs(r['params'] - adam_one['params']).max()}"
    )


def test_adam_on_two_workers_is_the_same_model(train_small, adam_one):
    """Without deterministic mode the sums round in another order: close, not equal."""
    r = train_small(**ADAM, workers=2, backend="thread")
    np.testing.assert_allclose(r["params"], adam_one["params"], rtol=0, atol=1e-4)


# ---------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_a_resumed_adam_run_ends_bitwise_equal_to_an_uninterrupted_one(
    train_small, tmp_path, backend, workers, optimizer
):
    """The second moment is in the checkpoint: without it the resumed steps would divide by
    a fresh (zero) second moment and the weights would differ."""
    kw = dict(ADAM, optimizer=optimizer, workers=workers, backend=backend, weight_decay=0.01)
    whole = train_small(**kw)
    ckpt = tmp_path / "run.ckpt.npz"
    # 11 steps per epoch: die in the second epoch, after the checkpoint of step 15
    with pytest.raises((parallel.WorkerError, RuntimeError), match="injected fault"):
        train_small(checkpoint=ckpt, checkpoint_every=5, fault=(0, 17, "raise"), **kw)
    with np.load(ckpt) as f:
        assert "optimizer_exp_avg_sq" in f.files
    resumed = train_small(resume=ckpt, **kw)
    assert np.array_equal(resumed["params"], whole["params"])
    assert resumed["train_loss"] == pytest.approx(whole["train_loss"], rel=1e-6)


def test_resume_refuses_another_optimizers_checkpoint(train_small, tmp_path):
    sgd, adam = tmp_path / "sgd.npz", tmp_path / "adam.npz"
    train_small(checkpoint=sgd, checkpoint_every=3, epochs=1, lr=ADAM["lr"])
    train_small(**ADAM, checkpoint=adam, checkpoint_every=3, epochs=1)
    with pytest.raises(ValueError, match="optimizer='sgd', but this run has optimizer='adam'"):
        train_small(**ADAM, resume=sgd, epochs=1)
    with pytest.raises(ValueError, match="optimizer='adam', but this run has optimizer='sgd'"):
        train_small(resume=adam, epochs=1, lr=ADAM["lr"])
    with pytest.raises(
        ValueError, match=r"betas=\[0.9, 0.999\], but this run has betas=\[0.9, 0.9"
    ):
        train_small(**ADAM, betas=(0.9, 0.99), resume=adam, epochs=1)


def test_a_checkpoint_without_the_optimizer_key_is_an_sgd_run(train_small, tmp_path):
    """Checkpoints written before the optimizer option (no 'optimizer' among their resume
    keys) were SGD's: an SGD run still resumes them."""
    import json

    ckpt = tmp_path / "old.npz"
    train_small(checkpoint=ckpt, checkpoint_every=5, epochs=1, lr=ADAM["lr"])
    with np.load(ckpt) as f:
        arrays = {k: f[k] for k in f.files}
    position = json.loads(str(arrays["position"]))
    del position["job"]["optimizer"]
    arrays["position"] = np.array(json.dumps(position))
    np.savez(ckpt, **arrays)
    train_small(resume=ckpt, epochs=1, lr=ADAM["lr"])
    with pytest.raises(ValueError, match="optimizer='sgd', but this run has optimizer='adam'"):
        train_small(**ADAM, resume=ckpt, epochs=1)


def test_a_checkpoint_with_a_damaged_second_moment_is_refused(train_small, tmp_path):
    ckpt = tmp_path / "c.npz"
    train_small(**ADAM, checkpoint=ckpt, checkpoint_every=5, epochs=1)
    with np.load(ckpt) as f:
        arrays = {k: f[k] for k in f.files}
    assert arrays["optimizer_steps"] == 10  # the optimizer's count: the position's here
    for name, bad, fragment in (
        (
            "exp_avg_sq",
            arrays["optimizer_exp_avg_sq"][:-1],
            r"optimizer_exp_avg_sq has dtype float32",
        ),
        ("exp_avg_sq", np.full_like(arrays["optimizer_exp_avg_sq"], np.nan), "non-finite"),
        ("steps", np.int64(9), "the optimizer's step count 9 is impossible at step 10"),
        ("steps", np.float64(10), "step count 10.0 is impossible"),
    ):
        np.savez(ckpt, **{**arrays, "optimizer_" + name: bad})
        with pytest.raises(ValueError, match=f"checkpoint {ckpt}.*" + fragment):
            train_small(**ADAM, resume=ckpt, epochs=1)
    del arrays["optimizer_exp_avg_sq"]
    np.savez(ckpt, **arrays)
    with pytest.raises(ValueError, match=r"checkpoint .*no 'optimizer_exp_avg_sq' array"):
        train_small(**ADAM, resume=ckpt, epochs=1)


def test_small_still_trains_sgd():
    """_runs.SMALL (every other engine test's run) names no optimizer: SGD, momentum 0.9."""
    assert "optimizer" not in SMALL and TrainConfig(**SMALL).optimizer == "sgd"


# ---------------------------------------------------------------- fit, continued
def _blobs(n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 8))
    return X, (X[:, 0] + X[:, 1] > 0).astype(int)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("workers,backend", [(1, "thread"), (2, "process")])
def test_fit_continues_the_optimizer_bitwise(optimizer, workers, backend):
    """Two fits of one epoch each, the second given the first's optimizer_state, end with
    the bits of one fit of two epochs (constant rate, deterministic mode, no shuffle: each
    fit's first epoch has the first epoch's order): the step count, the moments and the
    velocity carry over."""
    X, y = _blobs()
    kw = dict(
        optimizer=optimizer,
        lr=0.01,
        batch_size=64,
        lr_schedule="constant",
        shuffle=False,
        deterministic=True,
        quiet=True,
        workers=workers,
        backend=backend,
        **({} if optimizer == "sgd" else {"weight_decay": 0.01}),
    )
    whole = dptrain.MLP((8, 16, 2), seed=0)
    r = dptrain.fit(whole, X, y, epochs=2, **kw)
    assert r.optimizer_state["steps"] == 2 * 7  # 400 samples, batches of 64
    part = dptrain.MLP((8, 16, 2), seed=0)
    first = dptrain.fit(part, X, y, epochs=1, **kw)
    second = dptrain.fit(part, X, y, epochs=1, optimizer_state=first.optimizer_state, **kw)
    assert second.optimizer_state["steps"] == 2 * 7
    np.testing.assert_array_equal(part.params, whole.params)
    restarted = dptrain.MLP((8, 16, 2), seed=0)
    dptrain.fit(restarted, X, y, epochs=1, **kw)
    dptrain.fit(restarted, X, y, epochs=1, **kw)  # a new optimizer: not the same run
    assert not np.array_equal(restarted.params, whole.params)
    assert "optimizer_state" not in r.to_json()


def test_fit_refuses_an_optimizer_state_that_does_not_fit():
    X, y = _blobs(100)
    model = dptrain.MLP((8, 16, 2), seed=0)
    adam = dptrain.fit(model, X, y, optimizer="adam", epochs=1, batch_size=50, quiet=True)
    with pytest.raises(ValueError, match=r"optimizer_state does not fit optimizer='sgd'"):
        dptrain.fit(
            model, X, y, epochs=1, batch_size=50, quiet=True, optimizer_state=adam.optimizer_state
        )
    with pytest.raises(ValueError, match=r"optimizer_state does not fit optimizer='adam'.*shape"):
        dptrain.fit(
            dptrain.MLP((8, 4, 2)),
            X,
            y,
            optimizer="adam",
            epochs=1,
            batch_size=50,
            quiet=True,
            optimizer_state=adam.optimizer_state,
        )
