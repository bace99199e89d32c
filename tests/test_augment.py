"""Image augmentation (TrainConfig's augment; _core.augment_images, csrc/dp_common.c): the
kernel against its NumPy twin (a random crop of the zero-padded image, then a left-right
mirror by a coin), bit for bit; the draw is the sample's (seed, epoch, index), whatever batch
or position it is in, and covers every offset and both sides of the coin; in training, N
workers give the same bits as one in --deterministic, evaluation sees the images as they
are, a checkpoint resumes only with its augmentation; bad specs and inputs are refused by
name."""

import numpy as np
import pytest
from _core_helpers import DTYPES, dname, family_tests, rng_for
from _runs import as_flags

import dptrain
from dptrain import _core as core
from dptrain import reference as ref
from dptrain.cli import main
from dptrain.config import TrainConfig
from dptrain.reference.buffers import augment_draw


def _both(x, ids, **kw):
    mine, theirs = np.full_like(x, np.nan), np.full_like(x, np.nan)
    core.augment_images(x, mine, ids, **kw)
    ref.augment_images(x, theirs, ids, **kw)
    return mine, theirs


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize(
    "shape,pad,flip",
    [
        ((1, 28, 28), 4, True),
        ((3, 32, 32), 4, True),
        ((2, 5, 7), 2, False),
        ((1, 6, 6), 5, True),
        ((3, 8, 8), 1, False),
    ],
)
def test_the_kernel_is_its_twin_bit_for_bit(shape, pad, flip, dtype):
    rng = rng_for("augment", shape, pad, flip, dname(dtype))
    x = rng.standard_normal((50, int(np.prod(shape)))).astype(dtype)
    ids = rng.integers(0, 2**62, 50)
    mine, theirs = _both(x, ids, shape=shape, pad=pad, flip=flip, seed=123, epoch=4)
    np.testing.assert_array_equal(mine, theirs)


def test_a_samples_draw_is_its_own_whatever_its_batch():
    shape = (1, 6, 6)
    x = np.arange(36 * 10, dtype=np.float32).reshape(10, 36)
    ids = np.arange(100, 110)
    full = np.empty_like(x)
    core.augment_images(x, full, ids, shape=shape, pad=2, flip=True, seed=5, epoch=1)
    for i in (0, 4, 9):  # alone, at another position
        one = np.empty_like(x[:1])
        core.augment_images(
            x[i : i + 1], one, ids[i : i + 1], shape=shape, pad=2, flip=True, seed=5, epoch=1
        )
        np.testing.assert_array_equal(one[0], full[i])
    other = np.empty_like(x)
    core.augment_images(x, other, ids, shape=shape, pad=2, flip=True, seed=5, epoch=2)
    assert not np.array_equal(other, full)  # another epoch, other draws


def test_the_draws_cover_every_offset_and_both_sides():
    draws = [augment_draw(3, 0, i, 4) for i in range(4000)]
    oy, ox, coin = (np.array(d) for d in zip(*draws))
    assert set(oy) == set(ox) == set(range(9))
    assert 0.45 < coin.mean() < 0.55
    # an offset of pad is no shift: with pad 0 and no flip, the image itself
    x = np.random.default_rng(0).standard_normal((5, 48)).astype(np.float32)
    same = np.empty_like(x)
    core.augment_images(x, same, np.arange(5), shape=(3, 4, 4), pad=0, seed=0, epoch=0)
    np.testing.assert_array_equal(same, x)


def test_a_flipped_unshifted_image_is_its_mirror():
    x = np.arange(2 * 3 * 5, dtype=np.float64).reshape(1, -1)
    for sample in range(200):
        oy, ox, coin = augment_draw(9, 0, sample, 1)
        if coin and oy == ox == 1:  # flipped, no shift
            out = np.empty_like(x)
            core.augment_images(
                x, out, np.array([sample]), shape=(2, 3, 5), pad=1, flip=True, seed=9, epoch=0
            )
            np.testing.assert_array_equal(out.reshape(2, 3, 5), x.reshape(2, 3, 5)[:, :, ::-1])
            return
    pytest.fail("no sample of 200 drew a flip without a shift")


@pytest.mark.boundary
@pytest.mark.parametrize(
    "kwargs,error,fragment",
    [
        (dict(shape=(1, 3, 5)), ValueError, r"x has 12 values a row, but shape \(1, 3, 5\) has 15"),
        (dict(shape=(1, 3)), ValueError, r"shape must be a tuple \(C, H, W\)"),
        (dict(shape=(0, 3, 4)), ValueError, r"shape must be a tuple \(C, H, W\)"),
        (dict(pad=3), ValueError, "pad must be >= 0 and smaller than the image's 3 x 4, got 3"),
        (dict(pad=-1), ValueError, "pad must be >= 0"),
        (dict(seed=1.5), TypeError, "seed and epoch must be ints"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, error, fragment):
    x, out = np.ones((2, 12), np.float32), np.zeros((2, 12), np.float32)
    args = {**dict(shape=(1, 3, 4), pad=1, flip=True, seed=1, epoch=0), **kwargs}
    with pytest.raises(error, match=fragment):
        core.augment_images(x, out, np.arange(2), **args)
    assert not out.any()  # nothing written
    with pytest.raises(ValueError, match=r"ids has shape \(3,\), expected \(2,\)"):
        core.augment_images(x, out, np.arange(3), shape=(1, 3, 4), pad=1, seed=1, epoch=0)


globals().update(family_tests(("augment_images",), gil=("augment_images",)))


# ---------------------------------------------------------------------------------------
# in training

# MNIST where it is found (else its synthetic stand-in), a few hundred images
CNN = dict(
    model="cnn",
    dataset="mnist",
    limit=400,
    epochs=2,
    batch_size=50,
    quiet=True,
    progress=False,
)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_n_workers_augment_as_one(backend):
    opts = dict(CNN, augment="crop3,flip", deterministic=True, backend=backend)
    runs = [dptrain.train(**opts, workers=w) for w in (1, 2, 4)]
    for r in runs[1:]:
        assert np.array_equal(r["params"], runs[0]["params"])
    plain = dptrain.train(**dict(opts, augment=None), workers=1)
    assert not np.array_equal(plain["params"], runs[0]["params"])
    # evaluation sees the test images as they are: the result's accuracy is the model's own
    # on the raw test set
    from dptrain.engine.data import load_data

    data = load_data(
        TrainConfig(**{k: v for k, v in CNN.items() if k != "progress"}), None, None, None
    )
    _, acc = runs[0].model.evaluate(data.x_test, data.y_test)
    assert acc == runs[0]["final_test_accuracy"]


def test_a_checkpoint_resumes_only_with_its_augmentation(tmp_path):
    from dptrain.comm import WorkerError

    opts = dict(CNN, augment="crop2", workers=2, backend="thread", deterministic=True)
    whole = dptrain.train(**opts)
    ckpt = tmp_path / "run.npz"
    with pytest.raises((WorkerError, RuntimeError), match="injected fault"):
        dptrain.train(**opts, checkpoint=ckpt, fault=(1, 15, "raise"))
    with pytest.raises(ValueError, match="with augment='crop2', but this run has augment=None"):
        dptrain.train(**dict(opts, augment=None), resume=ckpt)
    resumed = dptrain.train(**opts, resume=ckpt)
    assert np.array_equal(resumed["params"], whole["params"])


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(augment="crop0"), "'crop0' is not cropP"),
        (dict(augment="rotate,flip"), "'rotate' is not cropP"),
        (dict(augment=4), "augment must be a string"),
        (dict(augment="flip,crop2,flip"), "'flip,crop2,flip': flip is given twice"),
        (dict(augment="crop2,crop4"), "'crop2,crop4': crop is given twice"),
    ],
)
def test_bad_specs_are_refused_by_name(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        TrainConfig(**kwargs)


def test_a_model_without_images_or_too_much_padding_is_refused():
    with pytest.raises(ValueError, match=r"needs images, a model whose input is \(C, H, W\)"):
        dptrain.train(
            model="mlp", dataset="synthetic", n_samples=100, epochs=1, quiet=True, augment="flip"
        )
    with pytest.raises(ValueError, match="a crop padding of 28 pixels is not smaller"):
        dptrain.train(**dict(CNN, augment="crop28"))


def test_the_cli_takes_augment(capsys):
    loud = {k: v for k, v in CNN.items() if k not in ("quiet", "progress")}
    assert main(["train", *as_flags(loud), "--augment", "crop2,flip", "--no-progress"]) == 0
