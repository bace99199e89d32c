"""Tests for dptrain.data.synthetic: shapes, determinism, learnability, bounded memory."""

import tracemalloc

import numpy as np
import pytest

from dptrain.data import synthetic_binary, synthetic_cifar10, synthetic_classification

# ---------------------------------------------------------------------------------------
# synthetic_binary and synthetic_classification
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_synthetic_binary_shapes_dtype_and_labels(dtype):
    ds = synthetic_binary(20_000, 13, seed=3, dtype=dtype)
    assert ds.x_train.shape == (20_000, 13) and ds.x_test.shape == (2000, 13)
    assert ds.x_train.dtype == dtype and ds.x_test.dtype == dtype
    assert ds.x_train.flags.c_contiguous
    assert ds.y_train.dtype == np.int64 and ds.n_classes == 2 and ds.n_features == 13
    w = ds.true_weights
    assert w.shape == (13,)
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        margin = x.astype(np.float64) @ w
        decided = np.abs(margin) > 1e-9  # a different summation order may flip only ties
        np.testing.assert_array_equal(y[decided], (margin > 0)[decided])
        assert abs(y.mean() - 0.5) < 0.03
    assert abs(ds.x_train.mean()) < 0.01 and abs(ds.x_train.std() - 1.0) < 0.01


def test_synthetic_binary_is_deterministic():
    a = synthetic_binary(1000, 5, seed=7)
    b = synthetic_binary(1000, 5, seed=7)
    c = synthetic_binary(1000, 5, seed=8)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    np.testing.assert_array_equal(a.true_weights, b.true_weights)
    assert not np.array_equal(a.x_train, c.x_train)
    assert not np.array_equal(a.true_weights, c.true_weights)
    # the training set does not depend on the size of the test set
    d = synthetic_binary(1000, 5, seed=7, n_test=17)
    np.testing.assert_array_equal(a.x_train, d.x_train)
    assert d.x_test.shape == (17, 5)


def test_synthetic_binary_float32_allocates_no_float64_copy():
    n, d = 200_000, 20
    tracemalloc.start()
    try:
        ds = synthetic_binary(n, d, dtype=np.float32, n_test=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    result = sum(a.nbytes for a in (ds.x_train, ds.y_train, ds.x_test, ds.y_test))
    # a float64 temporary of x alone would add 2x the float32 x (32 MB here)
    assert peak < result + 8 * 2**20, f"peak {peak} bytes for a {result}-byte result"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=0, d=3), r"n=0 must be >= 1"),
        (dict(n=10, d=-1), r"d=-1 must be >= 1"),
        (dict(n=2.5, d=3), r"n=2\.5 must be an integer"),
        (dict(n=10, d=3, n_test=0), r"n_test=0 must be >= 1"),
        (dict(n=10, d=3, dtype=np.float16), r"dtype=float16 is not supported"),
    ],
)
def test_synthetic_binary_validates_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        synthetic_binary(**kwargs)


def test_synthetic_classification_is_learnable_and_mnist_like():
    ds = synthetic_classification(3000, seed=1, n_test=1000)
    assert ds.x_train.shape == (3000, 784) and ds.n_classes == 10
    assert ds.x_train.min() >= 0.0 and ds.x_train.max() <= 1.0
    assert set(np.unique(ds.y_train)) == set(range(10))
    # nearest class mean on the training set classifies the test set far above chance
    means = np.stack([ds.x_train[ds.y_train == c].mean(0) for c in range(10)])
    dists = ((ds.x_test[:, None, :] - means[None]) ** 2).sum(-1)
    accuracy = (dists.argmin(1) == ds.y_test).mean()
    assert accuracy > 0.6, accuracy
    again = synthetic_classification(3000, seed=1, n_test=1000)
    np.testing.assert_array_equal(ds.x_test, again.x_test)


# ---------------------------------------------------------------------------------------
# synthetic_cifar10
# ---------------------------------------------------------------------------------------


def test_synthetic_cifar10_is_learnable_and_cifar_like():
    ds = synthetic_cifar10(3000, 1000, seed=1)
    assert ds.x_train.dtype == np.float32 and ds.x_train.flags.c_contiguous
    assert ds.x_train.min() >= 0.0 and ds.x_train.max() <= 1.0
    assert 0.4 < ds.x_train.mean() < 0.6 and 0.15 < ds.x_train.std() < 0.35
    assert set(np.unique(ds.y_train)) == set(range(10))
    means = np.stack([ds.x_train[ds.y_train == c].mean(0) for c in range(10)])
    dists = ((ds.x_test[:, None, :] - means[None]) ** 2).sum(-1)
    accuracy = (dists.argmin(1) == ds.y_test).mean()
    assert 0.5 < accuracy < 0.99, accuracy  # learnable, not trivial


def test_synthetic_cifar10_prefixes_and_determinism():
    big = synthetic_cifar10(2100, 30, seed=3)  # more than one 2048-row chunk
    for n in (1, 100, 2048, 2049):
        small = synthetic_cifar10(n, 10, seed=3)
        np.testing.assert_array_equal(small.x_train, big.x_train[:n])
        np.testing.assert_array_equal(small.y_train, big.y_train[:n])
        np.testing.assert_array_equal(small.x_test, big.x_test[:10])
    assert not np.array_equal(synthetic_cifar10(50, 10, seed=4).x_train, big.x_train[:50])
    wide = synthetic_cifar10(50, 10, seed=3, dtype=np.float64)
    assert wide.x_train.dtype == np.float64 and wide.x_train.flags.c_contiguous
    assert 0.0 <= wide.x_train.min() and wide.x_train.max() <= 1.0
    np.testing.assert_array_equal(
        wide.x_train, synthetic_cifar10(50, 1, seed=3, dtype=np.float64).x_train
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_train=0), r"n_train=0 must be >= 1"),
        (dict(n_test=-1), r"n_test=-1 must be >= 1"),
        (dict(distractor=1.5), r"distractor=1\.5 must be a number in \[0, 1\.0\]"),
        (dict(noise=-0.1), r"noise=-0\.1 must be a number"),
        (dict(dtype=np.int8), r"dtype=int8 is not supported"),
    ],
)
def test_synthetic_cifar10_validates_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        synthetic_cifar10(**{"n_train": 10, "n_test": 10, **kwargs})
