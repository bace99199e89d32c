"""The named data sets and the policies that pick a source for each.

`load_dataset(name)` is the single entry point the command line uses. `get_mnist` and
`get_cifar10` decide where MNIST and CIFAR-10 come from: local files, else (MNIST only) a
download, else an announced synthetic stand-in; a directory the user names must hold them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .cifar10 import CIFAR10_TEST_SIZE, CIFAR10_TRAIN_SIZE, load_cifar10
from .dataset import DataError, DataNotFound, Dataset, _check_count, _float_dtype
from .locations import check_env_data_dir, default_cache_dir
from .mnist import MNIST_CLASSES, MNIST_SIDE, download_mnist, load_mnist
from .synthetic import synthetic_binary, synthetic_cifar10, synthetic_classification
from .transforms import upscale_dataset

DATASET_NAMES = ("mnist", "cifar10", "synthetic")
SYNTHETIC_DEFAULT_SAMPLES = 100_000
SYNTHETIC_DEFAULT_FEATURES = 20


def get_mnist(
    data_dir=None,
    dtype=np.float32,
    allow_download=True,
    allow_synthetic=True,
    announce: Callable[[str], None] | None = print,
    *,
    seed: int = 0,
    synthetic_n_train: int = 60_000,
    synthetic_n_test: int = 10_000,
) -> Dataset:
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
    check_env_data_dir()
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
        raise DataNotFound(
            f"{not_found}; {download_note}", searched=not_found.searched
        ) from not_found
    ds = synthetic_classification(
        synthetic_n_train,
        n_features=MNIST_SIDE * MNIST_SIDE,
        n_classes=MNIST_CLASSES,
        seed=seed,
        n_test=synthetic_n_test,
        dtype=dt,
    )
    ds = dataclasses.replace(
        ds, source="synthetic (MNIST not found)", input_shape=(1, MNIST_SIDE, MNIST_SIDE)
    )
    if announce is not None:
        announce(
            f"MNIST not found (searched: {', '.join(not_found.searched)}; "
            f"{download_note}); using SYNTHETIC MNIST-shaped data: {ds.describe()}"
        )
    return ds


def get_cifar10(
    data_dir=None,
    dtype=np.float32,
    allow_synthetic=True,
    announce: Callable[[str], None] | None = print,
    *,
    seed: int = 0,
    synthetic_n_train: int = CIFAR10_TRAIN_SIZE,
    synthetic_n_test: int = CIFAR10_TEST_SIZE,
) -> Dataset:
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
    check_env_data_dir()
    try:
        return load_cifar10(dtype=dt)
    except DataNotFound as exc:
        if not allow_synthetic:
            raise
        not_found = exc
    ds = synthetic_cifar10(synthetic_n_train, synthetic_n_test, seed=seed, dtype=dt)
    ds = dataclasses.replace(ds, source="synthetic (CIFAR-10 not found)")
    if announce is not None:
        announce(
            f"CIFAR-10 not found (searched: {', '.join(not_found.searched)}; it is never "
            f"downloaded); using SYNTHETIC CIFAR-10-shaped data: {ds.describe()}"
        )
    return ds


def load_dataset(
    name: str,
    *,
    data_dir=None,
    dtype=np.float32,
    limit: int | None = None,
    seed: int = 0,
    n_samples: int | None = None,
    n_features: int | None = None,
    upscale: int = 1,
    allow_download: bool = True,
    announce: Callable[[str], None] | None = print,
) -> Dataset:
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
        raise ValueError(
            f"name={name!r} is not a known dataset; valid names: {', '.join(DATASET_NAMES)}"
        )
    dt = _float_dtype(dtype)
    if limit is not None:
        limit = _check_count(limit, "limit")
    upscale = _check_count(upscale, "upscale")
    if name in ("mnist", "cifar10"):
        for arg, value in (("n_samples", n_samples), ("n_features", n_features)):
            if value is not None:
                raise ValueError(
                    f"{arg}={value!r} applies only to name='synthetic', "
                    f"not name={name!r} (use limit to subsample {name})"
                )
    if name == "mnist":
        ds = get_mnist(
            data_dir,
            dtype=dt,
            allow_download=allow_download,
            allow_synthetic=True,
            announce=announce,
            seed=seed,
        )
    elif name == "cifar10":
        # the stand-in's first k rows do not depend on its size: draw only what is kept
        n_synthetic = CIFAR10_TRAIN_SIZE if limit is None else min(limit, CIFAR10_TRAIN_SIZE)
        ds = get_cifar10(
            data_dir,
            dtype=dt,
            allow_synthetic=True,
            announce=announce,
            seed=seed,
            synthetic_n_train=n_synthetic,
        )
    else:
        if data_dir is not None:
            raise ValueError(
                f"data_dir={str(data_dir)!r} applies to 'mnist' and 'cifar10'; "
                f"the 'synthetic' data set is generated, not read"
            )
        n = SYNTHETIC_DEFAULT_SAMPLES if n_samples is None else _check_count(n_samples, "n_samples")
        d = (
            SYNTHETIC_DEFAULT_FEATURES
            if n_features is None
            else _check_count(n_features, "n_features")
        )
        ds = synthetic_binary(n, d, seed=seed, dtype=dt)
    if limit is not None:
        if limit > ds.n_train:
            raise ValueError(
                f"limit={limit} exceeds the {ds.n_train} training samples of {ds.name}"
            )
        # copy, so the full training array can be freed
        ds = dataclasses.replace(
            ds,
            x_train=ds.x_train[:limit].copy(),
            y_train=ds.y_train[:limit].copy(),
            source=f"{ds.source}, first {limit} training samples",
        )
    if upscale > 1:
        ds = upscale_dataset(ds, upscale)
    return ds
