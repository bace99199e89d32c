"""Data sets for the training jobs: MNIST and CIFAR-10 from local files, synthetic workloads.

One role per module; every public name is re-exported here (`from dptrain.data import ...`):
- dataset.py: `Dataset` (train/test arrays in the layout the C core wants: x C-contiguous
  float32 or float64 of shape (n, features); y int64 of shape (n,) for a classification,
  float (n, k) for a regression; the shape of one input, `input_shape`, e.g. (1, 28, 28)
  or (3, 32, 32); where the data came from; `notes` for the caller to print), the errors
  `DataError` / `DataNotFound` / `DataWarning`, the checksum helpers and
  `first_nonfinite_row`.
- idx.py: `read_idx`, a strict reader for IDX files (the MNIST format), gzip or raw.
- locations.py: where data sets are looked for (`default_cache_dir`, $DPTRAIN_DATA).
- mnist.py: `load_mnist` / `download_mnist`: MNIST's files on disk, and the download.
- cifar10.py: `read_cifar10_batch` / `load_cifar10`: CIFAR-10 in either published format
  (the Python pickle batches, read without executing anything by _cifar_pickle.py, or the
  binary batches), as directories or the original .tar.gz archives; never downloaded.
- synthetic.py: `synthetic_binary` (the logistic-regression workload),
  `synthetic_classification` (MNIST's shapes), `synthetic_cifar10` (CIFAR-10's shapes).
- transforms.py: `upscale_images` / `upscale_dataset`: nearest-neighbour up-scaling
  (28x28 -> 56x56, 112x112) to make the per-sample compute larger for scaling experiments.
- arrays.py: the user's own data: `from_arrays` (NumPy arrays), `from_npy` (.npy files as
  memory maps: larger than memory is fine), `from_npz`; X converted to the model's dtype
  once (no copy when it already is), labels or regression targets validated row by row,
  a held-out set or `validation=` fraction; `memmap_region` for workers that map the data;
  `from_csv` (CSV files, read by csvfiles.py) and `from_files` (each file read by what it
  holds: .npz, .npy or CSV; what the command line uses).
- csvfiles.py: `read_csv` and the column choice of `from_csv`: delimited text, header
  detected, every value checked (the first bad one named by line and column).
- catalog.py: `load_dataset`, the single entry point the command line uses, and the
  policies `get_mnist` / `get_cifar10` (local files, else a download for MNIST, else an
  announced synthetic stand-in).

What is left out on purpose: shuffling, batching and sharding across workers (the training
loop owns those, so every rank sees the same arrays and takes its own deterministic shard),
and any dependency beyond NumPy and the standard library. Only `download_mnist` touches the
network, and only when asked to; CIFAR-10 is never downloaded (see `get_cifar10`).

Rank discipline: every function here is deterministic given its arguments, so all workers
can call it and get identical arrays. Messages go through the `announce` callable only;
pass `announce=lambda line: None` on ranks other than 0.
"""

from .arrays import from_arrays, from_csv, from_files, from_npy, from_npz, memmap_region
from .catalog import (
    DATASET_NAMES,
    SYNTHETIC_DEFAULT_FEATURES,
    SYNTHETIC_DEFAULT_SAMPLES,
    get_cifar10,
    get_mnist,
    load_dataset,
)
from .cifar10 import (
    CIFAR10_ARCHIVE_MD5,
    CIFAR10_BATCHES,
    CIFAR10_CLASSES,
    CIFAR10_FEATURES,
    CIFAR10_PYTHON_BATCH_MD5,
    CIFAR10_SHAPE,
    CIFAR10_TEST_SIZE,
    CIFAR10_TRAIN_SIZE,
    load_cifar10,
    read_cifar10_batch,
)
from .dataset import (
    CLASSIFICATION,
    REGRESSION,
    TASKS,
    DataError,
    DataNotFound,
    Dataset,
    DataWarning,
    first_nonfinite_row,
)
from .idx import read_idx
from .locations import ENV_DATA_DIR, default_cache_dir
from .mnist import (
    MNIST_CLASSES,
    MNIST_FILES,
    MNIST_MIRRORS,
    MNIST_SHA256,
    MNIST_SIDE,
    download_mnist,
    load_mnist,
)
from .synthetic import synthetic_binary, synthetic_cifar10, synthetic_classification
from .transforms import upscale_dataset, upscale_images

__all__ = [
    "CIFAR10_ARCHIVE_MD5",
    "CIFAR10_BATCHES",
    "CIFAR10_CLASSES",
    "CIFAR10_FEATURES",
    "CIFAR10_PYTHON_BATCH_MD5",
    "CIFAR10_SHAPE",
    "CIFAR10_TEST_SIZE",
    "CIFAR10_TRAIN_SIZE",
    "CLASSIFICATION",
    "DATASET_NAMES",
    "DataError",
    "DataNotFound",
    "DataWarning",
    "Dataset",
    "ENV_DATA_DIR",
    "MNIST_CLASSES",
    "MNIST_FILES",
    "MNIST_MIRRORS",
    "MNIST_SHA256",
    "MNIST_SIDE",
    "REGRESSION",
    "SYNTHETIC_DEFAULT_FEATURES",
    "SYNTHETIC_DEFAULT_SAMPLES",
    "TASKS",
    "default_cache_dir",
    "download_mnist",
    "first_nonfinite_row",
    "from_arrays",
    "from_csv",
    "from_files",
    "from_npy",
    "from_npz",
    "get_cifar10",
    "get_mnist",
    "load_cifar10",
    "load_dataset",
    "load_mnist",
    "memmap_region",
    "read_cifar10_batch",
    "read_idx",
    "synthetic_binary",
    "synthetic_cifar10",
    "synthetic_classification",
    "upscale_dataset",
    "upscale_images",
]
