"""Tests for dptrain.data.transforms: nearest-neighbour up-scaling of images and data sets."""

import dataclasses

import numpy as np
import pytest

from dptrain.data import (
    synthetic_binary,
    synthetic_classification,
    upscale_dataset,
    upscale_images,
)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("factor", [1, 2, 4])
def test_upscale_images_repeats_each_pixel(dtype, factor):
    n = 1500  # more than one chunk
    x = np.random.default_rng(0).random((n, 784)).astype(dtype)
    up = upscale_images(x, factor)
    side = 28 * factor
    assert up.shape == (n, side * side) and up.dtype == dtype and up.flags.c_contiguous
    img = x.reshape(n, 28, 28)
    img_up = up.reshape(n, 28, factor, 28, factor)
    for a in range(factor):
        for b in range(factor):
            np.testing.assert_array_equal(img_up[:, :, a, :, b], img)
    np.testing.assert_array_equal(up.reshape(n, side, side)[:, ::factor, ::factor], img)


def test_upscale_images_factor_2_pixel_positions():
    x = np.arange(2 * 784, dtype=np.float32).reshape(2, 784)
    up = upscale_images(x, 2).reshape(2, 56, 56)
    img = x.reshape(2, 28, 28)
    i, j = np.meshgrid(np.arange(28), np.arange(28), indexing="ij")
    for da in (0, 1):
        for db in (0, 1):
            np.testing.assert_array_equal(up[:, 2 * i + da, 2 * j + db], img[:, i, j])


def test_upscale_images_other_side_and_errors():
    x = np.arange(9, dtype=np.float64).reshape(1, 9)
    np.testing.assert_array_equal(
        upscale_images(x, 3, side=3).reshape(9, 9), np.kron(x.reshape(3, 3), np.ones((3, 3)))
    )
    with pytest.raises(ValueError, match=r"x has shape \(1, 9\), expected \(n, 784\)"):
        upscale_images(x, 2)
    with pytest.raises(ValueError, match=r"factor=0 must be >= 1"):
        upscale_images(x, 0, side=3)


def test_upscale_dataset():
    # MNIST's layout: 50 / 20 images of (1, 28, 28)
    ds = dataclasses.replace(
        synthetic_classification(50, n_test=20), name="mnist", input_shape=(1, 28, 28)
    )
    up = upscale_dataset(ds, 2)
    assert up.x_train.shape == (50, 3136) and up.x_test.shape == (20, 3136)
    assert up.n_features == 3136 and up.name == "mnist-x2"
    assert ds.input_shape == (1, 28, 28) and up.input_shape == (1, 56, 56)
    assert upscale_dataset(synthetic_binary(100, 16), 2).input_shape == (64,)
    np.testing.assert_array_equal(up.y_train, ds.y_train)
    with pytest.raises(ValueError, match=r"n_features=20 is not a square image"):
        upscale_dataset(synthetic_binary(100, 20), 2)
