"""The user's data as CSV (or any delimited text): ``from_csv`` and ``read_csv``.

A file holds one sample per line, its values separated by commas (or tabs, semicolons, or
runs of spaces: the first line tells which); blank lines and lines starting with # are
skipped. The first line is a header when none of its fields is a number (``header=None``,
the default), or as ``header=True/False`` says. ``from_csv`` takes one column as the
labels (``label_column``: its name in the header, or its index, negative from the end;
default the last column) and the other columns as the features.

Every value must be a finite number: the first one that is not is a DataError naming the
file, the line, the column (and its header name) and the value. Class labels are numbers
0..C-1 (encode text labels first, e.g. with np.unique(y, return_inverse=True)).

The file is read in chunks of lines, each converted to float64 at once, so the text is
never held whole in memory; the values are (a CSV's features are converted once to the
model's dtype, as ``from_arrays`` does). For data larger than memory use .npy files
(``from_npy``, memory-mapped).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .dataset import CLASSIFICATION, DataError

_DELIMITERS = (",", "\t", ";")
_CHUNK_LINES = 16384  # lines converted to numbers at once: bounded text in memory
_COMMENT = "#"


def _number(text: str) -> bool:
    # Python's float reads "1_000" as 1000 and "3_1" as 31: in a CSV cell that is more
    # likely an identifier than a number (pandas and np.loadtxt refuse it too)
    if "_" in text:
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True


def _delimiter(line: str) -> str | None:
    """The delimiter of a line: the most frequent of , TAB ; (None: runs of whitespace)."""
    counts = {d: line.count(d) for d in _DELIMITERS}
    best = max(counts, key=counts.get)
    return best if counts[best] else None


def _lines(path: Path):
    """(line number, fields) of every line that holds data (the delimiter read from the
    first such line)."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        first = next((t for t in f if t.strip() and not t.lstrip().startswith(_COMMENT)), "")
    delimiter = _delimiter(first)
    with open(path, newline="", encoding="utf-8-sig") as f:
        if delimiter is None:
            for number, line in enumerate(f, 1):
                fields = line.split()
                if fields and not fields[0].startswith(_COMMENT):
                    yield number, fields
            return
        reader = csv.reader(f, delimiter=delimiter)
        for fields in reader:
            if any(s.strip() for s in fields) and not fields[0].lstrip().startswith(_COMMENT):
                yield reader.line_num, [s.strip() for s in fields]


def read_csv(
    path, *, header: bool | None = None, label_column=None, task: str = CLASSIFICATION
) -> tuple[np.ndarray, list[str] | None]:
    """(values, column names) of a delimited text file: values a (n, columns) float64
    array, names the header's fields (None when the file has no header). header: None
    (detected: a first line with no number in it), True or False. DataError naming the
    file, line and column for a value that is not a finite number, a line with another
    number of fields than the first, a file with no data. label_column (as ``label_index``
    takes it; None: no column holds labels) and task: text in the label column is told
    apart, with how to turn text labels into numbers."""
    path = Path(path)
    try:
        lines = _lines(path)
        first = next(lines, None)
        if first is None:
            raise DataError(f"{path} holds no data (every line is blank or a # comment)")
        top, fields = first
        if header is None:
            header = not any(_number(s) for s in fields)
        names = fields if header else None
        width = len(fields)
        labels = None
        if label_column is not None:  # a one-column file is all labels
            labels = 0 if width == 1 else label_index(label_column, names, width, path)
        where = (names, top, labels, task)
        chunks, block, numbers = [], [], []
        if not header:
            block, numbers = [fields], [top]
        for number, fields in lines:
            if len(fields) != width:
                raise DataError(
                    f"{path} line {number} has {len(fields)} fields, but line {top} has {width}"
                )
            block.append(fields)
            numbers.append(number)
            if len(block) == _CHUNK_LINES:
                chunks.append(_values(path, block, numbers, *where))
                block, numbers = [], []
        if block:
            chunks.append(_values(path, block, numbers, *where))
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path} is not a text file (byte {exc.start} is not UTF-8): expected CSV "
            f"(a delimited text file), a .npy or an .npz file"
        ) from None
    except csv.Error as exc:
        raise DataError(f"{path}: not readable as CSV ({exc})") from None
    if not chunks:
        raise DataError(f"{path} holds a header line but no data")
    return np.concatenate(chunks) if len(chunks) > 1 else chunks[0], names


def _values(path, block: list, numbers: list, names, top: int, labels, task) -> np.ndarray:
    """A chunk of lines as float64, or a DataError naming the first value that is not a
    finite number (in the label column, `labels`, text is told apart: it names the fix)."""
    try:
        values = np.array(block, dtype=np.float64)
        if np.isfinite(values).all() and not any("_" in "".join(row) for row in block):
            return values
    except ValueError:
        pass
    for number, fields in zip(numbers, block):
        for j, text in enumerate(fields):
            if not (_number(text) and np.isfinite(float(text))):
                column = f"column {j + 1}" + (f" ({names[j]!r})" if names else "")
                what = "is empty" if not text else f"{text!r} is not a finite number"
                if j == labels and text and not _number(text):
                    raise DataError(f"{path} line {number}, {column}: {_text_label(text, task)}")
                hint = (
                    f" (if line {top} is a header, say so: header=True, --csv-header yes)"
                    if number == top and names is None
                    else ""
                )
                raise DataError(f"{path} line {number}, {column}: {what}{hint}")
    raise AssertionError("unreachable: a chunk failed to convert but every value is a number")


def _text_label(text: str, task: str) -> str:
    """What is wrong with a text label (or target), and the fix."""
    if task != CLASSIFICATION:
        return f"{text!r} is not a number: regression targets must be numbers"
    return (
        f"{text!r} is a text label: labels must be numbers, the class indices 0..C-1. Map "
        f"the labels to numbers first (e.g. np.unique(labels, return_inverse=True) gives "
        f"the indices), or use the scikit-learn estimators (dptrain.sklearn.MLPClassifier), "
        f"which take any labels"
    )


def label_index(label_column, names: list[str] | None, width: int, path) -> int:
    """The index of the label column: a header name, or an index (an int, or its text as
    the command line gives it), negative from the end."""
    if isinstance(label_column, str):
        text = label_column.strip()
        if names is not None and text in names:
            at = [i for i, name in enumerate(names) if name == text]
            if len(at) > 1:  # the first would be a guess
                raise DataError(
                    f"label column {text!r} is ambiguous: {path}'s header names columns "
                    f"{', '.join(map(str, at))} so; give the label column's index"
                )
            return at[0]
        try:
            label_column = int(text)
        except ValueError:
            known = f"its columns are {', '.join(names)}" if names else "it has no header line"
            raise DataError(
                f"label column {text!r} is not a column of {path}: {known} (or give an index)"
            ) from None
    if isinstance(label_column, bool) or not isinstance(label_column, (int, np.integer)):
        raise ValueError(f"label_column is {label_column!r}: give a column name or index")
    if not -width <= label_column < width:
        raise DataError(
            f"label column {label_column} is out of range: {path} has {width} columns "
            f"(0..{width - 1}, or -1 for the last)"
        )
    return int(label_column) % width


def labels_of(column: np.ndarray, task: str) -> np.ndarray:
    """A CSV column as labels: whole numbers as int64 class indices (the CSV's text has no
    dtype to keep), else as they are (from_arrays names what is wrong with them)."""
    if task == CLASSIFICATION and np.all(np.floor(column) == column):
        if np.all(np.abs(column) < 2**53):
            return column.astype(np.int64)
    return column


def split_csv(path, *, label_column=-1, header=None, task=CLASSIFICATION):
    """(features (n, d) float64, labels, names of the feature columns or None) of a CSV."""
    label_column = -1 if label_column is None else label_column
    values, names = read_csv(path, header=header, label_column=label_column, task=task)
    width = values.shape[1]
    if width < 2:
        raise DataError(
            f"{path} has one column: expected the features and a label column (or give "
            f"the labels in a file of their own)"
        )
    j = label_index(label_column, names, width, path)
    features = np.ascontiguousarray(np.delete(values, j, axis=1))
    kept = None if names is None else [n for i, n in enumerate(names) if i != j]
    return features, labels_of(values[:, j], task), kept
