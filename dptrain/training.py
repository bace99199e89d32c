"""Training: one synchronous data-parallel loop for 1..N workers, its timing, the JSON result.

``train(...)`` loads the data once, starts the workers (outside the timed region), runs
mini-batch SGD and returns a result dict (also written as JSON with ``out=``): the full
configuration, per-epoch training loss and test accuracy, and where the time went.

Semantics (the same model whatever the number of workers): each epoch has one seeded global
order of the training samples (``sampler.epoch_order``), cut into global batches of
``batch_size``; worker r of N takes its contiguous share of each global batch
(``parallel.shard``: sizes differ by at most one, no padding, no duplicates) and computes the
gradient of (sum of its samples' losses) / (global batch size). The all-reduced SUM of the
workers' gradients is then exactly the global batch's mean gradient, also for an uneven last
batch, and every worker applies the same SGD update to its identical copy of the parameters.

``train_seconds`` is the training loop alone, measured on rank 0 between barriers: start-up,
data loading and the per-epoch evaluation (on rank 0) are reported separately and are part of
``wall_seconds`` only.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from . import data as data_mod
from . import _core, parallel, timing
from .models import MODEL_KINDS, build_model, model_n_params, model_sizes
from .optim import SCHEDULES, SGD, lr_at
from .sampler import batch_bounds, epoch_order

MODELS = MODEL_KINDS        # "logreg", "softmax", "mlp", "cnn"

# Deterministic mode cuts every global batch into this many fixed chunks (by position, not by
# worker): each chunk's gradient is computed alone, and the chunks are summed in chunk order.
# Nothing then depends on which worker computed what, so any world size up to CHUNKS gives
# bitwise-identical weights.
CHUNKS = 8


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


@dataclass(frozen=True)
class Job:
    """Everything a worker needs besides the data: plain values, so it pickles for 'spawn'."""

    model: str
    sizes: tuple
    n_classes: int
    hidden: tuple
    dtype: str
    seed: int
    threads: int
    lr: float
    momentum: float
    dampening: float
    weight_decay: float
    nesterov: bool
    lr_schedule: str
    epochs: int
    batch_size: int
    shuffle: bool
    warmup_steps: int = 0
    allreduce: str = "native"
    bucket_kb: float = 0.0
    overlap: bool = False
    deterministic: bool = False
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: str | None = None
    fault: tuple | None = None    # (rank, step, "raise" | "kill"): injected, for fault tests
    straggle: tuple | None = None  # (rank, ms): that rank's compute takes ms longer each step
    straggle_random_ms: float = 0.0  # every rank's compute takes U(0, ms) longer each step

    # what a checkpoint must agree on to be resumed by this job
    RESUME_KEYS = ("model", "sizes", "dtype", "seed", "lr", "momentum", "dampening",
                   "weight_decay", "nesterov", "lr_schedule", "epochs", "batch_size", "shuffle",
                   "warmup_steps", "deterministic")

    def specs(self):
        """The shared buffers this job's workers need (parallel.BufferSpec per role)."""
        p = model_n_params(self.model, self.sizes)
        dt = np.dtype(self.dtype)
        # parameter server: the grads' rank-order sum goes into one shared array, read by 0
        into = "grads_sum" if self.allreduce == "ps" else None
        schedule = self.allreduce if self.allreduce in ("ring", "tree") else "native"
        specs = [parallel.BufferSpec("grads", p, dt, reduce_into=into, algorithm=schedule),
                 parallel.BufferSpec("params", p, dt),
                 parallel.BufferSpec("velocity", p, dt),
                 parallel.BufferSpec("stats", 2, np.dtype(np.float64))]
        if self.deterministic:
            specs += [parallel.BufferSpec("chunks", p, dt, count=CHUNKS, reduce_into="chunk_sum"),
                      parallel.BufferSpec("chunk_sum", p, dt, count=1)]
        if self.allreduce == "ps":
            specs.append(parallel.BufferSpec("grads_sum", p, dt, count=1))
        return specs


def gradient_buckets(n_params: int, itemsize: int, bucket_kb: float) -> list[tuple[int, int]]:
    """[(start, stop), ...] of the flat gradient in buckets of about bucket_kb, LAST layer
    first (the flat layout is first layer first, and backward produces the last layer's
    gradient first); one bucket (the whole buffer) when bucket_kb is 0."""
    if bucket_kb <= 0:
        return [(0, n_params)]
    per = max(1, int(bucket_kb * 1024) // itemsize)
    return [(max(0, stop - per), stop) for stop in range(n_params, 0, -per)]


def run_worker(comm: parallel.Communicator, job: Job, x, y, x_test, y_test, say=None) -> dict:
    """The training loop of one worker (any transport). Returns its timings; rank 0 also
    returns the per-epoch history and the final parameters."""
    try:
        return _run_worker(comm, job, x, y, x_test, y_test, say)
    finally:
        comm.close()


def _run_worker(comm, job, x, y, x_test, y_test, say):
    rank, world = comm.rank, comm.size
    net = build_model(job.model, job.sizes[0], job.n_classes, hidden=job.hidden,
                      dtype=job.dtype, threads=job.threads, seed=job.seed,
                      params=comm.buffer("params"), grads=comm.buffer("grads"),
                      velocity=comm.buffer("velocity"))
    opt = SGD(net, job.lr, momentum=job.momentum, dampening=job.dampening,
              weight_decay=job.weight_decay, nesterov=job.nesterov)
    state = {"step": 0, "epoch": 0, "batch": 0, "loss_sum": 0.0, "correct": 0, "history": [],
             "train_seconds": 0.0, "eval_seconds": 0.0}
    if rank == 0:
        if job.resume:
            state.update(load_checkpoint(job.resume, job, net, len(x)))
        else:
            net.reset_parameters()          # the seeded init, into the shared buffer
            net.velocity.fill(0)
    if job.resume:
        # every rank reads the position (the file is visible to all: one machine, or a shared
        # file system under MPI); parameters and momentum come from rank 0
        if rank != 0:
            state.update(load_checkpoint(job.resume, job, None, len(x)))
            state.update(loss_sum=0.0, correct=0)   # the epoch's sums so far count once, on 0
        comm.broadcast_("velocity", root=0)
    comm.broadcast_("params", root=0)
    opt.steps = state["step"]
    stats = comm.buffer("stats")
    chunk_bufs = comm.buffers("chunks") if job.deterministic else None
    buckets = gradient_buckets(net.n_params, net.dtype.itemsize, job.bucket_kb)
    layer_starts = [lo for lo, _ in net.layer_slices()]
    my_chunks = range(rank * CHUNKS // world, (rank + 1) * CHUNKS // world)

    n = len(x)
    bounds = batch_bounds(n, job.batch_size)
    total_steps = job.epochs * len(bounds)
    rows = -(-min(job.batch_size, n) // (CHUNKS if job.deterministic else world))
    xb = np.empty((rows, x.shape[1]), dtype=x.dtype)
    yb = np.empty(rows, dtype=np.int64)

    def batch_rows(order, lo, hi):
        if job.shuffle:
            bx, by = xb[:hi - lo], yb[:hi - lo]
            _core.gather_rows(x, order[lo:hi], bx)      # GIL released: thread workers gather
            _core.gather_rows(y, order[lo:hi], by)      # their batches at the same time
            return bx, by
        return x[lo:hi], y[lo:hi]          # contiguous slices: no copy

    timer = timing.StepTimer()
    delay_rng = np.random.default_rng([job.seed, rank, 0x57a6])
    fixed_delay = job.straggle[1] / 1e3 if job.straggle and job.straggle[0] == rank else 0.0
    history = state["history"]
    train_seconds, eval_seconds, step = state["train_seconds"], state["eval_seconds"], state["step"]
    clock = time.perf_counter
    for epoch in range(state["epoch"], job.epochs):
        order = epoch_order(n, epoch, job.seed, job.shuffle)
        first_batch = state["batch"] if epoch == state["epoch"] else 0
        loss_sum, correct = (state["loss_sum"], state["correct"]) if first_batch else (0.0, 0)
        comm.barrier()                    # every worker starts the epoch together
        e0 = clock()
        for b in range(first_batch, len(bounds)):
            s, e = bounds[b]
            if job.fault and job.fault[0] == rank and job.fault[1] == step:
                _inject_fault(job.fault[2], rank, step)
            scale = 1.0 / (e - s)
            t_a = e0 if b == first_batch else clock()
            delay = fixed_delay + (delay_rng.uniform(0.0, job.straggle_random_ms / 1e3)
                                   if job.straggle_random_ms else 0.0)
            if job.deterministic:
                t_data, batch_loss, batch_correct = 0.0, 0.0, 0
                for c in my_chunks:
                    u = clock()
                    bx, by = batch_rows(order, *parallel.shard(s, e, c, CHUNKS))
                    v = clock()
                    _core.zero_(chunk_bufs[c])
                    cl, cc = net.loss_grad(bx, by, scale, grads=chunk_bufs[c])
                    batch_loss += cl
                    batch_correct += cc
                    t_data += v - u
                if delay:
                    time.sleep(delay)               # injected straggler: slower compute
                t_b = t_a + t_data
                t_c = clock()
                w0 = comm.waited
                comm.allreduce_("chunks")        # chunk_sum = the chunks, summed in order
                grads = comm.buffer("chunk_sum")
            elif job.overlap:
                bx, by = batch_rows(order, *parallel.shard(s, e, rank, world))
                t_b = clock()
                net.zero_grad()
                batch_loss, batch_correct = net._net.forward_loss(bx, by, scale)
                if delay:
                    time.sleep(delay)
                w0 = comm.waited
                # backward layer by layer, last first; a bucket's all-reduce starts as soon as
                # every layer it covers is done, and runs while the next layers are computed
                handles, k = [], 0
                for layer in reversed(range(len(layer_starts))):
                    net._net.backward_layer(layer)
                    while k < len(buckets) and buckets[k][0] >= layer_starts[layer]:
                        handles.append(comm.allreduce_async_("grads", *buckets[k]))
                        k += 1
                t_c = clock()
                comm.wait_(handles)               # the communication backward did not hide
                grads = None
            else:
                bx, by = batch_rows(order, *parallel.shard(s, e, rank, world))
                t_b = clock()
                net.zero_grad()
                batch_loss, batch_correct = net.loss_grad(bx, by, scale)
                if delay:
                    time.sleep(delay)
                t_c = clock()
                w0 = comm.waited
                if job.allreduce == "ps":
                    grads = comm.reduce_("grads", root=0)   # the gradients' sum, for rank 0
                else:
                    for lo_b, hi_b in buckets:      # one collective per bucket
                        comm.allreduce_("grads", start=lo_b, stop=hi_b)
                    grads = None
            t_d = clock()
            waited = comm.waited - w0
            lr = lr_at(step, total_steps, job.lr, job.lr_schedule, job.warmup_steps)
            if job.allreduce == "ps":
                # parameter server: rank 0 alone updates, then sends the parameters out
                if rank == 0:
                    opt.step(lr, grads=grads)
                else:
                    opt.steps += 1
                comm.broadcast_("params", root=0)
            else:
                opt.step(lr, grads=grads)
            t_e = clock()
            timer.step(epoch, t_a, t_b, t_c, t_d, t_e, waited)
            loss_sum += batch_loss
            correct += batch_correct
            step += 1
            if job.checkpoint_every and step % job.checkpoint_every == 0:
                # the epoch's loss so far, over all workers (this all-reduce is also the
                # barrier after which every update of this step is done)
                stats[0], stats[1] = loss_sum, correct
                comm.allreduce_("stats")
                if rank == 0:
                    save_checkpoint(job.checkpoint, job, net, step=step, epoch=epoch,
                                    batch=b + 1, loss_sum=float(stats[0]),
                                    correct=int(round(stats[1])), history=history,
                                    train_seconds=train_seconds + clock() - e0,
                                    eval_seconds=eval_seconds)
        stats[0], stats[1] = loss_sum, correct
        comm.allreduce_("stats")          # also the barrier that ends the epoch's timing
        e1 = clock()
        timer.end(e1)
        epoch_seconds = e1 - e0
        train_seconds += epoch_seconds
        loss_sum, correct = float(stats[0]), int(round(stats[1]))
        if not math.isfinite(loss_sum):
            raise FloatingPointError(
                f"training diverged: the loss is {loss_sum} in epoch {epoch + 1} "
                f"(lr={job.lr}); try a smaller learning rate")
        if rank == 0:
            v0 = clock()
            test_loss, test_acc = net.evaluate(x_test, y_test)
            eval_seconds += clock() - v0
            rec = {"epoch": epoch + 1, "train_loss": loss_sum / n, "train_accuracy": correct / n,
                   "test_loss": test_loss, "test_accuracy": test_acc, "seconds": epoch_seconds}
            history.append(rec)
            if say:
                say(_epoch_line(rec, job.epochs, n))
    out = {"rank": rank, "steps": step, "stamps": timer.array(), "calls": comm.calls,
           "bytes_sent": comm.bytes_sent, "train_seconds": train_seconds}
    if rank == 0:
        out.update(history=history, eval_seconds=eval_seconds,
                   params=net.params.copy(), velocity=net.velocity.copy())
    return out


def breakdown_line(b: dict) -> str:
    """One line: each phase's share of the training time (mean over ranks), step p50/p99."""
    total = sum(b["phase_seconds"].values()) or 1.0
    shares = "  ".join(f"{k} {100 * v / total:.0f}%" for k, v in b["phase_seconds"].items())
    st = b["step_seconds"]
    return (f"time per step: p50 {1e3 * st['p50']:.2f} ms, p99 {1e3 * st['p99']:.2f} ms; "
            f"{shares}")


def _epoch_line(rec: dict, epochs: int, n: int) -> str:
    from .progress import format_seconds
    left = epochs - rec["epoch"]
    eta = f", eta {format_seconds(left * rec['seconds'])}" if left else ""
    return (f"epoch {rec['epoch']}/{epochs}  train loss {rec['train_loss']:.4f}  "
            f"test loss {rec['test_loss']:.4f}  test acc {100 * rec['test_accuracy']:.2f}%  "
            f"({rec['seconds']:.2f} s, {n / rec['seconds']:,.0f} samples/s{eta})")


CHECKPOINT_FORMAT = 1


def save_checkpoint(path, job: Job, net, *, step, epoch, batch, loss_sum, correct, history,
                    train_seconds, eval_seconds) -> None:
    """Writes everything a run needs to continue bitwise where it stopped (.npz, no pickle):
    parameters, momentum, the position (epoch, batch, step: the sampler's order and the
    learning-rate schedule are functions of these and the seed) and the epoch so far.

    Atomic and durable: written to a temporary beside it, flushed to disk (file, then the
    directory after the rename), then renamed over the old one, so a crash or a kill at any
    moment leaves the previous checkpoint or the new one, whole. Temporaries that a killed
    writer left behind are removed."""
    path = Path(path)
    position = {"step": step, "epoch": epoch, "batch": batch, "loss_sum": loss_sum,
                "correct": correct, "history": history, "train_seconds": train_seconds,
                "eval_seconds": eval_seconds,
                "job": {k: _plain(getattr(job, k)) for k in Job.RESUME_KEYS}}
    _remove_stale_temporaries(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}.npz")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, format=np.int64(CHECKPOINT_FORMAT), params=net.params,
                     velocity=net.velocity, position=np.array(json.dumps(position)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _remove_stale_temporaries(path: Path) -> None:
    """Deletes <path>.tmp-PID.npz files whose writer (PID) no longer runs."""
    for tmp in path.parent.glob(f"{path.name}.tmp-*.npz"):
        pid = tmp.name[len(path.name) + 5:-4]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except PermissionError:          # alive, someone else's
            pass


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:                       # not supported here (e.g. Windows): best effort
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_POSITION_FIELDS = {"step": int, "epoch": int, "batch": int, "loss_sum": float, "correct": int,
                    "history": list, "train_seconds": float, "eval_seconds": float,
                    "job": dict}


def read_checkpoint(path, job: Job, n_params: int, n_train: int):
    """(params, velocity, position) of a checkpoint that this job can resume, checked
    through: the file (a readable .npz of this format), its arrays (this model's dtype and
    length, finite), the run it belongs to (Job.RESUME_KEYS) and its position (a step this
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
                raise ValueError(f"no {', '.join(sorted(missing))} array (not a dptrain "
                                 f"checkpoint?)")
            fmt, params, velocity = f["format"], f["params"], f["velocity"]
            position = json.loads(str(f["position"]))
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError, ValueError, TypeError,
            UnicodeDecodeError, RuntimeError) as exc:
        # truncated, bit-flipped (a CRC error), empty, not a zip, a damaged member, bad JSON
        raise ValueError(f"{where} cannot be read: {type(exc).__name__}: {exc}") from None
    if fmt.shape != () or int(fmt) != CHECKPOINT_FORMAT:
        raise ValueError(f"{where} has format {fmt!r}, this dptrain reads format "
                         f"{CHECKPOINT_FORMAT}")
    dtype = np.dtype(job.dtype)
    for name, arr in (("params", params), ("velocity", velocity)):
        if arr.shape != (n_params,) or arr.dtype != dtype:
            raise ValueError(f"{where}: {name} has dtype {arr.dtype} and shape {arr.shape}, "
                             f"expected {dtype} and ({n_params},) for this model")
        if not np.isfinite(arr).all():
            raise ValueError(f"{where}: {name} holds non-finite values")
    if not isinstance(position, dict):
        raise ValueError(f"{where}: the position is not a JSON object")
    for key, kind in _POSITION_FIELDS.items():
        value = position.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or (
                kind is float and not isinstance(value, (int, float))):
            if not (kind is float and isinstance(value, int) and not isinstance(value, bool)):
                raise ValueError(f"{where}: position field {key!r} is {value!r}, expected "
                                 f"{kind.__name__}")
    for key in Job.RESUME_KEYS:
        saved, now = position["job"].get(key), _plain(getattr(job, key))
        if saved != now:
            raise ValueError(f"{path} was written by a run with {key}={saved!r}, but this run "
                             f"has {key}={now!r}: it cannot resume it")
    per_epoch = len(batch_bounds(n_train, job.batch_size))
    step, epoch, batch = position["step"], position["epoch"], position["batch"]
    if not (0 <= epoch < job.epochs and 0 <= batch <= per_epoch
            and step == epoch * per_epoch + batch):
        raise ValueError(f"{where}: step {step} at epoch {epoch}, batch {batch} is impossible "
                         f"for {job.epochs} epoch(s) of {per_epoch} steps (batch size "
                         f"{job.batch_size}, {n_train} samples)")
    if len(position["history"]) != epoch or not all(
            isinstance(h, dict) and "test_accuracy" in h for h in position["history"]):
        raise ValueError(f"{where}: its history has {len(position['history'])} epoch "
                         f"record(s), expected {epoch}")
    if not (math.isfinite(position["loss_sum"]) and 0 <= position["correct"] <= n_train
            and position["train_seconds"] >= 0 and position["eval_seconds"] >= 0):
        raise ValueError(f"{where}: the epoch's running sums are impossible (loss_sum "
                         f"{position['loss_sum']!r}, correct {position['correct']!r})")
    position.pop("job")
    return params, velocity, position


def load_checkpoint(path, job: Job, net, n_train: int) -> dict:
    """read_checkpoint, then net's params and momentum from it (when net is given); returns
    the position."""
    params, velocity, position = read_checkpoint(path, job, model_n_params(job.model, job.sizes),
                                                 n_train)
    if net is not None:
        net.params[:] = params
        net.velocity[:] = velocity
    return position


def check_writable(path, arg: str) -> None:
    """Raises ValueError naming the argument when a file cannot be written at `path`: its
    directory is missing or not writable, or the path is a directory. Probes by creating
    (and removing) a temporary file beside it: permission bits do not tell (root, read-only
    file systems, ACLs)."""
    import tempfile
    p = Path(path).expanduser()
    directory = p.parent
    if p.is_dir():
        raise ValueError(f"{arg}={str(path)!r} is a directory, expected a file path")
    if not directory.is_dir():
        raise ValueError(f"{arg}={str(path)!r}: the directory {str(directory)!r} does not exist "
                         f"(checked before training, so that no result is lost)")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".dptrain-probe-"):
            pass
    except OSError as exc:
        raise ValueError(f"{arg}={str(path)!r}: cannot write in {str(directory)!r} "
                         f"({exc.strerror or exc}; checked before training, so that no result "
                         f"is lost)") from None
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{arg}={str(path)!r}: the file exists and is not writable")


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def _inject_fault(kind: str, rank: int, step: int) -> None:
    if kind == "kill":
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault on rank {rank} at step {step}")


def _shared_data(comm: parallel.ShmComm) -> tuple:
    """The data set in the shared segment, its pages mapped into this process before the
    timed loop: a worker process maps the segment afresh, and without this every page of x
    would be faulted in during the first epoch's batch gathering (measured: the data phase of
    a 2-worker softmax step at 75-83 us instead of about 45)."""
    arrays = tuple(comm.extra(name) for name in ("x_train", "y_train", "x_test", "y_test"))
    for a in arrays:
        flat = a.reshape(-1).view(np.uint8)
        if flat.size:
            flat[::4096].sum()               # one read per 4 KiB page
    return arrays


def _process_worker(comm: parallel.ShmComm, job: Job) -> dict:
    """run_worker in a worker process: the data set lives in the shared segment."""
    return run_worker(comm, job, *_shared_data(comm))


def _uncoupled_worker(comm: parallel.Communicator, job: Job, x, y, x_test, y_test) -> dict:
    """One of N workers that never talk: after one start barrier (so that all run at the
    same moment), a 1-worker run on this rank's 1/N of the training set with 1/N of the
    batch (the same number of steps as the coupled run). Evaluation uses one test row: it
    is outside the timed loop and only has to exist."""
    comm.barrier()
    lo, hi = parallel.shard(0, len(x), comm.rank, comm.size)
    out = run_worker(parallel.LocalComm(job.specs()), job, x[lo:hi], y[lo:hi], x_test[:1],
                     y_test[:1])
    return {"train_seconds": out["train_seconds"]}


def _uncoupled_process_worker(comm: parallel.ShmComm, job: Job) -> dict:
    return _uncoupled_worker(comm, job, *_shared_data(comm))


def train(model: str = "mlp", dataset: str = "mnist", *, data_dir=None, epochs: int = 2,
          batch_size: int = 128, lr: float = 0.1, momentum: float = 0.9,
          nesterov: bool = False, weight_decay: float = 0.0, dampening: float = 0.0,
          lr_schedule: str = "cosine", seed: int = 0, shuffle: bool = True,
          limit: int | None = None, dtype: str = "float32", hidden=(256, 128),
          workers: int = 1, backend: str | None = None, threads: int = 1,
          start_method: str | None = None, timeout: float = 0.0,
          n_samples: int | None = None, n_features: int | None = None, upscale: int = 1,
          out=None, save_weights=None, quiet: bool = False, allow_download: bool = True,
          log=print, deterministic: bool = False, checkpoint=None, checkpoint_every: int = 0,
          resume=None, batch_per_worker: int | None = None, scale_lr: bool = False,
          allreduce: str = "native", bucket_kb: float = 0.0, overlap: bool = False,
          warmup_epochs: float = 0.0, fault: tuple | None = None, trace=None,
          straggle: tuple | None = None, straggle_random_ms: float = 0.0,
          uncoupled: bool = False, steps_csv=None) -> dict:
    """Trains one model on 1..N workers; returns the result dict (see the module docstring).

    model: 'logreg' | 'softmax' | 'mlp' (hidden sizes from ``hidden``) | 'cnn' (models.CNN,
    reading rows as images of the data set's input_shape: (1, 28, 28) for MNIST, (3, 32, 32)
    for CIFAR-10); dataset: 'mnist' | 'cifar10' | 'synthetic'.
    backend: 'thread' | 'process' | 'mpi' (under mpiexec, where the world size comes from
    MPI) | None (the default: 'mpi' when this process is one of several ranks started by an
    MPI launcher, else 'thread'; 'thread' or 'process' under such a launcher is an error,
    never N separate trainings); batch_size is the GLOBAL batch. shuffle=False keeps a fixed batch order;
    limit keeps the first N training samples. timeout > 0 bounds each collective's wait.
    allreduce: 'native' (the transport's own: MPI_Allreduce, or the shared-memory reduce),
    'ring' or 'tree' (point-to-point schedules: MPI messages, or reads of the sender's
    shared-memory buffer after a barrier on the thread/process backends), or 'ps' (parameter
    server: gradients summed on rank 0, which alone updates and broadcasts the parameters).
    bucket_kb > 0 exchanges the gradient in buckets of that many KiB, last layer first
    (0: one collective for the whole flat gradient); overlap=True starts each bucket's
    all-reduce as soon as backward has produced it, while backward goes on (a communication
    thread on the shared-memory transports, MPI_Iallreduce under MPI).
    Weak scaling: batch_per_worker=b fixes each worker's share (global batch b x workers);
    scale_lr=True multiplies lr by the number of workers (the linear scaling rule), and
    warmup_epochs ramps the learning rate up linearly over that many epochs first
    (Goyal et al., 2017, "Accurate, large minibatch SGD").
    deterministic=True gives bitwise-identical weights for any number of workers up to 8 (the
    gradient of each of 8 fixed chunks of the global batch is summed in chunk order).
    checkpoint_every=K writes the full training state to ``checkpoint`` every K steps;
    resume=PATH continues a run from such a file (bitwise as if it had not stopped).
    fault=(rank, step, "raise" | "kill") makes that worker fail at that step (for testing
    that a failure stops the whole run; "kill" needs the process backend).
    straggle=(rank, ms) makes that rank's compute take ms longer every step;
    straggle_random_ms=ms adds a U(0, ms) delay to every rank's compute every step (seeded):
    both for studying the synchronization wait (the delay is a sleep, the core stays free).
    trace=PATH writes a Chrome trace (all ranks, every step's phases) for Perfetto;
    steps_csv=PATH the per-step, per-rank phase table as CSV. Every output path (out,
    save_weights, trace, steps_csv, checkpoint) is checked for writing before training starts.
    uncoupled=True measures the contention ceiling instead of training: the N workers run at
    the same moment without any communication, each on its own 1/N of the data with 1/N of
    the batch; the result holds train_seconds (the slowest worker's) and rank_train_seconds.
    The result's "breakdown" holds where the time went (dptrain.timing: data, compute,
    communication, sync_wait, update, other, per rank; step percentiles; calls and bytes per
    epoch; the host's steal time) and result["step_times"] (not in the JSON) the full
    per-step, per-rank table as a timing.StepTimes.
    Raises FloatingPointError when the loss stops being finite and parallel.WorkerError
    (naming the rank) when a worker fails.
    """
    wall0 = time.perf_counter()
    if model not in MODELS:
        raise ValueError(f"model is {model!r}, expected one of {MODELS}")
    epochs = _positive_int("epochs", epochs)
    if batch_per_worker is None:
        batch_size = _positive_int("batch_size", batch_size)
    threads = _positive_int("threads", threads)
    workers = _positive_int("workers", workers)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype is {dtype!r}, expected 'float32' or 'float64'")
    hidden = tuple(_positive_int("hidden size", h) for h in hidden)
    if lr_schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule is {lr_schedule!r}, expected one of {SCHEDULES}")
    if not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
    backend, launch_note = parallel.resolve_backend(backend)
    mpi_rank = 0
    if backend == "mpi":
        comm_world = _mpi_comm()
        size, mpi_rank = comm_world.Get_size(), comm_world.Get_rank()
        if workers not in (1, size):
            raise ValueError(f"under MPI the number of workers is the world size set by "
                             f"mpiexec -n (here {size}), but workers={workers} was asked for: "
                             f"launch with mpiexec -n {workers} python -m dptrain train ...")
        workers = size
    base_lr = lr
    if batch_per_worker is not None:
        batch_size = _positive_int("batch_per_worker", batch_per_worker) * workers
    if scale_lr:
        lr = lr * workers
    if not (warmup_epochs >= 0 and math.isfinite(warmup_epochs)):
        raise ValueError(f"warmup_epochs must be a finite number >= 0, got {warmup_epochs!r}")
    parallel.check_world(workers, batch_size, threads, backend)
    from .collectives import ALGORITHMS
    if allreduce not in ALGORITHMS:
        raise ValueError(f"allreduce is {allreduce!r}, expected one of {ALGORITHMS}")
    if not (bucket_kb >= 0 and math.isfinite(bucket_kb)):
        raise ValueError(f"bucket_kb must be a finite number >= 0, got {bucket_kb!r}")
    if overlap and (deterministic or allreduce != "native"):
        raise ValueError("overlap works with allreduce='native' and without deterministic mode")
    if allreduce != "native" and deterministic:
        raise ValueError("deterministic mode has its own fixed-order reduction: use "
                         "allreduce='native' with it")
    if deterministic and workers > CHUNKS:
        raise ValueError(f"deterministic mode supports up to {CHUNKS} workers, got {workers}")
    if deterministic and backend == "mpi" and CHUNKS % workers:
        raise ValueError(f"deterministic mode under MPI needs a world size that divides "
                         f"{CHUNKS}, got {workers}")
    if straggle is not None:
        if (len(straggle) != 2 or not 0 <= int(straggle[0]) < workers
                or not (straggle[1] >= 0 and math.isfinite(straggle[1]))):
            raise ValueError(f"straggle must be (rank, ms) with 0 <= rank < workers={workers} "
                             f"and ms >= 0, got {straggle!r}")
        straggle = (int(straggle[0]), float(straggle[1]))
    if not (straggle_random_ms >= 0 and math.isfinite(straggle_random_ms)):
        raise ValueError(f"straggle_random_ms must be a finite number >= 0, got "
                         f"{straggle_random_ms!r}")
    checkpoint_every = int(checkpoint_every or 0)
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
    if checkpoint_every and not checkpoint:
        raise ValueError("checkpoint_every needs a checkpoint path to write to")
    if resume and not Path(resume).is_file():
        raise ValueError(f"resume: no checkpoint file at {resume}")
    if mpi_rank == 0:
        # every result is written after training: check now that it can be, not after hours
        for arg, path in (("out", out), ("save_weights", save_weights), ("trace", trace),
                          ("steps_csv", steps_csv), ("checkpoint", checkpoint)):
            if path:
                check_writable(path, arg)
    say = (lambda *a: None) if (quiet or mpi_rank != 0) else log
    if launch_note:
        say(f"dptrain: {launch_note}")
    warning = parallel.oversubscription_warning(workers, threads)
    if warning and mpi_rank == 0:
        warnings.warn(warning, RuntimeWarning, stacklevel=2)
    # validated here so that bad values fail before any worker starts
    SGD.check(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
              nesterov=nesterov)
    config = dict(model=model, dataset=dataset, data_dir=str(data_dir) if data_dir else None,
                  epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                  nesterov=nesterov, weight_decay=weight_decay, dampening=dampening,
                  lr_schedule=lr_schedule, seed=seed, shuffle=shuffle, limit=limit,
                  dtype=dtype, hidden=list(hidden) if model == "mlp" else None,
                  threads=threads, n_samples=n_samples, n_features=n_features,
                  upscale=upscale, workers=workers, backend=backend if workers > 1 or
                  backend == "mpi" else "sequential", start_method=start_method,
                  timeout=timeout, deterministic=deterministic,
                  checkpoint=str(checkpoint) if checkpoint else None,
                  checkpoint_every=checkpoint_every, resume=str(resume) if resume else None,
                  batch_per_worker=batch_per_worker, scale_lr=scale_lr, base_lr=base_lr,
                  allreduce=allreduce, bucket_kb=bucket_kb, overlap=overlap,
                  warmup_epochs=warmup_epochs, straggle=list(straggle) if straggle else None,
                  straggle_random_ms=straggle_random_ms)

    t0 = time.perf_counter()
    # a synthetic stand-in is announced on stderr even when quiet: a run on made-up data
    # must never pass for one on the real data set
    note = _stderr_line if mpi_rank == 0 else None
    ds = data_mod.load_dataset(dataset, data_dir=data_dir, dtype=np.dtype(dtype), limit=limit,
                               seed=seed, n_samples=n_samples, n_features=n_features,
                               upscale=upscale, allow_download=allow_download, announce=note)
    config["requested_dataset"] = dataset
    config["dataset"] = ds.name          # e.g. "synthetic-mnist" when MNIST was not found
    _check_finite_data(ds)
    if len(ds.x_train) < workers:
        raise ValueError(f"the data set has {len(ds.x_train)} training samples, fewer than "
                         f"workers={workers}")
    data_load_seconds = time.perf_counter() - t0

    if model == "logreg" and ds.n_classes != 2:
        raise ValueError(f"model 'logreg' is binary, but the data set has {ds.n_classes} classes")
    sizes = model_sizes(model, ds.n_features, ds.n_classes, hidden)
    job = Job(model=model, sizes=tuple(sizes), n_classes=ds.n_classes, hidden=hidden,
              dtype=dtype, seed=seed, threads=threads, lr=lr, momentum=momentum,
              dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
              lr_schedule=lr_schedule, epochs=epochs, batch_size=batch_size, shuffle=shuffle,
              warmup_steps=int(round(warmup_epochs * -(-len(ds.x_train) // batch_size))),
              allreduce=allreduce, bucket_kb=float(bucket_kb), overlap=bool(overlap),
              deterministic=bool(deterministic), checkpoint=str(checkpoint) if checkpoint else None,
              checkpoint_every=checkpoint_every, resume=str(resume) if resume else None,
              fault=tuple(fault) if fault else None, straggle=straggle,
              straggle_random_ms=float(straggle_random_ms))
    if resume:          # a damaged or foreign checkpoint fails here, before any worker starts
        read_checkpoint(resume, job, model_n_params(model, job.sizes), len(ds.x_train))
    if batch_size > len(ds.x_train):
        warnings.warn(f"batch_size={batch_size} is larger than the {len(ds.x_train)} training "
                      f"samples of {ds.name}: every step is one full-batch step over all of "
                      f"them", UserWarning, stacklevel=2)
    if fault and fault[2] == "kill" and backend != "process":
        raise ValueError("fault kind 'kill' kills the worker's process: use backend='process'")
    say(f"dptrain: {model} {tuple(sizes)} on {ds.name} ({len(ds.x_train)} train / "
        f"{len(ds.x_test)} test, source: {ds.source}), global batch {batch_size}, lr {lr}, "
        f"momentum {momentum}, {workers} worker(s)"
        + (f" on {config['backend']}" if workers > 1 or backend == "mpi" else ""))

    data = (ds.x_train, ds.y_train, ds.x_test, ds.y_test)
    steal0 = timing.read_steal()
    policy = parallel.WaitPolicy.for_workers(workers, threads, timeout, backend)
    if uncoupled:
        if backend == "mpi":
            raise ValueError("uncoupled runs use the thread or process backend")
        job = replace(job, batch_size=-(-batch_size // workers), checkpoint_every=0,
                      resume=None, checkpoint=None)
        layout = parallel.SharedLayout(job.specs(), workers, {} if backend == "thread" else
                                       {name: (arr.shape, arr.dtype) for name, arr in
                                        zip(("x_train", "y_train", "x_test", "y_test"), data)})
        if backend == "thread":
            results = parallel.run_threads(
                workers, layout, parallel.aligned_bytes(layout.nbytes), policy,
                lambda comm: _uncoupled_worker(comm, job, *data))
        else:
            def fill_data(mem):
                for name, arr in zip(("x_train", "y_train", "x_test", "y_test"), data):
                    layout.extra(mem, name)[...] = arr
            results = parallel.run_processes(workers, layout, fill_data, policy,
                                             _uncoupled_process_worker, (job,),
                                             start_method=start_method)
        seconds = [r["train_seconds"] for r in results]
        return {"config": config, "uncoupled": True, "train_seconds": max(seconds),
                "rank_train_seconds": seconds}
    if backend == "mpi":
        try:
            results = [run_worker(parallel.MPIComm(job.specs(), comm_world), job,
                                  *data, say=say)]
        except BaseException as exc:
            # the other ranks wait in a collective this rank will never join: name the rank
            # and the cause, then abort the whole communicator (MPI_Abort ends every rank;
            # MPICH then leaves its own /dev/shm/mpich_shm_* segment behind, see the README)
            import sys
            cause = ("interrupted (SIGINT)" if isinstance(exc, KeyboardInterrupt)
                     else f"failed: {parallel.describe(exc)}")
            print(f"dptrain: worker rank {mpi_rank} {cause}; aborting all {workers} MPI ranks",
                  file=sys.stderr, flush=True)
            comm_world.Abort(130 if isinstance(exc, KeyboardInterrupt) else 1)
            raise
    elif workers == 1 and backend != "process":
        results = [run_worker(parallel.LocalComm(job.specs()), job, *data, say=say)]
    elif backend == "thread":
        layout = parallel.SharedLayout(job.specs(), workers, {})
        mem = parallel.aligned_bytes(layout.nbytes)
        results = parallel.run_threads(
            workers, layout, mem, policy,
            lambda comm: run_worker(comm, job, *data, say=say if comm.rank == 0 else None))
    else:
        extras = {name: (arr.shape, arr.dtype) for name, arr in
                  zip(("x_train", "y_train", "x_test", "y_test"), data)}
        layout = parallel.SharedLayout(job.specs(), workers, extras)

        def fill(mem):
            for name, arr in zip(("x_train", "y_train", "x_test", "y_test"), data):
                layout.extra(mem, name)[...] = arr
        results = parallel.run_processes(workers, layout, fill, policy, _process_worker,
                                         (job,), start_method=start_method)
        for rec in results[0]["history"]:      # workers do not print; rank 0 reports here
            say(_epoch_line(rec, epochs, len(ds.x_train)))
    steal = timing.steal_fraction(steal0, timing.read_steal())
    per_rank = [{k: r[k] for k in ("stamps", "calls", "bytes_sent", "train_seconds")}
                for r in results]
    if backend == "mpi" and workers > 1:
        per_rank = comm_world.gather(per_rank[0], root=0)   # once, after training
    if mpi_rank != 0:
        return {"rank": mpi_rank}
    head = results[0]
    history = head["history"]
    net = build_model(model, ds.n_features, ds.n_classes, hidden=hidden, dtype=dtype,
                      seed=seed, params=head["params"], velocity=head["velocity"])
    if save_weights:
        net.save(save_weights)
    from . import build_info
    n, train_seconds = len(ds.x_train), head["train_seconds"]
    steps = head["steps"]
    step_times = timing.StepTimes([r["stamps"] for r in per_rank],
                                  [r["calls"] for r in per_rank],
                                  [r["bytes_sent"] for r in per_rank],
                                  meta={k: config[k] for k in ("model", "dataset", "workers",
                                                               "backend", "batch_size")})
    breakdown = step_times.summary()
    timer_cost = timing.timer_cost_seconds(5000)
    breakdown["timer_seconds_per_step"] = timer_cost
    breakdown["timer_fraction"] = (timer_cost / breakdown["step_seconds"]["mean"]
                                   if breakdown["step_seconds"]["mean"] > 0 else None)
    breakdown["steal_fraction"] = steal
    breakdown["param_bytes"] = net.n_params * net.dtype.itemsize
    breakdown["rank_train_seconds"] = [r["train_seconds"] for r in per_rank]
    result = {
        "dptrain_version": _version(),
        "config": config,
        "dataset": {"name": ds.name, "source": ds.source, "integrity": ds.integrity,
                    "synthetic": ds.name.startswith("synthetic"), "n_train": n,
                    "n_test": len(ds.x_test), "n_features": ds.n_features,
                    "n_classes": ds.n_classes},
        "model": {"kind": model, "sizes": list(net.sizes), "n_params": net.n_params,
                  "dtype": dtype, "loss": net.loss},
        "epochs": history,
        "train_loss": [h["train_loss"] for h in history],
        "test_accuracy": [h["test_accuracy"] for h in history],
        "final_test_accuracy": history[-1]["test_accuracy"],
        "steps": steps,
        "samples": n * epochs,
        "train_seconds": train_seconds,
        "eval_seconds": head["eval_seconds"],
        "data_load_seconds": data_load_seconds,
        "phase_seconds": breakdown["phase_seconds"],
        "rank_phase_seconds": breakdown["rank_phase_seconds"],
        "breakdown": breakdown,
        "steps_per_second": steps / train_seconds if train_seconds > 0 else None,
        "samples_per_second": n * epochs / train_seconds if train_seconds > 0 else None,
        "build": build_info(),
        "host": {"python": platform.python_version(), "machine": platform.machine(),
                 "cpus": os.cpu_count()},
        "job": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(job).items()},
    }
    result["wall_seconds"] = time.perf_counter() - wall0
    if out:
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
        say(f"wrote {out}")
    say(breakdown_line(breakdown))
    if trace:
        step_times.chrome_trace(trace)
        say(f"wrote {trace} (open it in https://ui.perfetto.dev)")
    if steps_csv:
        step_times.to_csv(steps_csv)
        say(f"wrote {steps_csv}")
    result["params"] = head["params"]      # not in the JSON: the trained parameters
    result["step_times"] = step_times      # not in the JSON: every step of every rank
    return result


_ANNOUNCED: set = set()     # lines already printed by this process (a sweep's runs repeat them)


def _stderr_line(line: str) -> None:
    import sys
    if line not in _ANNOUNCED:
        _ANNOUNCED.add(line)
        print(f"dptrain: {line}", file=sys.stderr, flush=True)


def _mpi_comm():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise RuntimeError("backend 'mpi' needs mpi4py and an MPI library: "
                           "pip install 'dptrain[mpi]'") from exc
    return MPI.COMM_WORLD


def _version() -> str:
    from . import __version__
    return __version__
