"""The Dataset every loader returns, the errors they raise, and the integrity helpers.

`Dataset` holds train and test splits in the layout the C core wants, validated once at
construction so that the training loop never converts. The errors: `DataError` (malformed or
inconsistent data; the message names the file or array), `DataNotFound` (no copy found;
lists where it looked) and the `DataWarning` for files that are not the published ones.
The helpers shared by the loaders: `_integrity` (checksums against published ones),
`_md5_file`, `first_nonfinite_row` (a bounded-memory scan for NaN and infinity),
`_float_dtype` (float32 / float64 only) and `_check_count`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import warnings
from pathlib import Path

import numpy as np


class DataError(ValueError):
    """Data is missing, malformed or inconsistent; the message names the file or the array
    (and the row, where one row is at fault)."""


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
    differ = [
        f"{file} ({algorithm} {digest}, published {expected})"
        for file, algorithm, digest, expected in checks
        if expected is not None and digest != expected
    ]
    if differ:
        warnings.warn(
            f"{what} in {where} is not the published data set: "
            + "; ".join(differ)
            + ". Training goes on with these files, but results "
            "will not be comparable with published ones.",
            DataWarning,
            stacklevel=4,
        )
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
    """`value` as an int, or a ValueError naming `arg` when it is not an integer >= minimum."""
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
    if isinstance(dtype, str) and dtype == "bfloat16":
        raise ValueError(
            f"{arg}='bfloat16': data sets hold float32 or float64; a bfloat16 "
            f"(mixed precision) model reads float32 data"
        )
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ValueError(
            f"{arg}={dtype!r} is not a NumPy dtype; expected float32 or float64"
        ) from exc
    if dt not in _FLOAT_DTYPES:
        raise ValueError(f"{arg}={dt} is not supported; expected float32 or float64")
    return dt


# The kinds of target a Dataset holds (one owner of these words; the models and the
# training loop import them from here).
CLASSIFICATION = "classification"
REGRESSION = "regression"
TASKS = (CLASSIFICATION, REGRESSION)

_CHUNK_BYTES = 8 << 20  # bytes of x read per chunk by the row-wise checks below


def first_nonfinite_row(x: np.ndarray, chunk_bytes: int = _CHUNK_BYTES) -> int | None:
    """The index of the first row of x (n, ...) holding a NaN or an infinity, else None.

    Reads x in chunks of about `chunk_bytes`, in order, so the temporaries stay bounded
    whatever n is and a memory map is read once from start to end. Integer and bool
    arrays hold no such values: None at once.
    """
    if x.dtype.kind not in "fc" or x.size == 0:
        return None
    rows = max(1, chunk_bytes // max(1, x[0].nbytes))
    for start in range(0, len(x), rows):
        block = x[start : start + rows].reshape(min(rows, len(x) - start), -1)
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            return start + int(np.argmin(finite))
    return None


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Train and test splits. x: (n, features) C-contiguous float32/float64; y: see `task`.

    `task` is "classification" (the default) or "regression":
    - classification: y is (n,) int64, class indices 0..n_classes-1, n_classes >= 2;
    - regression: y is (n, k) C-contiguous with x's dtype (k targets per row; a single
      target is (n, 1)), and n_classes is None. `n_outputs` is k or n_classes.
    The test split may be empty (n_test == 0, x_test of shape (0, features)): there is then
    no held-out set to evaluate on.
    x may be a read-only np.memmap (see arrays.py): a data set larger than memory.
    `source` says where the arrays came from (a directory, or "synthetic (...)").
    `true_weights` is the generating weight vector w* for `synthetic_binary`, else None.
    `integrity` says whether the files read are the published ones: "verified" (every
    file's checksum matches), "modified" (one differs; a DataWarning said which),
    "unchecked" (no published checksum, or not read from files).
    `input_shape` is the shape of one sample, whose row-major flattening is a row of x:
    (1, 28, 28) for MNIST, (3, 32, 32) for CIFAR-10 (channels first), so that a CNN can
    view the rows as images. Left out (None), it becomes (features,): plain vectors.
    `notes` are lines for the caller to print (rank 0 only): what was done to the user's
    data once when it was loaded (a dtype conversion, a held-out split), never printed here.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str
    n_classes: int | None
    source: str
    true_weights: np.ndarray | None = None
    input_shape: tuple[int, ...] | None = None
    integrity: str = "unchecked"
    task: str = CLASSIFICATION
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        # Validate once here so the training loop can trust the layout and never convert.
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r} is not one of {', '.join(TASKS)}")
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            if not isinstance(x, np.ndarray) or x.ndim != 2:
                raise ValueError(
                    f"x_{split} must be a 2-D ndarray (n, features), got "
                    f"{type(x).__name__} with shape {getattr(x, 'shape', None)}"
                )
            if x.dtype not in _FLOAT_DTYPES:
                raise ValueError(f"x_{split} has dtype {x.dtype}, expected float32 or float64")
            if not x.flags.c_contiguous:
                raise ValueError(f"x_{split} with shape {x.shape} is not C-contiguous")
            if self.task == CLASSIFICATION:
                if not isinstance(y, np.ndarray) or y.ndim != 1 or y.dtype != np.int64:
                    raise ValueError(
                        f"y_{split} must be a 1-D int64 ndarray, got "
                        f"{type(y).__name__} with shape "
                        f"{getattr(y, 'shape', None)} and dtype "
                        f"{getattr(y, 'dtype', None)}"
                    )
            elif not (
                isinstance(y, np.ndarray)
                and y.ndim == 2
                and y.shape[1] >= 1
                and y.dtype == x.dtype
                and y.flags.c_contiguous
            ):
                raise ValueError(
                    f"y_{split} of a regression must be a C-contiguous (n, k) "
                    f"ndarray with k >= 1 and x's dtype {x.dtype}, got "
                    f"{type(y).__name__} with shape {getattr(y, 'shape', None)} "
                    f"and dtype {getattr(y, 'dtype', None)}"
                )
            if len(x) != len(y):
                raise ValueError(f"x_{split} has {len(x)} samples but y_{split} has {len(y)}")
        if self.x_test.dtype != self.x_train.dtype:
            raise ValueError(
                f"x_train has dtype {self.x_train.dtype} but x_test has {self.x_test.dtype}"
            )
        if self.x_test.shape[1] != self.x_train.shape[1]:
            raise ValueError(
                f"x_train has {self.x_train.shape[1]} features but x_test has "
                f"{self.x_test.shape[1]}"
            )
        if self.task == CLASSIFICATION:
            if self.n_classes is None or int(self.n_classes) < 2:
                raise ValueError(f"n_classes={self.n_classes} must be at least 2")
        else:
            if self.n_classes is not None:
                raise ValueError(
                    f"n_classes={self.n_classes!r}: a regression has no classes (n_classes=None)"
                )
            if self.y_test.shape[1] != self.y_train.shape[1]:
                raise ValueError(
                    f"y_train has {self.y_train.shape[1]} targets per row but "
                    f"y_test has {self.y_test.shape[1]}"
                )
        shape = (self.x_train.shape[1],) if self.input_shape is None else self.input_shape
        if not (
            isinstance(shape, (tuple, list))
            and shape
            and all(
                isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1
                for s in shape
            )
        ):
            raise ValueError(
                f"input_shape={self.input_shape!r} must be a non-empty tuple of positive integers"
            )
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != self.x_train.shape[1]:
            raise ValueError(
                f"input_shape={shape} holds {math.prod(shape)} values but x_train "
                f"has {self.x_train.shape[1]} features"
            )
        object.__setattr__(self, "input_shape", shape)  # frozen: the normalized tuple
        if isinstance(self.notes, str) or not all(isinstance(s, str) for s in self.notes):
            raise ValueError(f"notes={self.notes!r} must be a sequence of strings")
        object.__setattr__(self, "notes", tuple(self.notes))

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
        """Test samples (0: no held-out set)."""
        return self.x_test.shape[0]

    @property
    def n_outputs(self) -> int:
        """Outputs a model needs: n_classes (classification) or targets per row (regression)."""
        return self.n_classes if self.task == CLASSIFICATION else self.y_train.shape[1]

    @property
    def dtype(self) -> np.dtype:
        """The dtype of x (float32 or float64)."""
        return self.x_train.dtype

    def describe(self) -> str:
        """One line for logs: name, sizes, input shape, targets, dtype and source."""
        shape = f" ({'x'.join(map(str, self.input_shape))})" if len(self.input_shape) > 1 else ""
        test = f"{self.n_test} test" if self.n_test else "no test set"
        if self.task == CLASSIFICATION:
            targets = f"{self.n_classes} classes"
        else:
            k = self.n_outputs
            targets = f"{k} regression target{'s' if k > 1 else ''}"
        return (
            f"{self.name}: {self.n_train} train / {test}, "
            f"{self.n_features} features{shape}, {targets}, {self.dtype} "
            f"[{self.source}]"
        )
