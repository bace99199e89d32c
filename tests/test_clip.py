"""Gradient clipping by global norm (TrainConfig's clip_norm, engine.clip.GradClip): the
step's norm is the exchanged gradient's, so N workers clip as one (the same bits in
--deterministic on 1, 2 and 4 workers, threads and processes; within rounding on the other
exchanges, the sharded update's slices included); the coefficient is torch's; the result and
the CLI say how often it clipped; bad values are refused by name. (Against
torch.nn.utils.clip_grad_norm_ over 200 steps: tests/test_adam_torch.py.)"""

import math

import numpy as np
import pytest
from _runs import SMALL, as_flags

import dptrain
from dptrain.cli import main
from dptrain.config import TrainConfig
from dptrain.engine.clip import EPS, GradClip


def test_the_coefficient_is_torchs_and_the_gradient_is_left_alone():
    g = np.arange(1, 9, dtype=np.float32)
    norm = math.sqrt(float((g.astype(np.float64) ** 2).sum()))
    clip = GradClip(2.0)
    out = clip(g)
    assert out is not g and np.array_equal(g, np.arange(1, 9, dtype=np.float32))
    assert np.array_equal(out, g * np.float32(2.0 / (norm + EPS)))
    assert clip(g * 0.01) is not out  # short enough: the gradient itself
    assert clip.record() == dict(
        max_norm=2.0,
        steps=2,
        clipped_steps=1,
        norm_median=pytest.approx((norm + 0.01 * norm) / 2),
        norm_max=pytest.approx(norm),
    )
    assert clip(np.full(4, np.nan, np.float32)).dtype == np.float32  # a NaN is not clipped


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_n_workers_clip_as_one_bit_for_bit(backend):
    opts = dict(SMALL, clip_norm=0.33, deterministic=True, backend=backend)
    runs = [dptrain.train(**opts, workers=w) for w in (1, 2, 4)]
    clip = runs[0]["grad_clip"]
    assert 0 < clip["clipped_steps"] < clip["steps"] == 22  # it clipped some steps
    for r in runs[1:]:
        assert np.array_equal(r["params"], runs[0]["params"])
        assert r["grad_clip"] == clip
    unclipped = dptrain.train(**dict(opts, clip_norm=None), workers=2)
    assert not np.array_equal(unclipped["params"], runs[0]["params"])
    assert unclipped["grad_clip"] is None


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(shard_update=True, backend="process"),
        dict(overlap=True, bucket_kb=64),
        dict(optimizer="adam", lr=1e-3),
        dict(allreduce="ps"),
    ],
    ids=["allreduce", "sharded", "overlap", "adam", "ps"],
)
def test_every_exchange_clips_the_global_gradient(options):
    opts = {**SMALL, "clip_norm": 0.33, "backend": "thread", **options}
    one = dptrain.train(
        **dict(opts, workers=1, shard_update=False, overlap=False, bucket_kb=0, allreduce="native")
    )
    two = dptrain.train(**opts, workers=2)
    scale = np.abs(one["params"]).max()
    assert np.abs(two["params"] - one["params"]).max() <= 1e-5 * scale
    assert two["grad_clip"]["clipped_steps"] == one["grad_clip"]["clipped_steps"] > 0
    assert one["grad_clip"]["clipped_steps"] < 22


def test_local_sgd_clips_each_replicas_gradient():
    opts = dict(SMALL, clip_norm=0.33, sync_every=3, replicas=4, backend="thread")
    runs = [dptrain.train(**opts, workers=w) for w in (1, 2, 4)]
    for r in runs[1:]:
        assert np.array_equal(r["params"], runs[0]["params"])
    # the record is the first replica's, whoever runs it: the same on any number of workers
    assert runs[0]["grad_clip"]["steps"] == 22 and runs[0]["grad_clip"]["clipped_steps"] > 0
    assert runs[1]["grad_clip"] == runs[2]["grad_clip"] == runs[0]["grad_clip"]


def test_one_step_periods_with_clipping_or_adam_stay_local_sgd():
    """An average every step is synchronous SGD only for SGD's linear update without a
    per-replica clip: Adam's moments of the mean are not the mean of its moments."""
    assert not TrainConfig(sync_every=1, replicas=4).local
    assert TrainConfig(sync_every=1, replicas=4, optimizer="adam").local
    assert TrainConfig(sync_every=1, replicas=4, clip_norm=0.5).local
    assert not TrainConfig(sync_every=1, clip_norm=0.5).local  # no replicas asked for
    # and a JSON round trip of a config (betas as a list) is the same config
    import json
    from dataclasses import asdict

    again = TrainConfig(**json.loads(json.dumps(asdict(TrainConfig(optimizer="adam")))))
    assert again.betas == (0.9, 0.999)
    assert TrainConfig(optimizer="sgd", betas=[0.9, 0.999]).optimizer == "sgd"


def test_a_clipped_sgd_step_is_lr_times_the_scaled_gradient():
    model = dptrain.MLP((6, 5, 3), seed=0)
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    y = np.arange(8) % 3
    model.zero_grad()
    model.loss_grad(x, y)
    g = model.grads.copy()
    before = model.params.copy()
    norm = math.sqrt(float((g.astype(np.float64) ** 2).sum()))
    opt = dptrain.SGD(model, lr=0.5)
    opt.step(grads=GradClip(norm / 4)(model.grads))
    coef = np.float32((norm / 4) / (norm + EPS))
    np.testing.assert_allclose(model.params, before - np.float32(0.5) * (g * coef), rtol=1e-6)


def test_the_cli_says_how_often_it_clipped(capsys):
    loud = {k: v for k, v in SMALL.items() if k != "quiet"}
    assert main(["train", *as_flags(loud), "--clip-norm", "0.3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "gradient clipping at norm 0.3: " in out and " steps clipped (" in out


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "x"])
def test_bad_clip_norms_are_refused_by_name(bad):
    with pytest.raises((ValueError, TypeError), match="clip_norm"):
        TrainConfig(clip_norm=bad)


def test_a_checkpoint_resumes_only_with_its_clip_norm(tmp_path):
    from dptrain.comm import WorkerError

    opts = dict(SMALL, clip_norm=0.33, workers=2, backend="thread", deterministic=True)
    whole = dptrain.train(**opts)
    ckpt = tmp_path / "run.npz"
    with pytest.raises((WorkerError, RuntimeError), match="injected fault"):
        dptrain.train(**opts, checkpoint=ckpt, fault=(1, 15, "raise"))
    for other in (1.0, None):
        with pytest.raises(
            ValueError, match=f"with clip_norm=0.33, but this run has clip_norm={other}"
        ):
            dptrain.train(**dict(opts, clip_norm=other), resume=ckpt)
    resumed = dptrain.train(**opts, resume=ckpt)
    assert np.array_equal(resumed["params"], whole["params"])
