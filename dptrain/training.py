"""Sequential training: the loop, its timing, and the JSON result.

``train(...)`` loads the data, builds the model, runs mini-batch SGD for some epochs and
returns a result dict (also written as JSON with ``out=``): the full configuration,
per-epoch training loss and test accuracy, and where the time went. ``train_seconds`` is the
training loop alone: start-up, data loading and the per-epoch evaluation are reported
separately (``data_load_seconds``, ``eval_seconds``) and are part of ``wall_seconds`` only.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path

import numpy as np

from . import data as data_mod
from .models import build_model
from .optim import SCHEDULES, SGD, lr_at
from .sampler import batch_bounds, epoch_order

MODELS = ("logreg", "softmax", "mlp")


def _positive_int(name, value):
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_finite_data(ds):
    for name in ("x_train", "x_test"):
        arr = getattr(ds, name)
        if not np.isfinite(arr).all():
            bad = int(np.argwhere(~np.isfinite(arr))[0][0])
            raise ValueError(f"data set {ds.name!r}: {name} has a non-finite value in row {bad}")


def train(model: str = "mlp", dataset: str = "mnist", *, data_dir=None, epochs: int = 2,
          batch_size: int = 128, lr: float = 0.1, momentum: float = 0.9,
          nesterov: bool = False, weight_decay: float = 0.0, dampening: float = 0.0,
          lr_schedule: str = "cosine", seed: int = 0, shuffle: bool = True, limit: int | None = None, dtype: str = "float32",
          hidden=(256, 128), threads: int = 1, n_samples: int | None = None,
          n_features: int | None = None, upscale: int = 1, out=None, save_weights=None,
          quiet: bool = False, allow_download: bool = True, log=print) -> dict:
    """Trains one model on one worker; returns the result dict (see the module docstring).

    model: 'logreg' | 'softmax' | 'mlp' (hidden sizes from ``hidden``); dataset: 'mnist' |
    'synthetic'. shuffle=False keeps a fixed batch order; limit keeps the first N training
    samples (data-size sweeps). Raises FloatingPointError when the loss stops being finite.
    """
    wall0 = time.perf_counter()
    if model not in MODELS:
        raise ValueError(f"model is {model!r}, expected one of {MODELS}")
    epochs = _positive_int("epochs", epochs)
    batch_size = _positive_int("batch_size", batch_size)
    threads = _positive_int("threads", threads)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype is {dtype!r}, expected 'float32' or 'float64'")
    hidden = tuple(_positive_int("hidden size", h) for h in hidden)
    if lr_schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule is {lr_schedule!r}, expected one of {SCHEDULES}")
    say = (lambda *a: None) if quiet else log
    config = dict(model=model, dataset=dataset, data_dir=str(data_dir) if data_dir else None,
                  epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                  nesterov=nesterov, weight_decay=weight_decay, dampening=dampening,
                  lr_schedule=lr_schedule, seed=seed,
                  shuffle=shuffle, limit=limit, dtype=dtype,
                  hidden=list(hidden) if model == "mlp" else None, threads=threads,
                  n_samples=n_samples, n_features=n_features, upscale=upscale, workers=1,
                  backend="sequential")

    t0 = time.perf_counter()
    ds = data_mod.load_dataset(dataset, data_dir=data_dir, dtype=np.dtype(dtype), limit=limit,
                               seed=seed, n_samples=n_samples, n_features=n_features,
                               upscale=upscale, allow_download=allow_download, announce=say)
    _check_finite_data(ds)
    data_load_seconds = time.perf_counter() - t0

    net = build_model(model, ds.n_features, ds.n_classes, hidden=hidden, seed=seed, dtype=dtype,
                      threads=threads)
    opt = SGD(net, lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
              nesterov=nesterov)
    say(f"dptrain: {net!r} on {ds.name} ({len(ds.x_train)} train / {len(ds.x_test)} test, "
        f"source: {ds.source}), batch {batch_size}, lr {lr}, momentum {momentum}")

    x, y = ds.x_train, ds.y_train
    n = len(x)
    bounds = batch_bounds(n, batch_size)
    total_steps = epochs * len(bounds)
    xb = np.empty((batch_size, ds.n_features), dtype=x.dtype)
    yb = np.empty(batch_size, dtype=np.int64)
    phase = {"data": 0.0, "compute": 0.0, "update": 0.0}
    history, train_seconds, eval_seconds, steps = [], 0.0, 0.0, 0
    for epoch in range(epochs):
        order = epoch_order(n, epoch, seed, shuffle)
        loss_sum, correct = 0.0, 0
        e0 = time.perf_counter()
        for s, e in bounds:
            t_a = time.perf_counter()
            if shuffle:
                idx = order[s:e]
                bx, by = xb[:e - s], yb[:e - s]
                np.take(x, idx, axis=0, out=bx)
                np.take(y, idx, out=by)
            else:
                bx, by = x[s:e], y[s:e]            # contiguous slices: no copy
            t_b = time.perf_counter()
            net.zero_grad()
            batch_loss, batch_correct = net.loss_grad(bx, by)
            t_c = time.perf_counter()
            if not math.isfinite(batch_loss):
                raise FloatingPointError(
                    f"training diverged: the loss is {batch_loss} at epoch {epoch + 1}, step "
                    f"{steps + 1} (lr={lr}); try a smaller learning rate")
            opt.step(lr_at(steps, total_steps, lr, lr_schedule))
            t_d = time.perf_counter()
            phase["data"] += t_b - t_a
            phase["compute"] += t_c - t_b
            phase["update"] += t_d - t_c
            loss_sum += batch_loss
            correct += batch_correct
            steps += 1
        epoch_seconds = time.perf_counter() - e0
        train_seconds += epoch_seconds
        v0 = time.perf_counter()
        test_loss, test_acc = net.evaluate(ds.x_test, ds.y_test)
        eval_seconds += time.perf_counter() - v0
        rec = {"epoch": epoch + 1, "train_loss": loss_sum / n, "train_accuracy": correct / n,
               "test_loss": test_loss, "test_accuracy": test_acc, "seconds": epoch_seconds}
        history.append(rec)
        say(f"epoch {epoch + 1}/{epochs}  train loss {rec['train_loss']:.4f}  "
            f"test loss {test_loss:.4f}  test acc {100 * test_acc:.2f}%  "
            f"({epoch_seconds:.2f} s, {n / epoch_seconds:,.0f} samples/s)")

    if save_weights:
        net.save(save_weights)
    from . import build_info
    result = {
        "dptrain_version": _version(),
        "config": config,
        "dataset": {"name": ds.name, "source": ds.source, "n_train": n,
                    "n_test": len(ds.x_test), "n_features": ds.n_features,
                    "n_classes": ds.n_classes},
        "model": {"kind": model, "sizes": list(net.sizes), "n_params": net.n_params,
                  "dtype": dtype, "loss": net.loss},
        "epochs": history,
        "train_loss": [h["train_loss"] for h in history],
        "test_accuracy": [h["test_accuracy"] for h in history],
        "final_test_accuracy": history[-1]["test_accuracy"],
        "steps": steps,
        "samples": steps and n * epochs,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "data_load_seconds": data_load_seconds,
        "phase_seconds": phase,
        "steps_per_second": steps / train_seconds if train_seconds > 0 else None,
        "samples_per_second": n * epochs / train_seconds if train_seconds > 0 else None,
        "build": build_info(),
        "host": {"python": platform.python_version(), "machine": platform.machine(),
                 "cpus": os.cpu_count()},
    }
    result["wall_seconds"] = time.perf_counter() - wall0
    if out:
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
        say(f"wrote {out}")
    return result


def _version() -> str:
    from . import __version__
    return __version__
