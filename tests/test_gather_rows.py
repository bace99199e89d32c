"""Batch assembly (dp_gather_rows, csrc/dp_common.h): dptrain._core.gather_rows, out[i] =
x[index[i]] for rows of any dtype, with the GIL released and its arguments checked. (Its
memory-safety cases: test_memory_safety.py.)
"""

import numpy as np
import pytest

from dptrain import _core as core

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

# ---------------------------------------------------------------------------------------
# behaviour fixed after review


def test_gather_rows_releases_the_gil_and_checks_its_arguments():
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    out = np.empty((3, 4), np.float32)
    core.gather_rows(x, np.array([5, 0, 5]), out)
    assert np.array_equal(out, x[[5, 0, 5]])
    y = np.arange(6, dtype=np.int64)
    yo = np.empty(2, np.int64)
    core.gather_rows(y, np.array([4, 1]), yo)
    assert list(yo) == [4, 1]
    with pytest.raises(IndexError, match=r"index\[1\] = -1 is out of range for 6 rows"):
        core.gather_rows(x, np.array([0, -1, 2]), out)
    with pytest.raises(ValueError, match=r"out has shape \(3, 4\), expected \(2, 4\)"):
        core.gather_rows(x, np.array([0, 1]), out)
    with pytest.raises(TypeError, match="out has dtype float64"):
        core.gather_rows(x, np.array([0, 1, 2]), np.empty((3, 4)))
