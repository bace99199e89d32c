"""Tests for dptrain.data.arrays: the user's own arrays, .npy memory maps and .npz archives.

Every refusal names the array (or file) and the row; conversions happen once and say so in
the notes; a C-contiguous array of the model's dtype is never copied; a memory map is read
in bounded chunks, never whole into memory.
"""

import tracemalloc

import numpy as np
import pytest

from dptrain.data import (
    DataError,
    Dataset,
    from_arrays,
    from_files,
    from_npy,
    from_npz,
    memmap_region,
)
from dptrain.data import arrays as arrays_mod


def rng():
    return np.random.default_rng(0)


def labels(n, classes=3):
    return np.arange(n) % classes


def traced_peak(call):
    """(result, peak bytes allocated while call() ran, as tracemalloc sees NumPy's buffers)."""
    tracemalloc.start()
    try:
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


# ---------------------------------------------------------------------------------------
# X: dtypes, shapes, one conversion or none
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_models_dtype_in_c_order_is_used_without_a_copy(dtype):
    X = rng().standard_normal((50, 6)).astype(dtype)
    ds = from_arrays(X, labels(50), dtype=dtype, validation=0.2)
    assert isinstance(ds, Dataset) and ds.dtype == dtype
    assert np.shares_memory(ds.x_train, X) and np.shares_memory(ds.x_test, X)
    np.testing.assert_array_equal(ds.x_train, X[:40])
    np.testing.assert_array_equal(ds.x_test, X[40:])
    assert not [n for n in ds.notes if n.startswith("X:")]  # nothing done to X


@pytest.mark.parametrize(
    "source, model",
    [
        (np.float64, "float32"),
        (np.float32, "float64"),
        (np.uint8, "float32"),
        (np.int64, "float64"),
        (np.bool_, "float32"),
        (np.float16, "float32"),
    ],
)
def test_other_dtypes_are_converted_once_with_a_note(source, model):
    X = (rng().random((40, 5)) * 200).astype(source)
    ds = from_arrays(X, labels(40), dtype=model)
    assert ds.x_train.dtype == np.dtype(model) and ds.x_train.flags.c_contiguous
    assert not np.shares_memory(ds.x_train, X)
    np.testing.assert_array_equal(ds.x_train, X.astype(model))
    size = "800 B" if model == "float32" else "1.6 kB"  # 40 x 5 values
    assert f"X: converted once from {np.dtype(source)} to {model} ({size} in memory)" in ds.notes


def test_a_strided_array_of_the_right_dtype_is_copied_once_into_c_order():
    X = rng().standard_normal((30, 8)).astype(np.float32)[:, ::2]
    ds = from_arrays(X, labels(30))
    np.testing.assert_array_equal(ds.x_train, X)
    assert ds.x_train.flags.c_contiguous
    assert any(n.startswith("X: copied once into C order") for n in ds.notes)


@pytest.mark.parametrize(
    "shape, input_shape",
    [
        ((10, 7), (7,)),
        ((10, 5, 6), (1, 5, 6)),  # (n, H, W): one channel
        ((10, 3, 4, 5), (3, 4, 5)),  # (n, C, H, W)
        ((10, 2, 3, 4, 5), (2, 3, 4, 5)),  # more dimensions: as they are
    ],
)
def test_rows_are_flattened_and_input_shape_recorded(shape, input_shape):
    X = rng().random(shape)
    ds = from_arrays(X, labels(10), dtype="float64")
    assert ds.input_shape == input_shape and ds.x_train.shape == (10, int(np.prod(shape[1:])))
    np.testing.assert_array_equal(ds.x_train, X.reshape(10, -1))
    assert np.shares_memory(ds.x_train, X)


def test_input_shape_can_be_given():
    X = rng().random((10, 784)).astype(np.float32)
    assert from_arrays(X, labels(10), input_shape=(1, 28, 28)).input_shape == (1, 28, 28)
    with pytest.raises(
        ValueError,
        match=r"input_shape=\(1, 28, 27\) holds 756 values but "
        r"x_train has 784 features",
    ):
        from_arrays(X, labels(10), input_shape=(1, 28, 27))


def test_lists_are_arrays_too():
    ds = from_arrays([[0, 1], [2, 3], [4, 5]], [0, 1, 0], dtype="float64")
    np.testing.assert_array_equal(ds.x_train, [[0, 1], [2, 3], [4, 5]])
    assert ds.source == "arrays (X: list; y: list)"


@pytest.mark.parametrize(
    "X, dtype",
    [
        (np.ones((4, 2), np.complex64), "complex64"),
        (np.array([[1, None], [2, 3]], dtype=object), "object"),
        (np.array([["a", "b"], ["c", "d"]]), "<U1"),
        (np.zeros((4, 2), dtype=[("a", "f4"), ("b", "f4")]), r"\[\('a', '<f4'\), \('b', '<f4'\)\]"),
    ],
)
def test_unreal_x_is_a_type_error_naming_the_dtype(X, dtype):
    with pytest.raises(
        TypeError,
        match=rf"X has dtype {dtype}: expected real numbers \(bool, "
        rf"integers or floats\); complex, object, string",
    ):
        from_arrays(X, labels(len(X)))


@pytest.mark.parametrize(
    "X, message",
    [
        (np.ones(5), r"X has shape \(5,\): expected one row per sample.*X\.reshape\(-1, 1\)"),
        (np.ones((0, 3)), r"X has no rows \(shape \(0, 3\)\)"),
        (np.ones((4, 0)), r"X has shape \(4, 0\): its samples hold no values"),
        ([[1, 2], [3]], r"X is not an array: .*inhomogeneous"),
    ],
)
def test_x_without_rows_of_values_is_refused(X, message):
    with pytest.raises(DataError, match=message):
        from_arrays(X, labels(4))


def test_dtype_must_be_a_float_the_core_supports():
    with pytest.raises(ValueError, match=r"dtype=float16 is not supported"):
        from_arrays(np.ones((4, 2)), labels(4), dtype="float16")


# ---------------------------------------------------------------------------------------
# NaN and infinity: refused, naming the row
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_row_is_named(dtype, value):
    for source in (np.float32, np.float64):  # used as it is, or converted
        X = np.ones((20, 4), source)
        X[13, 2] = value
        X[17, 0] = np.nan
        with pytest.raises(
            DataError,
            match=rf"X row 13 holds {value}: NaN and infinity are "
            rf"refused; drop or fill in that row",
        ):
            from_arrays(X, labels(20), dtype=dtype)


def test_a_value_beyond_float32_is_named_not_silently_infinite():
    X = np.ones((6, 3))
    X[4, 1] = -1e300
    with pytest.raises(
        DataError,
        match=r"X row 4 holds -1e\+300, beyond the range of float32 "
        r"\(largest 3\.40282e\+38\): rescale the data or use "
        r"dtype='float64'",
    ):
        from_arrays(X, labels(6))
    assert from_arrays(X, labels(6), dtype="float64").x_train[4, 1] == -1e300


def test_the_test_set_is_checked_too():
    X_test = np.ones((5, 3), np.float32)
    X_test[3] = np.nan
    with pytest.raises(DataError, match=r"X_test row 3 holds nan"):
        from_arrays(np.ones((8, 3), np.float32), labels(8), X_test=X_test, y_test=labels(5))


# ---------------------------------------------------------------------------------------
# y: class labels
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "y",
    [
        np.array([0, 1, 2, 1] * 3, np.int32),
        np.array([0, 1, 2, 1] * 3, np.uint8),
        np.array([0, 1, 2, 1] * 3, np.int64),
        [0, 1, 2, 1] * 3,
    ],
)
def test_integer_labels(y):
    ds = from_arrays(np.ones((12, 2)), y)
    assert ds.y_train.dtype == np.int64 and ds.n_classes == 3 and ds.task == "classification"
    np.testing.assert_array_equal(ds.y_train, [0, 1, 2, 1] * 3)
    assert not [n for n in ds.notes if n.startswith("y:")]


def test_bool_labels_are_a_binary_classification():
    ds = from_arrays(np.ones((4, 2)), np.array([True, False, True, True]))
    np.testing.assert_array_equal(ds.y_train, [1, 0, 1, 1])
    assert ds.n_classes == 2 and ds.n_outputs == 2


def test_real_valued_labels_name_the_fix_that_fit_accepts():
    import dptrain
    from dptrain import nn

    X = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.25
    with pytest.raises(ValueError, match=r"loss='mse'") as info:
        dptrain.fit(nn.mlp(3, [8], 2, seed=0), X, y, epochs=1, batch_size=16, quiet=True)
    assert "pass task=" not in str(info.value)  # an option fit refuses
    # what the message names works: the same call with a model built with loss='mse'
    r = dptrain.fit(
        nn.mlp(3, [8], 1, loss="mse", seed=0), X, y, epochs=1, batch_size=16, quiet=True
    )
    assert np.isfinite(r.history[-1]["train_loss"])


def test_whole_float_labels_become_int64_with_a_note():
    ds = from_arrays(np.ones((4, 2)), np.array([0.0, 1.0, 2.0, 1.0]))
    assert ds.y_train.dtype == np.int64 and ds.n_classes == 3
    assert "y: float64 labels converted to int64 (all whole numbers)" in ds.notes


@pytest.mark.parametrize(
    "y, message",
    [
        (
            [0.0, 1.0, 0.5, 2.0],
            r"y\[2\] = 0\.5 is not a whole number: classification labels are "
            r"class indices 0\.\.C-1 \(real-valued targets need a regression "
            r"model: dptrain\.fit with a model built with loss='mse'.*"
            r"MLPRegressor; dptrain\.data\.from_arrays takes task='regression'\)",
        ),
        ([0.0, np.nan, 1.0, 1.0], r"y\[1\] = nan is not a whole number"),
        ([0.0, 1.0, np.inf, 1.0], r"y\[2\] = inf is not a whole number"),
        ([0, 1, -1, 2], r"y\[2\] = -1 is negative: classification labels are class indices"),
        ([0.0, -3.0, 1.0, 1.0], r"y\[1\] = -3\.0 is negative"),
        ([0.0, 1.0, 2.0**60, 1.0], r"y\[2\] = 1\.152.*e\+18 is too large to be a class index"),
        (
            np.array([0, 1, 2**64 - 1, 1], np.uint64),
            r"y\[2\] = 18446744073709551615 is too "
            r"large",
        ),
        ([0, 1, 2], r"y has 3 labels but X has 4 rows"),
        (
            np.zeros((4, 3)),
            r"y has shape \(4, 3\): classification labels are one class index per "
            r"row, shape \(n,\); one-hot rows\? pass y\.argmax\(axis=1\)",
        ),
        (np.zeros((4, 1)), r"y has shape \(4, 1\).*; pass y\.ravel\(\)"),
        (
            [0, 0, 0, 0],
            r"y holds only the label 0: a classification needs two classes at least "
            r"\(pass n_classes=2",
        ),
    ],
)
def test_bad_labels_are_named_by_row(y, message):
    with pytest.raises(DataError, match=message):
        from_arrays(np.ones((4, 2)), y)


def test_string_labels_are_a_type_error_that_says_how_to_encode_them():
    with pytest.raises(
        TypeError,
        match=r"y has dtype <U3: classification labels must be class "
        r"indices.*np\.unique\(y, return_inverse=True\)",
    ):
        from_arrays(np.ones((3, 2)), np.array(["cat", "dog", "cat"]))


def test_n_classes_given_bounds_the_labels():
    ds = from_arrays(np.ones((4, 2)), [0, 1, 1, 0], n_classes=5)
    assert ds.n_classes == 5 and not [n for n in ds.notes if "classes" in n]
    with pytest.raises(
        DataError,
        match=r"y\[3\] = 2 is out of range 0\.\.1 for n_classes=2 "
        r"\(a binary classifier's labels are 0 and 1\)",
    ):
        from_arrays(np.ones((4, 2)), [0, 1, 1, 2], n_classes=2)
    with pytest.raises(
        DataError,
        match=r"y_test\[1\] = 4 is out of range 0\.\.3 for "
        r"n_classes=4$",
    ):
        from_arrays(
            np.ones((4, 2)), [0, 1, 1, 2], X_test=np.ones((2, 2)), y_test=[0, 4], n_classes=4
        )
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match=rf"n_classes={bad!r} must be"):
            from_arrays(np.ones((4, 2)), [0, 1, 1, 0], n_classes=bad)


def test_unused_classes_are_noted_and_the_test_labels_count():
    ds = from_arrays(np.ones((4, 2)), [3, 7, 3, 7], X_test=np.ones((2, 2)), y_test=[3, 9])
    assert ds.n_classes == 10
    assert (
        "y: the labels use 3 of the 10 classes 0..9, so the model gets 10 outputs, 7 of "
        "them for classes that never appear (encode the labels as 0..2, e.g. with "
        "np.unique(y, return_inverse=True), for 3)"
    ) in ds.notes


# ---------------------------------------------------------------------------------------
# y: regression targets
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_regression_targets(dtype):
    X = rng().random((10, 3))
    ds = from_arrays(X, np.linspace(-1, 1, 10), task="regression", dtype=dtype)
    assert ds.task == "regression" and ds.n_classes is None and ds.n_outputs == 1
    assert ds.y_train.shape == (10, 1) and ds.y_train.dtype == dtype
    np.testing.assert_allclose(ds.y_train[:, 0], np.linspace(-1, 1, 10), rtol=1e-6)
    two = from_arrays(X, np.ones((10, 2)), task="regression", dtype=dtype, validation=0.3)
    assert two.n_outputs == 2 and two.y_train.shape == (7, 2) and two.y_test.shape == (3, 2)
    assert "2 regression targets" in two.describe()
    converted = "y: float64 targets converted to float32 (the model's dtype)"
    assert (converted in ds.notes) == (dtype == "float32")
    ints = from_arrays(X, np.arange(10), task="regression", dtype=dtype)
    assert f"y: int64 targets converted to {dtype} (the model's dtype)" in ints.notes
    empty = from_arrays(X, np.ones((10, 2)), task="regression", dtype=dtype)
    assert empty.n_test == 0 and empty.y_test.shape == (0, 2) and empty.y_test.dtype == dtype


@pytest.mark.parametrize(
    "y, message",
    [
        ([0.0, 1.0, np.nan, 2.0], r"y row 2 holds nan: NaN and infinity are refused"),
        (np.array([[0.0, 1.0], [1.0, -np.inf], [0, 0], [1, 1]]), r"y row 1 holds -inf"),
        ([0.0, 1.0, 1e300, 2.0], r"y row 2 holds 1e\+300, beyond the range of float32"),
        ([0.0, 1.0, 2.0], r"y has 3 rows of targets but X has 4 rows"),
        (
            np.zeros((4, 2, 1)),
            r"y has shape \(4, 2, 1\): regression targets are \(n,\) or \(n, k\)",
        ),
        (np.zeros((4, 0)), r"y has shape \(4, 0\): regression targets"),
    ],
)
def test_bad_regression_targets_are_named_by_row(y, message):
    with pytest.raises(DataError, match=message):
        from_arrays(np.ones((4, 2)), y, task="regression")


def test_task_and_n_classes_arguments():
    with pytest.raises(
        ValueError,
        match=r"task='ranking' is not one of classification, "
        r"regression",
    ):
        from_arrays(np.ones((4, 2)), labels(4), task="ranking")
    with pytest.raises(
        ValueError,
        match=r"n_classes=3 applies to task='classification', not "
        r"task='regression'",
    ):
        from_arrays(np.ones((4, 2)), labels(4), task="regression", n_classes=3)
    with pytest.raises(
        TypeError,
        match=r"y has dtype complex128: regression targets must be "
        r"real numbers",
    ):
        from_arrays(np.ones((4, 2)), np.ones(4, complex), task="regression")


# ---------------------------------------------------------------------------------------
# the test set: given, a validation fraction, or none
# ---------------------------------------------------------------------------------------


def test_validation_holds_out_the_last_rows():
    X = np.arange(200, dtype=np.float32).reshape(100, 2)
    y = labels(100, 4)
    ds = from_arrays(X, y, validation=0.25)
    assert (ds.n_train, ds.n_test) == (75, 25)
    np.testing.assert_array_equal(ds.x_test, X[75:])
    np.testing.assert_array_equal(ds.y_test, y[75:])
    assert (
        "validation=0.25: the last 25 of the 100 rows (rows 75..99) are the test set, "
        "taken as they are (not shuffled): shuffle X and y together first if the rows are "
        "ordered"
    ) in ds.notes
    assert from_arrays(X, y, validation=0.005).n_test == 1  # rounds half up
    assert from_arrays(X, y, validation=0.994).n_train == 1


def test_validation_of_rows_ordered_by_label_is_noted():
    y = np.repeat([0, 1, 2], 10)  # sorted by class
    ds = from_arrays(np.ones((30, 2)), y, validation=0.2)
    assert set(ds.y_test) == {2}
    assert (
        "the held-out rows hold 1 of the 3 classes of the training rows: are the rows "
        "ordered by label? Then shuffle X and y together first"
    ) in ds.notes


@pytest.mark.parametrize(
    "validation, message",
    [
        (0, r"validation=0 must be a fraction between 0 and 1"),
        (1.0, r"validation=1\.0 must be a fraction"),
        (True, r"validation=True must be a fraction"),
        ("0.1", r"validation='0\.1' must be a fraction"),
        (
            0.001,
            r"validation=0\.001 of 100 rows holds out 0 rows: the training and the held-out "
            r"rows need one row each at least",
        ),
    ],
)
def test_bad_validation_fractions(validation, message):
    with pytest.raises(ValueError, match=message):
        from_arrays(np.ones((100, 2)), labels(100), validation=validation)


def test_a_given_test_set():
    X, X_test = rng().random((20, 2, 3)), rng().random((5, 2, 3))
    ds = from_arrays(X, labels(20), X_test=X_test, y_test=labels(5), dtype="float64")
    assert (ds.n_train, ds.n_test) == (20, 5) and ds.input_shape == (1, 2, 3)
    np.testing.assert_array_equal(ds.x_test, X_test.reshape(5, 6))
    assert "X_test: X_test" not in ds.source and "X_test: ndarray (5, 2, 3)" in ds.source
    with pytest.raises(
        DataError,
        match=r"X_test has rows of shape \(3, 2\) but X has rows of "
        r"shape \(2, 3\)",
    ):
        from_arrays(X, labels(20), X_test=rng().random((5, 3, 2)), y_test=labels(5))
    with pytest.raises(DataError, match=r"y_test has 4 labels but X_test has 5 rows"):
        from_arrays(X, labels(20), X_test=X_test, y_test=labels(4))
    with pytest.raises(ValueError, match=r"X_test and y_test: give both or neither"):
        from_arrays(X, labels(20), X_test=X_test)
    with pytest.raises(
        ValueError,
        match=r"validation=0\.1 holds out rows of X, but a test set "
        r"\(X_test, y_test\) is given too",
    ):
        from_arrays(X, labels(20), X_test=X_test, y_test=labels(5), validation=0.1)


def test_no_test_set_is_an_empty_split_and_a_note():
    ds = from_arrays(np.ones((6, 2), np.float32), labels(6))
    assert ds.n_test == 0 and ds.x_test.shape == (0, 2) and ds.x_test.dtype == np.float32
    assert ds.y_test.shape == (0,) and ds.y_test.dtype == np.int64
    assert "6 train / no test set" in ds.describe()
    assert any(n.startswith("no test set: nothing is held out") for n in ds.notes)


# ---------------------------------------------------------------------------------------
# .npy files: memory maps, bounded memory
# ---------------------------------------------------------------------------------------


def save(path, array):
    np.save(path, array)
    return path


# The memory bounds below: X is 16 MiB (its float32 form), the labels 0.5 MiB (int64; the
# check of the classes sorts a copy), the chunks 256 kB: reading the set may allocate the
# labels and a few chunks, 2 MiB in all, never a copy of X.


def test_npy_of_the_models_dtype_is_the_memory_map_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(arrays_mod, "_CHUNK_BYTES", 256 << 10)
    X = rng().standard_normal((65_536, 64)).astype(np.float32)  # 16 MiB
    x_path = save(tmp_path / "x.npy", X)
    y_path = save(tmp_path / "y.npy", labels(len(X)))
    ds, peak = traced_peak(lambda: from_npy(x_path, y_path, validation=0.5))
    assert isinstance(ds.x_train, np.memmap) and isinstance(ds.x_test, np.memmap)
    assert not ds.x_train.flags.writeable
    assert peak < 2 << 20, f"peak {peak} bytes for a {X.nbytes}-byte file"
    np.testing.assert_array_equal(ds.x_train, X[:32_768])
    np.testing.assert_array_equal(ds.x_test, X[32_768:])
    assert ds.name == "x" and ds.source == f"{x_path}, {y_path}"
    assert not [n for n in ds.notes if n.startswith(str(x_path))]
    for part, rows in ((ds.x_train, X[:32_768]), (ds.x_test, X[32_768:])):
        path, offset = memmap_region(part)
        assert path == str(x_path)
        again = np.memmap(path, np.float32, "r", offset=offset, shape=part.shape)
        np.testing.assert_array_equal(again, rows)


def test_a_memmap_given_to_from_arrays_shares_the_file_map(tmp_path):
    x_path = save(tmp_path / "x.npy", rng().random((100, 4, 5)))
    mapped = np.load(x_path, mmap_mode="r")
    ds = from_arrays(mapped, labels(100), dtype="float64")
    assert isinstance(ds.x_train, np.memmap) and np.shares_memory(ds.x_train, mapped)
    assert ds.input_shape == (1, 4, 5)
    assert memmap_region(ds.x_train) == (str(x_path), 128)
    assert memmap_region(np.ones((3, 3))) is None


@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_of_another_dtype_is_converted_into_an_unlinked_temporary_map(
    tmp_path, monkeypatch, order
):
    monkeypatch.setattr(arrays_mod, "_CHUNK_BYTES", 256 << 10)
    X = rng().integers(0, 256, (65_536, 64), dtype=np.uint8)  # 4 MiB, 16 as float32
    if order == "F":
        X = np.asfortranarray(X)
    x_path = save(tmp_path / "x.npy", X)
    y_path = save(tmp_path / "y.npy", labels(len(X)))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ds, peak = traced_peak(lambda: from_npy(x_path, y_path, tmp_dir=scratch))
    # the float32 result lives on disk: only chunks went through memory
    assert peak < 2 << 20, f"peak {peak} bytes converting a {X.nbytes}-byte file"
    assert isinstance(ds.x_train, np.memmap) and ds.x_train.dtype == np.float32
    np.testing.assert_array_equal(ds.x_train, X.astype(np.float32))
    assert list(scratch.iterdir()) == []  # unlinked at once
    assert memmap_region(ds.x_train) is None  # no name to map it by
    (note,) = [n for n in ds.notes if n.startswith(str(x_path))]
    assert note == (
        f"{x_path}: converted once from uint8 to float32 into a temporary "
        f"memory-mapped file in {scratch} (16.8 MB on disk, unlinked at once: freed "
        f"with the data set); save it as float32 in C order to train on the file "
        f"itself, with no copy"
    )


def test_npy_in_fortran_order_of_the_models_dtype_is_copied_into_c_order(tmp_path):
    X = np.asfortranarray(rng().random((50, 3)).astype(np.float32))
    ds = from_npy(
        save(tmp_path / "x.npy", X), save(tmp_path / "y.npy", labels(50)), tmp_dir=tmp_path
    )
    np.testing.assert_array_equal(ds.x_train, X)
    assert any(
        "copied once into C order (rows contiguous) into a temporary memory-mapped file" in n
        for n in ds.notes
    )


def test_nan_in_a_memory_map_is_found_in_bounded_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(arrays_mod, "_CHUNK_BYTES", 256 << 10)
    X = np.ones((65_536, 64), np.float32)  # 16 MiB
    X[50_000, 5] = np.nan
    x_path = save(tmp_path / "x.npy", X)
    y_path = save(tmp_path / "y.npy", labels(len(X)))
    del X

    def load():
        with pytest.raises(DataError, match=rf"{x_path} row 50000 holds nan"):
            from_npy(x_path, y_path)

    _, peak = traced_peak(load)
    assert peak < 2 << 20, f"peak {peak} bytes scanning a 16 MiB file"
    scratch = tmp_path / "scratch"  # the same, while converting to float64
    scratch.mkdir()
    with pytest.raises(DataError, match=rf"{x_path} row 50000 holds nan"):
        from_npy(x_path, y_path, dtype="float64", tmp_dir=scratch)
    assert list(scratch.iterdir()) == []


def test_a_conversion_that_does_not_fit_on_disk_is_refused(tmp_path, monkeypatch):
    x_path = save(tmp_path / "x.npy", np.ones((1000, 10), np.uint8))
    y_path = save(tmp_path / "y.npy", labels(1000))

    class Usage:
        free = 1000

    monkeypatch.setattr(arrays_mod.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(
        DataError,
        match=rf"{x_path}: converting uint8 to float32 needs 40 kB "
        rf"in {tmp_path}, which has 1 kB free: pass tmp_dir=",
    ):
        from_npy(x_path, y_path, tmp_dir=tmp_path)
    with pytest.raises(ValueError, match=r"tmp_dir='.*nowhere' is not a directory"):
        from_npy(x_path, y_path, tmp_dir=tmp_path / "nowhere")


def test_npy_labels_and_test_files(tmp_path):
    X = rng().random((20, 3)).astype(np.float32)
    paths = [
        save(tmp_path / f"{k}.npy", a)
        for k, a in (
            ("xa", X),
            ("ya", labels(20).astype(np.float64)),
            ("xb", X[:4]),
            ("yb", labels(4)),
        )
    ]
    ds = from_npy(*paths[:2], x_test_path=paths[2], y_test_path=paths[3], name="mine")
    assert (ds.n_train, ds.n_test, ds.name) == (20, 4, "mine")
    assert f"{paths[1]}: float64 labels converted to int64 (all whole numbers)" in ds.notes
    bad = save(tmp_path / "bad.npy", np.array([0, 1.5] + [0.0] * 18))
    with pytest.raises(DataError, match=rf"{bad}\[1\] = 1\.5 is not a whole number"):
        from_npy(paths[0], bad)
    with pytest.raises(ValueError, match=r"x_test_path=.* and y_test_path=None: give both"):
        from_npy(*paths[:2], x_test_path=paths[2])


def test_bad_npy_files_are_named(tmp_path):
    y_path = save(tmp_path / "y.npy", labels(3))
    text = tmp_path / "x.npy"
    text.write_text("1,2,3\n")
    with pytest.raises(DataError, match=rf"{text} is a text file \(CSV\?\), not a \.npy array"):
        from_npy(text, y_path)
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([[1, None]] * 3, dtype=object), allow_pickle=True)
    with pytest.raises(TypeError, match=rf"{objects} holds object data: expected real numbers"):
        from_npy(objects, y_path)
    strings = save(tmp_path / "strings.npy", np.array(["a", "b", "c"]))
    with pytest.raises(TypeError, match=rf"{strings} holds <U1 data"):
        from_npy(save(tmp_path / "x2.npy", np.ones((3, 2))), strings)
    empty = save(tmp_path / "empty.npy", np.ones((0, 4)))
    with pytest.raises(DataError, match=rf"{empty} has no rows"):
        from_npy(empty, y_path)
    with pytest.raises(FileNotFoundError):
        from_npy(tmp_path / "missing.npy", y_path)


def _npy_header_over(path, shape, data: bytes, dtype="<f4"):
    """An .npy file whose header declares `shape` over `data` (whatever its size)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": dtype, "fortran_order": False, "shape": shape}
        )
        f.write(data)
    return path


@pytest.mark.parametrize(
    "shape, data, message",
    [
        (
            (100, 4),
            bytes(1500),
            r"is truncated: its header declares shape \(100, 4\) of float32, "
            r"1,600 bytes of data \(1.6 kB\), but the file holds 1,500 after the header",
        ),
        (
            (2**40, 4),
            bytes(1000),
            r"is truncated: its header declares shape \(1099511627776, 4\) "
            r"of float32, 17,592,186,044,416 bytes of data \(17.6 TB\), but the file holds 1,000",
        ),
        ((100, 4), bytes(1603), r"is longer than its header says: .* the file holds 1,603"),
    ],
)
@pytest.mark.parametrize("which", ["X", "y"])
def test_a_npy_whose_header_disagrees_with_its_size_is_named_before_mapping(
    tmp_path, shape, data, message, which
):
    """Checked from the header, before np.load maps it (NumPy's own words, "mmap length is
    greater than file size", name neither the file nor the sizes)."""
    bad = _npy_header_over(tmp_path / "Xtr.npy", shape, data)
    x = save(tmp_path / "x.npy", np.ones((4, 2), np.float32))
    args = (bad, save(tmp_path / "y.npy", labels(4))) if which == "X" else (x, bad)
    with pytest.raises(DataError, match=rf"^{bad} {message}"):
        from_npy(*args)
    with pytest.raises(DataError, match=rf"^{bad} {message}"):
        from_files(*args)


# ---------------------------------------------------------------------------------------
# .npz archives
# ---------------------------------------------------------------------------------------


def test_npz_with_train_and_test_members(tmp_path):
    X = rng().random((12, 2, 2))
    path = tmp_path / "mine.npz"
    np.savez(path, x_train=X, y_train=labels(12), x_test=X[:3], y_test=labels(3), extra=[1])
    ds = from_npz(path)
    assert (ds.n_train, ds.n_test, ds.name, ds.source) == (12, 3, "mine", str(path))
    assert ds.input_shape == (1, 2, 2) and ds.x_train.dtype == np.float32
    np.testing.assert_array_equal(ds.x_test, X[:3].reshape(3, 4).astype(np.float32))
    assert f"{path}[x_train]: converted once from float64 to float32 (192 B in memory)" in ds.notes


def test_npz_with_x_and_y(tmp_path):
    path = tmp_path / "d.npz"
    np.savez_compressed(path, X=np.ones((10, 3)), y=np.linspace(0, 1, 10))
    ds = from_npz(path, task="regression", validation=0.2, dtype="float64", name="r")
    assert (ds.n_train, ds.n_test, ds.name, ds.n_outputs) == (8, 2, "r", 1)


def test_bad_npz_archives_are_named(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, features=np.ones((3, 2)), y=labels(3))
    with pytest.raises(
        DataError,
        match=rf"{path}: expected members x_train and y_train \(or X "
        rf"and y\), found features, y",
    ):
        from_npz(path)
    np.savez(path, X=np.ones((3, 2)), y=labels(3), X_test=np.ones((1, 2)))
    with pytest.raises(DataError, match=rf"{path}: holds X_test without y_test"):
        from_npz(path)
    np.savez(path, X=np.array([[1j, 2]] * 3), y=labels(3))
    with pytest.raises(TypeError, match=rf"{path}\[X\] holds complex128 data"):
        from_npz(path)
    np.savez(path, X=np.array([[1, None]] * 3, dtype=object), y=labels(3))
    with pytest.raises(TypeError, match=rf"{path}\[X\] holds object data"):
        from_npz(path)
    npy = save(tmp_path / "x.npy", np.ones((3, 2)))
    with pytest.raises(
        DataError,
        match=rf"{npy} is a \.npy array \(np.save's format\), not an \.npz archive "
        rf".*: read it with from_npy",
    ):
        from_npz(npy)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(DataError, match=rf"{junk} is a text file \(CSV\?\), not an \.npz archive"):
        from_npz(junk)
