"""Tests for dptrain.data.catalog: the names load_dataset knows and the synthetic set's
options (MNIST's and CIFAR-10's policies are tested with their files, in test_data_mnist.py
and test_data_cifar10.py)."""

import numpy as np
import pytest

from dptrain.data import load_dataset


def test_load_dataset_unknown_name_lists_valid_names():
    with pytest.raises(
        ValueError,
        match=r"name='cifar100' is not a known dataset; "
        r"valid names: mnist, cifar10, synthetic",
    ):
        load_dataset("cifar100")


def test_load_dataset_synthetic_defaults_and_options():
    ds = load_dataset("synthetic")
    assert ds.x_train.shape == (100_000, 20) and ds.x_train.dtype == np.float32
    small = load_dataset(
        "synthetic", n_samples=500, n_features=16, seed=2, dtype=np.float64, limit=100, upscale=2
    )
    assert small.x_train.shape == (100, 64) and small.x_test.shape == (1000, 64)
    assert small.x_train.dtype == np.float64
