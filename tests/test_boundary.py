"""The binding layer's shared machinery (csrc/mod_common.c): the argument parser's errors name the
function and the argument (too many, missing, unknown, repeated, keyword-only by position, a
scalar of the wrong type), on one example of each; and the GIL probe (conftest.releases_gil)
can fail.

Each kernel family's boundary checks (bad dtype, ndim, shape, layout, writeability,
aliasing, labels, non-finite scalars, arguments by name, reference leaks, the GIL) are in its
own test file (test_gemm.py, test_loss.py, ...), from the table in _core_helpers.py.
"""

import numpy as np
import pytest

from dptrain import _core as core

# also run under ASan (test_asan_extension); in-process, safe beside other tests
pytestmark = [pytest.mark.boundary, pytest.mark.kernels]


def _two():
    return np.ones((2, 2)), np.ones((2, 2)), np.zeros((2, 2))


ARGUMENT_ERRORS = {
    # id: (thunk, exception, fragments of its message)
    "too-many-positional": (
        lambda: core.gemm(*_two(), True),
        TypeError,
        ("gemm()", "3 positional", "4 given"),
    ),
    "missing-required": (lambda: core.gemm(*_two()[:2]), TypeError, ("gemm()", "'c'", "pos 3")),
    "missing-keyword-only": (
        lambda: core.sgd_step(np.ones(3), np.ones(3), None),
        TypeError,
        ("sgd_step()", "keyword-only", "'lr'"),
    ),
    "unknown-keyword": (
        lambda: core.gemm(*_two(), tranz_a=True),
        TypeError,
        ("'tranz_a'", "invalid keyword", "gemm()"),
    ),
    # a keyword is the whole name: not a prefix of one, nor one and more
    "keyword-a-prefix": (
        lambda: core.gemm(*_two(), trans=True),
        TypeError,
        ("'trans'", "invalid keyword", "gemm()"),
    ),
    "keyword-extends-one": (
        lambda: core.gemm(*_two(), trans_ab=True),
        TypeError,
        ("'trans_ab'", "invalid keyword", "gemm()"),
    ),
    "keyword-empty": (
        lambda: core.gemm(*_two(), **{"": True}),
        TypeError,
        ("''", "invalid keyword", "gemm()"),
    ),
    "keyword-not-ascii": (
        lambda: core.gemm(*_two(), **{"trans_\u00e4": True}),
        TypeError,
        ("'trans_\u00e4'", "invalid keyword", "gemm()"),
    ),
    "name-and-position": (
        lambda: core.gemm(*_two(), a=np.ones((2, 2))),
        TypeError,
        ("gemm()", "('a')", "position (1)"),
    ),
    "keyword-only-by-position": (
        lambda: core.dense_forward(
            np.ones((2, 2)), np.ones((2, 2)), np.ones(2), np.zeros((2, 2)), None
        ),
        TypeError,
        ("dense_forward()", "4 positional", "5 given"),
    ),
    "optional-too-many": (
        lambda: core.softmax_xent(np.ones((2, 2)), np.zeros(2, np.int64), None, None, None),
        TypeError,
        ("softmax_xent()", "at most 4 positional", "5 given"),
    ),
    "float-not-a-number": (
        lambda: core.gemm(*_two(), alpha="2"),
        TypeError,
        ("gemm() argument 'alpha'", "real number", "str"),
    ),
    "int-given-a-float": (
        lambda: core.conv2d_forward(
            np.ones((1, 1, 3, 3)),
            np.ones((1, 1, 2, 2)),
            np.ones(1),
            np.zeros((1, 1, 2, 2)),
            padding=1.0,
        ),
        TypeError,
        ("conv2d_forward() argument 'padding'", "float"),
    ),
    "int-overflow": (
        lambda: core.conv2d_forward(
            np.ones((1, 1, 3, 3)),
            np.ones((1, 1, 2, 2)),
            np.ones(1),
            np.zeros((1, 1, 2, 2)),
            padding=2**40,
        ),
        OverflowError,
        ("conv2d_forward() argument 'padding'", "maximum"),
    ),
    "truth-raises": (
        lambda: core.gemm(*_two(), trans_a=np.ones(3)),
        ValueError,
        ("gemm() argument 'trans_a'", "ambiguous"),
    ),
    "method-unknown-keyword": (
        lambda: core.Model(
            [("dense", 2)], (3,), "softmax_xent", np.zeros(8), np.zeros(8)
        ).loss_grad(np.ones((1, 3)), np.zeros(1, np.int64), scale=1.0),
        TypeError,
        ("'scale'", "loss_grad()"),
    ),
}


@pytest.mark.parametrize("case", list(ARGUMENT_ERRORS))
def test_argument_errors_name_the_function_and_argument(case):
    thunk, exc, fragments = ARGUMENT_ERRORS[case]
    with pytest.raises(exc) as info:
        thunk()
    for fragment in fragments:
        assert fragment in str(info.value), f"{case}: {fragment!r} not in {str(info.value)!r}"


def test_gil_probe_detects_a_call_that_holds_the_gil(gil_probe):
    """The probe itself can fail: a pure-Python busy loop never releases the GIL."""

    def hold():
        s = 0
        for i in range(20000):
            s += i
        return s

    assert not gil_probe(hold, max_calls=20)
