"""A training run from end to end: ``train`` (a named model on a named data set or on your
arrays) and ``fit`` (your model object on your arrays), both on 1..N workers.

1. The options become one validated ``TrainConfig``; the transport is picked (``--backend``,
   or MPI when started by an MPI launcher); every output path is checked for writing.
2. The data are loaded once (a named data set, or arrays: converted once to the model's
   dtype), the model's spec is made (or taken from your model), the checkpoint to resume is
   checked: all before any worker starts.
3. The workers run ``engine.loop.run_worker``: threads of this process, processes sharing
   the data set (inherited from this process under the 'fork' start method, copied once into
   shared memory under the others), or MPI ranks (each reads the data itself).
4. The result (``TrainResult``): the trained model, the per-epoch history, where the time
   went (``breakdown``, ``step_times``), the configuration, the data set; written as JSON
   with ``out=``.

Semantics (the same model whatever the number of workers): each epoch has one seeded global
order of the training samples, cut into global batches of ``batch_size``; worker r of N takes
its contiguous share of each (``sampler.shard``) and the exchanged gradient is exactly the
global batch's mean gradient (see ``engine.exchange``), so every worker applies the same SGD
update to its identical copy of the parameters.

``train_seconds`` is the training loop alone, measured on rank 0 between barriers: start-up,
data loading and the per-epoch evaluation (on rank 0) are reported separately and are part of
``wall_seconds`` only.
"""
from __future__ import annotations

import inspect
import json
import os
import platform
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from .. import data as data_mod
from ..comm import (HierComm, LocalComm, WaitPolicy, check_world, mpi_comm,
                    oversubscription_warning, resolve_backend, run_processes, run_threads)
from ..comm.mpi import abort_job, world as mpi_world
from ..config import CHUNKS, TrainConfig, options_doc
from ..measure import timing
from ..models import (MODEL_KINDS, Model, model_from_spec, model_n_params, model_sizes,
                      storage_dtype)
from ..sampler import shard
from .checkpoint import read_checkpoint
from .loop import Job, epoch_line, run_worker

DATA_NAMES = ("x_train", "y_train", "x_test", "y_test")


class TrainResult(dict):
    """What a run returns: a dict (the JSON result's keys, plus ``params`` and
    ``step_times``) with attributes for what a user reaches for first:

    - ``model``: the trained model (predict, evaluate, save);
    - ``history``: one dict per epoch (train_loss, train_accuracy, test_loss, test_accuracy,
      seconds);
    - ``breakdown``: where the time went (phases per rank, step percentiles, collectives);
    - ``step_times``: every step of every rank (``dptrain.measure.timing.StepTimes``);
    - ``config``: the options as run; ``to_json()``.
    """

    @property
    def model(self) -> Model | None:
        """The trained model (rank 0; None on other MPI ranks)."""
        return self.get("_model")

    @property
    def history(self) -> list:
        """One dict per epoch."""
        return self.get("epochs", [])

    @property
    def breakdown(self) -> dict:
        """Where the time went (see dptrain.measure.timing)."""
        return self.get("breakdown", {})

    @property
    def step_times(self):
        """Every step of every rank: a dptrain.measure.timing.StepTimes."""
        return self.get("step_times")

    @property
    def config(self) -> dict:
        """The options as run."""
        return self.get("config", {})

    def to_json(self, path=None) -> str:
        """The JSON result (without the parameters and the step table); written to path
        when given."""
        text = json.dumps({k: v for k, v in self.items()
                           if k not in ("params", "step_times", "_model")}, indent=2) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text


# ---------------------------------------------------------------- entry points
def train(model: str = "mlp", dataset="mnist", *, X=None, y=None, X_test=None, y_test=None,
          validation: float | None = None, log=print, **options) -> TrainResult:
    return _run(TrainConfig.from_kwargs(model=model, dataset=dataset if isinstance(dataset, str)
                                        else "mnist", **options),
                model_obj=None, data=_data_arg(dataset, X, y, X_test, y_test, validation),
                log=log)


def fit(model: Model, X, y, *, X_test=None, y_test=None, validation: float | None = None,
        log=print, **options) -> TrainResult:
    """Trains ``model`` (a dptrain model object: MLP, CNN, ...) on the arrays X, y, on 1..N
    workers, starting from its current parameters; its parameters and momentum are updated
    in place and it is ``result.model``. X: any real dtype, shape (n, features) or (n, C, H,
    W), converted once to the model's dtype; y: integer class labels (or integral floats).
    X_test/y_test: a held-out set, or validation=0.1: a fraction of the data held out. The
    options are ``dptrain.train``'s (epochs, batch_size, lr, workers, backend, ...)."""
    if not isinstance(model, Model):
        raise TypeError(f"model must be a dptrain model (e.g. dptrain.MLP([784, 256, 10])), "
                        f"got {type(model).__name__}")
    spec = model.spec()
    options.setdefault("dtype", spec["dtype"])
    if options["dtype"] != spec["dtype"]:
        raise ValueError(f"dtype={options['dtype']!r}, but the model is {spec['dtype']}")
    options.setdefault("seed", spec["seed"])
    return _run(TrainConfig.from_kwargs(model=spec["kind"], **options), model_obj=model,
                data=_data_arg(None, X, y, X_test, y_test, validation), log=log)


def _data_arg(dataset, X, y, X_test, y_test, validation):
    """What the data are: None (the named data set of the config), a Dataset, or arrays."""
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


def _signature():
    """train's signature for help(): the data arguments, then every TrainConfig option."""
    from dataclasses import MISSING, fields
    params = [inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, default="mlp"),
              inspect.Parameter("dataset", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default="mnist")]
    for name in ("X", "y", "X_test", "y_test", "validation"):
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None))
    params.append(inspect.Parameter("log", inspect.Parameter.KEYWORD_ONLY, default=print))
    for f in fields(TrainConfig):
        if f.name in ("model", "dataset"):
            continue
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                        default=f.default if f.default is not MISSING else None,
                                        annotation=f.type))
    return inspect.Signature(params, return_annotation="TrainResult")


train.__signature__ = _signature()
train.__doc__ = f"""Trains a model on 1..N workers; returns a TrainResult (a dict with .model,
.history, .breakdown, .step_times, .to_json()).

model: a named model ('logreg', 'softmax', 'mlp', 'cnn'); for your own model object use
``dptrain.fit(model, X, y, ...)``. dataset: a named data set ('mnist', 'cifar10',
'synthetic'), a dptrain.data.Dataset, or (X, y); or give X, y (and X_test, y_test, or a
validation fraction) as keyword arguments: X of any real dtype and shape (n, ...), converted
once to the model's dtype; y integer class labels. Named data sets: a directory you name
(data_dir) must hold them; otherwise MNIST and CIFAR-10 fall back to an announced synthetic
stand-in, named 'synthetic-mnist' / 'synthetic-cifar10' everywhere. log: prints the progress
lines (default print).

Options (TrainConfig; the CLI's `python -m dptrain train --help` lists the same):
{options_doc()}

Raises ValueError (naming the option and value) before any work for a bad option,
FloatingPointError when the loss stops being finite, and dptrain.comm.WorkerError (naming
the rank) when a worker fails."""


# ---------------------------------------------------------------- the run
_ANNOUNCED: set = set()     # lines already printed by this process (a sweep's runs repeat them)


def _stderr_line(line: str) -> None:
    if line not in _ANNOUNCED:
        _ANNOUNCED.add(line)
        print(f"dptrain: {line}", file=sys.stderr, flush=True)


def _run(cfg: TrainConfig, *, model_obj, data, log) -> TrainResult:
    wall0 = time.perf_counter()
    backend, launch_note = resolve_backend(cfg.backend)
    mpi_rank, comm_world = 0, None
    world = cfg.workers
    if backend == "mpi":
        comm_world = mpi_world()
        size, mpi_rank = comm_world.Get_size(), comm_world.Get_rank()
        if cfg.workers not in (1, size):
            raise ValueError(f"under MPI the number of workers is the world size set by "
                             f"mpiexec -n (here {size}), but workers={cfg.workers} was asked "
                             f"for: launch with mpiexec -n {cfg.workers} python -m dptrain "
                             f"train ...")
        world = size
        if cfg.deterministic and CHUNKS % world:
            raise ValueError(f"deterministic mode under MPI needs a world size that divides "
                             f"{CHUNKS}, got {world}")
    user_cfg, cfg = cfg, cfg.resolve(world)
    check_world(world, cfg.batch_size, cfg.threads, backend)
    if cfg.resume and not Path(cfg.resume).is_file():
        raise ValueError(f"resume: no checkpoint file at {cfg.resume}")
    if mpi_rank == 0:
        # every result is written after training: check now that it can be, not after hours
        for arg in ("out", "save_weights", "trace", "steps_csv", "checkpoint"):
            if getattr(cfg, arg):
                check_writable(getattr(cfg, arg), arg)
    say = (lambda *a: None) if (cfg.quiet or mpi_rank != 0) else log
    if launch_note:
        say(f"dptrain: {launch_note}")
    warning = oversubscription_warning(world, cfg.threads)
    if warning and mpi_rank == 0:
        warnings.warn(warning, RuntimeWarning, stacklevel=3)
    if cfg.fault and cfg.fault[2] == "kill" and backend != "process":
        raise ValueError("fault kind 'kill' kills the worker's process: use backend='process'")

    # ---- the data, once
    t0 = time.perf_counter()
    note = _stderr_line if mpi_rank == 0 else None      # announced even when quiet
    ds = _load_data(cfg, data, model_obj, note)
    for line in ds.notes:                 # what was done to the data (a conversion, a split)
        say(f"dptrain: {line}")
    _check_finite_data(ds)
    if ds.n_train < world:
        raise ValueError(f"the data set has {ds.n_train} training samples, fewer than "
                         f"workers={world}")
    data_load_seconds = time.perf_counter() - t0

    # ---- the model's spec, the job
    spec = _model_spec(cfg, ds, model_obj)
    steps_per_epoch = -(-ds.n_train // cfg.batch_size)
    job = Job(config=cfg, model=spec,
              warmup_steps=int(round(cfg.warmup_epochs * steps_per_epoch)))
    if cfg.resume:      # a damaged or foreign checkpoint fails here, before any worker starts
        read_checkpoint(cfg.resume, job, spec["n_params"], ds.n_train)
    if cfg.batch_size > ds.n_train:
        warnings.warn(f"batch_size={cfg.batch_size} is larger than the {ds.n_train} training "
                      f"samples of {ds.name}: every step is one full-batch step over all of "
                      f"them", UserWarning, stacklevel=3)
    config = cfg.as_dict()
    config.update(requested_dataset=user_cfg.dataset if data is None else "arrays",
                  dataset=ds.name, base_lr=user_cfg.lr, scale_lr=user_cfg.scale_lr,
                  hidden=list(cfg.hidden) if spec["kind"] == "mlp" else None,
                  backend=backend if world > 1 or backend == "mpi" else "sequential")
    say(f"dptrain: {spec['kind']} {tuple(spec['sizes'])} on {ds.name} ({ds.n_train} train / "
        f"{ds.n_test} test, source: {ds.source}), global batch {cfg.batch_size}, lr {cfg.lr}, "
        f"momentum {cfg.momentum}, {world} worker(s)"
        + (f" on {config['backend']}" if world > 1 or backend == "mpi" else "")
        + (f", {cfg.dtype} (float32 weights, bfloat16 GEMM inputs; gradient exchange in "
           f"{cfg.comm_dtype})" if cfg.dtype == "bfloat16" else
           ", gradient exchange in bfloat16" if cfg.comm_dtype == "bfloat16" else ""))

    arrays = (ds.x_train, ds.y_train, ds.x_test, ds.y_test)
    init = model_obj.params if model_obj is not None else None
    steal0 = timing.read_steal()
    policy = WaitPolicy.for_workers(world, cfg.threads, cfg.timeout, backend)
    if cfg.uncoupled:
        return _uncoupled(job, arrays, world, backend, policy, cfg, config)
    progress = _progress_bar(cfg, say, mpi_rank)
    try:
        results = _launch(job, arrays, world, backend, policy, cfg, say, init, comm_world,
                          mpi_rank, progress)
    finally:
        if progress is not None:
            progress.close()
    steal = timing.steal_fraction(steal0, timing.read_steal())
    per_rank = [{k: r[k] for k in ("stamps", "calls", "bytes_sent", "train_seconds")}
                for r in results]
    if backend == "mpi" and world > 1:
        per_rank = comm_world.gather(per_rank[0], root=0)   # once, after training
    if mpi_rank != 0:
        return TrainResult(rank=mpi_rank)
    head = results[0]
    if backend == "mpi":
        # the ranks of each node (shared memory inside, MPI between leaders); None: flat MPI
        # (--no-mpi-shm, DPTRAIN_MPI_SHM=0 or one rank)
        config["mpi_layout"] = head.get("mpi_layout")
        config["mpi_shm"] = config["mpi_layout"] is not None
    return _result(cfg, config, ds, spec, head, per_rank, steal, data_load_seconds, wall0,
                   model_obj, say)


def _load_data(cfg, data, model_obj, note):
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
        n_classes = None if model_obj is None or regression else _model_classes(model_obj.spec())
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


def _model_spec(cfg, ds, model_obj) -> dict:
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
        classes = _model_classes(spec)
        if ds.n_classes > classes:
            raise ValueError(f"the labels name {ds.n_classes} classes, but the model has "
                             f"{classes} outputs")
        return spec
    if cfg.layers is not None:
        from ..models import Sequential
        binary = ds.n_classes == 2 and cfg.layers[-1] in (("dense", 1), ["dense", 1])
        probe = Sequential(cfg.layers, ds.input_shape, "sigmoid_bce" if binary else
                           "softmax_xent", dtype=cfg.dtype, seed=cfg.seed)
        if not binary and probe.n_outputs != ds.n_classes:
            raise ValueError(f"layers: the model has {probe.n_outputs} outputs, but the data "
                             f"set has {ds.n_classes} classes: end with dense:{ds.n_classes}"
                             + (" (or dense:1 for two classes)" if ds.n_classes == 2 else ""))
        return probe.spec()
    if cfg.model not in MODEL_KINDS:
        raise ValueError(f"model={cfg.model!r} is a model you build (dptrain.nn.Sequential): "
                         f"train it with dptrain.fit(model, X, y); dptrain.train names one of "
                         f"{MODEL_KINDS}")
    if cfg.model == "logreg" and ds.n_classes != 2:
        raise ValueError(f"model 'logreg' is binary, but the data set has {ds.n_classes} "
                         f"classes")
    shape = ds.input_shape if len(ds.input_shape) == 3 else None
    sizes = model_sizes(cfg.model, ds.n_features, ds.n_classes, cfg.hidden, input_shape=shape)
    from ..models import build_model
    # the spec of the model build_model makes (its buffers are not allocated here: the
    # workers make theirs where the exchange wants them)
    probe = build_model(cfg.model, ds.n_features, ds.n_classes, hidden=cfg.hidden,
                        input_shape=shape, dtype=cfg.dtype, seed=cfg.seed)
    spec = probe.spec()
    assert tuple(spec["sizes"]) == tuple(sizes)
    assert spec["n_params"] == model_n_params(cfg.model, sizes, input_shape=shape)
    return spec


def _model_classes(spec) -> int:
    """The classes a model's outputs name: 2 for a binary (sigmoid) model, else one per logit."""
    return 2 if spec["loss"] == "sigmoid_bce" else spec["sizes"][-1]


def _check_finite_data(ds):
    """NaN/inf in the features are refused, naming the row (scanned in bounded chunks: the
    data may be a memory map larger than RAM)."""
    for name in ("x_train", "x_test"):
        bad = data_mod.first_nonfinite_row(getattr(ds, name))
        if bad is not None:
            raise ValueError(f"data set {ds.name!r}: {name} has a non-finite value in row {bad}")


def _launch(job, arrays, world, backend, policy, cfg, say, init, comm_world, mpi_rank,
            progress):
    """The workers, on the transport; returns their results by rank (MPI: this rank's)."""
    if backend == "mpi":
        comm = mpi_comm(comm_world, shm=cfg.mpi_shm, nodes=cfg.mpi_nodes or None,
                        timeout=cfg.timeout, threads=cfg.threads)
        _watch(progress, comm)
        try:
            out = run_worker(comm, job, *arrays, say=say, init_params=init)
            out["mpi_layout"] = getattr(comm, "node_members", None)
            if isinstance(comm, HierComm):
                comm.close_windows()           # the results are copies: free the windows
            return [out]
        except BaseException as exc:
            # the other ranks wait in a collective this rank will never join (MPI_Abort ends
            # every rank; MPICH then leaves its own /dev/shm/mpich_shm_* segment behind, see
            # the README)
            abort_job(comm_world, mpi_rank, exc)
            raise
    if world == 1 and backend != "process":
        comm = LocalComm()
        _watch(progress, comm)
        return [run_worker(comm, job, *arrays, say=say, init_params=init)]
    if backend == "thread":
        def target(comm):
            if comm.rank == 0:
                _watch(progress, comm)
            return run_worker(comm, job, *arrays, say=say if comm.rank == 0 else None,
                              init_params=init)
        return run_threads(world, target, policy=policy)
    extras, mapped = _share(arrays)
    if init is not None:
        extras["init_params"] = init
    results = run_processes(world, _process_worker, (job, init is not None, mapped),
                            policy=policy, extras=extras, start_method=cfg.start_method,
                            watch=progress.watch if progress is not None else None)
    for rec in results[0]["history"]:      # workers do not print; rank 0 reports here
        say(epoch_line(rec, cfg.epochs, len(arrays[0])))
    return results


def _share(arrays) -> tuple[dict, dict]:
    """How worker processes get the data: an array that is a view of a memory-mapped file
    that still has its name (a user's .npy) is opened again by each worker (the page cache
    is shared: no copy, and a data set larger than RAM stays on disk); the others are the
    workers' extras (shm.run_processes: inherited under fork, else copied once into the
    shared segment). Returns (extras, {name: (path, offset, shape, dtype)})."""
    extras, mapped = {}, {}
    for name, a in zip(DATA_NAMES, arrays):
        region = data_mod.memmap_region(a)
        if region is None:
            extras[name] = a
        else:
            mapped[name] = (region[0], region[1], a.shape, a.dtype.str)
    return extras, mapped


def _shared_data(comm, mapped=None) -> tuple:
    """The data set of a worker process: memory maps of the user's files, or its extras (the
    launcher's arrays, inherited, or views of the shared segment), whose pages are mapped into
    this process before the timed loop (for inherited arrays a quick pass over pages the fork
    already mapped): a spawned worker maps the segment afresh, and without this every page of x would be faulted in
    during the first epoch's batch gathering (measured: the data phase of a 2-worker softmax
    step at 75-83 us instead of about 45)."""
    mapped = mapped or {}
    arrays = []
    for name in DATA_NAMES:
        if name in mapped:
            path, offset, shape, dtype = mapped[name]
            arrays.append(np.memmap(path, np.dtype(dtype), "r", offset, tuple(shape)))
            continue
        a = comm.extra(name)
        flat = a.reshape(-1).view(np.uint8)
        if flat.size:
            flat[::4096].sum()               # one read per 4 KiB page
        arrays.append(a)
    return tuple(arrays)


def _process_worker(comm, job: Job, has_init: bool, mapped: dict) -> dict:
    """run_worker in a worker process: the data set is its extras (inherited, or in the shared
    segment) or the user's memory-mapped files."""
    init = comm.extra("init_params") if has_init else None
    return run_worker(comm, job, *_shared_data(comm, mapped), init_params=init)


# ---------------------------------------------------------------- progress
class _StepBar:
    """A live bar over the run's steps (tqdm.auto: a terminal line, or a widget in Jupyter
    and Colab), drawn in the launching process from rank 0's progress slot (steps done, steps
    in all: shared memory when the workers are processes), polled every 0.2 s."""

    def __init__(self):
        from tqdm.auto import tqdm
        self.bar = tqdm(total=None, desc="training", unit="step", leave=False,
                        dynamic_ncols=True, file=sys.stderr)
        self.done = threading.Event()
        self.thread = None

    def watch(self, slot) -> None:
        def loop():
            while not self.done.wait(0.2):
                self._draw(slot)
            self._draw(slot)
        self.thread = threading.Thread(target=loop, daemon=True, name="dptrain-progress")
        self.thread.start()

    def _draw(self, slot):
        step, total = int(slot[0]), int(slot[1])
        if total and self.bar.total != total:
            self.bar.total = total
            self.bar.refresh()
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(1.0)
        self.bar.close()


def _progress_bar(cfg, say, mpi_rank):
    """The run's _StepBar, or None when quiet (or tqdm is missing)."""
    if cfg.quiet or not cfg.progress or mpi_rank != 0:
        return None
    try:
        return _StepBar()
    except ImportError:
        return None


def _watch(bar, comm, progress=None):
    if bar is not None:
        bar.watch(progress if progress is not None else comm.progress)


# ---------------------------------------------------------------- contention ceiling
def _uncoupled(job, arrays, world, backend, policy, cfg, config):
    """p workers that never talk, started together: each a 1-worker run on its 1/p of the
    data with 1/p of the batch (the same number of steps as the coupled run)."""
    if backend == "mpi":
        raise ValueError("uncoupled runs use the thread or process backend")
    cfg1 = replace(cfg, batch_size=-(-cfg.batch_size // world), checkpoint_every=0,
                   resume=None, checkpoint=None, workers=1, deterministic=False,
                   comm_dtype=None)
    job1 = replace(job, config=cfg1)
    if backend == "thread":
        results = run_threads(world, lambda comm: _uncoupled_worker(comm, job1, *arrays),
                              policy=policy)
    else:
        extras, mapped = _share(arrays)
        results = run_processes(world, _uncoupled_process_worker, (job1, mapped), policy=policy,
                                extras=extras, start_method=cfg.start_method)
    seconds = [r["train_seconds"] for r in results]
    return TrainResult(config=config, uncoupled=True, train_seconds=max(seconds),
                       rank_train_seconds=seconds)


def _uncoupled_worker(comm, job, x, y, x_test, y_test) -> dict:
    """One of N workers that never talk: after one start barrier (so that all run at the
    same moment), a 1-worker run on this rank's 1/N of the training set. Evaluation uses one
    test row: it is outside the timed loop and only has to exist."""
    comm.barrier()
    lo, hi = shard(0, len(x), comm.rank, comm.size)
    out = run_worker(LocalComm(), job, x[lo:hi], y[lo:hi], x_test[:1], y_test[:1])
    return {"train_seconds": out["train_seconds"]}


def _uncoupled_process_worker(comm, job, mapped) -> dict:
    return _uncoupled_worker(comm, job, *_shared_data(comm, mapped))


# ---------------------------------------------------------------- the result
def _result(cfg, config, ds, spec, head, per_rank, steal, data_load_seconds, wall0, model_obj,
            say) -> TrainResult:
    from .. import __version__, build_info
    history = head["history"]
    if model_obj is not None:
        model_obj.params[:] = head["params"]
        model_obj.velocity[:] = head["velocity"]
        net = model_obj
    else:
        net = model_from_spec(spec, threads=cfg.threads, params=head["params"].copy())
        net.velocity[:] = head["velocity"]
    if cfg.save_weights:
        net.save(cfg.save_weights)
    n, train_seconds, steps = ds.n_train, head["train_seconds"], head["steps"]
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
    result = TrainResult({
        "dptrain_version": __version__,
        "config": config,
        "dataset": {"name": ds.name, "source": ds.source, "integrity": ds.integrity,
                    "synthetic": ds.name.startswith("synthetic"), "n_train": n,
                    "n_test": ds.n_test, "n_features": ds.n_features,
                    "n_classes": ds.n_classes, "task": ds.task},
        "model": {"kind": spec["kind"], "sizes": list(net.sizes), "n_params": net.n_params,
                  "dtype": cfg.dtype, "loss": net.loss},
        "epochs": history,
        "train_loss": [h["train_loss"] for h in history],
        "test_accuracy": [h["test_accuracy"] for h in history],
        "final_test_accuracy": history[-1]["test_accuracy"] if history else None,
        "final_test_loss": history[-1]["test_loss"] if history else None,
        "steps": steps,
        "samples": n * cfg.epochs,
        "train_seconds": train_seconds,
        "eval_seconds": head["eval_seconds"],
        "data_load_seconds": data_load_seconds,
        "phase_seconds": breakdown["phase_seconds"],
        "rank_phase_seconds": breakdown["rank_phase_seconds"],
        "breakdown": breakdown,
        "steps_per_second": steps / train_seconds if train_seconds > 0 else None,
        "samples_per_second": n * cfg.epochs / train_seconds if train_seconds > 0 else None,
        "build": build_info(),
        "host": {"python": platform.python_version(), "machine": platform.machine(),
                 "cpus": os.cpu_count()},
        "job": {"model": spec, "warmup_steps": int(round(cfg.warmup_epochs
                                                         * -(-n // cfg.batch_size)))},
    })
    result["wall_seconds"] = time.perf_counter() - wall0
    if cfg.out:
        result.to_json(cfg.out)
        say(f"wrote {cfg.out}")
    say(breakdown_line(breakdown))
    if cfg.trace:
        step_times.chrome_trace(cfg.trace)
        say(f"wrote {cfg.trace} (open it in https://ui.perfetto.dev)")
    if cfg.steps_csv:
        step_times.to_csv(cfg.steps_csv)
        say(f"wrote {cfg.steps_csv}")
    result["params"] = head["params"]      # not in the JSON: the trained parameters
    result["step_times"] = step_times      # not in the JSON: every step of every rank
    result["_model"] = net                 # not in the JSON: the trained model
    return result


def breakdown_line(b: dict) -> str:
    """One line: each phase's share of the training time (mean over ranks), step p50/p99."""
    total = sum(b["phase_seconds"].values()) or 1.0
    shares = "  ".join(f"{k} {100 * v / total:.0f}%" for k, v in b["phase_seconds"].items())
    st = b["step_seconds"]
    return (f"time per step: p50 {1e3 * st['p50']:.2f} ms, p99 {1e3 * st['p99']:.2f} ms; "
            f"{shares}")


def check_writable(path, arg: str) -> None:
    """Raises ValueError naming the argument when a file cannot be written at `path`: its
    directory is missing or not writable, or the path is a directory. Probes by creating
    (and removing) a temporary file beside it: permission bits do not tell (root, read-only
    file systems, ACLs)."""
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
