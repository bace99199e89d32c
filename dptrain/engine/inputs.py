"""What a run trains on and what it trains, checked against each other before any worker
starts: the data (a named data set, a Dataset, or the user's arrays, converted once to the
model's dtype, finite, at least one sample per worker) and the spec of the model (the
user's model, or the named one planned for the data without allocating it).
"""
from __future__ import annotations

import sys
from dataclasses import replace

from .. import data as data_mod
from ..models import MODEL_KINDS, layers_spec, named_spec, storage_dtype


def data_arg(dataset, X, y, X_test, y_test, validation):
    """What the data of train/fit are: None (the named data set of the config), a Dataset,
    or the arrays ("arrays", X, y, X_test, y_test, validation); errors name the argument."""
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
        raise TypeError(f"dataset is a {type(dataset).__name__}: give a name ('mnist', "
                        f"'cifar10', 'synthetic'), a dptrain.data.Dataset, or (X, y)")
    if X is None:
        if y is not None or X_test is not None:
            raise ValueError("y, X_test and y_test need X")
        return None
    if y is None:
        raise ValueError("X needs its labels y")
    return ("arrays", X, y, X_test, y_test, validation)


ANNOUNCED: set = set()      # lines already printed by this process (a sweep's runs repeat them)


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
        return data_mod.load_dataset(cfg.dataset, data_dir=cfg.data_dir,
                                     dtype=storage_dtype(cfg.dtype), limit=cfg.limit, seed=cfg.seed,
                                     n_samples=cfg.n_samples, n_features=cfg.n_features,
                                     upscale=cfg.upscale, allow_download=cfg.allow_download,
                                     announce=note)
    if isinstance(data, data_mod.Dataset):
        ds = data
    else:
        _, X, y, X_test, y_test, validation = data
        # a given model fixes the classes (its outputs): labels are checked against them,
        # and arrays that hold only some of them (one, in a partial_fit batch) are fine
        regression = model_obj is not None and model_obj.loss == "mse"
        n_classes = None if model_obj is None or regression else model_classes(model_obj.spec())
        ds = data_mod.from_arrays(X, y, X_test=X_test, y_test=y_test, validation=validation,
                                  n_classes=n_classes, dtype=storage_dtype(cfg.dtype),
                                  task="regression" if regression else "classification")
    if ds.dtype != storage_dtype(cfg.dtype):
        raise ValueError(f"the data set is {ds.dtype}, but the run is {cfg.dtype}"
                         + (" (float32 data)" if cfg.dtype == "bfloat16" else ""))
    if cfg.limit is not None:
        if cfg.limit > ds.n_train:
            raise ValueError(f"limit={cfg.limit} exceeds the {ds.n_train} training samples of "
                             f"{ds.name}")
        ds = replace(ds, x_train=ds.x_train[:cfg.limit], y_train=ds.y_train[:cfg.limit])
    return ds


def model_spec(cfg, ds, model_obj) -> dict:
    """The spec of the model the run trains: the user's model (checked against the data), or
    the named model built for the data."""
    if model_obj is not None:
        spec = model_obj.spec()
        if spec["sizes"][0] != ds.n_features:
            raise ValueError(f"the model takes {spec['sizes'][0]} features, but X has "
                             f"{ds.n_features} per row")
        if spec["loss"] == "mse":
            if ds.task != "regression" or ds.n_outputs != spec["sizes"][-1]:
                got = (f"{ds.n_outputs} target(s) per row" if ds.task == "regression"
                       else "class labels")
                raise ValueError(f"the model regresses onto {spec['sizes'][-1]} output(s) "
                                 f"(loss 'mse'), but y has {got}")
            return spec
        if ds.task != "classification":
            raise ValueError(f"the model is a classifier (loss {spec['loss']!r}), but the data "
                             f"set is a regression: use a model with loss='mse'")
        classes = model_classes(spec)
        if ds.n_classes > classes:
            raise ValueError(f"the labels name {ds.n_classes} classes, but the model has "
                             f"{classes} outputs")
        return spec
    if cfg.layers is not None:
        binary = ds.n_classes == 2 and cfg.layers[-1] in (("dense", 1), ["dense", 1])
        spec = layers_spec(cfg.layers, ds.input_shape, "sigmoid_bce" if binary else
                           "softmax_xent", dtype=cfg.dtype, seed=cfg.seed)
        outputs = spec["sizes"][-1]
        if not binary and outputs != ds.n_classes:
            raise ValueError(f"layers: the model has {outputs} outputs, but the data "
                             f"set has {ds.n_classes} classes: end with dense:{ds.n_classes}"
                             + (" (or dense:1 for two classes)" if ds.n_classes == 2 else ""))
        return spec
    if cfg.model not in MODEL_KINDS:
        raise ValueError(f"model={cfg.model!r} is a model you build (dptrain.nn.Sequential): "
                         f"train it with dptrain.fit(model, X, y); dptrain.train names one of "
                         f"{MODEL_KINDS}")
    shape = ds.input_shape if len(ds.input_shape) == 3 else None
    return named_spec(cfg.model, ds.n_features, ds.n_classes, hidden=cfg.hidden,
                      input_shape=shape, dtype=cfg.dtype, seed=cfg.seed)


def model_classes(spec) -> int:
    """The classes a model's outputs name: 2 for a binary (sigmoid) model, else one per logit."""
    return 2 if spec["loss"] == "sigmoid_bce" else spec["sizes"][-1]


def check_finite(ds) -> None:
    """NaN/inf in the features are refused, naming the row (scanned in bounded chunks: the
    data may be a memory map larger than RAM)."""
    for name in ("x_train", "x_test"):
        bad = data_mod.first_nonfinite_row(getattr(ds, name))
        if bad is not None:
            raise ValueError(f"data set {ds.name!r}: {name} has a non-finite value in row {bad}")
