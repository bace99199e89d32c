"""What a run trains on, read and checked before any worker starts: a named data set, a
Dataset, or the user's arrays (converted once to the model's dtype, labels checked against
a given model's classes, limited, finite)."""

from __future__ import annotations

import numbers
import sys
from dataclasses import replace

from .. import data as data_mod
from ..models import storage_dtype
from .model import model_classes


def data_arg(dataset, X, y, X_test, y_test, validation):
    """What the data of train/fit are: None (the named data set of the config), a Dataset,
    or the arrays ("arrays", X, y, X_test, y_test, validation); errors name the argument.
    validation holds out a fraction of the arrays: a named data set or a Dataset has its own
    test set, and is refused it rather than silently ignoring it."""
    if validation is not None and (
        isinstance(validation, bool)
        or not isinstance(validation, numbers.Real)
        or not 0 < validation < 1
    ):
        raise ValueError(f"validation={validation!r} must be a fraction between 0 and 1 (e.g. 0.1)")
    if validation is not None and (X is None and not isinstance(dataset, (tuple, list))):
        what = f"the named data set {dataset!r}" if isinstance(dataset, str) else "a Dataset"
        raise ValueError(
            f"validation={validation!r} holds out a fraction of your arrays (X, y), but the "
            f"run trains on {what}, which has its own test set"
        )
    if isinstance(dataset, data_mod.Dataset):
        if X is not None:
            raise ValueError("give either dataset= (a Dataset) or X=, not both")
        return dataset
    if isinstance(dataset, (tuple, list)):
        if X is not None or len(dataset) not in (2, 4):
            raise ValueError("dataset as a tuple is (X, y) or (X, y, X_test, y_test)")
        X, y, *rest = dataset
        if rest:
            X_test, y_test = rest
    elif dataset is not None and not isinstance(dataset, str):
        raise TypeError(
            f"dataset is a {type(dataset).__name__}: give a name ('mnist', "
            f"'cifar10', 'synthetic'), a dptrain.data.Dataset, or (X, y)"
        )
    if X is None:
        if y is not None or X_test is not None:
            raise ValueError("y, X_test and y_test need X")
        return None
    if y is None:
        raise ValueError("X needs its labels y")
    return ("arrays", X, y, X_test, y_test, validation)


ANNOUNCED: set = set()  # lines already printed by this process (a sweep's runs repeat them)


def announce(line: str) -> None:
    """Prints a line about the data on stderr once per process (even when quiet): a
    synthetic stand-in is always said."""
    if line not in ANNOUNCED:
        ANNOUNCED.add(line)
        print(f"dptrain: {line}", file=sys.stderr, flush=True)


def load_data(cfg, data, model_obj, note):
    """The run's data set: the named one (``data`` None), the given Dataset, or the arrays of
    ``data_arg``, in the model's dtype, limited to ``cfg.limit`` samples. note: how a
    synthetic stand-in is announced (None: not at all, on MPI ranks other than 0)."""
    if data is None:
        if model_obj is not None:
            raise ValueError("fit needs the arrays X, y")
        return data_mod.load_dataset(
            cfg.dataset,
            data_dir=cfg.data_dir,
            dtype=storage_dtype(cfg.dtype),
            limit=cfg.limit,
            seed=cfg.seed,
            n_samples=cfg.n_samples,
            n_features=cfg.n_features,
            upscale=cfg.upscale,
            allow_download=cfg.allow_download,
            announce=note,
        )
    if isinstance(data, data_mod.Dataset):
        ds = data
    else:
        _, X, y, X_test, y_test, validation = data
        # a given model fixes the classes (its outputs): labels are checked against them,
        # and arrays that hold only some of them (one, in a partial_fit batch) are fine
        regression = model_obj is not None and model_obj.loss == "mse"
        n_classes = None if model_obj is None or regression else model_classes(model_obj.spec())
        ds = data_mod.from_arrays(
            X,
            y,
            X_test=X_test,
            y_test=y_test,
            validation=validation,
            n_classes=n_classes,
            dtype=storage_dtype(cfg.dtype),
            task="regression" if regression else "classification",
        )
    if ds.dtype != storage_dtype(cfg.dtype):
        raise ValueError(
            f"the data set is {ds.dtype}, but the run is {cfg.dtype}"
            + (" (float32 data)" if cfg.dtype == "bfloat16" else "")
        )
    if cfg.limit is not None:
        if cfg.limit > ds.n_train:
            raise ValueError(
                f"limit={cfg.limit} exceeds the {ds.n_train} training samples of {ds.name}"
            )
        ds = replace(ds, x_train=ds.x_train[: cfg.limit], y_train=ds.y_train[: cfg.limit])
    return ds


def check_finite(ds) -> None:
    """NaN/inf in the features are refused, naming the row (scanned in bounded chunks: the
    data may be a memory map larger than RAM)."""
    for name in ("x_train", "x_test"):
        bad = data_mod.first_nonfinite_row(getattr(ds, name))
        if bad is not None:
            raise ValueError(f"data set {ds.name!r}: {name} has a non-finite value in row {bad}")
