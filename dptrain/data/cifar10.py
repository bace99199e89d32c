"""CIFAR-10 on disk, in either published format: read, validate, never download.

The Python format's pickled batches are read without running anything (see
_cifar_pickle.py); the binary format's records are parsed directly. Both are found as
directories or as the original .tar.gz archives (read in memory), in a named directory or
$DPTRAIN_DATA then the cache (see locations.py). The policy "local files, else announced
synthetic data" is `catalog.get_cifar10`.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import zlib
from pathlib import Path

import numpy as np

from .._aligned import aligned_empty
from ._cifar_pickle import (
    _ALLOWED_GLOBALS_TEXT,
    _BadArrayPickle,
    _CifarUnpickler,
    _PickledArray,
    _RefusedGlobal,
)
from .dataset import DataError, DataNotFound, Dataset, _float_dtype, _integrity, _md5_file
from .locations import ENV_DATA_DIR, search_dirs

# Both published formats hold the same batches: data_batch_1..5 (10,000 training images
# each) and test_batch (10,000 test images). An image is 3072 bytes: the 1024 red, then the
# 1024 green, then the 1024 blue pixels, each plane row-major 32x32. That is channels-first
# (CHW) order already, so a flattened image is used as it is.
CIFAR10_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
CIFAR10_SHAPE = (3, 32, 32)
CIFAR10_FEATURES = 3 * 32 * 32
CIFAR10_CLASSES = 10
CIFAR10_TRAIN_SIZE = 50_000
CIFAR10_TEST_SIZE = 10_000
_CIFAR10_RECORD = 1 + CIFAR10_FEATURES  # binary format: one label byte, then the pixels

# The published md5 of each archive, and of each batch file of the Python format
# (https://www.cs.toronto.edu/~kriz/cifar.html gives the archives'). No checksum of the binary
# format's single batch files is published: read outside their archive, they go unchecked.
CIFAR10_ARCHIVE_MD5 = {
    "cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
    "cifar-10-binary.tar.gz": "c32a1d4ab5d03f1284b67883e8d87530",
}
CIFAR10_PYTHON_BATCH_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}

# format -> (official directory name, suffix of the batch files, official archive name)
_CIFAR10_FORMATS = {
    "python": ("cifar-10-batches-py", "", "cifar-10-python.tar.gz"),
    "binary": ("cifar-10-batches-bin", ".bin", "cifar-10-binary.tar.gz"),
}


def _batch_entry(batch: dict, key: str, where: str):
    # Python 2 wrote the keys as str, which arrive as bytes (encoding="bytes"); a batch
    # re-pickled by Python 3 may have str keys.
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise DataError(
        f"{where}: the pickled dict has no {key!r} entry (keys: "
        f"{', '.join(repr(k) for k in list(batch)[:10])})"
    )


def _check_cifar10_labels(labels: np.ndarray, where: str) -> None:
    bad = (labels < 0) | (labels >= CIFAR10_CLASSES)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{where}: label {int(labels[i])} of image {i} is out of range 0..{CIFAR10_CLASSES - 1}"
        )


def _parse_cifar10_pickle(blob: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """A pickled batch (Python format) -> (uint8 images (n, 3072), int64 labels (n,))."""
    try:
        batch = _CifarUnpickler(io.BytesIO(blob), encoding="bytes").load()
    except _RefusedGlobal as exc:
        raise DataError(
            f"{where}: refused to unpickle: the file asks for {exc.qualified}, "
            f"but a CIFAR-10 batch needs only {_ALLOWED_GLOBALS_TEXT}; it is not a "
            f"CIFAR-10 batch or it has been tampered with (nothing in it was run)"
        ) from None
    except _BadArrayPickle as exc:
        raise DataError(f"{where}: not a CIFAR-10 batch: {exc}") from None
    except Exception as exc:  # untrusted bytes: any failure to parse means a damaged file
        raise DataError(
            f"{where}: truncated or corrupt pickle ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(batch, dict):
        raise DataError(
            f"{where}: expected a pickled dict with 'data' and 'labels', found "
            f"{type(batch).__name__}"
        )
    data, labels = _batch_entry(batch, "data", where), _batch_entry(batch, "labels", where)
    if not isinstance(data, _PickledArray):
        raise DataError(
            f"{where}: 'data' is a {type(data).__name__}, expected a uint8 NumPy "
            f"array of shape (n, {CIFAR10_FEATURES})"
        )
    images = data.to_uint8(where, CIFAR10_FEATURES)
    if not isinstance(labels, (list, tuple)):
        raise DataError(
            f"{where}: 'labels' is a {type(labels).__name__}, expected a list of integers"
        )
    try:
        label_array = np.array(labels)
    except (ValueError, OverflowError) as exc:
        raise DataError(f"{where}: 'labels' is not a list of integers ({exc})") from None
    if label_array.ndim != 1 or label_array.dtype.kind not in "iu":
        raise DataError(
            f"{where}: 'labels' is not a list of integers (it converts to "
            f"{label_array.dtype} of shape {label_array.shape})"
        )
    if len(label_array) != len(images):
        raise DataError(f"{where}: {len(images)} images but {len(label_array)} labels")
    label_array = label_array.astype(np.int64)
    _check_cifar10_labels(label_array, where)
    return images, label_array


def _parse_cifar10_bin(blob: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """A binary batch -> (uint8 images (n, 3072), a strided view; int64 labels (n,))."""
    n, extra = divmod(len(blob), _CIFAR10_RECORD)
    if not blob:
        raise DataError(
            f"{where}: empty file; a CIFAR-10 binary batch holds "
            f"{_CIFAR10_RECORD}-byte records (1 label byte + {CIFAR10_FEATURES} "
            f"pixel bytes)"
        )
    if n == 0 or extra:
        raise DataError(
            f"{where}: size {len(blob)} bytes is not a whole number of "
            f"{_CIFAR10_RECORD}-byte records (1 label byte + {CIFAR10_FEATURES} "
            f"pixel bytes): {n} records and {extra} bytes over; the file is "
            f"truncated or not a CIFAR-10 binary batch"
        )
    records = np.frombuffer(blob, dtype=np.uint8).reshape(n, _CIFAR10_RECORD)
    labels = records[:, 0].astype(np.int64)
    _check_cifar10_labels(labels, where)
    return records[:, 1:], labels


def read_cifar10_batch(path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 batch file: (uint8 images of shape (n, 3072) in CHW order, int64 labels).

    A name ending in ".bin" is read as the binary format, anything else as the Python
    (pickle) format, which is parsed without running code (see `_CifarUnpickler`). Raises
    DataError naming the file for a truncated or malformed file, a wrong shape, a label
    outside 0..9, or a pickle that asks for anything beyond a uint8 array.
    """
    path = Path(path)
    parse = _parse_cifar10_bin if path.name.endswith(".bin") else _parse_cifar10_pickle
    return parse(path.read_bytes(), str(path))


def _read_cifar10_archive(
    archive: Path, fmt: str
) -> tuple[dict[str, tuple[str, bytes]] | None, str]:
    """The batches of an official .tar.gz, read into memory (nothing is extracted to disk).

    Only members named <official directory>/<batch> are read, and only regular files.
    Returns ({batch: (description, bytes)}, "") or (None, what is missing); raises DataError
    for an unreadable archive.
    """
    directory, suffix, _ = _CIFAR10_FORMATS[fmt]
    wanted = {f"{directory}/{b}{suffix}": b for b in CIFAR10_BATCHES}
    blobs = {}
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for member in tar:
                name = member.name[2:] if member.name.startswith("./") else member.name
                if name not in wanted:
                    continue
                if not member.isfile():
                    raise DataError(f"{archive}: member {member.name} is not a regular file")
                handle = tar.extractfile(member)
                blobs[wanted[name]] = (f"{archive} member {name}", handle.read())
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"{archive}: corrupt or unreadable tar.gz archive ({type(exc).__name__}: {exc})"
        ) from exc
    missing = [b for b in CIFAR10_BATCHES if b not in blobs]
    if not blobs:
        return None, f"{archive.name} holds no {directory}/ batches"
    if missing:
        return None, f"{archive.name} lacks " + ", ".join(
            f"{directory}/{b}{suffix}" for b in missing
        )
    return blobs, ""


def _find_cifar10(root: Path) -> tuple[tuple[str, Path, dict] | None, str]:
    """CIFAR-10 under `root`: (format, location, {batch: path or (description, bytes)}).

    Tried in order: batch files directly in root (Python format, then binary), the official
    directories root/cifar-10-batches-py and root/cifar-10-batches-bin, then the official
    archives root/cifar-10-python.tar.gz and root/cifar-10-binary.tar.gz. Returns None and
    why not (for the not-found message) when none is complete.
    """
    if not root.is_dir():
        return None, "no such directory"
    partial = []
    places = [(fmt, root) for fmt in _CIFAR10_FORMATS]
    places += [(fmt, root / spec[0]) for fmt, spec in _CIFAR10_FORMATS.items()]
    for fmt, directory in places:
        suffix = _CIFAR10_FORMATS[fmt][1]
        files = {b: directory / (b + suffix) for b in CIFAR10_BATCHES}
        present = [b for b, path in files.items() if path.is_file()]
        if len(present) == len(files):
            return (fmt, directory, files), ""
        if present:
            partial.append(
                f"{directory} lacks "
                + ", ".join(b + suffix for b in CIFAR10_BATCHES if b not in present)
            )
    for fmt, (_, _, archive_name) in _CIFAR10_FORMATS.items():
        archive = root / archive_name
        if archive.is_file():
            blobs, why = _read_cifar10_archive(archive, fmt)
            if blobs is not None:
                return (fmt, archive, blobs), ""
            partial.append(why)
    return None, "; ".join(partial) or "no CIFAR-10 batches"


def load_cifar10(data_dir=None, *, dtype=np.float32, normalize=True) -> Dataset:
    """Load CIFAR-10 from local files: x of shape (n, 3072), input_shape (3, 32, 32).

    Search order: `data_dir` (and data_dir/cifar10) when given, and nothing else; otherwise
    $DPTRAIN_DATA and $DPTRAIN_DATA/cifar10, then the cache directory
    (`default_cache_dir("cifar10")`). In each, see `_find_cifar10`: the batch files directly,
    cifar-10-batches-py/ or cifar-10-batches-bin/, or the official .tar.gz archives (read in
    memory). The training set is data_batch_1..5 in order, the test set test_batch.
    Rows are channels-first (CHW), as stored. Pixels are divided by 255 when `normalize`
    (to [0, 1], as for MNIST; no mean/std standardization). Raises DataNotFound listing the
    places searched, or DataError naming the file when a file is malformed.
    """
    dt = _float_dtype(dtype)
    searched = []
    for root in search_dirs(data_dir, "cifar10"):
        found, why = _find_cifar10(root)
        if found is None:
            searched.append(f"{root} ({why})")
            continue
        fmt, location, batches = found
        parse = _parse_cifar10_pickle if fmt == "python" else _parse_cifar10_bin
        splits = {"train": [], "test": []}
        checks = []
        if location.is_file():  # an official archive: its own published md5
            checks.append(
                (location.name, "md5", _md5_file(location), CIFAR10_ARCHIVE_MD5.get(location.name))
            )
        for batch in CIFAR10_BATCHES:  # in this order, whatever the order in an archive
            item = batches[batch]
            where, blob = (str(item), item.read_bytes()) if isinstance(item, Path) else item
            if not location.is_file():
                checks.append(
                    (
                        batch + _CIFAR10_FORMATS[fmt][1],
                        "md5",
                        hashlib.md5(blob).hexdigest(),
                        CIFAR10_PYTHON_BATCH_MD5[batch] if fmt == "python" else None,
                    )
                )
            splits["test" if batch == "test_batch" else "train"].append(parse(blob, where))
        x_train, y_train = _stack_cifar10(splits["train"], dt, normalize)
        x_test, y_test = _stack_cifar10(splits["test"], dt, normalize)
        return Dataset(
            x_train=x_train,
            y_train=y_train,
            x_test=x_test,
            y_test=y_test,
            name="cifar10",
            n_classes=CIFAR10_CLASSES,
            source=str(location),
            input_shape=CIFAR10_SHAPE,
            integrity=_integrity("CIFAR-10", location, checks),
        )
    hint = "" if data_dir is not None else f" (set {ENV_DATA_DIR} to a directory holding them)"
    raise DataNotFound(
        "CIFAR-10 not found: looked for cifar-10-batches-py/ or cifar-10-batches-bin/ (or the "
        "batch files themselves, or cifar-10-python.tar.gz / cifar-10-binary.tar.gz) in: "
        + "; ".join(searched)
        + hint,
        searched=searched,
    )


def _stack_cifar10(parts, dtype: np.dtype, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate (uint8 images, labels) batches straight into one float array."""
    n = sum(len(images) for images, _ in parts)
    x = aligned_empty((n, CIFAR10_FEATURES), dtype)
    start = 0
    for images, _ in parts:
        x[start : start + len(images)] = images  # converts uint8 -> float, no temporary
        start += len(images)
    if normalize:
        np.divide(x, 255, out=x)  # exact division, as for MNIST: 255 -> 1.0
    return x, np.concatenate([labels for _, labels in parts])
