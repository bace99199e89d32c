"""Arrays dptrain allocates start on a cache line (dptrain._aligned): the data sets it builds,
the conversions of a user's arrays, the batch buffers of shuffled training. An array the
user hands over in the model's layout is used as it is (no copy made to align it)."""

import numpy as np
import pytest

from dptrain import data
from dptrain._aligned import ALIGN, aligned_empty, aligned_zeros
from dptrain.data.cifar10 import _stack_cifar10
from dptrain.data.mnist import _images_to_float
from dptrain.sampler import BatchRows


def on_line(a: np.ndarray) -> bool:
    return a.ctypes.data % ALIGN == 0


@pytest.mark.parametrize("shape", [0, 1, 7, (3, 5), (2, 3, 4), (0, 20)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64, np.int64])
def test_aligned_empty_and_zeros(shape, dtype):
    for make in (aligned_empty, aligned_zeros):
        a = make(shape, dtype)
        want = (shape,) if np.ndim(shape) == 0 else shape
        assert a.shape == want and a.dtype == dtype and a.flags.c_contiguous
        assert a.flags.writeable and (a.size == 0 or on_line(a))  # empty: no bytes to place
    assert not aligned_zeros(shape, dtype).any()


@pytest.mark.parametrize("shape", [-1, (2, -3), (2**40, 2**40)])
def test_aligned_refuses_impossible_shapes(shape):
    """A negative size is refused by name, an impossible one by NumPy's allocator (no wrapped
    size, no silently empty array)."""
    for make in (aligned_empty, aligned_zeros):
        with pytest.raises(
            (ValueError, MemoryError), match="negative|[Mm]aximum|too big|Unable to allocate"
        ):
            make(shape, np.float64)


def test_aligned_arrays_do_not_overlap():
    """Each array has its own buffer: writing one leaves another as it was."""
    a, b = aligned_zeros(100, np.float64), aligned_zeros(100, np.float64)
    a[:] = 1
    assert not b.any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_synthetic_data_sets_start_on_a_line(dtype):
    for ds in (
        data.synthetic_binary(1000, 20, dtype=dtype),
        data.synthetic_classification(300, 30, 3, dtype=dtype),
        data.synthetic_cifar10(50, 20, dtype=dtype),
    ):
        assert on_line(ds.x_train) and on_line(ds.x_test), ds.name


def test_mnist_and_cifar_conversions_start_on_a_line_and_keep_the_values():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (37, 28, 28), dtype=np.uint8)
    for normalize in (True, False):
        x = _images_to_float(images, np.dtype(np.float32), normalize)
        want = images.reshape(37, -1).astype(np.float32) / (255 if normalize else 1)
        assert on_line(x) and x.shape == (37, 784)
        np.testing.assert_array_equal(x, want)
    parts = [(rng.integers(0, 256, (n, 3072), dtype=np.uint8), np.arange(n) % 10) for n in (5, 3)]
    x, y = _stack_cifar10(parts, np.dtype(np.float64), True)
    assert on_line(x)
    np.testing.assert_array_equal(x, np.concatenate([p for p, _ in parts]) / 255.0)
    np.testing.assert_array_equal(y, np.concatenate([lab for _, lab in parts]))


def test_user_arrays_are_converted_onto_a_line_but_never_copied_to_align():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 64)
    ints = rng.integers(-5, 5, (64, 9))
    ds = data.from_arrays(ints, y, dtype="float64")  # a conversion: dptrain's copy
    assert on_line(ds.x_train)
    np.testing.assert_array_equal(ds.x_train, ints)
    raw = np.empty(64 * 9 * 8 + ALIGN, np.uint8)
    off = (16 - raw.ctypes.data) % ALIGN  # 16 bytes past a line
    x = raw[off : off + 64 * 9 * 8].view(np.float64).reshape(64, 9)
    x[...] = ints
    ds = data.from_arrays(x, y, dtype="float64")  # the model's layout: as it is
    assert np.shares_memory(ds.x_train, x) and ds.x_train.ctypes.data % ALIGN == 16


def test_shuffled_batch_buffers_start_on_a_line():
    x = np.arange(50 * 6, dtype=np.float32).reshape(50, 6)
    y = np.arange(50, dtype=np.int64)
    rows = BatchRows(x, y, 16, shuffle=True)
    assert on_line(rows.xb) and on_line(rows.yb)
    rows.order = np.arange(50)[::-1].copy()
    bx, by = rows(3, 19)
    np.testing.assert_array_equal(bx, x[rows.order[3:19]])
    np.testing.assert_array_equal(by, y[rows.order[3:19]])
