"""Checkpoints: everything a run needs to continue bitwise where it stopped, in a .npz (no
pickle), written atomically and durably, and read back through one validating function.

A checkpoint holds the parameters, the momentum, and the position: epoch, batch, step (the
sampler's order and the learning-rate schedule are functions of these and the seed) and the
epoch's running sums; plus the options a run must share to resume it (``resume_keys``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..models import storage_dtype
from ..sampler import steps_per_epoch


def resume_keys(job) -> dict:
    """What a checkpoint must agree on with the run that resumes it."""
    cfg = job.config
    return {
        "model": job.model["kind"],
        "sizes": list(job.model["sizes"]),
        "dtype": cfg.dtype,
        "seed": cfg.seed,
        "lr": job.lr,
        "momentum": cfg.momentum,
        "dampening": cfg.dampening,
        "weight_decay": cfg.weight_decay,
        "nesterov": cfg.nesterov,
        "lr_schedule": cfg.lr_schedule,
        "epochs": cfg.epochs,
        "batch_size": job.batch_size,
        "shuffle": cfg.shuffle,
        "warmup_steps": job.warmup_steps,
        "deterministic": cfg.deterministic,
        "optimizer": cfg.optimizer,
        **({} if cfg.optimizer == "sgd" else {"betas": list(cfg.betas), "eps": cfg.eps}),
    }


# what a checkpoint that lacks a resume key was written with: before the optimizer option
# every run was SGD's
_RESUME_KEY_BEFORE = {"optimizer": "sgd"}


CHECKPOINT_FORMAT = 1


def save_checkpoint(
    path,
    job,
    net,
    *,
    step,
    epoch,
    batch,
    loss_sum,
    correct,
    history,
    train_seconds,
    eval_seconds,
    optimizer=None,
) -> None:
    """Writes everything a run needs to continue bitwise where it stopped (.npz, no pickle):
    parameters, momentum, the position (epoch, batch, step: the sampler's order and the
    learning-rate schedule are functions of these and the seed) and the epoch so far; and
    the optimizer's state (Adam's second moment, the step count) as OPTIMIZER_ARRAY + name.

    Atomic and durable: written to a temporary beside it, flushed to disk (file, then the
    directory after the rename), then renamed over the old one, so a crash or a kill at any
    moment leaves the previous checkpoint or the new one, whole. Temporaries that a killed
    writer left behind are removed."""
    path = Path(path)
    position = {
        "step": step,
        "epoch": epoch,
        "batch": batch,
        "loss_sum": loss_sum,
        "correct": correct,
        "history": history,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "job": resume_keys(job),
    }
    _remove_stale_temporaries(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}.npz")
    try:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                format=np.int64(CHECKPOINT_FORMAT),
                params=net.params,
                velocity=net.velocity,
                position=np.array(json.dumps(position)),
                **_optimizer_arrays(optimizer),
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


OPTIMIZER_ARRAY = "optimizer_"  # the prefix of the optimizer's arrays in a checkpoint


def _optimizer_arrays(optimizer) -> dict:
    """The optimizer's state_dict (its arrays, and its step count: a run that continued an
    earlier one's optimizer counts on from there), by .npz name."""
    if optimizer is None:
        return {}
    state = optimizer.state_dict()
    state["steps"] = np.int64(state["steps"])
    return {OPTIMIZER_ARRAY + k: v for k, v in state.items()}


def load_optimizer_state(path, optimizer, step: int) -> None:
    """The optimizer's state from a checkpoint that read_checkpoint accepted for this run (its
    arrays and step count, named OPTIMIZER_ARRAY + name; a checkpoint without the count was
    written at the position's step); a checkpoint whose arrays this optimizer cannot take is
    a ValueError naming the file."""
    where = f"checkpoint {path}"
    try:
        with np.load(path, allow_pickle=False) as f:
            state = {
                k[len(OPTIMIZER_ARRAY) :]: f[k] for k in f.files if k.startswith(OPTIMIZER_ARRAY)
            }
    except (OSError, EOFError, ValueError, KeyError, RuntimeError) as exc:
        raise ValueError(f"{where} cannot be read: {type(exc).__name__}: {exc}") from None
    steps = state.pop("steps", np.int64(step))
    if steps.shape != () or steps.dtype.kind not in "iu" or not step <= steps:
        raise ValueError(
            f"{where}: the optimizer's step count {steps.item()!r} is impossible at step {step}"
        )
    for name, arr in state.items():
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ValueError(f"{where}: optimizer array {name} holds non-finite values")
    try:
        optimizer.load_state_dict({"steps": int(steps), **state})
    except ValueError as exc:
        raise ValueError(f"{where}: its optimizer state does not fit this run: {exc}") from None


def _remove_stale_temporaries(path: Path) -> None:
    """Deletes <path>.tmp-PID.npz files whose writer (PID) no longer runs."""
    for tmp in path.parent.glob(f"{path.name}.tmp-*.npz"):
        pid = tmp.name[len(path.name) + 5 : -4]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except PermissionError:  # alive, someone else's
            pass


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported here (e.g. Windows): best effort
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_POSITION_FIELDS = {
    "step": int,
    "epoch": int,
    "batch": int,
    "loss_sum": float,
    "correct": int,
    "history": list,
    "train_seconds": float,
    "eval_seconds": float,
    "job": dict,
}


def read_checkpoint(path, job, n_params: int, n_train: int):
    """(params, velocity, position) of a checkpoint that this job can resume, checked
    through: the file (a readable .npz of this format), its arrays (this model's dtype and
    length, finite), the run it belongs to (resume_keys) and its position (a step this
    data set and batch size can reach). Any problem is one ValueError naming the file and
    what is wrong."""
    import zipfile

    where = f"checkpoint {path}"
    try:
        with np.load(path, allow_pickle=False) as f:
            if not isinstance(f, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not a .npz checkpoint")
            missing = {"format", "params", "velocity", "position"} - set(f.files)
            if missing:
                raise ValueError(
                    f"no {', '.join(sorted(missing))} array (not a dptrain checkpoint?)"
                )
            fmt, params, velocity = f["format"], f["params"], f["velocity"]
            position = json.loads(str(f["position"]))
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except (
        OSError,
        EOFError,
        zipfile.BadZipFile,
        KeyError,
        ValueError,
        TypeError,
        UnicodeDecodeError,
        RuntimeError,
    ) as exc:
        # truncated, bit-flipped (a CRC error), empty, not a zip, a damaged member, bad JSON
        raise ValueError(f"{where} cannot be read: {type(exc).__name__}: {exc}") from None
    if fmt.shape != () or int(fmt) != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{where} has format {fmt!r}, this dptrain reads format {CHECKPOINT_FORMAT}"
        )
    cfg = job.config
    dtype = storage_dtype(cfg.dtype)
    for name, arr in (("params", params), ("velocity", velocity)):
        if arr.shape != (n_params,) or arr.dtype != dtype:
            raise ValueError(
                f"{where}: {name} has dtype {arr.dtype} and shape {arr.shape}, "
                f"expected {dtype} and ({n_params},) for this model"
            )
        if not np.isfinite(arr).all():
            raise ValueError(f"{where}: {name} holds non-finite values")
    if not isinstance(position, dict):
        raise ValueError(f"{where}: the position is not a JSON object")
    for key, kind in _POSITION_FIELDS.items():
        value = position.get(key)
        if (
            not isinstance(value, kind)
            or isinstance(value, bool)
            or (kind is float and not isinstance(value, (int, float)))
        ):
            if not (kind is float and isinstance(value, int) and not isinstance(value, bool)):
                raise ValueError(
                    f"{where}: position field {key!r} is {value!r}, expected {kind.__name__}"
                )
    for key, now in resume_keys(job).items():
        saved = position["job"].get(key, _RESUME_KEY_BEFORE.get(key))
        if saved != now:
            raise ValueError(
                f"{path} was written by a run with {key}={saved!r}, but this run "
                f"has {key}={now!r}: it cannot resume it"
            )
    per_epoch = steps_per_epoch(n_train, job.batch_size)
    step, epoch, batch = position["step"], position["epoch"], position["batch"]
    if not (
        0 <= epoch < cfg.epochs and 0 <= batch <= per_epoch and step == epoch * per_epoch + batch
    ):
        raise ValueError(
            f"{where}: step {step} at epoch {epoch}, batch {batch} is impossible "
            f"for {cfg.epochs} epoch(s) of {per_epoch} steps (batch size "
            f"{job.batch_size}, {n_train} samples)"
        )
    if len(position["history"]) != epoch or not all(
        isinstance(h, dict) and "test_accuracy" in h for h in position["history"]
    ):
        raise ValueError(
            f"{where}: its history has {len(position['history'])} epoch record(s), expected {epoch}"
        )
    if not (
        math.isfinite(position["loss_sum"])
        and 0 <= position["correct"] <= n_train
        and position["train_seconds"] >= 0
        and position["eval_seconds"] >= 0
    ):
        raise ValueError(
            f"{where}: the epoch's running sums are impossible (loss_sum "
            f"{position['loss_sum']!r}, correct {position['correct']!r})"
        )
    position.pop("job")
    return params, velocity, position


def load_checkpoint(path, job, net, n_train: int) -> dict:
    """read_checkpoint, then net's params and momentum from it (when net is given); returns
    the position."""
    params, velocity, position = read_checkpoint(path, job, job.model["n_params"], n_train)
    if net is not None:
        net.params[:] = params
        net.velocity[:] = velocity
    return position
