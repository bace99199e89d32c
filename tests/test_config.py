"""The run's configuration (dptrain.config.TrainConfig): every bad value is refused before
any work with a message naming the option, and what depends on the number of workers is
checked against it."""

import pytest

import dptrain
from dptrain import TrainConfig, cli


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(workers=4, batch_size=3), "batch_size=3 is smaller than workers=4"),
        (dict(workers=2, backend="carrier-pigeon"), "backend is 'carrier-pigeon'"),
        (dict(workers=0), "workers must be a positive integer"),
        (dict(fault=(0, 1, "kill"), workers=2, backend="thread"), "use backend='process'"),
        (dict(timeout=-1.0), "timeout must be"),
    ],
)
def test_bad_configurations_are_rejected(train_small, kw, match):
    with pytest.raises(ValueError, match=match):
        train_small(**kw)


def test_deterministic_mode_limits_the_world_size(train_small):
    with pytest.raises(ValueError, match="up to 8 workers"):
        train_small(deterministic=True, workers=9, backend="thread")


def test_overlap_rejects_combinations_it_cannot_run(train_small):
    with pytest.raises(ValueError, match="overlap works with allreduce='native'"):
        train_small(workers=2, backend="thread", overlap=True, allreduce="ps")
    with pytest.raises(ValueError, match="overlap works with"):
        train_small(overlap=True, deterministic=True)


@pytest.mark.mpi
def test_mpi_workers_must_match_the_world_size(train_small):
    with pytest.raises(ValueError, match="mpiexec -n 2"):
        train_small(workers=2, backend="mpi")


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(epochs=0), "epochs must be a positive integer"),
        (dict(batch_size=-1), "batch_size must be a positive integer"),
        (dict(model="resnet"), "model is 'resnet'"),
        (dict(dtype="float16"), "dtype is 'float16'"),
        (dict(lr_schedule="linear"), "lr_schedule is 'linear'"),
        (dict(dataset="imagenet"), "imagenet"),
        (dict(lr=-1.0), "lr must be"),
    ],
)
def test_bad_arguments_are_named(train_small, kw, match):
    args = dict(model="softmax", dataset="synthetic", n_samples=500, epochs=1)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        train_small(**args)


def test_a_fault_past_the_runs_end_is_refused_not_left_to_never_happen(train_small):
    """An injected fault is a test of a failure: one at a step the run never reaches would
    let that test pass silently. The step after the last (the run's end) is allowed."""
    args = dict(model="softmax", dataset="synthetic", n_samples=500, epochs=1, batch_size=100)
    with pytest.raises(ValueError, match=r"fault is at step 6, but the run has 5 steps"):
        train_small(**args, workers=2, fault=(1, 6, "raise"))
    with pytest.raises(RuntimeError, match="injected fault"):
        train_small(**args, workers=2, backend="thread", fault=(1, 5, "raise"))


def test_what_the_number_of_workers_makes_impossible_is_named():
    TrainConfig(straggle=(3, 1.0)).check_world(4, "thread")
    with pytest.raises(ValueError, match=r"0 <= rank < workers=2"):
        TrainConfig(straggle=(3, 1.0)).check_world(2, "thread")
    with pytest.raises(ValueError, match="fault names rank 2, but there are 2 workers"):
        TrainConfig(fault=(2, 1, "raise")).check_world(2, "thread")
    TrainConfig(deterministic=True).check_world(3, "thread")
    TrainConfig(deterministic=True).check_world(3, "mpi")  # (MPI's uneven gather)
    with pytest.raises(ValueError, match="up to 8 workers, got an MPI world of 9 ranks"):
        TrainConfig(deterministic=True).check_world(9, "mpi")
    with pytest.raises(ValueError, match="batch_size=4 is smaller than workers=8"):
        TrainConfig(batch_size=4).check_world(8, "thread")
    TrainConfig(batch_size=None, batch_per_worker=1).check_world(8, "thread")  # 8 in all
    with pytest.raises(ValueError, match="use backend='process'"):
        TrainConfig(fault=(0, 1, "kill")).check_world(2, "thread")


@pytest.mark.parametrize("how", ["train", "cli"])
def test_a_run_validates_its_configuration_once(monkeypatch, how):
    """The CLI's config is the run's (no round trip through keyword arguments); train builds
    one from its keywords; nothing rebuilds it for the number of workers."""
    built = []
    original = TrainConfig.__post_init__

    def counting(self):
        built.append(self)
        original(self)

    monkeypatch.setattr(TrainConfig, "__post_init__", counting)
    args = dict(
        model="softmax",
        dataset="synthetic",
        n_samples=300,
        epochs=1,
        batch_size=50,
        workers=2,
        backend="thread",
        scale_lr=True,
        quiet=True,
    )
    if how == "train":
        dptrain.train(**args)
    else:
        assert (
            cli.main(
                [
                    "train",
                    "--model",
                    "softmax",
                    "--dataset",
                    "synthetic",
                    "--n-samples",
                    "300",
                    "--epochs",
                    "1",
                    "--batch-size",
                    "50",
                    "--workers",
                    "2",
                    "--backend",
                    "thread",
                    "--scale-lr",
                    "--quiet",
                ]
            )
            == 0
        )
    assert len(built) == 1
