"""Checkpoints: everything a run needs to continue bitwise where it stopped, in a .npz (no
pickle), written atomically and durably, and read back through one validating function.

A checkpoint holds the parameters, the momentum, and the position: epoch, batch, step (the
sampler's order and the learning-rate schedule are functions of these and the seed) and the
epoch's running sums; plus the options a run must share to resume it (``resume_keys``),
the data set's identity among them (``data_identity``).
"""

from __future__ import annotations

import json
import math
import zlib

import numpy as np

from .._files import NpzArchive, savez, write_atomically
from ..models import _checked_state, storage_dtype
from ..sampler import steps_per_epoch


def resume_keys(job) -> dict:
    """What a checkpoint must agree on with the run that resumes it, compared in this order:
    first what a user changes on purpose (the optimizer, the data set) and whose refusal
    should name it, not a consequence of it (another default lr, another model size)."""
    cfg = job.config
    return {
        "optimizer": cfg.optimizer,
        **job.data,
        "model": job.model["kind"],
        "sizes": list(job.model["sizes"]),
        "dtype": cfg.dtype,
        "seed": cfg.seed,
        "lr": job.lr,
        "weight_decay": cfg.weight_decay,
        "lr_schedule": cfg.lr_schedule,
        "epochs": cfg.epochs,
        "batch_size": job.batch_size,
        "shuffle": cfg.shuffle,
        "warmup_steps": job.warmup_steps,
        "deterministic": cfg.deterministic,
        # local SGD's (replicas 0: synchronous SGD)
        "sync_every": cfg.sync_every,
        "replicas": job.replicas,
        "local_after": cfg.local_after,
        "local_momentum": cfg.local_momentum,
        "outer_lr": cfg.outer_lr,
        "outer_momentum": cfg.outer_momentum,
        **OPTIMIZER_KEYS[cfg.optimizer](cfg),
        "clip_norm": cfg.clip_norm,
        "augment": cfg.augment,
        "lr_gamma": cfg.lr_gamma,
        "lr_step_epochs": cfg.lr_step_epochs,
    }


# each optimizer's own hyper-parameters among the resume keys
OPTIMIZER_KEYS = {
    "sgd": lambda c: {"momentum": c.momentum, "dampening": c.dampening, "nesterov": c.nesterov},
    "adam": lambda c: {"betas": list(c.betas), "eps": c.eps},
    "adamw": lambda c: {"betas": list(c.betas), "eps": c.eps},
    "rmsprop": lambda c: {
        "rms_alpha": c.rms_alpha,
        "eps": c.eps,
        "momentum": c.momentum,
        "centered": c.centered,
    },
}


_FINGERPRINT_ROWS = 8  # rows of x (and 64 labels) at each end of the training set


def data_identity(ds) -> dict:
    """The data set a run trains on, as its checkpoints record it (resume keys): its name,
    its training samples and features, and a fingerprint: the CRC-32 of its first and last
    rows and labels (cheap on any size: not a hash of the whole set, so it tells data sets
    apart, not a changed row in the middle)."""
    crc = 0
    for part in (
        ds.x_train[:_FINGERPRINT_ROWS],
        ds.x_train[-_FINGERPRINT_ROWS:],
        ds.y_train[: 8 * _FINGERPRINT_ROWS],
        ds.y_train[-8 * _FINGERPRINT_ROWS :],
    ):
        crc = zlib.crc32(np.ascontiguousarray(part).tobytes(), crc)
    return {
        "data": ds.name,
        "n_train": int(ds.n_train),
        "n_features": int(ds.n_features),
        "data_fingerprint": f"{crc:08x}",
    }


# what a checkpoint that lacks a resume key was written with: before the optimizer option
# every run was SGD's
# and before local SGD, every run was synchronous
_RESUME_KEY_BEFORE = {
    "optimizer": "sgd",
    "sync_every": 1,
    "replicas": 0,
    "local_after": 0,
    "local_momentum": "average",
    "outer_lr": 1.0,
    "outer_momentum": 0.0,
    "clip_norm": None,
    "augment": None,
    "lr_gamma": None,
    "lr_step_epochs": None,
}


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
    epoch_seconds=0.0,
    optimizer=None,
    local=None,
) -> None:
    """Writes everything a run needs to continue bitwise where it stopped (.npz, no pickle):
    parameters, momentum, the position (epoch, batch, step: the sampler's order and the
    learning-rate schedule are functions of these and the seed) and the epoch so far; and
    the optimizer's state (Adam's second moment, the step count) as OPTIMIZER_ARRAY + name.

    Atomic and durable: written to a temporary beside it, flushed to disk (file, then the
    directory after the rename), then renamed over the old one, so a crash or a kill at any
    moment leaves the previous checkpoint or the new one, whole. Temporaries that a killed
    writer left behind are removed.

    local: local SGD's (position, arrays) (``LocalSGD.checkpoint_state``), written at an
    average, where every replica holds the same model: the position's ``local_sgd`` and
    the arrays as LOCAL_ARRAY + name."""
    local_position, local_arrays = local if local is not None else (None, {})
    position = {
        "step": step,
        "epoch": epoch,
        "batch": batch,
        "loss_sum": loss_sum,
        "correct": correct,
        "history": history,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        # the epoch's time so far: a resumed run's line for that epoch counts it (it gave the
        # time since the resume alone, for all the epoch's samples: 9 million samples/s)
        "epoch_seconds": epoch_seconds,
        "job": resume_keys(job),
    }
    if local_position is not None:
        position["local_sgd"] = local_position
    write_atomically(
        path,
        lambda f: savez(
            f,
            format=np.int64(CHECKPOINT_FORMAT),
            params=net.params,
            velocity=net.velocity,
            **({"bn_state": net.state} if net.state.size else {}),
            position=np.array(json.dumps(position)),
            **_optimizer_arrays(optimizer),
            **{LOCAL_ARRAY + k: v for k, v in local_arrays.items()},
        ),
    )


LOCAL_ARRAY = "local_"  # the prefix of local SGD's arrays (its outer momentum)


def read_local_arrays(path, n_params: int, dtype) -> dict:
    """Local SGD's arrays in a checkpoint that read_checkpoint accepted (its outer momentum,
    where it has one), checked as the parameters are."""
    where = f"checkpoint {path}"
    out = {}
    with NpzArchive(path, where) as f:
        for name in f.files:
            if name.startswith(LOCAL_ARRAY):
                arr = f.array(
                    name,
                    max_bytes=n_params * np.dtype(dtype).itemsize,
                    shape=(n_params,),
                    dtype=np.dtype(dtype),
                )
                if not np.isfinite(arr).all():
                    raise ValueError(f"{where}: {name} holds non-finite values")
                out[name[len(LOCAL_ARRAY) :]] = arr
    return out


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
    # the arrays this optimizer holds, as it holds them, and its step count: each is read only
    # after its header matched (shape, dtype, size), as read_checkpoint reads the parameters
    expected = {k: v for k, v in optimizer.state_dict().items() if k != "steps"}
    with NpzArchive(path, where) as f:
        state = {
            name: f.array(
                OPTIMIZER_ARRAY + name, max_bytes=arr.nbytes, shape=arr.shape, dtype=arr.dtype
            )
            for name, arr in expected.items()
        }
        counted = OPTIMIZER_ARRAY + "steps" in f.files
        steps = f.array(OPTIMIZER_ARRAY + "steps", max_bytes=64) if counted else np.int64(step)
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


_POSITION_BYTES = 64 << 20  # the position's JSON: its history grows by ~200 bytes an epoch
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
    """(params, velocity, position, bn_state or None) of a checkpoint that this job can
    resume, checked through: the file (a readable .npz of this format), its arrays (this
    model's dtype and length, finite), the run it belongs to (resume_keys) and its position
    (a step this data set and batch size can reach). Any problem is one ValueError naming
    the file and what is wrong. bn_state's size against the model: load_checkpoint."""
    where = f"checkpoint {path}"
    dtype = storage_dtype(job.config.dtype)
    with NpzArchive(path, where, advice="--resume reads the checkpoints --checkpoint writes") as f:
        missing = {"format", "params", "velocity", "position"} - set(f.files)
        if missing:
            raise ValueError(
                f"{where} has no {', '.join(sorted(missing))} array (not a dptrain checkpoint?)"
            )
        # every array's header is checked before its data is read: a damaged or hostile
        # header (2^40 values) is refused here, not met as a MemoryError
        fmt = f.array("format", max_bytes=64)
        params, velocity = (
            f.array(name, max_bytes=n_params * dtype.itemsize, shape=(n_params,), dtype=dtype)
            for name in ("params", "velocity")
        )
        text = f.array("position", max_bytes=_POSITION_BYTES)
        # batch norms' running statistics: 2 C doubles for 2 C parameters, at most n_params
        bn_state = (
            f.array("bn_state", max_bytes=8 * n_params, dtype=np.float64)
            if "bn_state" in f.files
            else None
        )
    try:
        position = json.loads(str(text[()]))
    except ValueError as exc:
        raise ValueError(f"{where} cannot be read: its position is not JSON ({exc})") from None
    if fmt.shape != () or fmt.dtype.kind not in "iu" or int(fmt) != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{where} has format {fmt!r}, this dptrain reads format {CHECKPOINT_FORMAT}"
        )
    cfg = job.config
    for name, arr in (("params", params), ("velocity", velocity)):
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
            other = " (on another data set)" if key in job.data else ""
            raise ValueError(
                f"{path} was written by a run with {key}={saved!r}, but this run "
                f"has {key}={now!r}: it cannot resume it{other}"
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
    # (a checkpoint written before it was kept has none: the resumed epoch counts from 0)
    position.setdefault("epoch_seconds", 0.0)
    if not (
        math.isfinite(position["loss_sum"])
        and 0 <= position["correct"] <= n_train
        and position["train_seconds"] >= 0
        and position["eval_seconds"] >= 0
        and isinstance(position["epoch_seconds"], (int, float))
        and not isinstance(position["epoch_seconds"], bool)
        and 0 <= position["epoch_seconds"] < math.inf
    ):
        raise ValueError(
            f"{where}: the epoch's running sums are impossible (loss_sum "
            f"{position['loss_sum']!r}, correct {position['correct']!r})"
        )
    position.pop("job")
    return params, velocity, position, bn_state


def load_checkpoint(path, job, net, n_train: int) -> dict:
    """read_checkpoint, then net's params, momentum and batch norms' running statistics from
    it (when net is given); returns the position."""
    params, velocity, position, bn_state = read_checkpoint(
        path, job, job.model["n_params"], n_train
    )
    if net is not None:
        net.params[:] = params
        net.velocity[:] = velocity
        state = _checked_state(bn_state, net, f"checkpoint {path}")
        if state is not None:
            net.state[:] = state
    return position
