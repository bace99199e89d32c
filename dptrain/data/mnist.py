"""MNIST on disk: find the four IDX files, read and validate them, download them.

`load_mnist` looks in a named directory, or $DPTRAIN_DATA then the cache directory (see
locations.py), and checks every file against its published sha256. `download_mnist` is the
only function of dptrain.data that touches the network, and only when called. The policy
"local files, else a download, else announced synthetic data" is `catalog.get_mnist`.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import tempfile
import urllib.request
import zlib
from pathlib import Path

import numpy as np

from .._aligned import aligned_empty
from .dataset import DataError, DataNotFound, Dataset, _float_dtype, _integrity
from .idx import _parse_idx, _read_bytes
from .locations import ENV_DATA_DIR, default_cache_dir, search_dirs

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

# sha256 of the DECOMPRESSED files (see shared/data/README.md); the gzip bytes vary by mirror.
MNIST_SHA256 = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}

MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

MNIST_SIDE = 28
MNIST_CLASSES = 10


def _candidate_names(base: str) -> list[str]:
    # "train-images-idx3-ubyte" also appears as "train-images.idx3-ubyte"; raw before gzip.
    dotted = base.replace("-idx", ".idx")
    return [base, base + ".gz", dotted, dotted + ".gz"]


def _find_mnist_files(directory: Path) -> tuple[dict[str, Path] | None, str]:
    """The four files in `directory`, or None and why not (for the not-found message)."""
    if not directory.is_dir():
        return None, "no such directory"
    found, missing = {}, []
    for base in MNIST_FILES:
        for name in _candidate_names(base):
            if (directory / name).is_file():
                found[base] = directory / name
                break
        else:
            missing.append(base)
    if missing:
        if len(missing) == len(MNIST_FILES):
            return None, "no MNIST files"
        return None, "missing " + ", ".join(f"{m}[.gz]" for m in missing)
    return found, ""


def _check_split(images: np.ndarray, labels: np.ndarray, img_path: Path, lbl_path: Path):
    side = MNIST_SIDE
    if images.ndim != 3 or images.shape[1:] != (side, side):
        raise DataError(
            f"{img_path}: expected images of shape (n, {side}, {side}), found dims {images.shape}"
        )
    if labels.ndim != 1:
        raise DataError(f"{lbl_path}: expected labels of shape (n,), found dims {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"sample counts differ: {img_path} has {images.shape[0]} images but "
            f"{lbl_path} has {labels.shape[0]} labels"
        )
    if labels.size and int(labels.max()) >= MNIST_CLASSES:
        bad = int(np.argmax(labels >= MNIST_CLASSES))
        raise DataError(
            f"{lbl_path}: label {int(labels[bad])} at index {bad} is out of range "
            f"0..{MNIST_CLASSES - 1}"
        )


def _images_to_float(images: np.ndarray, dtype: np.dtype, normalize: bool) -> np.ndarray:
    x = aligned_empty((images.shape[0], math.prod(images.shape[1:])), dtype)
    x[...] = images.reshape(len(x), -1)  # converts uint8 -> float, no temporary
    if normalize:
        np.divide(x, 255, out=x)  # exact division: 255 -> 1.0, in place, no temporary
    return x


def load_mnist(data_dir=None, *, dtype=np.float32, normalize=True) -> Dataset:
    """Load MNIST from local IDX files (gzip or raw) as a Dataset with x of shape (n, 784).

    Search order: `data_dir` (and data_dir/mnist) when given, and nothing else; otherwise
    $DPTRAIN_DATA and $DPTRAIN_DATA/mnist, then the cache directory (`default_cache_dir()`).
    Pixels are divided by 255 when `normalize`. Raises DataNotFound listing the places
    searched, or DataError naming the file when a file is malformed or inconsistent.
    """
    dt = _float_dtype(dtype)
    searched = []
    for directory in search_dirs(data_dir, "mnist"):
        files, why = _find_mnist_files(directory)
        if files is None:
            searched.append(f"{directory} ({why})")
            continue
        arrays, checks = {}, []
        for base, path in files.items():
            raw = _read_bytes(path)
            checks.append(
                (
                    path.name,
                    "sha256 of the content",
                    hashlib.sha256(raw).hexdigest(),
                    MNIST_SHA256[base],
                )
            )
            arrays[base] = _parse_idx(raw, path)
        x_tr_img, y_tr_lbl = arrays["train-images-idx3-ubyte"], arrays["train-labels-idx1-ubyte"]
        x_te_img, y_te_lbl = arrays["t10k-images-idx3-ubyte"], arrays["t10k-labels-idx1-ubyte"]
        _check_split(
            x_tr_img, y_tr_lbl, files["train-images-idx3-ubyte"], files["train-labels-idx1-ubyte"]
        )
        _check_split(
            x_te_img, y_te_lbl, files["t10k-images-idx3-ubyte"], files["t10k-labels-idx1-ubyte"]
        )
        return Dataset(
            x_train=_images_to_float(x_tr_img, dt, normalize),
            y_train=y_tr_lbl.astype(np.int64),
            x_test=_images_to_float(x_te_img, dt, normalize),
            y_test=y_te_lbl.astype(np.int64),
            name="mnist",
            n_classes=MNIST_CLASSES,
            source=str(directory),
            input_shape=(1, MNIST_SIDE, MNIST_SIDE),
            integrity=_integrity("MNIST", directory, checks),
        )
    hint = "" if data_dir is not None else f" (set {ENV_DATA_DIR} to a directory holding them)"
    raise DataNotFound(
        f"MNIST not found: looked for {', '.join(f + '[.gz]' for f in MNIST_FILES)} in: "
        + "; ".join(searched)
        + hint,
        searched=searched,
    )


def _fetch(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def download_mnist(dest_dir=None, *, timeout: float = 10.0, mirrors=MNIST_MIRRORS) -> Path:
    """Download the four gzip files into `dest_dir` (default: the cache directory).

    Each file is checked against MNIST_SHA256 (of the decompressed content) before it is
    written, and written atomically (temporary file in dest_dir, then rename), so workers
    racing on one directory never see half a file. Files already present and correct are
    kept. Mirrors are tried in order. Returns dest_dir; raises DataError when a file could
    not be fetched from any mirror.
    """
    dest = Path(dest_dir).expanduser() if dest_dir is not None else default_cache_dir()
    for base in MNIST_FILES:
        target = dest / (base + ".gz")
        if target.is_file():
            try:
                if hashlib.sha256(_read_bytes(target)).hexdigest() == MNIST_SHA256[base]:
                    continue
            except (OSError, DataError):
                pass  # unreadable or corrupt: fetch it again and replace it
        failures = []
        for mirror in mirrors:
            url = mirror + base + ".gz"
            try:
                blob = _fetch(url, timeout)
                digest = hashlib.sha256(gzip.decompress(blob)).hexdigest()
            except (OSError, EOFError, zlib.error) as exc:  # URLError, timeouts, bad gzip
                failures.append(f"{url}: {type(exc).__name__}: {exc}")
                continue
            if digest != MNIST_SHA256[base]:
                failures.append(
                    f"{url}: sha256 of decompressed data is {digest}, expected {MNIST_SHA256[base]}"
                )
                continue
            try:  # created only once there is something to keep
                dest.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DataError(f"cannot create dest_dir={str(dest)!r}: {exc}") from exc
            _write_atomic(target, blob)
            break
        else:
            raise DataError(f"could not download {base}.gz into {dest}: " + "; ".join(failures))
    return dest


def _write_atomic(target: Path, blob: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
