"""A training run, in the launching process: ``train`` (a named model on a named data set or
on your arrays), ``fit`` (your model object on your arrays) and ``run`` (a TrainConfig, as
the command line and the estimators pass it), on 1..N workers.

1. The options are one validated ``TrainConfig``, built once (by the CLI, by ``train`` /
   ``fit`` from their keyword arguments, by an estimator) and passed as it is; the
   transport is picked (``--backend``, or MPI when started by an MPI launcher); every
   output path is checked for writing.
2. The data are loaded once and the model's spec is made without allocating a model
   (``engine.data``, ``engine.model``); what depends on the number of workers is settled
   once, into the ``Job``; the checkpoint to resume is checked: all before any worker
   starts.
3. ``dptrain.comm.launch`` starts the workers, each running ``engine.loop.train_worker`` on
   the data it hands them (``comm.extra``): threads of this process, processes sharing
   memory (the data inherited under 'fork', copied once into shared memory under the other
   start methods, a memory-mapped .npy mapped again by each), or MPI ranks (each reads the
   data itself). Rank 0 reports each epoch as it ends (``comm.report``), and this process
   prints its line, the same on every transport.
4. The result (``engine.result.TrainResult``): the trained model, the per-epoch history,
   where the time went, the configuration, the data set; written as JSON with ``out=``.

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
import multiprocessing
import os
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from .._files import remove_stale_temporaries
from ..comm import launch, oversubscription_warning, placement, resolve_backend, ulfm
from ..comm.launch import ELASTIC_MPI_REFUSAL
from ..comm.mpi import bounded, timed_arrival
from ..comm.mpi import world as mpi_world
from ..comm.placement import AUTO
from ..comm.shm import check_main_guard
from ..config import TrainConfig, options_doc
from ..measure import timing
from ..models import Model
from ..optim import make_optimizer
from .checkpoint import data_identity, read_checkpoint
from .data import announce, check_finite, data_arg, load_data
from .elastic import launch_elastic
from .job import Job
from .loop import (
    DATA_NAMES,
    INIT_OPTIMIZER,
    INIT_PARAMS,
    INIT_STATE,
    INIT_STEP,
    train_worker,
    uncoupled_worker,
)
from .model import model_spec
from .result import TrainResult, epoch_line, make_result


# ---------------------------------------------------------------- entry points
def train(
    model: str = "mlp",
    dataset="mnist",
    *,
    X=None,
    y=None,
    X_test=None,
    y_test=None,
    validation: float | None = None,
    log=print,
    **options,
) -> TrainResult:
    config = TrainConfig.from_kwargs(
        model=model, dataset=dataset if isinstance(dataset, str) else "mnist", **options
    )
    return run(config, data=data_arg(dataset, X, y, X_test, y_test, validation), log=log)


def fit(
    model: Model,
    X,
    y,
    *,
    X_test=None,
    y_test=None,
    validation: float | None = None,
    log=print,
    optimizer_state: dict | None = None,
    **options,
) -> TrainResult:
    """Trains ``model`` (a dptrain model object: MLP, CNN, ...) on the arrays X, y, on 1..N
    workers, starting from its current parameters; its parameters and momentum are updated
    in place and it is ``result.model``. X: any real dtype, shape (n, features) or (n, C, H,
    W), converted once to the model's dtype; y: integer class labels (or integral floats).
    X_test/y_test: a held-out set, or validation=0.1: a fraction of the data held out. The
    options are ``dptrain.train``'s (epochs, batch_size, lr, workers, backend, optimizer,
    ...). optimizer_state: an earlier fit's ``result.optimizer_state`` (of the same optimizer
    and model), to continue that optimizer (its step count, Adam's moments, with the model's
    velocity as the momentum or first moment) instead of starting a new one, as
    torch.optim does across calls of a loop and scikit-learn's partial_fit."""
    if not isinstance(model, Model):
        raise TypeError(
            f"model must be a dptrain model (e.g. dptrain.MLP([784, 256, 10])), "
            f"got {type(model).__name__}"
        )
    spec = model.spec()
    options.setdefault("dtype", spec["dtype"])
    if options["dtype"] != spec["dtype"]:
        raise ValueError(f"dtype={options['dtype']!r}, but the model is {spec['dtype']}")
    options.setdefault("seed", spec["seed"])
    return run(
        TrainConfig.from_kwargs(model=spec["kind"], **options),
        data=data_arg(None, X, y, X_test, y_test, validation),
        model=model,
        log=log,
        optimizer_state=optimizer_state,
    )


def _signature():
    """train's signature for help(): the data arguments, then every TrainConfig option."""
    from dataclasses import MISSING, fields

    params = [
        inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, default="mlp"),
        inspect.Parameter("dataset", inspect.Parameter.POSITIONAL_OR_KEYWORD, default="mnist"),
    ]
    for name in ("X", "y", "X_test", "y_test", "validation"):
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None))
    params.append(inspect.Parameter("log", inspect.Parameter.KEYWORD_ONLY, default=print))
    for f in fields(TrainConfig):
        if f.name in ("model", "dataset"):
            continue
        params.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=f.default if f.default is not MISSING else None,
                annotation=f.type,
            )
        )
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
def run(
    config: TrainConfig,
    *,
    data=None,
    model: Model | None = None,
    log=print,
    optimizer_state: dict | None = None,
) -> TrainResult:
    """Runs the training that ``config`` describes (see the module docstring). data: None
    (the config's named data set), a ``dptrain.data.Dataset``, or ``engine.data.data_arg``'s
    arrays; model: the user's model to train (its parameters are the start and are updated
    in place), else the config's named model or layers; optimizer_state: see ``fit``."""
    wall0 = time.perf_counter()
    backend, launch_note = resolve_backend(config.backend)
    if backend == "mpi":  # MPI's start-up, bounded by the timeout (see comm.mpi.world)
        mpi_world(float(config.timeout or 0.0))
    # under MPI, this rank's node: its ranks and their CPUs (collective on the world, once,
    # after every rank's start: a rank stalled before it is named within the timeout)
    node = None
    if backend == "mpi":
        timeout = float(config.timeout or 0.0)
        timed_arrival(mpi_world(), "start-up", timeout)
        with bounded("MPI's start-up", timeout, mpi_world().Get_rank()):
            node = placement.MPINode.of(mpi_world())
    auto = [name for name in ("workers", "threads") if getattr(config, name) == AUTO]
    config = resolve_auto(config, node)
    rank, world = 0, config.workers
    if backend == "mpi":
        comm_world = mpi_world()
        world, rank = comm_world.Get_size(), comm_world.Get_rank()
        if config.workers not in (1, world):
            raise ValueError(
                f"under MPI the number of workers is the world size set by "
                f"mpiexec -n (here {world}), but workers={config.workers} was "
                f"asked for: launch with mpiexec -n {config.workers} python -m "
                f"dptrain train ..."
            )
    config.check_world(world, backend)
    if backend == "mpi" and config.elastic and world > 1:
        if not ulfm.available():
            raise ValueError(ELASTIC_MPI_REFUSAL)
        if config.respawn:
            raise ValueError(
                "respawn=True starts a new worker process in a lost one's place: the process "
                "backend's; an MPI job's ranks are mpiexec's (an elastic MPI run goes on with "
                "the survivors)"
            )
    # pin=True with more workers x threads than CPUs: refused here, before the header
    if backend == "mpi":
        node.plan(config.threads, config.pin)
    else:
        placement.plan(world, config.threads, config.pin, placement.usable_cpus(), backend)
    if backend == "process":  # before the header: a script that lacks its main guard
        check_main_guard(multiprocessing.get_context(config.start_method).get_start_method())
    if config.resume and not Path(config.resume).is_file():
        raise ValueError(f"resume: no checkpoint file at {config.resume}")
    refused = None
    if rank == 0:
        # every result is written after training: check now that it can be, not after hours
        try:
            for arg in ("out", "save_weights", "trace", "steps_csv", "checkpoint"):
                if getattr(config, arg):
                    check_writable(getattr(config, arg), arg)
        except ValueError as exc:
            refused = str(exc)
    if backend == "mpi" and world > 1:
        # rank 0 writes the results, so it alone checks; every rank leaves with its refusal
        # (the others waited for rank 0 in the first collective, forever)
        refused = mpi_world().bcast(refused, root=0)
    if refused is not None:
        raise ValueError(refused)
    say = (lambda *a: None) if (config.quiet or rank != 0) else log
    if launch_note:
        say(f"dptrain: {launch_note}")

    # ---- the data and the model's spec, once
    t0 = time.perf_counter()
    ds = load_data(config, data, model, announce if rank == 0 else None)
    for line in ds.notes:  # what was done to the data (a conversion, a split)
        say(f"dptrain: {line}")
    check_finite(ds)
    if ds.n_train < world:
        raise ValueError(
            f"the data set has {ds.n_train} training samples, fewer than workers={world}"
        )
    data_load_seconds = time.perf_counter() - t0
    job = Job.plan(config, model_spec(config, ds, model), world, ds.n_train, data_identity(ds))
    resumed = None
    if config.resume:  # a damaged or foreign checkpoint fails here, before any worker starts
        resumed = read_checkpoint(config.resume, job, job.model["n_params"], ds.n_train)[2]
    # every check is done: warnings now (a refusal comes before them and the header); launch
    # warns of oversubscribed threads and processes itself, not of MPI ranks
    warning = backend == "mpi" and oversubscription_warning(node.size, config.threads, node.cpus)
    if warning and rank == 0:
        warnings.warn(warning, RuntimeWarning, stacklevel=3)
    if job.batch_size > ds.n_train:
        warnings.warn(
            f"batch_size={job.batch_size} is larger than the {ds.n_train} training "
            f"samples of {ds.name}: every step is one full-batch step over all of "
            f"them",
            UserWarning,
            stacklevel=3,
        )
    record = _config_record(
        job, backend, ds, requested=config.dataset if data is None else "arrays"
    )
    record["auto"] = auto
    say(_header_line(job, ds, record["backend"]))
    if auto:
        say(_auto_line(auto, job))
    if resumed is not None:  # the position: epochs done (the one it resumes in, from 1)
        say(
            f"dptrain: resumed from {config.resume} at epoch {resumed['epoch'] + 1}, "
            f"step {resumed['step']}"
        )

    extras = dict(zip(DATA_NAMES, (ds.x_train, ds.y_train, ds.x_test, ds.y_test)))
    if model is not None:
        extras[INIT_PARAMS] = model.params
        if model.state.size:  # batch norms' running statistics: every worker starts from them
            extras[INIT_STATE] = model.state.copy()
        extras[INIT_STEP] = np.array([model.step], np.int64)  # dropout's count, continued
    if optimizer_state is not None:
        extras.update(_continued_optimizer(optimizer_state, config, job, model))
    options = dict(
        workers=world,
        backend=backend,
        timeout=config.timeout,
        threads=config.threads,
        start_method=config.start_method,
        extras=extras,
        mpi_shm=config.mpi_shm,
        mpi_nodes=config.mpi_nodes,
        gather="root",
        pin=config.pin,
    )
    if config.uncoupled:
        if backend == "mpi":
            raise ValueError("uncoupled runs use the thread or process backend")
        per_rank = launch(uncoupled_worker, job, **options)
        seconds = [r["train_seconds"] for r in per_rank]
        return TrainResult(
            config=record,
            uncoupled=True,
            train_seconds=max(seconds),
            rank_train_seconds=seconds,
            placement=placement.summary([r["placement"] for r in per_rank]),
        )
    steal0 = timing.read_steal()
    bar = _step_bar(config) if rank == 0 else None

    def report(rec):  # rank 0's record of an epoch, as it ends
        line = epoch_line(rec, config.epochs, ds.n_train)
        bar.above(say, line) if bar is not None else say(line)
        if "stopped" in rec:
            say(rec["stopped"])

    def became(new_rank):  # an elastic MPI run's survivors: rank 0 of theirs speaks now
        nonlocal rank, say
        rank = new_rank
        say = (lambda *a: None) if (config.quiet or rank != 0) else log

    recoveries = None
    try:
        if config.elastic and world > 1:
            per_rank, recoveries = launch_elastic(
                job,
                ds.n_train,
                options,
                lambda line: say(line),
                report=report,
                watch=bar.watch if bar else None,
                became=became,
            )
        else:
            per_rank = launch(
                train_worker, job, watch=bar.watch if bar else None, report=report, **options
            )
    except BaseException:
        # the run stopped (a worker failed, Ctrl-C, a timeout): a checkpoint being written
        # then leaves its temporary (a killed worker's, or a thread's the interrupt left);
        # the previous checkpoint is whole, and the workers are gone
        if config.checkpoint:
            remove_stale_temporaries(Path(config.checkpoint), own=backend != "mpi")
        raise
    finally:
        if bar is not None:
            bar.close()
    steal = timing.steal_fraction(steal0, timing.read_steal())
    if rank != 0:
        if model is not None:  # dropout's count, as make_result moves rank 0's
            model.step += per_rank[rank]["steps"]
        return TrainResult(rank=rank)
    if backend == "mpi":
        # the ranks of each node (shared memory inside, MPI between leaders); None: flat MPI
        # (--no-mpi-shm, DPTRAIN_MPI_SHM=0 or one rank)
        record["mpi_layout"] = per_rank[0]["node_members"]
        record["mpi_shm"] = record["mpi_layout"] is not None
    return make_result(
        job, record, ds, per_rank, steal, data_load_seconds, wall0, model, say, recoveries
    )


def resolve_auto(config: TrainConfig, node=None) -> TrainConfig:
    """The config with workers='auto' and threads='auto' chosen for the machine (see
    TrainConfig.split); under MPI workers='auto' is the world size and threads='auto' the
    CPUs of the rank's node divided among its ranks, or those the launcher bound the rank
    to (node: the rank's MPINode under MPI, else None)."""
    if AUTO not in (config.workers, config.threads):
        return config
    if node is None:
        workers, threads = config.split()
    else:
        workers = mpi_world().Get_size() if config.workers == AUTO else config.workers
        threads = node.threads() if config.threads == AUTO else config.threads
    return replace(config, workers=workers, threads=threads)


def _auto_line(auto: list, job: Job) -> str:
    """The line that says what workers='auto' / threads='auto' chose."""
    chosen = ", ".join(
        f"--{name} auto: {job.world if name == 'workers' else job.config.threads}" for name in auto
    )
    return (
        f"dptrain: {chosen} (of the {placement.cpu_count()} CPUs this process may use: "
        f"{job.world} worker(s) x {job.config.threads} thread(s))"
    )


def _continued_optimizer(state, config: TrainConfig, job: Job, model) -> dict:
    """The INIT_OPTIMIZER extras that continue ``state`` (an earlier fit's optimizer_state),
    checked first (by loading it into a throwaway optimizer of this run's kind): a state of
    another optimizer or model size is a ValueError naming it, before any worker starts."""
    if model is None:
        raise ValueError(
            "optimizer_state continues an earlier fit of the same model: give the model"
        )
    if config.resume:
        raise ValueError(
            "optimizer_state and resume: the checkpoint holds the optimizer's state; give one"
        )
    try:
        make_optimizer(model, job.lr, config).load_state_dict(state)
    except ValueError as exc:
        raise ValueError(
            f"optimizer_state does not fit optimizer={config.optimizer!r}: {exc}"
        ) from None
    arrays = {k: np.ascontiguousarray(v) for k, v in state.items() if k != "steps"}
    arrays["steps"] = np.array([state["steps"]], np.int64)
    arrays["velocity"] = model.velocity
    return {INIT_OPTIMIZER + k: v for k, v in arrays.items()}


def _config_record(job: Job, backend: str, ds, requested: str) -> dict:
    """The configuration as the result records it: the options, with what the number of
    workers settled (workers, the global batch, the learning rate: base_lr is the one
    asked for) and what the run really used (the data set, the backend)."""
    cfg = job.config
    record = cfg.as_dict()
    record.update(
        workers=job.world,
        batch_size=job.batch_size,
        lr=job.lr,
        requested_dataset=requested,
        dataset=ds.name,
        base_lr=cfg.lr,
        hidden=list(cfg.hidden) if job.model["kind"] == "mlp" else None,
        backend=backend if job.world > 1 or backend == "mpi" else "sequential",
    )
    return record


def _header_line(job: Job, ds, backend: str) -> str:
    """The line that says what is about to be trained, on what, how."""
    cfg, spec = job.config, job.model
    if cfg.optimizer == "sgd":
        optimizer = f"sgd momentum {cfg.momentum}" + (" (nesterov)" if cfg.nesterov else "")
    elif cfg.optimizer == "rmsprop":
        optimizer = (
            f"rmsprop alpha {cfg.rms_alpha}, eps {cfg.eps}"
            + (f", momentum {cfg.momentum}" if cfg.momentum else "")
            + (", centered" if cfg.centered else "")
        )
    else:
        optimizer = f"{cfg.optimizer} betas {cfg.betas}, eps {cfg.eps}"
    if cfg.weight_decay:
        optimizer += f", weight decay {cfg.weight_decay}"
    return (
        f"dptrain: {spec['kind']} {tuple(spec['sizes'])} on {ds.name} ({ds.n_train} train / "
        f"{ds.n_test} test, source: {ds.source}), global batch {job.batch_size}, lr "
        f"{job.lr}, {optimizer}, {job.world} worker(s)"
        + (f" on {backend}" if backend != "sequential" else "")
        + (
            f", {cfg.dtype} (float32 weights, bfloat16 GEMM inputs; gradient exchange in "
            f"{cfg.comm_dtype})"
            if cfg.dtype == "bfloat16"
            else ", gradient exchange in bfloat16"
            if cfg.comm_dtype == "bfloat16"
            else ""
        )
    )


def _step_bar(config: TrainConfig):
    """The run's live step bar (measure.progress.StepBar), or None when quiet (or tqdm is
    missing)."""
    if config.quiet or not config.progress:
        return None
    try:
        from ..measure.progress import StepBar

        return StepBar()
    except ImportError:
        return None


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
        raise ValueError(
            f"{arg}={str(path)!r}: the directory {str(directory)!r} does not exist "
            f"(checked before training, so that no result is lost)"
        )
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".dptrain-probe-"):
            pass
    except OSError as exc:
        raise ValueError(
            f"{arg}={str(path)!r}: cannot write in {str(directory)!r} "
            f"({exc.strerror or exc}; checked before training, so that no result "
            f"is lost)"
        ) from None
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{arg}={str(path)!r}: the file exists and is not writable")
