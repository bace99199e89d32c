"""The Dataset every loader returns, the errors they raise, and the integrity helpers.

`Dataset` holds train and test splits in the layout the C core wants, validated once at
construction so that the training loop never converts. The errors: `DataError` (malformed or
inconsistent data; the message names the file or array), `DataNotFound` (no copy found;
lists where it looked) and the `DataWarning` for files that are not the published ones.
The helpers shared by the loaders: `_integrity` (checksums against published ones),
`_md5_file`, `_float_dtype` (float32 / float64 only) and `_check_count`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import warnings
from pathlib import Path

import numpy as np


class DataError(ValueError):
    """A data file is missing, malformed or inconsistent; the message names the file."""


class DataNotFound(DataError):
    """No copy of the dataset was found; `searched` lists the places looked at."""

    def __init__(self, message: str, searched: list[str] | None = None):
        super().__init__(message)
        self.searched = list(searched or [])


class DataWarning(UserWarning):
    """A data file was read, but it is not the published file it is named after (its
    checksum differs): a subset, a re-encoding or damage. Training goes on with it."""


def _integrity(what: str, where, checks: list[tuple[str, str, str, str | None]]) -> str:
    """Dataset.integrity from (file, algorithm, digest, published digest or None) rows.

    Warns once (DataWarning) naming every file whose digest is not the published one:
    such files are a subset, a re-encoding or damaged, and results on them are not
    comparable with published ones; training goes on with them.
    """
    differ = [f"{file} ({algorithm} {digest}, published {expected})"
              for file, algorithm, digest, expected in checks
              if expected is not None and digest != expected]
    if differ:
        warnings.warn(f"{what} in {where} is not the published data set: "
                      + "; ".join(differ) + ". Training goes on with these files, but results "
                      "will not be comparable with published ones.", DataWarning, stacklevel=4)
        return "modified"
    if checks and all(expected is not None for *_, expected in checks):
        return "verified"
    return "unchecked"


def _md5_file(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_count(value, arg: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{arg}={value!r} must be an integer >= {minimum}")
    if value < minimum:
        raise ValueError(f"{arg}={value} must be >= {minimum}")
    return int(value)


# ---------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _float_dtype(dtype, arg: str = "dtype") -> np.dtype:
    """Normalize a requested dtype; only float32 and float64 are supported by the C core."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ValueError(f"{arg}={dtype!r} is not a NumPy dtype; expected float32 or "
                         f"float64") from exc
    if dt not in _FLOAT_DTYPES:
        raise ValueError(f"{arg}={dt} is not supported; expected float32 or float64")
    return dt


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Train and test splits. x: (n, features) C-contiguous float32/float64; y: (n,) int64.

    `source` says where the arrays came from (a directory, or "synthetic (...)").
    `true_weights` is the generating weight vector w* for `synthetic_binary`, else None.
    `integrity` says whether the files read are the published ones: "verified" (every
    file's checksum matches), "modified" (one differs; a DataWarning said which),
    "unchecked" (no published checksum, or not read from files).
    `input_shape` is the shape of one sample, whose row-major flattening is a row of x:
    (1, 28, 28) for MNIST, (3, 32, 32) for CIFAR-10 (channels first), so that a CNN can
    view the rows as images. Left out (None), it becomes (features,): plain vectors.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str
    n_classes: int
    source: str
    true_weights: np.ndarray | None = None
    input_shape: tuple[int, ...] | None = None
    integrity: str = "unchecked"

    def __post_init__(self):
        # Validate once here so the training loop can trust the layout and never convert.
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            if not isinstance(x, np.ndarray) or x.ndim != 2:
                raise ValueError(f"x_{split} must be a 2-D ndarray (n, features), got "
                                 f"{type(x).__name__} with shape {getattr(x, 'shape', None)}")
            if x.dtype not in _FLOAT_DTYPES:
                raise ValueError(f"x_{split} has dtype {x.dtype}, expected float32 or float64")
            if not x.flags.c_contiguous:
                raise ValueError(f"x_{split} with shape {x.shape} is not C-contiguous")
            if not isinstance(y, np.ndarray) or y.ndim != 1 or y.dtype != np.int64:
                raise ValueError(f"y_{split} must be a 1-D int64 ndarray, got "
                                 f"{type(y).__name__} with shape {getattr(y, 'shape', None)} "
                                 f"and dtype {getattr(y, 'dtype', None)}")
            if len(x) != len(y):
                raise ValueError(f"x_{split} has {len(x)} samples but y_{split} has {len(y)}")
        if self.x_test.dtype != self.x_train.dtype:
            raise ValueError(f"x_train has dtype {self.x_train.dtype} but x_test has "
                             f"{self.x_test.dtype}")
        if self.x_test.shape[1] != self.x_train.shape[1]:
            raise ValueError(f"x_train has {self.x_train.shape[1]} features but x_test has "
                             f"{self.x_test.shape[1]}")
        if int(self.n_classes) < 2:
            raise ValueError(f"n_classes={self.n_classes} must be at least 2")
        shape = (self.x_train.shape[1],) if self.input_shape is None else self.input_shape
        if not (isinstance(shape, (tuple, list)) and shape and all(
                isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1
                for s in shape)):
            raise ValueError(f"input_shape={self.input_shape!r} must be a non-empty tuple of "
                             f"positive integers")
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != self.x_train.shape[1]:
            raise ValueError(f"input_shape={shape} holds {math.prod(shape)} values but x_train "
                             f"has {self.x_train.shape[1]} features")
        object.__setattr__(self, "input_shape", shape)  # frozen: the normalized tuple

    @property
    def n_features(self) -> int:
        """Features per row of x."""
        return self.x_train.shape[1]

    @property
    def n_train(self) -> int:
        """Training samples."""
        return self.x_train.shape[0]

    @property
    def n_test(self) -> int:
        """Test samples."""
        return self.x_test.shape[0]

    @property
    def dtype(self) -> np.dtype:
        """The dtype of x (float32 or float64)."""
        return self.x_train.dtype

    def describe(self) -> str:
        """One line for logs: name, sizes, input shape, dtype and source."""
        shape = f" ({'x'.join(map(str, self.input_shape))})" if len(self.input_shape) > 1 else ""
        return (f"{self.name}: {self.n_train} train / {self.n_test} test, "
                f"{self.n_features} features{shape}, {self.n_classes} classes, {self.dtype} "
                f"[{self.source}]")
