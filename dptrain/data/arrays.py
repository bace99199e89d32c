"""The user's own data as a Dataset: NumPy arrays in memory, .npy files, an .npz archive.

- `from_arrays(X, y, ...)`: arrays (or array-likes) in memory, or np.memmap objects.
- `from_npy(x_path, y_path, ...)`: .npy files opened as read-only memory maps, so that a
  data set larger than memory trains: the OS pages rows in as the training loop reads them.
- `from_npz(path, ...)`: an .npz archive (x_train / y_train [/ x_test / y_test], or X / y
  [/ X_test / y_test]); its members are read into memory (NumPy cannot map inside a zip),
  each after its header was checked (a damaged or hostile archive is a DataError naming it).
- `from_csv(path, label_column=..., ...)`: a CSV file (dptrain.data.csvfiles).
- `from_files(x_path, y_path=None, ...)`: the files a user names, each read by what it holds
  (.npz, .npy or CSV): what the command line's --data and --train-x/--train-y read.
- `memmap_region(x)`: where a memory-mapped array lies in its file, so that a worker
  process can map the same bytes itself instead of being sent a copy.

The layout (what the C core wants, see Dataset): a sample of X, whatever its shape, is one
row of x, flattened in C order: X of shape (n, d) gives rows of d features, input_shape
(d,); (n, H, W) gives input_shape (1, H, W), one channel; (n, C, H, W) gives (C, H, W), so
4-D images must be channels first (transpose channels-last (n, H, W, C) data with
X.transpose(0, 3, 1, 2) first); more dimensions are kept as they are. `input_shape=` says
otherwise (e.g. (1, 28, 28) for rows of 784 pixels).

X is converted to the model's dtype (float32 or float64) once, here, and never on a
training step: an X that is already a C-contiguous array of that dtype is used as it is (a
view, no copy; a memory map stays one); any other X is converted chunk by chunk, into
memory, or, when X is a memory map, into a temporary file in `tmp_dir` (default
tempfile.gettempdir()) that is mapped and unlinked at once (so nothing is left behind,
whatever ends the process; its space is freed with the data set). Every conversion is
said in `Dataset.notes`, for the caller to print. NaN and infinity are refused, naming the
first bad row; the scan reads X in bounded chunks, so a memory map is never read whole into
memory.

Targets (`task`):
- "classification" (the default): y holds one class index 0..C-1 per row: integers, bool,
  or floats that are all whole numbers (converted to int64, with a note). n_classes is
  max(label) + 1 over the training and test labels unless given; a binary classifier
  (n_classes=2, a logistic model's single output) takes labels 0 and 1. Labels are used as
  they are: other labels (strings, ids such as [3, 7]) must be encoded as 0..C-1 first
  (np.unique(y, return_inverse=True); the scikit-learn-style layer does that and keeps
  the classes); a note says when some of the classes 0..C-1 never appear.
- "regression": y holds real targets of shape (n,) or (n, k), stored as (n, k) in the
  model's dtype; NaN and infinity are refused, naming the row.

The test set: X_test and y_test; or `validation=f`, which holds out the LAST f * n rows
(rounded to the nearest, halves up; no shuffling: a contiguous range, so that a
memory-mapped X is split without a copy; shuffle X and y together beforehand if the rows
are ordered, e.g. by label); or neither, and the Dataset's test split is empty
(n_test == 0).

Left out on purpose: label encoding, shuffling (the training loop shuffles every epoch),
feature scaling (divide uint8 pixels by 255 yourself), reading anything but NumPy's formats
and CSV.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .._aligned import aligned_empty
from .._files import (
    KIND_NAMES,
    NpzArchive,
    memory_bytes,
    not_the_kind,
    read_npy_header,
    size_text,
    sniff,
)
from .._memmap import memmap_region  # noqa: F401  (dptrain.data's: where a map lies)
from .csvfiles import label_index, labels_of, read_csv, split_csv
from .dataset import (
    CLASSIFICATION,
    REGRESSION,
    TASKS,
    DataError,
    Dataset,
    _check_count,
    _float_dtype,
    first_nonfinite_row,
)

_CHUNK_BYTES = 8 << 20  # bytes per chunk of a conversion or a scan: bounded temporaries
_REAL_KINDS = "biuf"  # bool, signed and unsigned integers, floats
_EXACT_INTEGERS = 2**53  # float labels at or beyond this are not exact class indices
_NPZ_LAYOUTS = (("x_train", "y_train", "x_test", "y_test"), ("X", "y", "X_test", "y_test"))


def from_arrays(
    X,
    y,
    *,
    X_test=None,
    y_test=None,
    validation: float | None = None,
    task: str = CLASSIFICATION,
    n_classes: int | None = None,
    dtype="float32",
    input_shape: tuple[int, ...] | None = None,
    name: str = "arrays",
    tmp_dir=None,
) -> Dataset:
    """A Dataset of the user's arrays: X (n, ...) of real numbers, y one target per row.

    X: bool, integer or float values (complex, object and string arrays are a TypeError
    naming the dtype), n >= 1 rows; a row is X[i] flattened (see the module docstring for
    input_shape). y: class indices (task="classification") or real targets
    (task="regression"). X_test / y_test: a held-out set, rows shaped as X's; or
    validation=f: the last f * n rows (rounded, halves up) are held out; or neither: no
    test set. n_classes: for a classification, the number of classes (default: the largest
    label + 1). input_shape: the shape of one sample, if not the one X's shape implies.
    dtype: the model's dtype, float32 or float64; X is converted to it once, here (a
    C-contiguous X of that dtype is not copied at all: the Dataset holds a view of it).
    tmp_dir: where an np.memmap X that needs a conversion is converted to (a temporary
    file, unlinked at once; default tempfile.gettempdir()). name: the Dataset's name.
    Returns a Dataset whose `notes` say what was done (conversions, the split); raises
    DataError naming the array and the row for inconsistent data, ValueError for bad
    arguments.
    """
    names = {"X": "X", "y": "y", "X_test": "X_test", "y_test": "y_test"}
    return _build(
        X,
        y,
        X_test,
        y_test,
        names=names,
        validation=validation,
        task=task,
        n_classes=n_classes,
        dtype=dtype,
        input_shape=input_shape,
        name=name,
        source=_describe_source(X, y, X_test),
        tmp_dir=tmp_dir,
    )


def from_npy(
    x_path,
    y_path,
    *,
    x_test_path=None,
    y_test_path=None,
    validation: float | None = None,
    task: str = CLASSIFICATION,
    n_classes: int | None = None,
    dtype="float32",
    input_shape: tuple[int, ...] | None = None,
    name: str | None = None,
    tmp_dir=None,
) -> Dataset:
    """A Dataset of .npy files (np.save's format), X files opened as read-only memory maps.

    When an X file already holds the model's dtype in C order, the Dataset's x IS the
    memory map (np.memmap; a validation split is two views of it): nothing is read until
    the training loop reads it, so the file may be larger than memory. Otherwise it is
    converted once, chunk by chunk, into a temporary memory-mapped file in `tmp_dir`
    (default tempfile.gettempdir(); unlinked at once), never whole in memory; a note says
    so. Labels and targets are read into memory. The other arguments are from_arrays';
    `name` defaults to the X file's stem. A file that is not a .npy file is a DataError, one
    of complex, object or string data a TypeError, each naming the file.
    """
    x_path, y_path = Path(x_path), Path(y_path)
    if (x_test_path is None) != (y_test_path is None):
        raise ValueError(
            f"x_test_path={x_test_path!r} and y_test_path={y_test_path!r}: give both or neither"
        )
    paths = [x_path, y_path] + (
        [] if x_test_path is None else [Path(x_test_path), Path(y_test_path)]
    )
    arrays = [_open_npy(p) for p in paths] + [None] * (4 - len(paths))
    names = dict(zip(("X", "y", "X_test", "y_test"), map(str, paths)))
    return _build(
        *arrays,
        names=names,
        validation=validation,
        task=task,
        n_classes=n_classes,
        dtype=dtype,
        input_shape=input_shape,
        name=x_path.stem if name is None else name,
        source=", ".join(map(str, paths)),
        tmp_dir=tmp_dir,
    )


def from_npz(
    path,
    *,
    validation: float | None = None,
    task: str = CLASSIFICATION,
    n_classes: int | None = None,
    dtype="float32",
    input_shape: tuple[int, ...] | None = None,
    name: str | None = None,
) -> Dataset:
    """A Dataset of an .npz archive (np.savez's format), its members read into memory.

    The archive holds x_train and y_train (and, optionally, x_test and y_test), or X and y
    (and, optionally, X_test and y_test); other members are ignored. For data larger than
    memory use .npy files and from_npy: NumPy cannot memory-map inside a zip. The other
    arguments are from_arrays'; `name` defaults to the file's stem. Raises DataError naming
    the file when it is not an .npz archive or lacks the members, TypeError naming the
    member for complex, object or string data.
    """
    path = Path(path)
    _expect(path, "npz")
    with NpzArchive(path, str(path), error=DataError) as archive:
        keys = set(archive.files)
        layout = next((lay for lay in _NPZ_LAYOUTS if set(lay[:2]) <= keys), None)
        if layout is None:
            raise DataError(
                f"{path}: expected members x_train and y_train (or X and y), "
                f"found {', '.join(sorted(keys)) or 'none'}"
            )
        test_keys = [k for k in layout[2:] if k in keys]
        if len(test_keys) == 1:
            raise DataError(
                f"{path}: holds {test_keys[0]} without "
                f"{({*layout[2:]} - {*test_keys}).pop()}; give both or neither"
            )
        wanted = layout if test_keys else layout[:2]
        arrays = [_npz_member(archive, key, path) for key in wanted] + [None] * (4 - len(wanted))
    names = dict(zip(("X", "y", "X_test", "y_test"), (f"{path}[{k}]" for k in layout)))
    return _build(
        *arrays,
        names=names,
        validation=validation,
        task=task,
        n_classes=n_classes,
        dtype=dtype,
        input_shape=input_shape,
        name=path.stem if name is None else name,
        source=str(path),
        tmp_dir=None,
    )


def from_csv(
    path,
    *,
    label_column: int | str | None = None,
    header: bool | None = None,
    test_path=None,
    name: str | None = None,
    **options,
) -> Dataset:
    """A Dataset of a CSV file (or any delimited text, see dptrain.data.csvfiles): one
    sample per line, its label in ``label_column`` (a header name, or an index, negative
    from the end; default the last column), its features in the other columns. header:
    None (detected: a first line with no number in it is a header), True or False.
    test_path: a held-out set in a second file of the same columns. options: from_arrays'
    validation, task, n_classes, dtype, input_shape; `name` defaults to the file's stem. A
    value that is not a finite number is a DataError naming the file, line and column."""
    paths = [Path(path)] + ([] if test_path is None else [Path(test_path)])
    arrays = []
    for p in paths:
        _expect(p, "text")
        features, labels, _ = split_csv(
            p, label_column=label_column, header=header, task=options.get("task", CLASSIFICATION)
        )
        arrays += [features, labels]
    names = [f"{p} ({part})" for p in paths for part in ("features", "labels")]
    return _build_named(arrays, names, paths, name, None, options)


def from_files(
    x_path,
    y_path=None,
    *,
    x_test_path=None,
    y_test_path=None,
    label_column: int | str | None = None,
    header: bool | None = None,
    name: str | None = None,
    tmp_dir=None,
    **options,
) -> Dataset:
    """A Dataset of the files a user names, each read by what it holds (not by its name):
    one file (``y_path`` None): an .npz archive (from_npz) or a CSV of features and labels
    (from_csv); or an X and a y file (and X_test, y_test), each a .npy (memory-mapped, as
    from_npy) or a CSV: an X CSV's columns are all features, a y CSV holds one column or
    its ``label_column``. options: from_arrays' validation, task, n_classes, dtype,
    input_shape. What the command line reads."""
    x_path = Path(x_path)
    if y_path is None:
        if x_test_path is not None or y_test_path is not None:
            raise ValueError("a test set goes with an X and a y file, not with one data file")
        kind = sniff(x_path) if x_path.is_file() else None
        if kind == "text":
            return from_csv(x_path, label_column=label_column, header=header, name=name, **options)
        if kind == "empty":
            raise DataError(f"{x_path} is empty: expected CSV text or {KIND_NAMES['npz']}")
        _no_label_column(label_column, x_path)
        return from_npz(x_path, name=name, **options)
    if (x_test_path is None) != (y_test_path is None):
        raise ValueError(
            f"x_test_path={x_test_path!r} and y_test_path={y_test_path!r}: give both or neither"
        )
    paths = [x_path, Path(y_path)] + (
        [] if x_test_path is None else [Path(x_test_path), Path(y_test_path)]
    )
    if not (paths[1].is_file() and sniff(paths[1]) == "text"):
        _no_label_column(label_column, paths[1])
    task = options.get("task", CLASSIFICATION)
    arrays = [
        _open_data_file(p, labels=i % 2 == 1, label_column=label_column, header=header, task=task)
        for i, p in enumerate(paths)
    ]
    return _build_named(arrays, list(map(str, paths)), paths, name, tmp_dir, options)


# from_arrays' defaults of the options that from_csv and from_files pass on
_BUILD_DEFAULTS = dict(
    validation=None, task=CLASSIFICATION, n_classes=None, dtype="float32", input_shape=None
)


def _build_named(arrays: list, names: list, paths: list, name, tmp_dir, options) -> Dataset:
    """_build of the arrays read from files: [X, y] or [X, y, X_test, y_test], named
    as given; the Dataset named after the first file unless `name` is given."""
    arrays = arrays + [None] * (4 - len(arrays))
    names = names + [None] * (4 - len(names))
    return _build(
        *arrays,
        names=dict(zip(("X", "y", "X_test", "y_test"), names)),
        **{**_BUILD_DEFAULTS, **options},
        name=paths[0].stem if name is None else name,
        source=", ".join(map(str, paths)),
        tmp_dir=tmp_dir,
    )


def _no_label_column(label_column, path: Path) -> None:
    if label_column is not None:
        raise ValueError(
            f"label column {label_column!r} picks a column of a CSV file, but {path} is not "
            f"one: its labels are its own array"
        )


def _open_data_file(path: Path, *, labels: bool, label_column, header, task) -> np.ndarray:
    """One file of from_files: a .npy (memory-mapped) or a CSV (all its columns for X;
    one column, or ``label_column``, for the labels)."""
    kind = sniff(path) if path.is_file() else None
    if kind == "empty":
        raise DataError(f"{path} is empty: expected CSV text or {KIND_NAMES['npy']}")
    if kind != "text":
        return _open_npy(path)
    label_column = -1 if label_column is None else label_column
    values, names = read_csv(
        path, header=header, label_column=label_column if labels else None, task=task
    )
    if not labels:
        return values
    j = 0
    if values.shape[1] > 1:
        j = label_index(label_column, names, values.shape[1], path)
    return labels_of(values[:, j], task)


# ---------------------------------------------------------------------------------------
# building the Dataset
# ---------------------------------------------------------------------------------------


def _build(
    X,
    y,
    X_test,
    y_test,
    *,
    names: dict,
    validation,
    task,
    n_classes,
    dtype,
    input_shape,
    name,
    source,
    tmp_dir,
) -> Dataset:
    """The Dataset of validated arrays; cheap checks (shapes, labels) before converting X."""
    dt = _float_dtype(dtype)
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not one of {', '.join(TASKS)}")
    if n_classes is not None:
        if task == REGRESSION:
            raise ValueError(
                f"n_classes={n_classes!r} applies to task='classification', not task='regression'"
            )
        n_classes = _check_count(n_classes, "n_classes", minimum=2)
    if (X_test is None) != (y_test is None):
        raise ValueError(f"{names['X_test']} and {names['y_test']}: give both or neither")
    if validation is not None and X_test is not None:
        raise ValueError(
            f"validation={validation!r} holds out rows of {names['X']}, but a "
            f"test set ({names['X_test']}, {names['y_test']}) is given too: "
            f"pass one or the other"
        )
    notes: list[str] = []
    X = _real_rows(X, names["X"])
    n = X.shape[0]
    if X_test is not None:
        X_test = _real_rows(X_test, names["X_test"])
        if X_test.shape[1:] != X.shape[1:]:
            raise DataError(
                f"{names['X_test']} has rows of shape {X_test.shape[1:]} but "
                f"{names['X']} has rows of shape {X.shape[1:]}"
            )
    n_held_out = 0 if validation is None else _held_out_rows(validation, n)

    # targets first: they are small, and a bad label should not wait for X's conversion
    if task == CLASSIFICATION:
        labels = _class_labels(y, n, names["y"], names["X"], notes)
        test_labels = (
            None
            if y_test is None
            else _class_labels(y_test, len(X_test), names["y_test"], names["X_test"], notes)
        )
        n_classes = _check_label_range(labels, test_labels, n_classes, names, notes)
    else:
        labels = _regression_targets(y, n, dt, names["y"], names["X"], notes)
        test_labels = (
            None
            if y_test is None
            else _regression_targets(
                y_test, len(X_test), dt, names["y_test"], names["X_test"], notes
            )
        )

    rows = _rows_of(X, dt, names["X"], tmp_dir, notes)
    if X_test is not None:
        x_train, y_train = rows, labels
        x_test, y_test = _rows_of(X_test, dt, names["X_test"], tmp_dir, notes), test_labels
    elif n_held_out:
        cut = n - n_held_out
        x_train, x_test = rows[:cut], rows[cut:]
        y_train, y_test = labels[:cut], labels[cut:]
        notes.append(
            f"validation={validation}: the last {n_held_out} of the {n} rows "
            f"(rows {cut}..{n - 1}) are the test set, taken as they are (not "
            f"shuffled): shuffle X and y together first if the rows are ordered"
        )
        if task == CLASSIFICATION:
            seen, held = len(np.unique(y_train)), len(np.unique(y_test))
            if held < seen:
                notes.append(
                    f"the held-out rows hold {held} of the {seen} classes of the "
                    f"training rows: are the rows ordered by label? Then shuffle "
                    f"X and y together first"
                )
    else:
        x_train, y_train = rows, labels
        x_test = np.empty((0, rows.shape[1]), dtype=dt)
        y_test = labels[:0].copy()
        notes.append(
            "no test set: nothing is held out to measure the model on (give a test "
            "set, or validation=0.1 to hold out the last 10 % of the rows)"
        )
    shape = _default_input_shape(X.shape) if input_shape is None else input_shape
    note = channels_last_note("X", X.shape) if input_shape is None else None
    if note:
        notes.append(note)
    return Dataset(
        x_train,
        y_train,
        x_test,
        y_test,
        name=name,
        n_classes=n_classes if task == CLASSIFICATION else None,
        source=source,
        input_shape=shape,
        task=task,
        notes=tuple(notes),
    )


def as_rows(X, dtype, what: str = "X", notes: list[str] | None = None, *, per_call=False):
    """X as fit takes it (any real dtype, array-like, (n, ...) with n >= 1) as C-contiguous
    (n, features) rows of ``dtype``: X itself when it already is, else converted once, NaN
    and infinity refused naming the row; the conversion is said in ``notes``. per_call: the
    note says that a model's call converts on every call (it has no data set to keep)."""
    notes = [] if notes is None else notes
    return _rows_of(_real_rows(X, what), _float_dtype(dtype), what, None, notes, per_call)


def as_targets(y, n: int, dtype, n_classes, what="y", x_what="X", notes=None) -> np.ndarray:
    """y for n rows as fit takes it: with n_classes (a classifier's), class indices 0..C-1
    (integers of any width, bool, whole-number floats) as int64; with n_classes None
    (regression), real targets as (n, k) of ``dtype``. Errors name ``what`` and the row."""
    notes = [] if notes is None else notes
    if n_classes is None:
        return _regression_targets(y, n, _float_dtype(dtype), what, x_what, notes)
    labels = _class_labels(y, n, what, x_what, notes)
    _check_label_range(labels, None, n_classes, {"y": what, "y_test": what}, notes)
    return labels


def _real_rows(a, what: str) -> np.ndarray:
    """a as an ndarray of real numbers with n >= 1 rows of >= 1 value (an np.memmap stays one)."""
    arr = _real_array(a, what, "expected real numbers (bool, integers or floats)")
    if arr.ndim < 2:
        raise DataError(
            f"{what} has shape {arr.shape}: expected one row per sample, (n, "
            f"features) or (n, C, H, W); for one feature per sample pass "
            f"{what}.reshape(-1, 1)"
        )
    if arr.shape[0] == 0:
        raise DataError(f"{what} has no rows (shape {arr.shape})")
    if 0 in arr.shape[1:]:
        raise DataError(f"{what} has shape {arr.shape}: its samples hold no values")
    return arr


def _real_array(a, what: str, expected: str) -> np.ndarray:
    if isinstance(a, np.ndarray):
        arr = a
    else:
        try:
            arr = np.asarray(a)
        except ValueError as exc:  # ragged nested sequences
            raise DataError(f"{what} is not an array: {exc}") from None
    if arr.dtype.kind not in _REAL_KINDS:
        raise TypeError(
            f"{what} has dtype {arr.dtype}: {expected}; complex, object, string "
            f"and structured data are refused"
        )
    return arr


def channels_last(sample: tuple[int, ...]) -> tuple[int, ...] | None:
    """(C, H, W) when an image sample of shape (H, W, C) looks channels last (1, 3 or 4 values
    on its last axis, more on its first, as Keras and PIL lay images out), else None."""
    if len(sample) == 3 and sample[2] in (1, 3, 4) and sample[0] > 4:
        return (sample[2], sample[0], sample[1])
    return None


def channels_last_note(what: str, shape: tuple[int, ...]) -> str | None:
    """What to say of an X of this shape whose samples look channels last (see
    channels_last), read channels first as the C core reads images; else None."""
    chw = channels_last(tuple(shape[1:]))
    if chw is None:
        return None
    return (
        f"{what} has shape {tuple(shape)}, read channels first: {shape[1]} channels of "
        f"{shape[2]} x {shape[3]}; if its images are channels last ({chw[0]} channels of "
        f"{chw[1]} x {chw[2]}), pass {what}.transpose(0, 3, 1, 2)"
    )


def _default_input_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """(n, d) -> (d,); (n, H, W) -> (1, H, W), one channel; (n, C, H, W) and more: as is."""
    return (1,) + shape[1:] if len(shape) == 3 else shape[1:]


def _held_out_rows(validation, n: int) -> int:
    if (
        isinstance(validation, bool)
        or not isinstance(validation, (int, float))
        or not 0 < validation < 1
    ):
        raise ValueError(f"validation={validation!r} must be a fraction between 0 and 1 (e.g. 0.1)")
    held = int(validation * n + 0.5)
    if not 1 <= held <= n - 1:
        raise ValueError(
            f"validation={validation} of {n} rows holds out {held} rows: the "
            f"training and the held-out rows need one row each at least"
        )
    return held


# ---------------------------------------------------------------------------------------
# X: converted once, checked in chunks
# ---------------------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def _rows_of(
    X: np.ndarray, dt: np.dtype, what: str, tmp_dir, notes: list[str], per_call: bool = False
) -> np.ndarray:
    """X (n, ...) as a C-contiguous (n, features) array of dt, checked for NaN and infinity.

    A view when X already is one; else converted once: into memory, or into a temporary
    memory-mapped file when X is a memory map.
    """
    n, d = X.shape[0], math.prod(X.shape[1:])
    if X.dtype == dt and X.flags.c_contiguous:
        rows = X.reshape(n, d)  # a view (of a memory map: a memory map)
        bad = first_nonfinite_row(rows, _CHUNK_BYTES)
        if bad is not None:
            raise _nonfinite_error(what, rows, bad, dt)
        return rows
    change = (
        f"converted once from {X.dtype} to {dt}"
        if X.dtype != dt
        else "copied once into C order (rows contiguous)"
    )
    if per_call:  # a model's call: in memory, said without a size (the batches differ)
        change = (
            f"{change.replace(' once', '')} on every call (the model's dtype is {dt}: pass "
            f"{dt} rows in C order to skip the copy)"
        )
    elif isinstance(X, np.memmap):
        return _convert_to_file(X, dt, what, change, tmp_dir, notes)
    out = aligned_empty((n, d), dt)
    _copy_rows(X, out, what)
    notes.append(f"{what}: {change}" + ("" if per_call else f" ({_size(out.nbytes)} in memory)"))
    return out


def _convert_to_file(
    X: np.memmap, dt: np.dtype, what: str, change: str, tmp_dir, notes: list[str]
) -> np.memmap:
    """X converted chunk by chunk into a temporary .npy file, mapped read-only and unlinked."""
    directory = Path(tempfile.gettempdir() if tmp_dir is None else tmp_dir).expanduser()
    if not directory.is_dir():
        raise ValueError(f"tmp_dir={str(directory)!r} is not a directory")
    n, d = X.shape[0], math.prod(X.shape[1:])
    nbytes = n * d * dt.itemsize
    free = shutil.disk_usage(directory).free
    if nbytes > free:  # a full disk under a memory map is a SIGBUS
        raise DataError(
            f"{what}: converting {X.dtype} to {dt} needs {_size(nbytes)} in "
            f"{directory}, which has {_size(free)} free: pass tmp_dir= a directory "
            f"with room, or save {what} as {dt} in C order (used then as it is)"
        )
    fd, name = tempfile.mkstemp(prefix="dptrain-", suffix=".npy", dir=directory)
    os.close(fd)
    try:
        out = np.lib.format.open_memmap(name, mode="w+", dtype=dt, shape=(n, d))
        _copy_rows(X, out, what)
        out.flush()
        del out  # unmaps the writable view
        rows = np.load(name, mmap_mode="r")
    finally:
        os.unlink(name)  # nameless now: freed with the last mapping
    notes.append(
        f"{what}: {change} into a temporary memory-mapped file in {directory} "
        f"({_size(nbytes)} on disk, unlinked at once: freed with the data set); "
        f"save it as {dt} in C order to train on the file itself, with no copy"
    )
    return rows


def _copy_rows(src: np.ndarray, out: np.ndarray, what: str) -> None:
    """out[:] = src rows, converted chunk by chunk; a float source is checked as it goes."""
    n, d = out.shape
    check = src.dtype.kind == "f"
    step = max(1, _CHUNK_BYTES // max(src[0].nbytes, out[0].nbytes))
    for start in range(0, n, step):
        stop = min(start + step, n)
        block = out[start:stop]
        with np.errstate(over="ignore", invalid="ignore"):  # out of range: caught below
            block[...] = src[start:stop].reshape(stop - start, d)
        if check:
            bad = first_nonfinite_row(block, _CHUNK_BYTES)
            if bad is not None:
                raise _nonfinite_error(what, src, start + bad, out.dtype)


def _nonfinite_error(what: str, src: np.ndarray, row: int, dt: np.dtype) -> DataError:
    """Names the row and the value: NaN or infinity in the data, or a value beyond dt."""
    values = np.asarray(src[row], dtype=np.float64).reshape(-1)
    finite = np.isfinite(values)
    if not finite.all():
        return DataError(
            f"{what} row {row} holds {values[np.argmin(finite)]}: NaN and "
            f"infinity are refused; drop or fill in that row"
        )
    big = values[np.argmax(np.abs(values) > np.finfo(dt).max)]
    return DataError(
        f"{what} row {row} holds {big:g}, beyond the range of {dt} (largest "
        f"{np.finfo(dt).max:g}): rescale the data or use dtype='float64'"
    )


# ---------------------------------------------------------------------------------------
# y: class labels or regression targets
# ---------------------------------------------------------------------------------------


def _class_labels(y, n: int, what: str, x_what: str, notes: list[str]) -> np.ndarray:
    """y as (n,) int64 class indices >= 0 (upper bound checked by _check_label_range)."""
    y = _real_array(
        y,
        what,
        "classification labels must be class indices 0..C-1 (integers, "
        "or floats that are whole numbers); encode other labels first, "
        "e.g. classes, y = np.unique(y, return_inverse=True)",
    )
    if y.ndim != 1:
        hint = ""
        if y.ndim == 2:
            hint = (
                f"; pass {what}.ravel()"
                if y.shape[1] == 1
                else f"; one-hot rows? pass {what}.argmax(axis=1)"
            )
        raise DataError(
            f"{what} has shape {y.shape}: classification labels are one class "
            f"index per row, shape (n,){hint}"
        )
    if len(y) != n:
        raise DataError(f"{what} has {len(y)} labels but {x_what} has {n} rows")
    if y.dtype.kind == "f":
        whole = np.isfinite(y) & (np.floor(y) == y)
        if not whole.all():
            i = int(np.argmin(whole))
            raise DataError(
                f"{what}[{i}] = {y[i]} is not a whole number: classification "
                f"labels are class indices 0..C-1 (real-valued targets need a "
                f"regression model: dptrain.fit with a model built with loss='mse', "
                f"e.g. nn.mlp(..., loss='mse'), or dptrain.sklearn.MLPRegressor; "
                f"dptrain.data.from_arrays takes task='regression')"
            )
    if y.dtype.kind in "if" and len(y):
        negative = y < 0
        if negative.any():
            i = int(np.argmax(negative))
            raise DataError(
                f"{what}[{i}] = {y[i]} is negative: classification labels are class indices 0..C-1"
            )
    if y.dtype.kind in "uf" and len(y):
        limit = _EXACT_INTEGERS if y.dtype.kind == "f" else np.iinfo(np.int64).max
        i = int(np.argmax(y))
        if y[i] >= limit:
            raise DataError(f"{what}[{i}] = {y[i]} is too large to be a class index")
    if y.dtype.kind == "f":
        notes.append(f"{what}: {y.dtype} labels converted to int64 (all whole numbers)")
    return np.ascontiguousarray(y, dtype=np.int64)


def _check_label_range(
    labels: np.ndarray,
    test_labels: np.ndarray | None,
    n_classes: int | None,
    names: dict,
    notes: list[str],
) -> int:
    """n_classes (given, or the largest label + 1), every label checked against it."""
    if n_classes is not None:
        for array, what in ((labels, names["y"]), (test_labels, names["y_test"])):
            if array is None or not len(array):
                continue
            i = int(np.argmax(array))
            if array[i] >= n_classes:
                binary = " (a binary classifier's labels are 0 and 1)" if n_classes == 2 else ""
                raise DataError(
                    f"{what}[{i}] = {array[i]} is out of range 0..{n_classes - 1} "
                    f"for n_classes={n_classes}{binary}"
                )
        return n_classes
    every = labels if test_labels is None else np.concatenate([labels, test_labels])
    n_classes = int(every.max()) + 1
    if n_classes < 2:
        raise DataError(
            f"{names['y']} holds only the label 0: a classification needs two "
            f"classes at least (pass n_classes=2 if the other class is only "
            f"missing from these rows)"
        )
    used = len(np.unique(every))
    if used < n_classes:
        notes.append(
            f"{names['y']}: the labels use {used} of the {n_classes} classes "
            f"0..{n_classes - 1}, so the model gets {n_classes} outputs, "
            f"{n_classes - used} of them for classes that never appear (encode the "
            f"labels as 0..{used - 1}, e.g. with np.unique(y, return_inverse=True), "
            f"for {used})"
        )
    return n_classes


def _regression_targets(
    y, n: int, dt: np.dtype, what: str, x_what: str, notes: list[str]
) -> np.ndarray:
    """y as a C-contiguous (n, k) array of dt, finite."""
    y = _real_array(y, what, "regression targets must be real numbers")
    if y.ndim == 1:
        y = y.reshape(-1, 1)
    elif y.ndim != 2 or y.shape[1] == 0:
        raise DataError(
            f"{what} has shape {y.shape}: regression targets are (n,) or (n, k) with k >= 1"
        )
    if len(y) != n:
        raise DataError(f"{what} has {len(y)} rows of targets but {x_what} has {n} rows")
    with np.errstate(over="ignore", invalid="ignore"):  # out of range: caught below
        targets = np.ascontiguousarray(y, dtype=dt)
    bad = first_nonfinite_row(targets, _CHUNK_BYTES)
    if bad is not None:
        raise _nonfinite_error(what, y, bad, dt)
    if y.dtype != dt:
        notes.append(f"{what}: {y.dtype} targets converted to {dt} (the model's dtype)")
    return targets


# ---------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------


def _npy_header(f, where) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from an open .npy stream's header; DataError naming `where` if none."""
    try:
        shape, _, dtype = read_npy_header(f)
    except ValueError as exc:
        raise DataError(f"{where}: not a .npy file ({exc})") from None
    return shape, dtype


def _refuse_unreal(dtype: np.dtype, where) -> None:
    if dtype.kind not in _REAL_KINDS:
        raise TypeError(
            f"{where} holds {dtype} data: expected real numbers (bool, integers or "
            f"floats); complex, object, string and structured data are refused"
        )


# what to do with a file of each kind given where another kind was expected
_ADVICE = {
    "npy": "read it with from_npy (command line: --train-x)",
    "npz": "read it with from_npz (command line: --data)",
    "text": "read CSV with from_csv (command line: --data, --train-x and --train-y read CSV too)",
}


def _expect(path: Path, kind: str) -> None:
    """DataError naming the file, what it is and what to do with it, when it is not a file
    of `kind` ('npy', 'npz' or 'text'). A missing file is left to open() (FileNotFoundError)."""
    if path.is_dir():
        raise DataError(f"{path} is a directory, expected a file")
    if path.exists():
        wrong = not_the_kind(path, kind, _ADVICE.get(sniff(path), ""))
        if wrong is not None:
            raise DataError(wrong)


def _open_npy(path: Path) -> np.ndarray:
    """A .npy file as a read-only memory map (read into memory only when it is empty)."""
    _expect(path, "npy")
    with open(path, "rb") as f:
        shape, dtype = _npy_header(f, path)
        data_start = f.tell()
    _refuse_unreal(dtype, path)
    # the header's size against the file's before mapping: np.load's own words for a short
    # file are "mmap length is greater than file size", naming neither file nor sizes
    declared, held = math.prod(shape) * dtype.itemsize, os.path.getsize(path) - data_start
    if declared != held:
        raise DataError(
            f"{path} is "
            + ("truncated" if declared > held else "longer than its header says")
            + f": its header declares shape {tuple(shape)} of {dtype}, {declared:,} bytes "
            f"of data ({size_text(declared)}), but the file holds {held:,} after the header"
        )
    if math.prod(shape) == 0:  # nothing to map; the row checks name it
        return np.load(path)
    return np.load(path, mmap_mode="r")


def _npz_member(archive: NpzArchive, key: str, path: Path) -> np.ndarray:
    """A member of the user's .npz, its header checked (real numbers, a size this
    machine's memory holds) before its data is read."""
    _, dtype = archive.header(key)
    _refuse_unreal(dtype, f"{path}[{key}]")
    return archive.array(key, max_bytes=memory_bytes())


def _describe_source(X, y, X_test) -> str:
    """Dataset.source for arrays: their types, shapes and dtypes, e.g. "arrays (X: ndarray
    (100, 784) uint8; y: ndarray (100,) int64)"."""

    def one(what, a):
        shape, dtype = getattr(a, "shape", None), getattr(a, "dtype", None)
        known = [str(v) for v in (shape, dtype) if v is not None]
        return " ".join([f"{what}: {type(a).__name__}"] + known)

    parts = [one("X", X), one("y", y)] + ([] if X_test is None else [one("X_test", X_test)])
    return "arrays (" + "; ".join(parts) + ")"
