"""Datasets for the training jobs: MNIST and CIFAR-10 from local files, and synthetic workloads.

What is here:
- `Dataset`: train/test arrays in the layout the C core wants (x C-contiguous float32 or
  float64 of shape (n, features), y int64 of shape (n,)), the shape of one input
  (`input_shape`, e.g. (1, 28, 28) or (3, 32, 32)), and where the data came from.
- `read_idx`: a strict reader for IDX files (the MNIST format), gzip or raw.
- `load_mnist` / `download_mnist` / `get_mnist`: find MNIST on disk (argument, then the
  DPTRAIN_DATA environment variable, then the cache directory), fetch it when allowed, or
  fall back to an MNIST-shaped synthetic set with a one-line announcement.
- `read_cifar10_batch` / `load_cifar10` / `get_cifar10`: CIFAR-10 in either published format
  (the Python pickle batches, read without executing anything, or the binary batches), as
  directories or the original .tar.gz archives, found the same way as MNIST; never
  downloaded; else a CIFAR-10-shaped synthetic set with a one-line announcement.
- `synthetic_binary`: the logistic-regression workload (x ~ N(0, 1), y = 1[x . w* > 0]).
- `synthetic_classification`: a learnable 10-class set with MNIST's shapes.
- `synthetic_cifar10`: a learnable 10-class set with CIFAR-10's shapes and spatial structure.
- `upscale_images` / `upscale_dataset`: nearest-neighbour up-scaling (28x28 -> 56x56, 112x112)
  to make the per-sample compute larger for scaling experiments.
- `load_dataset`: the single entry point the command line uses.

What is left out on purpose: shuffling, batching and sharding across workers (the training
loop owns those, so every rank sees the same arrays and takes its own deterministic shard),
and any dependency beyond NumPy and the standard library. Only `download_mnist` touches the
network, and only when asked to; CIFAR-10 is never downloaded (see `get_cifar10`).

Rank discipline: every function here is deterministic given its arguments, so all workers
can call it and get identical arrays. Messages go through the `announce` callable only;
pass `announce=lambda line: None` on ranks other than 0.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import math
import os
import pickle
import tarfile
import tempfile
import urllib.request
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = [
    "CIFAR10_BATCHES",
    "CIFAR10_SHAPE",
    "DataError",
    "DataNotFound",
    "DataWarning",
    "Dataset",
    "DATASET_NAMES",
    "MNIST_FILES",
    "MNIST_MIRRORS",
    "MNIST_SHA256",
    "default_cache_dir",
    "download_mnist",
    "get_cifar10",
    "get_mnist",
    "load_cifar10",
    "load_dataset",
    "load_mnist",
    "read_cifar10_batch",
    "read_idx",
    "synthetic_binary",
    "synthetic_cifar10",
    "synthetic_classification",
    "upscale_dataset",
    "upscale_images",
]


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


# ---------------------------------------------------------------------------------------
# IDX files
# ---------------------------------------------------------------------------------------

# IDX header: two zero bytes, an element-type byte, the number of dimensions, then one
# big-endian uint32 per dimension. MNIST uses only type 0x08 (unsigned byte).
_IDX_UBYTE = 0x08
_IDX_TYPE_NAMES = {0x08: "uint8", 0x09: "int8", 0x0B: "int16", 0x0C: "int32",
                   0x0D: "float32", 0x0E: "float64"}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    """The file's content, decompressed when it starts with the gzip magic (not by name)."""
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise DataError(f"{path}: corrupt gzip data ({type(exc).__name__}: {exc})") from exc


def read_idx(path) -> np.ndarray:
    """Read an IDX file (gzip or raw) into a read-only uint8 array shaped by its header.

    Raises DataError naming the file for a wrong magic number, an unsupported element type,
    a truncated file, trailing bytes after the data, or corrupt gzip data.
    """
    path = Path(path)
    return _parse_idx(_read_bytes(path), path)


def _parse_idx(data: bytes, path: Path) -> np.ndarray:
    """The array of an IDX file's (decompressed) bytes; `path` names it in errors."""
    if len(data) < 4:
        raise DataError(f"{path}: truncated IDX header: expected at least 4 bytes, found "
                        f"{len(data)}")
    zero0, zero1, elem_type, ndim = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0 or ndim == 0:
        found = int.from_bytes(data[:4], "big")
        raise DataError(f"{path}: not an IDX file: wrong magic number 0x{found:08x}, expected "
                        f"0x0000TTNN (two zero bytes, element type TT = 0x08, "
                        f"number of dimensions NN >= 1)")
    if elem_type != _IDX_UBYTE:
        kind = _IDX_TYPE_NAMES.get(elem_type, "unknown")
        raise DataError(f"{path}: unsupported IDX element type 0x{elem_type:02x} ({kind}); "
                        f"only 0x08 (uint8) is supported")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DataError(f"{path}: truncated IDX header: {ndim} dimensions need {header_len} "
                        f"bytes, found {len(data)}")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = math.prod(dims)
    found = len(data) - header_len
    if found < expected:
        raise DataError(f"{path}: truncated file: dims {dims} need {expected} bytes of data, "
                        f"found {found}")
    if found > expected:
        raise DataError(f"{path}: trailing garbage: dims {dims} need {expected} bytes of data, "
                        f"found {found} ({found - expected} extra)")
    return np.frombuffer(data, dtype=np.uint8, count=expected, offset=header_len).reshape(dims)


# ---------------------------------------------------------------------------------------
# MNIST on disk
# ---------------------------------------------------------------------------------------

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# sha256 of the DECOMPRESSED files (see shared/data/README.md); the gzip bytes vary by mirror.
MNIST_SHA256 = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}

MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
                 "https://storage.googleapis.com/cvdf-datasets/mnist/")

MNIST_SIDE = 28
MNIST_CLASSES = 10
ENV_DATA_DIR = "DPTRAIN_DATA"


def default_cache_dir(dataset: str = "mnist") -> Path:
    """$XDG_CACHE_HOME/dptrain/<dataset>, or ~/.cache/dptrain/<dataset> ("mnist", "cifar10")."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "dptrain" / dataset


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


def _mnist_search_dirs(data_dir) -> list[Path]:
    """Where to look, in order. An explicit data_dir is the only place searched."""
    if data_dir is not None:
        d = Path(data_dir).expanduser()
        return [d, d / "mnist"]
    dirs = []
    env = os.environ.get(ENV_DATA_DIR, "")
    if env:
        d = Path(env).expanduser()
        dirs += [d, d / "mnist"]
    dirs.append(default_cache_dir())
    return dirs


def _check_split(images: np.ndarray, labels: np.ndarray, img_path: Path, lbl_path: Path):
    side = MNIST_SIDE
    if images.ndim != 3 or images.shape[1:] != (side, side):
        raise DataError(f"{img_path}: expected images of shape (n, {side}, {side}), found "
                        f"dims {images.shape}")
    if labels.ndim != 1:
        raise DataError(f"{lbl_path}: expected labels of shape (n,), found dims {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"sample counts differ: {img_path} has {images.shape[0]} images but "
                        f"{lbl_path} has {labels.shape[0]} labels")
    if labels.size and int(labels.max()) >= MNIST_CLASSES:
        bad = int(np.argmax(labels >= MNIST_CLASSES))
        raise DataError(f"{lbl_path}: label {int(labels[bad])} at index {bad} is out of range "
                        f"0..{MNIST_CLASSES - 1}")


def _images_to_float(images: np.ndarray, dtype: np.dtype, normalize: bool) -> np.ndarray:
    x = images.reshape(images.shape[0], -1).astype(dtype)  # a fresh C-contiguous copy
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
    for directory in _mnist_search_dirs(data_dir):
        files, why = _find_mnist_files(directory)
        if files is None:
            searched.append(f"{directory} ({why})")
            continue
        arrays, checks = {}, []
        for base, path in files.items():
            raw = _read_bytes(path)
            checks.append((path.name, "sha256 of the content", hashlib.sha256(raw).hexdigest(),
                           MNIST_SHA256[base]))
            arrays[base] = _parse_idx(raw, path)
        x_tr_img, y_tr_lbl = arrays["train-images-idx3-ubyte"], arrays["train-labels-idx1-ubyte"]
        x_te_img, y_te_lbl = arrays["t10k-images-idx3-ubyte"], arrays["t10k-labels-idx1-ubyte"]
        _check_split(x_tr_img, y_tr_lbl, files["train-images-idx3-ubyte"],
                     files["train-labels-idx1-ubyte"])
        _check_split(x_te_img, y_te_lbl, files["t10k-images-idx3-ubyte"],
                     files["t10k-labels-idx1-ubyte"])
        return Dataset(
            x_train=_images_to_float(x_tr_img, dt, normalize),
            y_train=y_tr_lbl.astype(np.int64),
            x_test=_images_to_float(x_te_img, dt, normalize),
            y_test=y_te_lbl.astype(np.int64),
            name="mnist", n_classes=MNIST_CLASSES, source=str(directory),
            input_shape=(1, MNIST_SIDE, MNIST_SIDE),
            integrity=_integrity("MNIST", directory, checks))
    hint = "" if data_dir is not None else f" (set {ENV_DATA_DIR} to a directory holding them)"
    raise DataNotFound(
        f"MNIST not found: looked for {', '.join(f + '[.gz]' for f in MNIST_FILES)} in: "
        + "; ".join(searched) + hint, searched=searched)


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
                failures.append(f"{url}: sha256 of decompressed data is {digest}, "
                                f"expected {MNIST_SHA256[base]}")
                continue
            try:                          # created only once there is something to keep
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


def _check_env_data_dir() -> None:
    """$DPTRAIN_DATA names a directory: when it is set but there is no such directory (a
    typo), that is an error, never a reason to fall back to synthetic data."""
    env = os.environ.get(ENV_DATA_DIR, "")
    if env and not Path(env).expanduser().is_dir():
        raise DataNotFound(f"${ENV_DATA_DIR} is {env!r}, but there is no such directory",
                           searched=[env])


def get_mnist(data_dir=None, dtype=np.float32, allow_download=True, allow_synthetic=True,
              announce: Callable[[str], None] | None = print, *, seed: int = 0,
              synthetic_n_train: int = 60_000, synthetic_n_test: int = 10_000) -> Dataset:
    """MNIST for the main job: local files, else a download, else synthetic stand-in data.

    A directory the user names (`data_dir`, or $DPTRAIN_DATA when it does not exist) must
    hold the files: otherwise DataNotFound names the directory and the files looked for,
    and nothing is downloaded, created or made up. Without one (the implicit default):
    1. `load_mnist()`: $DPTRAIN_DATA, then the cache directory.
    2. If not found and `allow_download`: `download_mnist` into the cache directory, then
       load it.
    3. If still not found and `allow_synthetic`: announce one line through `announce` and
       return `synthetic_classification` data with MNIST's shapes (784 features, 10
       classes), named "synthetic-mnist" (never "mnist").
    4. Otherwise raise DataNotFound.
    A malformed local file raises DataError; it is never papered over.
    """
    dt = _float_dtype(dtype)
    if data_dir is not None:
        return load_mnist(data_dir, dtype=dt)
    _check_env_data_dir()
    try:
        return load_mnist(dtype=dt)
    except DataNotFound as exc:
        not_found = exc
    download_note = "download disabled"
    if allow_download:
        dest = default_cache_dir()
        try:
            download_mnist(dest)
            return load_mnist(dest, dtype=dt)
        except DataError as exc:
            download_note = f"download into {dest} failed: {exc}"
    if not allow_synthetic:
        raise DataNotFound(f"{not_found}; {download_note}", searched=not_found.searched) \
            from not_found
    ds = synthetic_classification(synthetic_n_train, n_features=MNIST_SIDE * MNIST_SIDE,
                                  n_classes=MNIST_CLASSES, seed=seed, n_test=synthetic_n_test,
                                  dtype=dt)
    ds = dataclasses.replace(ds, source="synthetic (MNIST not found)",
                             input_shape=(1, MNIST_SIDE, MNIST_SIDE))
    if announce is not None:
        announce(f"MNIST not found (searched: {', '.join(not_found.searched)}; "
                 f"{download_note}); using SYNTHETIC MNIST-shaped data: {ds.describe()}")
    return ds


# ---------------------------------------------------------------------------------------
# CIFAR-10 on disk
# ---------------------------------------------------------------------------------------

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
CIFAR10_ARCHIVE_MD5 = {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
                       "cifar-10-binary.tar.gz": "c32a1d4ab5d03f1284b67883e8d87530"}
CIFAR10_PYTHON_BATCH_MD5 = {"data_batch_1": "c99cafc152244af753f735de768cd75f",
                            "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
                            "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
                            "data_batch_4": "634d18415352ddfa80567beed471001a",
                            "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
                            "test_batch": "40351d587109b95175f43aff81a1287e"}

# format -> (official directory name, suffix of the batch files, official archive name)
_CIFAR10_FORMATS = {
    "python": ("cifar-10-batches-py", "", "cifar-10-python.tar.gz"),
    "binary": ("cifar-10-batches-bin", ".bin", "cifar-10-binary.tar.gz"),
}


class _RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.qualified = f"{module}.{name}"


class _BadArrayPickle(ValueError):
    """A stand-in below was given arguments that NumPy never writes for a uint8 array."""


class _StandIn:
    """What `_CifarUnpickler.find_class` hands out instead of a real global.

    Calling it calls `make`. It has no __dict__ and refuses BUILD, so a pickle cannot attach
    anything to these module-level objects either.
    """

    __slots__ = ("qualified", "make")

    def __init__(self, qualified: str, make: Callable):
        self.qualified = qualified
        self.make = make

    def __call__(self, *args):
        return self.make(*args)

    def __setstate__(self, state):
        raise _BadArrayPickle(f"BUILD applied to {self.qualified}")


def _not_callable(*args):
    raise _BadArrayPickle("numpy.ndarray called directly; NumPy never pickles an array so")


_NDARRAY = _StandIn("numpy.ndarray", _not_callable)  # only an argument of _reconstruct


class _PickledDtype:
    """Stands for numpy.dtype("u1"): the only dtype a CIFAR-10 batch holds.

    NumPy pickles a dtype as dtype(spec, align, copy) followed by BUILD with a state tuple
    (version, byte order, subarray, names, fields, ...); for uint8 the byte order is "|".
    """

    __slots__ = ()

    def __init__(self, spec, align=False, copy=True):
        if spec not in ("u1", b"u1"):
            raise _BadArrayPickle(f"dtype {spec!r} is not uint8 ('u1')")

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) >= 5 and state[1] in ("|", b"|")
                and state[2:5] == (None, None, None)):
            raise _BadArrayPickle(f"unexpected uint8 dtype state {state!r}")


class _PickledArray:
    """Stands for an ndarray being unpickled: records the BUILD state, builds nothing.

    NumPy pickles an array as _reconstruct(ndarray, (0,), b"b") followed by BUILD with
    (version=1, shape, dtype, is_fortran, raw bytes); `to_uint8` checks that state and
    makes the array with np.frombuffer.
    """

    __slots__ = ("state",)

    def __init__(self):
        self.state = None

    def __setstate__(self, state):
        self.state = state

    def to_uint8(self, where: str) -> np.ndarray:
        state = self.state
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
            raise DataError(f"{where}: the data array's pickled state is not NumPy's "
                            f"(1, shape, dtype, is_fortran, bytes) layout")
        _, shape, dtype, fortran, raw = state
        if not isinstance(dtype, _PickledDtype):
            raise DataError(f"{where}: the data array has no uint8 dtype")
        if not (isinstance(shape, tuple) and all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
            raise DataError(f"{where}: the data array has an invalid shape {shape!r}")
        if len(shape) != 2 or shape[1] != CIFAR10_FEATURES or shape[0] == 0:
            raise DataError(f"{where}: data has shape {shape}, expected (n, "
                            f"{CIFAR10_FEATURES}) with n >= 1")
        if not isinstance(raw, (bytes, bytearray)):
            raise DataError(f"{where}: the data array's pixels are a {type(raw).__name__}, "
                            f"expected bytes")
        if len(raw) != math.prod(shape):
            raise DataError(f"{where}: data of shape {shape} needs {math.prod(shape)} bytes, "
                            f"the file holds {len(raw)}")
        if fortran not in (False, True, 0, 1):
            raise DataError(f"{where}: the data array has an invalid is_fortran flag {fortran!r}")
        if fortran:
            return np.frombuffer(raw, dtype=np.uint8).reshape(shape[::-1]).T
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape)


def _reconstruct_array(subtype, shape, typecode):
    # numpy.core.multiarray._reconstruct(ndarray, (0,), b"b") starts every pickled ndarray
    if subtype is not _NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise _BadArrayPickle(f"_reconstruct{(subtype, shape, typecode)!r} is not how NumPy "
                              f"starts a plain ndarray")
    return _PickledArray()


def _latin1_encode(text, encoding):
    # _codecs.encode(text, "latin1") is how Python 3 writes bytes at pickle protocol 2
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _BadArrayPickle(f"_codecs.encode with {type(text).__name__} and {encoding!r} is "
                              f"not a protocol-2 bytes object")
    return text.encode("latin-1")


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR-10 batch, refusing every global except the stand-ins below.

    Unpickling runs code only through globals: GLOBAL / STACK_GLOBAL / INST and the
    extension registry all go through `find_class`, and REDUCE / BUILD / NEWOBJ can only call
    what it returned. Without globals a pickle builds inert data (dict, list, tuple, str,
    bytes, int, float, bool, None). But the published batches do need globals: Python 2
    pickled (protocol 2) a dict whose b"data" is a numpy.ndarray, and NumPy pickles an array
    as numpy.core.multiarray._reconstruct(numpy.ndarray, (0,), b"b") plus BUILD state, with
    numpy.dtype("u1", 0, 1) plus BUILD state inside. So exactly these are allowed:
      numpy.core.multiarray._reconstruct (numpy._core.multiarray._reconstruct when the file
      was re-pickled by NumPy 2), numpy.ndarray, numpy.dtype, and _codecs.encode, which
      Python 3 uses for every bytes object at protocol 2 (so a batch re-pickled with
      pickle.dump(batch, f, 2) loads too).
    None of them is the real object: each maps to a stand-in above that accepts only the
    arguments NumPy writes for a plain uint8 array and records the state, and the array is
    then made with np.frombuffer from the recorded bytes. So no NumPy code (whose
    __setstate__ also accepts object arrays) and no other code runs on the file's behalf.
    Anything else (os.system, builtins.eval, numpy.load, ...) is refused before it is called.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _StandIn("_reconstruct", _reconstruct_array),
        ("numpy._core.multiarray", "_reconstruct"): _StandIn("_reconstruct", _reconstruct_array),
        ("numpy", "ndarray"): _NDARRAY,
        ("numpy", "dtype"): _StandIn("numpy.dtype", _PickledDtype),
        ("_codecs", "encode"): _StandIn("_codecs.encode", _latin1_encode),
    }

    def find_class(self, module, name):
        try:
            return self._ALLOWED[(module, name)]
        except (KeyError, TypeError):
            raise _RefusedGlobal(str(module), str(name)) from None


_ALLOWED_GLOBALS_TEXT = ", ".join(sorted({f"{m}.{n}" for m, n in _CifarUnpickler._ALLOWED}))


def _batch_entry(batch: dict, key: str, where: str):
    # Python 2 wrote the keys as str, which arrive as bytes (encoding="bytes"); a batch
    # re-pickled by Python 3 may have str keys.
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise DataError(f"{where}: the pickled dict has no {key!r} entry (keys: "
                    f"{', '.join(repr(k) for k in list(batch)[:10])})")


def _check_cifar10_labels(labels: np.ndarray, where: str) -> None:
    bad = (labels < 0) | (labels >= CIFAR10_CLASSES)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{where}: label {int(labels[i])} of image {i} is out of range "
                        f"0..{CIFAR10_CLASSES - 1}")


def _parse_cifar10_pickle(blob: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """A pickled batch (Python format) -> (uint8 images (n, 3072), int64 labels (n,))."""
    try:
        batch = _CifarUnpickler(io.BytesIO(blob), encoding="bytes").load()
    except _RefusedGlobal as exc:
        raise DataError(f"{where}: refused to unpickle: the file asks for {exc.qualified}, "
                        f"but a CIFAR-10 batch needs only {_ALLOWED_GLOBALS_TEXT}; it is not a "
                        f"CIFAR-10 batch or it has been tampered with (nothing in it was run)"
                        ) from None
    except _BadArrayPickle as exc:
        raise DataError(f"{where}: not a CIFAR-10 batch: {exc}") from None
    except Exception as exc:  # untrusted bytes: any failure to parse means a damaged file
        raise DataError(f"{where}: truncated or corrupt pickle "
                        f"({type(exc).__name__}: {exc})") from exc
    if not isinstance(batch, dict):
        raise DataError(f"{where}: expected a pickled dict with 'data' and 'labels', found "
                        f"{type(batch).__name__}")
    data, labels = _batch_entry(batch, "data", where), _batch_entry(batch, "labels", where)
    if not isinstance(data, _PickledArray):
        raise DataError(f"{where}: 'data' is a {type(data).__name__}, expected a uint8 NumPy "
                        f"array of shape (n, {CIFAR10_FEATURES})")
    images = data.to_uint8(where)
    if not isinstance(labels, (list, tuple)):
        raise DataError(f"{where}: 'labels' is a {type(labels).__name__}, expected a list of "
                        f"integers")
    try:
        label_array = np.array(labels)
    except (ValueError, OverflowError) as exc:
        raise DataError(f"{where}: 'labels' is not a list of integers ({exc})") from None
    if label_array.ndim != 1 or label_array.dtype.kind not in "iu":
        raise DataError(f"{where}: 'labels' is not a list of integers (it converts to "
                        f"{label_array.dtype} of shape {label_array.shape})")
    if len(label_array) != len(images):
        raise DataError(f"{where}: {len(images)} images but {len(label_array)} labels")
    label_array = label_array.astype(np.int64)
    _check_cifar10_labels(label_array, where)
    return images, label_array


def _parse_cifar10_bin(blob: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """A binary batch -> (uint8 images (n, 3072), a strided view; int64 labels (n,))."""
    n, extra = divmod(len(blob), _CIFAR10_RECORD)
    if not blob:
        raise DataError(f"{where}: empty file; a CIFAR-10 binary batch holds "
                        f"{_CIFAR10_RECORD}-byte records (1 label byte + {CIFAR10_FEATURES} "
                        f"pixel bytes)")
    if n == 0 or extra:
        raise DataError(f"{where}: size {len(blob)} bytes is not a whole number of "
                        f"{_CIFAR10_RECORD}-byte records (1 label byte + {CIFAR10_FEATURES} "
                        f"pixel bytes): {n} records and {extra} bytes over; the file is "
                        f"truncated or not a CIFAR-10 binary batch")
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


def _read_cifar10_archive(archive: Path,
                          fmt: str) -> tuple[dict[str, tuple[str, bytes]] | None, str]:
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
        raise DataError(f"{archive}: corrupt or unreadable tar.gz archive "
                        f"({type(exc).__name__}: {exc})") from exc
    missing = [b for b in CIFAR10_BATCHES if b not in blobs]
    if not blobs:
        return None, f"{archive.name} holds no {directory}/ batches"
    if missing:
        return None, f"{archive.name} lacks " + ", ".join(f"{directory}/{b}{suffix}"
                                                          for b in missing)
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
            partial.append(f"{directory} lacks " + ", ".join(
                b + suffix for b in CIFAR10_BATCHES if b not in present))
    for fmt, (_, _, archive_name) in _CIFAR10_FORMATS.items():
        archive = root / archive_name
        if archive.is_file():
            blobs, why = _read_cifar10_archive(archive, fmt)
            if blobs is not None:
                return (fmt, archive, blobs), ""
            partial.append(why)
    return None, "; ".join(partial) or "no CIFAR-10 batches"


def _cifar10_search_dirs(data_dir) -> list[Path]:
    """Where to look, in order (as for MNIST). An explicit data_dir is the only place searched."""
    if data_dir is not None:
        d = Path(data_dir).expanduser()
        return [d, d / "cifar10"]
    dirs = []
    env = os.environ.get(ENV_DATA_DIR, "")
    if env:
        d = Path(env).expanduser()
        dirs += [d, d / "cifar10"]
    dirs.append(default_cache_dir("cifar10"))
    return dirs


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
    for root in _cifar10_search_dirs(data_dir):
        found, why = _find_cifar10(root)
        if found is None:
            searched.append(f"{root} ({why})")
            continue
        fmt, location, batches = found
        parse = _parse_cifar10_pickle if fmt == "python" else _parse_cifar10_bin
        splits = {"train": [], "test": []}
        checks = []
        if location.is_file():            # an official archive: its own published md5
            checks.append((location.name, "md5", _md5_file(location),
                           CIFAR10_ARCHIVE_MD5.get(location.name)))
        for batch in CIFAR10_BATCHES:  # in this order, whatever the order in an archive
            item = batches[batch]
            where, blob = (str(item), item.read_bytes()) if isinstance(item, Path) else item
            if not location.is_file():
                checks.append((batch + _CIFAR10_FORMATS[fmt][1], "md5",
                               hashlib.md5(blob).hexdigest(),
                               CIFAR10_PYTHON_BATCH_MD5[batch] if fmt == "python" else None))
            splits["test" if batch == "test_batch" else "train"].append(parse(blob, where))
        x_train, y_train = _stack_cifar10(splits["train"], dt, normalize)
        x_test, y_test = _stack_cifar10(splits["test"], dt, normalize)
        return Dataset(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                       name="cifar10", n_classes=CIFAR10_CLASSES, source=str(location),
                       input_shape=CIFAR10_SHAPE,
                       integrity=_integrity("CIFAR-10", location, checks))
    hint = ("" if data_dir is not None else
            f" (set {ENV_DATA_DIR} to a directory holding them)")
    raise DataNotFound(
        "CIFAR-10 not found: looked for cifar-10-batches-py/ or cifar-10-batches-bin/ (or the "
        "batch files themselves, or cifar-10-python.tar.gz / cifar-10-binary.tar.gz) in: "
        + "; ".join(searched) + hint, searched=searched)


def _md5_file(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stack_cifar10(parts, dtype: np.dtype, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate (uint8 images, labels) batches straight into one float array."""
    n = sum(len(images) for images, _ in parts)
    x = np.empty((n, CIFAR10_FEATURES), dtype=dtype)
    start = 0
    for images, _ in parts:
        x[start:start + len(images)] = images  # converts uint8 -> float, no temporary
        start += len(images)
    if normalize:
        np.divide(x, 255, out=x)  # exact division, as for MNIST: 255 -> 1.0
    return x, np.concatenate([labels for _, labels in parts])


def get_cifar10(data_dir=None, dtype=np.float32, allow_synthetic=True,
                announce: Callable[[str], None] | None = print, *, seed: int = 0,
                synthetic_n_train: int = CIFAR10_TRAIN_SIZE,
                synthetic_n_test: int = CIFAR10_TEST_SIZE) -> Dataset:
    """CIFAR-10 for the main job: local files, else announced synthetic stand-in data.

    A directory the user names (`data_dir`, or $DPTRAIN_DATA when it does not exist) must
    hold the batches: otherwise DataNotFound names the directory and what was looked for.
    Without one (the implicit default):
    1. `load_cifar10()`: $DPTRAIN_DATA, then the cache directory.
    2. If not found and `allow_synthetic`: announce one line through `announce` and return
       `synthetic_cifar10` data with CIFAR-10's shapes (3072 features, 10 classes), named
       "synthetic-cifar10".
    3. Otherwise raise DataNotFound.
    There is no download step: CIFAR-10 is not reachable from the machines this runs on, so
    the data must be put in place by hand. A malformed local file raises DataError; it is
    never papered over.
    """
    dt = _float_dtype(dtype)
    if data_dir is not None:
        return load_cifar10(data_dir, dtype=dt)
    _check_env_data_dir()
    try:
        return load_cifar10(dtype=dt)
    except DataNotFound as exc:
        if not allow_synthetic:
            raise
        not_found = exc
    ds = synthetic_cifar10(synthetic_n_train, synthetic_n_test, seed=seed, dtype=dt)
    ds = dataclasses.replace(ds, source="synthetic (CIFAR-10 not found)")
    if announce is not None:
        announce(f"CIFAR-10 not found (searched: {', '.join(not_found.searched)}; it is never "
                 f"downloaded); using SYNTHETIC CIFAR-10-shaped data: {ds.describe()}")
    return ds


# ---------------------------------------------------------------------------------------
# Synthetic workloads
# ---------------------------------------------------------------------------------------

_CHUNK_ROWS = 16_384  # rows per chunk: bounds temporaries to a few MiB whatever n is


def _check_count(value, arg: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{arg}={value!r} must be an integer >= {minimum}")
    if value < minimum:
        raise ValueError(f"{arg}={value} must be >= {minimum}")
    return int(value)


def synthetic_binary(n: int, d: int, *, seed: int = 0, n_test: int | None = None,
                     dtype=np.float64) -> Dataset:
    """The logistic-regression workload: x ~ N(0, 1) of shape (n, d), y = 1[x . w* > 0].

    w* ~ N(0, 1) of shape (d,) is drawn first (returned as `true_weights`, float64); train
    and test come from independent streams of one SeedSequence(seed), so the training set
    does not depend on n_test (default max(1000, n // 10)). x is drawn directly in `dtype`
    (no float64 copy when float32 is asked for); labels are computed from the stored x with
    float64 dot products, chunk by chunk, so they agree exactly with the returned data.
    """
    n = _check_count(n, "n")
    d = _check_count(d, "d")
    n_test = max(1000, n // 10) if n_test is None else _check_count(n_test, "n_test")
    dt = _float_dtype(dtype)
    w_seq, train_seq, test_seq = np.random.SeedSequence(seed).spawn(3)
    w = np.random.default_rng(w_seq).standard_normal(d)

    def draw(count: int, seq: np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seq)
        x = np.empty((count, d), dtype=dt)
        rng.standard_normal(out=x, dtype=dt)  # fills in place, in the final dtype
        y = np.empty(count, dtype=np.int64)
        for start in range(0, count, _CHUNK_ROWS):
            stop = min(start + _CHUNK_ROWS, count)
            margin = x[start:stop].astype(np.float64) @ w
            np.greater(margin, 0.0, out=y[start:stop], casting="unsafe")
        return x, y

    x_train, y_train = draw(n, train_seq)
    x_test, y_test = draw(n_test, test_seq)
    return Dataset(x_train, y_train, x_test, y_test, name="synthetic", n_classes=2,
                   source=f"synthetic_binary(n={n}, d={d}, seed={seed})", true_weights=w)


def synthetic_classification(n_train: int, n_features: int = 784, n_classes: int = 10,
                             seed: int = 0, *, n_test: int | None = None, dtype=np.float32,
                             noise: float = 2.0) -> Dataset:
    """A learnable multi-class set shaped like MNIST: class prototypes plus Gaussian noise.

    Each class has a sparse "ink" prototype p_c (about 20% of the features lit with values
    in [0.5, 1)); a sample of class c is clip(p_c + noise * (N(0, 1) - 1), 0, 1). The shift
    by -noise keeps the background mostly at 0, so with the default noise=2 the pixel
    statistics resemble MNIST's (mean about 0.13, about 18% of pixels non-zero). The classes
    overlap: a linear softmax model trained by SGD (batch 64, lr 0.1) starts at chance and
    reaches about 90% test accuracy within one epoch, so a demo shows accuracy rising.
    n_test defaults to max(1000, n_train // 6) (MNIST's ratio). Deterministic given the
    arguments; x is drawn directly in `dtype`.
    """
    n_train = _check_count(n_train, "n_train")
    n_features = _check_count(n_features, "n_features")
    n_classes = _check_count(n_classes, "n_classes", minimum=2)
    n_test = max(1000, n_train // 6) if n_test is None else _check_count(n_test, "n_test")
    if not (isinstance(noise, (int, float)) and noise >= 0):
        raise ValueError(f"noise={noise!r} must be a number >= 0")
    dt = _float_dtype(dtype)
    proto_seq, train_seq, test_seq = np.random.SeedSequence(seed).spawn(3)
    prng = np.random.default_rng(proto_seq)
    lit = prng.random((n_classes, n_features)) < 0.2
    prototypes = (lit * prng.uniform(0.5, 1.0, (n_classes, n_features))).astype(dt)

    def draw(count: int, seq: np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seq)
        y = rng.integers(0, n_classes, size=count, dtype=np.int64)
        x = np.empty((count, n_features), dtype=dt)
        rng.standard_normal(out=x, dtype=dt)
        for start in range(0, count, _CHUNK_ROWS):
            block = x[start:start + _CHUNK_ROWS]
            block -= 1.0
            block *= noise  # noise * (N(0, 1) - 1): mostly-dark background after clipping
            block += prototypes[y[start:start + _CHUNK_ROWS]]
            np.clip(block, 0.0, 1.0, out=block)
        return x, y

    x_train, y_train = draw(n_train, train_seq)
    x_test, y_test = draw(n_test, test_seq)
    return Dataset(x_train, y_train, x_test, y_test, name="synthetic-mnist",
                   n_classes=n_classes,
                   source=f"synthetic_classification(n_train={n_train}, "
                          f"n_features={n_features}, n_classes={n_classes}, seed={seed})")


_SYNTH_GRID = 4      # a pattern: per channel, a 4x4 grid of random levels, interpolated to 32x32
_SYNTH_SHIFT = 3     # class patterns move by up to 3 pixels each way (wrapping around)
_SYNTH_CHUNK = 2048  # rows per independently seeded chunk


def _bilinear(levels: np.ndarray, side: int) -> np.ndarray:
    """(..., G, G) grids of levels -> (..., side, side) planes, by linear interpolation along
    each axis from G evenly spread points to `side` points.

    Written as element-wise products and sums (two terms per output value), never as a
    matrix product: a BLAS call may block its reduction by the number of rows, so its
    rounding would depend on how many samples are drawn at once. This way every value is
    the same whatever the batch, on any machine.
    """
    g = levels.shape[-1]
    pos = np.linspace(0.0, g - 1.0, side)
    lo = np.minimum(np.floor(pos).astype(np.int64), g - 2)
    frac = pos - lo
    w0, w1 = (1.0 - frac).astype(levels.dtype), frac.astype(levels.dtype)
    rows = levels[..., lo, :] * w0[:, None] + levels[..., lo + 1, :] * w1[:, None]
    return rows[..., lo] * w0 + rows[..., lo + 1] * w1


def synthetic_cifar10(n_train: int = CIFAR10_TRAIN_SIZE, n_test: int = CIFAR10_TEST_SIZE, *,
                      seed: int = 0, dtype=np.float32, distractor: float = 0.6,
                      noise: float = 0.2) -> Dataset:
    """A learnable 10-class set shaped like CIFAR-10: x (n, 3072) in CHW order, in [0, 1].

    A "pattern" is, per channel, a 4x4 grid of uniform random levels bilinearly interpolated
    to 32x32: smooth colour blobs. Each class has one pattern p_c; a sample of class c is
        clip((1 - distractor) * shift(p_c) + distractor * q + noise * u, 0, 1)
    where shift rolls p_c by up to 3 pixels each way, q is a fresh random pattern (clutter
    the model must learn to ignore) and u is uniform noise with mean 0 and variance 1. The
    pixel mean is about 0.50 and the standard deviation about 0.24 (CIFAR-10: 0.47, 0.25).
    With the defaults a nearest-class-mean classifier scores about 88 % and softmax
    regression trained by SGD goes from chance to about 89 % in one pass over 20,000
    samples, so a demo shows accuracy rising; the shifts favour convolutions.
    Rows are drawn in chunks of 2048 from streams seeded by SeedSequence(seed,
    spawn_key=(split, chunk, role)), so the first k rows do not depend on n_train (or
    n_test): a set of k rows is the first k rows of a larger one. Deterministic given the
    arguments.
    """
    n_train = _check_count(n_train, "n_train")
    n_test = _check_count(n_test, "n_test")
    for arg, value, hi in (("distractor", distractor, 1.0), ("noise", noise, math.inf)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= hi:
            raise ValueError(f"{arg}={value!r} must be a number in [0, {hi}]")
    dt = _float_dtype(dtype)
    channels, side, _ = CIFAR10_SHAPE
    plane = side * side
    grid = (_SYNTH_GRID, _SYNTH_GRID)
    prng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    patterns = _bilinear(prng.random((CIFAR10_CLASSES, channels) + grid, dtype=dt), side)
    # every class pattern at every shift, pre-scaled: a sample starts as one row of this
    offsets = range(-_SYNTH_SHIFT, _SYNTH_SHIFT + 1)
    shifted = np.stack([np.roll(p, (dy, dx), axis=(1, 2)).reshape(-1)
                        for p in patterns for dy in offsets for dx in offsets])
    shifted *= 1.0 - distractor
    n_shifts = len(offsets) ** 2
    uniform_scale = noise * math.sqrt(12.0)  # U(-1/2, 1/2) has variance 1/12

    def draw(count: int, split: int) -> tuple[np.ndarray, np.ndarray]:
        x = np.empty((count, CIFAR10_FEATURES), dtype=dt)
        y = np.empty(count, dtype=np.int64)
        for k, start in enumerate(range(0, count, _SYNTH_CHUNK)):
            # one stream per role, each consumed row by row: a short chunk draws a prefix
            # of what a full one would, whatever the other streams hold
            label_rng, shift_rng, noise_rng, clutter_rng = (
                np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(split, k, role)))
                for role in range(4))
            block = x[start:start + _SYNTH_CHUNK]
            m = len(block)
            labels = label_rng.integers(0, CIFAR10_CLASSES, size=m, dtype=np.int64)
            which = labels * n_shifts + shift_rng.integers(0, n_shifts, size=m)
            noise_rng.random(out=block, dtype=dt)  # uniform noise, drawn in place
            block -= 0.5
            block *= uniform_scale
            block += shifted[which]
            clutter = _bilinear(clutter_rng.random((m, channels) + grid, dtype=dt), side)
            clutter *= distractor
            block += clutter.reshape(m, channels * plane)
            np.clip(block, 0.0, 1.0, out=block)
            y[start:start + m] = labels
        return x, y

    x_train, y_train = draw(n_train, 1)
    x_test, y_test = draw(n_test, 2)
    return Dataset(x_train, y_train, x_test, y_test, name="synthetic-cifar10",
                   n_classes=CIFAR10_CLASSES, input_shape=CIFAR10_SHAPE,
                   source=f"synthetic_cifar10(n_train={n_train}, n_test={n_test}, seed={seed})")


# ---------------------------------------------------------------------------------------
# Up-scaling
# ---------------------------------------------------------------------------------------

_UPSCALE_CHUNK_ROWS = 1024  # images per chunk: the temporary stays cache-sized


def upscale_images(x: np.ndarray, factor: int, side: int = MNIST_SIDE) -> np.ndarray:
    """Nearest-neighbour up-scaling: (n, side*side) -> (n, (side*factor)**2), same dtype.

    Each pixel becomes a factor x factor block: viewed as images,
    out[k, r, c] == x[k, r // factor, c // factor]. Works in chunks of rows, so besides the
    output only a chunk-sized temporary is allocated. factor == 1 returns a copy.
    """
    factor = _check_count(factor, "factor")
    side = _check_count(side, "side")
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != side * side:
        raise ValueError(f"x has shape {getattr(x, 'shape', None)}, expected (n, {side * side}) "
                         f"for side={side}")
    n = x.shape[0]
    wide = side * factor
    # out viewed as (n, side, factor, wide): source row r fills output rows r*factor + a.
    out = np.empty((n, side, factor, wide), dtype=x.dtype)
    chunk = _UPSCALE_CHUNK_ROWS
    for start in range(0, n, chunk):
        block = out[start:start + chunk]
        # repeat each pixel along the row, into the first of the factor copies of the row ...
        block[:, :, 0, :] = np.repeat(x[start:start + chunk].reshape(-1, side, side), factor,
                                      axis=2)
        # ... then duplicate that widened row factor - 1 times
        block[:, :, 1:, :] = block[:, :, :1, :]
    return out.reshape(n, wide * wide)


def upscale_dataset(ds: Dataset, factor: int) -> Dataset:
    """`ds` with both splits up-scaled by `factor`; a sample must be one square image.

    That is input_shape (1, side, side), which stays an image, or flat features that form
    a square, which stay flat. Several channels (CIFAR-10) are not supported.
    """
    factor = _check_count(factor, "factor")
    side = math.isqrt(ds.n_features)
    if side * side != ds.n_features:
        raise ValueError(f"cannot upscale {ds.name}: n_features={ds.n_features} is not a "
                         f"square image (side * side)")
    if ds.input_shape not in ((1, side, side), (ds.n_features,)):
        raise ValueError(f"cannot upscale {ds.name}: input_shape={ds.input_shape} is not a "
                         f"single-channel square image")
    if factor == 1:
        return ds
    wide = side * factor
    return dataclasses.replace(
        ds, x_train=upscale_images(ds.x_train, factor, side),
        x_test=upscale_images(ds.x_test, factor, side),
        input_shape=(1, wide, wide) if len(ds.input_shape) == 3 else (wide * wide,),
        name=f"{ds.name}-x{factor}", source=f"{ds.source}, upscaled x{factor}")


# ---------------------------------------------------------------------------------------
# The command line's entry point
# ---------------------------------------------------------------------------------------

DATASET_NAMES = ("mnist", "cifar10", "synthetic")
SYNTHETIC_DEFAULT_SAMPLES = 100_000
SYNTHETIC_DEFAULT_FEATURES = 20


def load_dataset(name: str, *, data_dir=None, dtype=np.float32, limit: int | None = None,
                 seed: int = 0, n_samples: int | None = None, n_features: int | None = None,
                 upscale: int = 1, allow_download: bool = True,
                 announce: Callable[[str], None] | None = print) -> Dataset:
    """Load a dataset by name for the training job.

    "mnist": `get_mnist` (local, else download if allowed, else announced synthetic data).
    "cifar10": `get_cifar10` (local, else announced synthetic data; never downloaded, so
    `allow_download` does not apply).
    "synthetic": `synthetic_binary(n_samples or 100_000, n_features or 20, seed=seed)`.
    `limit` keeps the first `limit` training samples (the test split is untouched);
    `upscale` > 1 applies `upscale_dataset` (after `limit`, to bound memory; MNIST and
    square synthetic sets only).
    """
    if name not in DATASET_NAMES:
        raise ValueError(f"name={name!r} is not a known dataset; valid names: "
                         f"{', '.join(DATASET_NAMES)}")
    dt = _float_dtype(dtype)
    if limit is not None:
        limit = _check_count(limit, "limit")
    upscale = _check_count(upscale, "upscale")
    if name in ("mnist", "cifar10"):
        for arg, value in (("n_samples", n_samples), ("n_features", n_features)):
            if value is not None:
                raise ValueError(f"{arg}={value!r} applies only to name='synthetic', "
                                 f"not name={name!r} (use limit to subsample {name})")
    if name == "mnist":
        ds = get_mnist(data_dir, dtype=dt, allow_download=allow_download,
                       allow_synthetic=True, announce=announce, seed=seed)
    elif name == "cifar10":
        # the stand-in's first k rows do not depend on its size: draw only what is kept
        n_synthetic = CIFAR10_TRAIN_SIZE if limit is None else min(limit, CIFAR10_TRAIN_SIZE)
        ds = get_cifar10(data_dir, dtype=dt, allow_synthetic=True, announce=announce,
                         seed=seed, synthetic_n_train=n_synthetic)
    else:
        if data_dir is not None:
            raise ValueError(f"data_dir={str(data_dir)!r} applies to 'mnist' and 'cifar10'; "
                             f"the 'synthetic' data set is generated, not read")
        n = SYNTHETIC_DEFAULT_SAMPLES if n_samples is None else _check_count(n_samples, "n_samples")
        d = (SYNTHETIC_DEFAULT_FEATURES if n_features is None
             else _check_count(n_features, "n_features"))
        ds = synthetic_binary(n, d, seed=seed, dtype=dt)
    if limit is not None:
        if limit > ds.n_train:
            raise ValueError(f"limit={limit} exceeds the {ds.n_train} training samples of "
                             f"{ds.name}")
        # copy, so the full training array can be freed
        ds = dataclasses.replace(ds, x_train=ds.x_train[:limit].copy(),
                                 y_train=ds.y_train[:limit].copy(),
                                 source=f"{ds.source}, first {limit} training samples")
    if upscale > 1:
        ds = upscale_dataset(ds, upscale)
    return ds
