"""Tests for dptrain.data.dataset: the Dataset's validation and the error classes."""
import numpy as np
import pytest

from dptrain.data import DataError, DataNotFound, Dataset, upscale_dataset


def test_data_not_found_is_a_data_error_is_a_value_error():
    assert issubclass(DataNotFound, DataError)
    assert issubclass(DataError, ValueError)


def test_dataset_validates_layout():
    x = np.zeros((4, 3), np.float32)
    y = np.zeros(4, np.int64)
    Dataset(x, y, x, y, name="t", n_classes=2, source="test")
    with pytest.raises(ValueError, match=r"x_train with shape \(4, 3\) is not C-contiguous"):
        Dataset(np.zeros((3, 4), np.float32).T, y, x, y, name="t", n_classes=2, source="test")
    with pytest.raises(ValueError, match=r"y_test must be a 1-D int64 ndarray.*int32"):
        Dataset(x, y, x, y.astype(np.int32), name="t", n_classes=2, source="test")
    with pytest.raises(ValueError, match=r"x_train has 4 samples but y_train has 3"):
        Dataset(x, y[:3], x, y, name="t", n_classes=2, source="test")
    with pytest.raises(ValueError, match=r"x_train has dtype float32 but x_test has float64"):
        Dataset(x, y, x.astype(np.float64), y, name="t", n_classes=2, source="test")


def test_dataset_input_shape():
    x = np.zeros((4, 12), np.float32)
    y = np.zeros(4, np.int64)
    assert Dataset(x, y, x, y, name="t", n_classes=2, source="test").input_shape == (12,)
    ds = Dataset(x, y, x, y, name="t", n_classes=2, source="test", input_shape=[3, 2, 2])
    assert ds.input_shape == (3, 2, 2) and "12 features (3x2x2)" in ds.describe()
    with pytest.raises(ValueError, match=r"input_shape=\(3, 2, 3\) holds 18 values but x_train "
                                         r"has 12 features"):
        Dataset(x, y, x, y, name="t", n_classes=2, source="test", input_shape=(3, 2, 3))
    for bad in ((), (12.0,), (0, 12), (True, 12), 12):
        with pytest.raises(ValueError, match=r"must be a non-empty tuple of positive integers"):
            Dataset(x, y, x, y, name="t", n_classes=2, source="test", input_shape=bad)
    x16 = np.zeros((4, 16), np.float32)  # 16 = 4 x 4, but as 4 channels of 2 x 2
    four_channels = Dataset(x16, y, x16, y, name="t", n_classes=2, source="t",
                            input_shape=(4, 2, 2))
    with pytest.raises(ValueError, match=r"input_shape=\(4, 2, 2\) is not a single-channel "
                                         r"square image"):
        upscale_dataset(four_channels, 2)
