"""Tests for dptrain.data.dataset: the Dataset's validation (classification, regression, no
test set, notes), the error classes and the bounded-memory scan for non-finite rows."""

import numpy as np
import pytest

from dptrain.data import DataError, DataNotFound, Dataset, first_nonfinite_row, upscale_dataset


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
    with pytest.raises(
        ValueError,
        match=r"input_shape=\(3, 2, 3\) holds 18 values but x_train "
        r"has 12 features",
    ):
        Dataset(x, y, x, y, name="t", n_classes=2, source="test", input_shape=(3, 2, 3))
    for bad in ((), (12.0,), (0, 12), (True, 12), 12):
        with pytest.raises(ValueError, match=r"must be a non-empty tuple of positive integers"):
            Dataset(x, y, x, y, name="t", n_classes=2, source="test", input_shape=bad)
    x16 = np.zeros((4, 16), np.float32)  # 16 = 4 x 4, but as 4 channels of 2 x 2
    four_channels = Dataset(
        x16, y, x16, y, name="t", n_classes=2, source="t", input_shape=(4, 2, 2)
    )
    with pytest.raises(
        ValueError,
        match=r"input_shape=\(4, 2, 2\) is not a single-channel "
        r"square image",
    ):
        upscale_dataset(four_channels, 2)


def test_dataset_regression_targets():
    x = np.zeros((4, 3), np.float32)
    y = np.zeros((4, 2), np.float32)
    ds = Dataset(x, y, x, y, name="t", n_classes=None, source="test", task="regression")
    assert ds.n_outputs == 2 and ds.task == "regression"
    assert "2 regression targets" in ds.describe() and "classes" not in ds.describe()
    one = Dataset(
        x,
        y[:, :1].copy(),
        x,
        y[:, :1].copy(),
        name="t",
        n_classes=None,
        source="test",
        task="regression",
    )
    assert one.n_outputs == 1 and "1 regression target," in one.describe()
    with pytest.raises(
        ValueError,
        match=r"y_train of a regression must be a C-contiguous "
        r"\(n, k\) ndarray .* float32, got ndarray with shape "
        r"\(4,\) and dtype float32",
    ):
        Dataset(x, y[:, 0].copy(), x, y, name="t", n_classes=None, source="t", task="regression")
    with pytest.raises(ValueError, match=r"y_test of a regression .* dtype float64"):
        Dataset(
            x, y, x, y.astype(np.float64), name="t", n_classes=None, source="t", task="regression"
        )
    with pytest.raises(ValueError, match=r"y_train of a regression .* C-contiguous"):
        Dataset(
            x,
            np.zeros((2, 4), np.float32).T,
            x,
            y,
            name="t",
            n_classes=None,
            source="t",
            task="regression",
        )
    with pytest.raises(ValueError, match=r"n_classes=2: a regression has no classes"):
        Dataset(x, y, x, y, name="t", n_classes=2, source="t", task="regression")
    with pytest.raises(ValueError, match=r"y_train has 2 targets per row but y_test has 1"):
        Dataset(x, y, x, y[:, :1].copy(), name="t", n_classes=None, source="t", task="regression")
    with pytest.raises(
        ValueError,
        match=r"task='ranking' is not one of classification, "
        r"regression",
    ):
        Dataset(x, y, x, y, name="t", n_classes=None, source="t", task="ranking")


def test_dataset_classification_keeps_its_rules():
    x = np.zeros((4, 3), np.float32)
    y = np.zeros(4, np.int64)
    ds = Dataset(x, y, x, y, name="t", n_classes=3, source="test")
    assert ds.task == "classification" and ds.n_outputs == 3 and ds.notes == ()
    for n_classes in (None, 1):
        with pytest.raises(ValueError, match=rf"n_classes={n_classes} must be at least 2"):
            Dataset(x, y, x, y, name="t", n_classes=n_classes, source="test")
    with pytest.raises(ValueError, match=r"y_train must be a 1-D int64 ndarray"):
        Dataset(x, y.astype(np.float32), x, y, name="t", n_classes=2, source="test")


def test_dataset_without_a_test_set():
    x = np.zeros((4, 3), np.float64)
    y = np.zeros(4, np.int64)
    ds = Dataset(x, y, x[:0], y[:0], name="t", n_classes=2, source="test")
    assert ds.n_test == 0 and ds.n_train == 4
    assert ds.describe().startswith("t: 4 train / no test set, 3 features, 2 classes, float64")


def test_dataset_notes_are_a_tuple_of_strings():
    x = np.zeros((4, 3), np.float32)
    y = np.zeros(4, np.int64)
    ds = Dataset(x, y, x, y, name="t", n_classes=2, source="test", notes=["a", "b"])
    assert ds.notes == ("a", "b")
    for bad in ("one string", [1]):
        with pytest.raises(ValueError, match=r"notes=.* must be a sequence of strings"):
            Dataset(x, y, x, y, name="t", n_classes=2, source="test", notes=bad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_nonfinite_row_scans_in_bounded_chunks(dtype):
    x = np.ones((1000, 7), dtype)
    assert first_nonfinite_row(x, chunk_bytes=64) is None
    for row, value in ((0, np.nan), (999, np.inf), (123, -np.inf)):
        bad = x.copy()
        bad[row, 3] = value
        bad[row + 1 :, 0] = np.nan  # only the first bad row is named
        assert first_nonfinite_row(bad, chunk_bytes=64) == row
        assert first_nonfinite_row(bad.reshape(1000, 7, 1)) == row
    assert first_nonfinite_row(np.arange(10).reshape(5, 2)) is None
