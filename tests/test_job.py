"""What the number of workers settles, once, into a run's Job (dptrain.engine.job): the
global batch of weak scaling, the scaled learning rate, the warm-up in steps."""

import numpy as np
import pytest

from dptrain import TrainConfig
from dptrain.engine import Job
from dptrain.models import named_spec


def test_batch_per_worker_is_the_global_batch_split(train_small, sequential):
    r = train_small(workers=2, backend="thread", batch_size=None, batch_per_worker=50)
    assert r["config"]["batch_size"] == 100
    np.testing.assert_allclose(r["params"], sequential["params"], atol=1e-5)


def test_scale_lr_and_warmup(train_small):
    a = train_small(workers=2, backend="thread", lr=0.025, scale_lr=True, lr_schedule="constant")
    b = train_small(workers=2, backend="thread", lr=0.05, lr_schedule="constant")
    assert a["config"]["lr"] == pytest.approx(0.05) and a["config"]["base_lr"] == 0.025
    np.testing.assert_array_equal(a["params"], b["params"])
    w = train_small(warmup_epochs=1.0, lr_schedule="constant")
    assert w["job"]["warmup_steps"] == 11  # one epoch of 1030 / 100 batches
    assert not np.array_equal(w["params"], b["params"])
    with pytest.raises(ValueError, match="warmup_epochs must be"):
        train_small(warmup_epochs=float("nan"))


def test_the_job_settles_what_the_number_of_workers_decides_once():
    cfg = TrainConfig(
        batch_size=None,
        batch_per_worker=32,
        lr=0.1,
        scale_lr=True,
        warmup_epochs=0.5,
        epochs=1,
        deterministic=True,
        checkpoint="c.npz",
        checkpoint_every=3,
    )
    job = Job.plan(cfg, named_spec("mlp", 12, 3, hidden=(8,)), world=4, n_train=1000)
    assert job.config is cfg  # the options as validated, not rebuilt
    assert (job.world, job.batch_size, job.lr) == (4, 128, pytest.approx(0.4))
    assert job.warmup_steps == 4  # half of ceil(1000 / 128) = 8 steps
    assert job.deterministic and job.checkpoint_every == 3
    # one of the uncoupled workers of the contention ceiling: a plain 1-worker run with a
    # quarter of the batch, the same learning rate and warm-up
    one = job.uncoupled()
    assert (one.world, one.batch_size, one.lr, one.warmup_steps) == (1, 32, job.lr, 4)
    assert not one.deterministic and one.checkpoint_every == 0 and one.resume is None
