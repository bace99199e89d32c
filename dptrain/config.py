"""A training run's configuration: one frozen, validated object, built once.

``TrainConfig`` is the single owner of the run's options: their defaults, their checks, and
what the command line and ``help(dptrain.train)`` say about them. The CLI builds its
``train`` options from the fields' metadata (``add_train_arguments``), ``dptrain.train``
and ``dptrain.fit`` take them as keyword arguments (``TrainConfig.from_kwargs``), the
scikit-learn estimators make one from their parameters, and the result records it
(``as_dict``). Nothing about transports or data lives in the training loop: it reads this.

Validation happens in ``__post_init__``: a bad value raises ValueError naming the option and
the value before any data is read or worker started: an ``OptionError``, whose ``option`` the
command line names by its flag (``cli_message``). What depends on the number of workers
(the global batch of ``batch_per_worker``, the scaled learning rate, ranks named by faults)
is settled once per run, into its ``engine.job.Job`` (``global_batch``, ``peak_lr``,
``check_world``): the config itself is never rebuilt.
"""

from __future__ import annotations

import argparse
import math
import numbers
import os
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from ._files import memory_bytes, npz_path, size_text
from .comm.algorithms import ALGORITHMS
from .comm.base import BACKENDS
from .comm.placement import AUTO, auto_split, cpu_count
from .data.catalog import DATASET_NAMES as DATASETS  # the named data sets
from .models import MODEL_KINDS as MODELS  # the named models
from .models import PRECISIONS as DTYPES  # float32, float64, bfloat16 (mixed)
from .optim import OPTIMIZERS, SCHEDULES, SGD, Adam, RMSprop
from .sampler import CHUNKS  # deterministic mode's fixed chunks

START_METHODS = ("spawn", "fork", "forkserver")
COMM_DTYPES = ("float32", "float64", "bfloat16")


class OptionError(ValueError):
    """A bad option of TrainConfig: ``option`` is its field name, and the message names it as
    the Python API does (``threads must be ...``, ``save_weights='x': ...``), first.
    ``cli_message`` names it as the command line's flag instead."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


# ---- parsers of the command line's text forms (the API takes the values themselves)
def parse_hidden(text: str) -> tuple[int, ...]:
    """'256,128' -> (256, 128)."""
    if not text.strip():
        return ()
    if any(not s.strip() for s in text.split(",")):
        raise ValueError(f"--hidden is {text!r}: a width between its commas is empty")
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise ValueError(
            f"--hidden is {text!r}, expected comma-separated widths such as 256,128"
        ) from None
    return sizes


def parse_layers(text: str) -> tuple:
    """'conv:32:3,relu,maxpool2,flatten,dense:10' -> (('conv', 32, 3), 'relu', 'maxpool2',
    'flatten', ('dense', 10)): a layer's name, then its sizes after colons (a conv's
    OUT:KERNEL[:PADDING[:STRIDE]], dropout's rate: dropout:0.5)."""
    layers = []
    if not text.strip():
        return ()
    if any(not s.strip() for s in text.split(",")):  # "dense:10,,relu": a layer left out?
        raise ValueError(f"--layers is {text!r}: a layer between its commas is empty")
    for item in (t.strip() for t in text.split(",")):
        name, *sizes = item.split(":")
        if name == "dropout":  # its rate is a number: dropout:0.5
            try:
                layers.append((name, *(float(v) for v in sizes)))
            except ValueError:
                raise ValueError(
                    f"--layers: {item!r}: dropout's rate is a number in [0, 1), e.g. dropout:0.5"
                ) from None
            continue
        try:
            layers.append((name, *(int(v) for v in sizes)) if sizes else name)
        except ValueError:
            raise ValueError(
                f"--layers: {item!r} has a size that is not an int; write layers "
                f"as NAME[:SIZE...], e.g. conv:32:3,relu,maxpool2,flatten,"
                f"dense:10 (conv:OUT:KERNEL:PADDING:STRIDE, dropout:RATE)"
            ) from None
    return tuple(layers)


FAULT_KINDS = ("raise", "kill", "stop")  # --inject-fault's: see engine.hooks.Injection


def parse_fault(text: str) -> tuple[int, int, str]:
    """'1:10:raise' -> (1, 10, 'raise')."""
    parts = text.split(":")
    if len(parts) != 3 or parts[2] not in FAULT_KINDS or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(
            f"--inject-fault is {text!r}, expected RANK:STEP:KIND with KIND raise, kill or "
            f"stop, e.g. 1:10:raise"
        )
    return int(parts[0]), int(parts[1]), parts[2]


def parse_beta(text: str) -> float:
    """'0.999' -> 0.999 (one of --betas' two values)."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--betas takes two numbers in [0, 1), got {text!r}") from None


def parse_count(text: str) -> int | str:
    """'4' -> 4, 'auto' -> 'auto' (--workers, --threads)."""
    if text.strip() == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        value = 0  # one message for every text it refuses
    if value < 1:
        raise ValueError(f"expected a positive integer or {AUTO}, got {text!r}")
    return value


def parse_straggle(text: str) -> tuple[int, float]:
    """'1:5' -> (1, 5.0)."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        return int(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"--straggle is {text!r}, expected RANK:MS, e.g. 1:5") from None


def parse_period(text: str) -> int | str:
    """'8' -> 8, 'auto' -> 'auto' (--sync-every)."""
    if text.strip() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"--sync-every is {text!r}, expected a positive integer (the local steps between "
            f"two averages) or {AUTO}"
        ) from None


# the options that only some optimizers take (each refuses the others' when changed)
OPTIMIZER_OPTIONS = {
    "sgd": {"momentum", "dampening", "nesterov"},
    "adam": {"betas", "eps"},
    "adamw": {"betas", "eps"},
    "rmsprop": {"momentum", "eps", "rms_alpha", "centered"},
}
LOCAL_MOMENTA = ("average", "local", "reset")  # what an average does to the optimizer's state
SYNC_EVERY_MAX = 64  # the longest period --sync-every auto chooses


def option(
    default,
    help: str,
    *,
    group: str,
    flag: str | None = None,
    flag_help: str | None = None,  # a True default's --no-x flag: what the flag does
    parse=None,
    choices=None,
    metavar=None,
    cli: bool = True,
    late: bool = False,
    nargs=None,
):
    """A TrainConfig field with what the CLI and the docs say about it. parse: the CLI text's
    parser (argparse refuses bad text with exit code 2; late=True parses it with the rest of
    the config instead: exit code 1 and the config's message); nargs: the CLI flag takes
    that many values, each parsed by parse."""
    return field(
        default=default,
        metadata={
            "help": help,
            "group": group,
            "flag": flag,
            "flag_help": flag_help,
            "parse": parse,
            "choices": choices,
            "metavar": metavar,
            "cli": cli,
            "late": late,
            "nargs": nargs,
        },
    )


@dataclass(frozen=True)
class TrainConfig:
    """Every option of a training run (see the module docstring); frozen once validated."""

    # ---- the model
    model: str = option(
        "mlp",
        "the named model: logreg (binary), softmax, mlp (dense layers "
        "of --hidden widths, ReLU), cnn (two conv blocks and fc 128, reading each "
        "row as a 1x28x28 or 3xSxS image)",
        group="model",
        choices=MODELS,
    )
    hidden: tuple = option(
        (256, 128),
        "MLP hidden widths (CLI: comma-separated, e.g. 256,128)",
        group="model",
        parse=parse_hidden,
    )
    layers: tuple | None = option(
        None,
        "a model of your own instead of --model: its layers, "
        "e.g. conv:32:3,relu,maxpool2,flatten,dense:128,relu,dense:10 "
        "(dense:OUT, conv:CHANNELS:KERNEL[:PADDING[:STRIDE]], maxpool2, "
        "avgpool2, globalavgpool, dropout:RATE, layernorm, batchnorm, res_begin ... "
        "res_end (a residual block), "
        "flatten, relu, tanh, sigmoid, gelu; the last dense layer "
        "has one output per class, or 1 for two classes). API: a "
        "list of dptrain.nn layers",
        group="model",
        parse=parse_layers,
        metavar="LAYERS",
    )
    dtype: str = option(
        "float32",
        "float32, float64, or bfloat16: mixed precision (float32 "
        "weights, gradients and optimizer state; every GEMM's inputs rounded "
        "to bfloat16, float32 accumulation)",
        group="model",
        choices=DTYPES,
    )
    seed: int = option(
        0, "seeds the initial weights, the epochs' sample order and synthetic data", group="model"
    )
    threads: int | str = option(
        1,
        "threads the C kernels split each worker's batch over; auto: the usable CPUs divided "
        "among the workers (under mpiexec, among the node's ranks, or the CPUs the launcher "
        "bound the rank to)",
        group="model",
        parse=parse_count,
    )
    # ---- the data
    dataset: str = option(
        "mnist",
        "the named data set: mnist, cifar10 (from local files; a "
        "named --data-dir must hold them, else the announced synthetic "
        "stand-in), or synthetic (the logistic-regression workload)",
        group="data",
        choices=DATASETS,
    )
    data_dir: str | None = option(
        None,
        "directory with the MNIST IDX files or the CIFAR-10 "
        "batches; default: $DPTRAIN_DATA, then ~/.cache/dptrain",
        group="data",
    )
    limit: int | None = option(
        None, "use only the first N training samples (default: all)", group="data", metavar="N"
    )
    n_samples: int | None = option(
        None, "synthetic data set: training samples (default 100000)", group="data"
    )
    n_features: int | None = option(None, "synthetic data set: features (default 20)", group="data")
    upscale: int = option(
        1,
        "MNIST up-scaling factor: 2 -> 56x56, 4 -> 112x112 inputs",
        group="data",
        choices=(1, 2, 4),
    )
    allow_download: bool = option(
        True,
        "download MNIST into the cache when it is not found (CLI: --no-download turns it off)",
        group="data",
        flag="--no-download",
        flag_help="never download MNIST: without local files, train on the announced "
        "synthetic stand-in",
    )
    augment: str | None = option(
        None,
        "augment the training images: 'cropP' (a random crop of the image zero-padded by P "
        "pixels each side) and/or 'flip' (a random left-right mirror), e.g. crop4,flip; drawn "
        "from (seed, epoch, sample), so the same on any number of workers; never for "
        "evaluation. Needs a model of images (input (C, H, W))",
        group="data",
        metavar="SPEC",
    )
    shuffle: bool = option(
        True,
        "a seeded new order every epoch (CLI: --no-shuffle keeps the data set's order)",
        group="data",
        flag="--no-shuffle",
        flag_help="no reshuffle: every epoch takes the data set's own order",
    )
    # ---- the optimization
    epochs: int = option(2, "passes over the training set", group="optimization")
    batch_size: int | None = option(
        128,
        "the GLOBAL batch: worker r takes its contiguous "
        "share of every global batch (None with "
        "batch_per_worker)",
        group="optimization",
    )
    batch_per_worker: int | None = option(
        None,
        "weak scaling: each worker's batch (the global batch is B x workers)",
        group="optimization",
        metavar="B",
    )
    lr: float | None = option(
        None,
        "learning rate (default: 0.1 with optimizer sgd, 0.001 with adam and adamw, 0.01 "
        "with rmsprop)",
        group="optimization",
    )
    scale_lr: bool = option(
        False, "multiply lr by the number of workers (linear scaling rule)", group="optimization"
    )
    momentum: float | None = option(
        None,
        "momentum, in [0, 1), SGD's or RMSprop's (default: 0.9 with optimizer sgd, 0 with rmsprop)",
        group="optimization",
    )
    dampening: float = option(0.0, "SGD dampening, in [0, 1]", group="optimization")
    weight_decay: float | None = option(
        None,
        "weight decay: an L2 term in the gradient (sgd, adam), or decoupled (adamw); default "
        "0, and 0.01 with adamw (PyTorch's defaults)",
        group="optimization",
    )
    nesterov: bool = option(False, "Nesterov momentum", group="optimization")
    clip_norm: float | None = option(
        None,
        "clip the gradient to this global L2 norm before every step "
        "(torch.nn.utils.clip_grad_norm_): the norm of the exchanged gradient, the same on "
        "every worker",
        group="optimization",
        metavar="MAX",
    )
    optimizer: str = option(
        "sgd",
        "sgd (with momentum, dampening, nesterov), adam or adamw (PyTorch's Adam and AdamW, "
        "with betas and eps; adamw's weight decay shrinks the weights instead of adding an L2 "
        "term to the gradient), rmsprop (PyTorch's RMSprop, with rms_alpha, eps, momentum and "
        "centered)",
        group="optimization",
        choices=tuple(OPTIMIZERS),
    )
    betas: tuple = option(
        (0.9, 0.999),
        "adam/adamw: the decay rates of the gradient's moving average and of its square's, "
        "each in [0, 1)",
        group="optimization",
        parse=parse_beta,
        nargs=2,
        metavar=("B1", "B2"),
    )
    eps: float = option(
        1e-8,
        "adam/adamw/rmsprop: added to the denominator (the root of the second moment)",
        group="optimization",
    )
    rms_alpha: float = option(
        0.99,
        "rmsprop: the decay rate of the squared gradient's moving average, in [0, 1]",
        group="optimization",
    )
    centered: bool = option(
        False,
        "rmsprop: divide by the root of the gradient's variance (its square's moving average "
        "less the square of its own)",
        group="optimization",
    )
    lr_schedule: str = option(
        "cosine",
        "learning-rate schedule over the whole run: constant; cosine (to 0 at the end); step "
        "(x lr_gamma every lr_step_epochs epochs) and exponential (x lr_gamma every epoch), "
        "torch's StepLR and ExponentialLR stepped once an epoch; onecycle (torch's OneCycleLR: "
        "up from lr/25 to lr over the first 30 percent of the steps, then down to lr/25/1e4)",
        group="optimization",
        choices=SCHEDULES,
    )
    lr_gamma: float | None = option(
        None,
        "the step and exponential schedules' factor (step's default 0.1, as torch's StepLR; "
        "exponential needs it)",
        group="optimization",
    )
    lr_step_epochs: int | None = option(
        None,
        "the step schedule's period in epochs (as torch's StepLR's step_size; step needs it)",
        group="optimization",
        metavar="E",
    )
    warmup_epochs: float = option(
        0.0, "ramp the learning rate up linearly over this many epochs first", group="optimization"
    )
    tol: float | None = option(
        None,
        "stop early once the epoch's training loss has not fallen below the best so far by "
        "at least this much for more than n_iter_no_change epochs in a row (scikit-learn's "
        "tol for its stochastic solvers); default: run every epoch",
        group="optimization",
    )
    n_iter_no_change: int | None = option(
        None,
        "with tol: epochs in a row without improvement before stopping (default: 10 with tol)",
        group="optimization",
    )
    # ---- the workers
    workers: int | str = option(
        1,
        "data-parallel workers (under mpiexec: the MPI world size); auto: one per CPU this "
        "process may use (CPUs // threads with threads given; under mpiexec the world size). "
        "Both workers and threads auto: one worker per CPU with one thread each, as worker "
        "processes scale better than one worker's threads today",
        group="parallel",
        parse=parse_count,
    )
    pin: bool | None = option(
        None,
        "pin each worker (process, MPI rank or worker thread) to CPUs of its own, threads "
        "CPUs each, out of those this process may use, before it builds its model; refused "
        "where workers x threads exceed them. Default: worker processes and MPI ranks are "
        "pinned where there are several, with CPUs enough for their threads (thread workers "
        "are not: they ran slower pinned); under mpiexec a binding the launcher gave is kept "
        "(see docs/multinode.md)",
        group="parallel",
        flag="--pin",
        flag_help="never pin the workers: the OS places them",
    )
    backend: str | None = option(
        None,
        "how workers run: thread, process (sharing memory) or "
        "mpi (launch with mpiexec -n N); default: mpi when started by "
        "an MPI launcher with several ranks, else thread",
        group="parallel",
        choices=BACKENDS,
    )
    start_method: str | None = option(
        None,
        "process backend: how worker processes start (default: Python's)",
        group="parallel",
        choices=START_METHODS,
    )
    timeout: float = option(
        0.0,
        "fail a collective that waits longer than this many seconds for a late rank "
        "(0: never; waits for rank 0's evaluation or checkpoint and for the start-up "
        "do not count); the error names the ranks that did not arrive",
        group="parallel",
    )
    elastic: bool = option(
        False,
        "a worker that fails (raises, dies, or misses --timeout) costs the step it was in, "
        "not the run: the others go on without it from the last completed step, the same "
        "global batch shared by one worker less (with --deterministic the same bits as a "
        "run that lost no one); thread and process backends, and MPI under ULFM (Open MPI's "
        "mpiexec --with-ft ulfm)",
        group="parallel",
    )
    min_workers: int = option(
        1,
        "with elastic: the fewest workers the run goes on with; losing one more fails it",
        group="parallel",
    )
    respawn: bool = option(
        False,
        "with elastic: a new worker replaces each one lost, from the same step, so the run "
        "goes on with as many workers as it started with",
        group="parallel",
    )
    allreduce: str = option(
        "native",
        "gradient exchange: the transport's own (native), the "
        "ring or tree schedule, or a parameter server (ps)",
        group="parallel",
        choices=ALGORITHMS,
    )
    bucket_kb: float = option(
        0.0,
        "exchange the gradient in buckets of this many KiB, last "
        "layer first (0: one all-reduce of the whole flat gradient)",
        group="parallel",
    )
    overlap: bool = option(
        False, "start each bucket's all-reduce while backward is still running", group="parallel"
    )
    deterministic: bool = option(
        False,
        f"bitwise-identical weights for any number of workers up to {CHUNKS}",
        group="parallel",
    )
    shard_update: bool = option(
        False,
        "workers sharing memory (thread, process) hold the parameters and the optimizer's "
        "state once, in shared memory, and each sums and updates its own slice of them: the "
        "same bits as every worker updating all of them, 1/N of the update's work each (on 2 "
        "cores 4-11 percent slower: bench/README.md). With thread or process workers and "
        "allreduce=native without buckets, overlap, deterministic mode or a bfloat16 exchange",
        group="parallel",
    )
    comm_dtype: str | None = option(
        None,
        "the gradient exchange's dtype: bfloat16 rounds each "
        "worker's gradient (in deterministic mode, each chunk's) "
        "to bfloat16, sums them in float32 and rounds the sum to "
        "bfloat16: half the bytes of float32, for links where "
        "bytes cost (MPI between nodes); over one machine's shared "
        "memory its conversions cost more than the bytes save "
        "(bench/bench_bf16.py). With allreduce=native and no "
        "overlap or bucket_kb. Default: the model's buffers' dtype "
        "(float32 for a bfloat16 model)",
        group="parallel",
        choices=COMM_DTYPES,
    )
    mpi_shm: bool = option(
        True,
        "under MPI, the ranks of each node reduce over shared "
        "memory and one leader per node all-reduces between nodes (CLI: "
        "--no-mpi-shm, or DPTRAIN_MPI_SHM=0: a flat MPI all-reduce over "
        "every rank)",
        group="parallel",
        flag="--no-mpi-shm",
        flag_help="no shared-memory reduction inside each node: under MPI, one flat MPI "
        "all-reduce over every rank (as DPTRAIN_MPI_SHM=0 does)",
    )
    mpi_nodes: int = option(
        0,
        "under MPI, split the ranks into K simulated nodes of "
        "consecutive ranks, to run the inter-node path on one machine "
        "(0: the real nodes, or DPTRAIN_MPI_NODES)",
        group="parallel",
        metavar="K",
    )
    # ---- local SGD (periodic model averaging)
    sync_every: int | str = option(
        1,
        "local SGD: each replica takes H local steps on its own shard of every global batch, "
        "then the replicas' parameters are averaged (1: synchronous SGD, run as such; auto: "
        "chosen from the run's loss and breakdown, starting at 2 and doubling while the loss "
        "keeps falling "
        f"and the averages cost time, up to {SYNC_EVERY_MAX}). The result depends on the "
        "replicas and the period, not on the workers that run them",
        group="local sgd",
        parse=parse_period,
        metavar="H|auto",
    )
    local_after: int = option(
        0,
        "post-local SGD: average after every step for the first E epochs, then every "
        "sync_every steps",
        group="local sgd",
        metavar="E",
    )
    replicas: int | None = option(
        None,
        "local SGD's replicas K (a multiple of the workers: each worker runs K / workers of "
        "them), each with its shard of every global batch and its own optimizer state; "
        "default: one per worker. K replicas give the same weights on any number of workers "
        "that divides K",
        group="local sgd",
        metavar="K",
    )
    local_momentum: str = option(
        "average",
        "local SGD: what an average does to the optimizer's state (momentum, Adam's moments): "
        "average it too, keep each replica's own, or reset it to zero",
        group="local sgd",
        choices=LOCAL_MOMENTA,
    )
    outer_lr: float = option(
        1.0,
        "local SGD's outer optimizer (DiLoCo): the average's delta from the last average is "
        "applied with this learning rate and Nesterov momentum outer_momentum (1 and 0: plain "
        "averaging)",
        group="local sgd",
    )
    outer_momentum: float = option(
        0.0, "local SGD's outer Nesterov momentum (see outer_lr)", group="local sgd"
    )
    # ---- checkpoints
    checkpoint: str | None = option(None, "checkpoint file to write (.npz)", group="checkpoints")
    checkpoint_every: int = option(
        0,
        "write the checkpoint every K steps (0: at the end of every epoch, when a checkpoint "
        "path is given)",
        group="checkpoints",
        metavar="K",
    )
    resume: str | None = option(
        None, "continue the run saved in this checkpoint", group="checkpoints", metavar="PATH"
    )
    # ---- outputs
    out: str | None = option(None, "write the JSON result here", group="outputs")
    save_weights: str | None = option(None, "save the trained model (.npz)", group="outputs")
    trace: str | None = option(
        None,
        "write a Chrome trace of every step on every rank (open in https://ui.perfetto.dev)",
        group="outputs",
        metavar="FILE",
    )
    steps_csv: str | None = option(
        None, "write the per-step, per-rank phase table as CSV", group="outputs", metavar="FILE"
    )
    quiet: bool = option(
        False,
        "print nothing but errors (a synthetic stand-in is still announced, on stderr)",
        group="outputs",
    )
    progress: bool = option(
        True,
        "a live progress bar inside each epoch (terminal, Jupyter, Colab); CLI: --no-progress",
        group="outputs",
        flag="--no-progress",
        flag_help="no live progress bar (the epoch lines are still printed); there is "
        "none either where stderr is not a terminal (a log file)",
    )
    # ---- fault and straggler injection (to study failures and synchronization)
    fault: tuple | None = option(
        None,
        "make one worker fail at one step: (rank, step, 'raise' | 'kill' | 'stop'); 'kill' "
        "(SIGKILL) needs worker processes (process backend, MPI); 'stop' stalls it (SIGSTOP "
        "a process, a thread sleeps until the run gives up on it), for --timeout",
        group="injection",
        flag="--inject-fault",
        parse=parse_fault,
        metavar="RANK:STEP:raise|kill|stop",
        late=True,
    )
    straggle: tuple | None = option(
        None,
        "(rank, ms): that rank's compute takes ms longer every step",
        group="injection",
        parse=parse_straggle,
        metavar="RANK:MS",
        late=True,
    )
    straggle_random_ms: float = option(
        0.0,
        "add a random U(0, ms) delay to every rank's compute every step (seeded)",
        group="injection",
        flag="--straggle-random",
        metavar="MS",
    )
    uncoupled: bool = option(
        False,
        "measure the contention ceiling instead of training: the "
        "workers run at the same moment without communicating, each on "
        "its 1/N of the data with 1/N of the batch",
        group="injection",
        cli=False,
    )

    def __post_init__(self):
        try:
            self._validate()
        except OptionError:
            raise
        except ValueError as exc:  # about the option its message starts with: say which
            name = re.match(r"\w*", str(exc)).group()
            if name not in {f.name for f in fields(self)}:
                raise
            raise OptionError(name, str(exc)) from None
        check_paths(self)  # its messages name both options, as both APIs spell them

    def _validate(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen)
        for name in (*OUTPUT_PATHS, "resume"):  # checkpoint=123 wrote a file named 123
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, os.PathLike) or isinstance(value, str) and value.strip()
            ):
                raise ValueError(f"{name} must be a file path (str or os.PathLike), got {value!r}")
        for f in fields(self):  # a switch is a bool: shuffle="False" shuffled
            if isinstance(f.default, bool):
                value = getattr(self, f.name)
                if not (
                    isinstance(value, (bool, np.bool_))
                    or isinstance(value, numbers.Integral)
                    and value in (0, 1)
                ):
                    raise ValueError(f"{f.name} must be True or False, got {value!r}")
                set_(f.name, bool(value))
        if self.batch_size is None and self.batch_per_worker is None:
            raise ValueError(
                "batch_size must be a positive integer, got None (None only with batch_per_worker)"
            )
        for name in ("epochs", "threads", "workers", "upscale") + (
            ("batch_size",) if self.batch_size is not None else ()
        ):
            value = getattr(self, name)
            if name in ("threads", "workers") and not _is_positive_int(value):
                if value == AUTO:
                    continue  # chosen for the machine by the run (engine.run.resolve_auto)
                raise ValueError(f"{name} must be a positive integer or {AUTO!r}, got {value!r}")
            set_(name, _positive_int(name, value))
        if self.pin is not None and not isinstance(self.pin, bool):
            raise ValueError(f"pin must be True, False or None (where it helps): {self.pin!r}")
        # the C core's bound, refused here rather than in a worker
        if self.threads != AUTO and self.threads > 1:
            from . import _core

            most = _core.build_info()["max_threads"]
            if self.threads > most:
                raise ValueError(f"threads must be in [1, {most}], got {self.threads}")
        for name in ("limit", "n_samples", "n_features", "batch_per_worker", "n_iter_no_change"):
            if getattr(self, name) is not None:
                set_(name, _positive_int(name, getattr(self, name)))
        set_("seed", _int("seed", self.seed, minimum=0))
        set_("checkpoint_every", _int("checkpoint_every", self.checkpoint_every, minimum=0))
        set_("mpi_nodes", _int("mpi_nodes", self.mpi_nodes, minimum=0))
        # "sequential": the kind of a model the user built (dptrain.fit passes its kind)
        for name, allowed in (
            ("model", MODELS + ("sequential",)),
            ("dtype", DTYPES),
            ("lr_schedule", SCHEDULES),
            ("allreduce", ALGORITHMS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} is {getattr(self, name)!r}, expected one of {allowed}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend is {self.backend!r}, expected one of {BACKENDS} or None")
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise ValueError(
                f"start_method is {self.start_method!r}, expected one of {START_METHODS} or None"
            )
        if self.upscale not in (1, 2, 4):
            raise ValueError(f"upscale is {self.upscale}, expected 1, 2 or 4")
        hidden = self.hidden if isinstance(self.hidden, (tuple, list)) else (self.hidden,)
        if not all(_is_positive_int(h) for h in hidden):
            raise ValueError(f"hidden must hold positive integer widths, got {self.hidden!r}")
        set_("hidden", tuple(int(h) for h in hidden))
        if self.layers is not None:  # a model of the user's: it replaces the named one
            from .models import layer_specs

            specs = tuple(layer_specs(self.layers))
            if not specs:
                raise ValueError("layers is empty: give at least one dense or conv layer")
            set_("layers", specs)
            set_("model", "sequential")
        for name in (
            "timeout",
            "bucket_kb",
            "warmup_epochs",
            "straggle_random_ms",
            "tol",
            "outer_lr",
            "outer_momentum",
        ):
            value = getattr(self, name)
            if name == "tol" and value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or not (value >= 0 and math.isfinite(value))
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
            set_(name, float(value))
        if self.tol is None and self.n_iter_no_change is not None:
            raise ValueError(
                f"n_iter_no_change={self.n_iter_no_change} counts the epochs without an "
                f"improvement by tol, which is not given (every epoch runs): give tol too, "
                f"or leave it out"
            )
        if self.tol is not None and self.n_iter_no_change is None:
            set_("n_iter_no_change", 10)  # scikit-learn's
        if self.start_method is not None and self.backend != "process":
            raise ValueError(
                f"start_method={self.start_method!r} says how the process backend starts its "
                f"workers, but backend={self.backend!r}: give backend='process' too, or leave "
                f"it out"
            )
        self._check_optimizer(set_)
        self._check_schedule(set_)
        self._check_step_options(set_)
        self._check_model_memory()
        if self.overlap and (self.deterministic or self.allreduce != "native"):
            raise ValueError("overlap works with allreduce='native' and without deterministic mode")
        if self.allreduce != "native" and self.deterministic:
            raise ValueError(
                "deterministic mode has its own fixed-order reduction: use "
                "allreduce='native' with it"
            )
        storage = "float64" if self.dtype == "float64" else "float32"
        bf16_ok = (
            self.allreduce == "native"
            and not self.overlap
            and (self.deterministic or not self.bucket_kb)
        )
        if self.comm_dtype is None:
            set_("comm_dtype", storage)
        elif self.comm_dtype not in COMM_DTYPES:
            raise ValueError(
                f"comm_dtype is {self.comm_dtype!r}, expected one of {COMM_DTYPES} or None"
            )
        elif self.comm_dtype == "bfloat16":
            if storage != "float32":
                raise ValueError(
                    "comm_dtype='bfloat16' needs float32 gradients: dtype float32 "
                    "or bfloat16, got float64"
                )
            if not bf16_ok:
                raise ValueError(
                    f"comm_dtype='bfloat16' works with allreduce='native' (or "
                    f"deterministic mode) and without overlap or bucket_kb; got "
                    f"allreduce={self.allreduce!r}, overlap={self.overlap}, "
                    f"bucket_kb={self.bucket_kb}"
                )
        elif self.comm_dtype != storage:
            raise ValueError(
                f"comm_dtype is {self.comm_dtype!r}, but the model's gradients are "
                f"{storage}: use {storage!r} or 'bfloat16'"
            )
        if self.shard_update:
            # after comm_dtype is resolved: the bfloat16 exchange has its own strategy
            clash = [
                f"{name}={value!r}"
                for name, value, ok in [
                    ("backend", self.backend, self.backend in (None, "thread", "process")),
                    ("allreduce", self.allreduce, self.allreduce == "native"),
                    ("bucket_kb", self.bucket_kb, not self.bucket_kb),
                    ("overlap", self.overlap, not self.overlap),
                    ("deterministic", self.deterministic, not self.deterministic),
                    ("comm_dtype", self.comm_dtype, self.comm_dtype != "bfloat16"),
                ]
                if not ok
            ]
            if clash:
                raise ValueError(
                    f"shard_update=True needs workers sharing memory (backend thread or process) "
                    f"and the native all-reduce of the whole gradient; got {', '.join(clash)}"
                )
        self._check_local(set_)
        self._check_elastic(set_)
        if self.deterministic and self.split()[0] > CHUNKS:
            raise ValueError(
                f"deterministic mode supports up to {CHUNKS} workers, got {self.workers}"
            )
        if self.checkpoint_every and not self.checkpoint:
            raise ValueError("checkpoint_every needs a checkpoint path to write to")
        if self.fault is not None:
            f = tuple(self.fault)
            if (
                len(f) != 3
                or f[2] not in FAULT_KINDS
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in f[:2])
            ):
                raise ValueError(
                    f"fault must be (rank, step, 'raise' | 'kill' | 'stop'), got {self.fault!r}"
                )
            set_("fault", f)
        if self.straggle is not None:
            st = tuple(self.straggle)
            if (
                len(st) != 2
                or not isinstance(st[0], numbers.Integral)
                or st[0] < 0
                or not isinstance(st[1], numbers.Real)
                or not (st[1] >= 0 and math.isfinite(st[1]))
            ):
                raise ValueError(
                    f"straggle must be (rank, ms) with rank >= 0 and ms >= 0, got {self.straggle!r}"
                )
            set_("straggle", (int(st[0]), float(st[1])))
        for name in (
            "data_dir",
            "checkpoint",
            "resume",
            "out",
            "save_weights",
            "trace",
            "steps_csv",
        ):
            value = getattr(self, name)
            if value is not None:
                set_(name, str(value))

    @property
    def local(self) -> bool:
        """Local SGD: replicas that average their parameters (sync_every, replicas). An
        average after every step of the parameters and SGD's momentum, taken as it is, is
        synchronous SGD, and runs as such (the gradient all-reduce: one exchange instead of
        two, and the same bits as synchronous SGD, --deterministic's included): sync_every 1
        is local SGD only with an outer optimizer, another momentum policy, an optimizer
        whose update is not linear in the gradient (Adam's, RMSprop's moments of the mean
        are not the mean of the moments) or a gradient clipped per replica."""
        if self.sync_every != 1:
            return True
        # the same algorithm only where the update is linear in the gradient (SGD) and each
        # replica's gradient is not clipped on its own
        synchronous = (
            self.outer_lr == 1.0
            and self.outer_momentum == 0.0
            and self.local_momentum == "average"
            and self.optimizer == "sgd"
            and self.clip_norm is None
        )
        return self.replicas is not None and not synchronous

    def _check_elastic(self, set_) -> None:
        """elastic and min_workers: an elastic run goes on from the last completed step, which
        every worker holds whole (the parameters, the optimizer's state); what keeps state
        apart on some workers, or exchanges inside the update, is refused."""
        set_("min_workers", _positive_int("min_workers", self.min_workers))
        if not self.elastic:
            for name, value, what in (
                (
                    "min_workers",
                    self.min_workers != 1,
                    "is the fewest workers an elastic run goes on with",
                ),
                ("respawn", self.respawn, "replaces an elastic run's lost workers"),
            ):
                if value:
                    raise ValueError(
                        f"{name}={getattr(self, name)} {what}: give elastic=True (--elastic) "
                        f"too, or leave it out"
                    )
            return
        if self.workers != AUTO and self.min_workers > self.workers:
            raise ValueError(f"min_workers={self.min_workers} is more than workers={self.workers}")
        clash = [
            text
            for text, on in (
                ("overlap=True", self.overlap),
                ("allreduce='ps'", self.allreduce == "ps"),
                ("shard_update=True", self.shard_update),
                ("local SGD (sync_every, replicas)", self.local),
                ("uncoupled=True", self.uncoupled),
            )
            if on
        ]
        if clash:
            raise ValueError(
                f"elastic=True goes on from the last completed step, which every worker holds "
                f"whole; it works on the thread and process backends (and MPI under ULFM) "
                f"with the all-reduce of "
                f"the whole gradient (native, ring, tree, bucketed, bfloat16) or deterministic "
                f"mode, not with {', '.join(clash)}"
            )

    def _check_local(self, set_) -> None:
        """The local SGD options: their values, then what they cannot run with."""
        if self.sync_every != AUTO:
            set_("sync_every", _positive_int("sync_every", self.sync_every))
        set_("local_after", _int("local_after", self.local_after, minimum=0))
        if self.replicas is not None:
            set_("replicas", _positive_int("replicas", self.replicas))
        if self.local_momentum not in LOCAL_MOMENTA:
            raise ValueError(
                f"local_momentum is {self.local_momentum!r}, expected one of {LOCAL_MOMENTA}"
            )
        if self.outer_lr == 0:
            raise ValueError("outer_lr must be > 0: 0 would never move the parameters")
        if self.outer_momentum >= 1:
            raise ValueError(f"outer_momentum must be in [0, 1), got {self.outer_momentum!r}")
        if not self.local:
            changed = [
                f"{name}={getattr(self, name)!r}"
                for name, default in (
                    ("local_after", 0),
                    ("local_momentum", "average"),
                    ("outer_lr", 1.0),
                    ("outer_momentum", 0.0),
                )
                if getattr(self, name) != default
            ]
            if changed:
                raise ValueError(
                    f"{changed[0].split('=')[0]}: {', '.join(changed)} set(s) local SGD's "
                    f"averages, but sync_every=1 is synchronous SGD: give sync_every (e.g. 8 "
                    f"or 'auto') too"
                )
            return
        clash = [
            f"{name}={value!r}"
            for name, value, ok in [
                ("allreduce", self.allreduce, self.allreduce == "native"),
                ("bucket_kb", self.bucket_kb, not self.bucket_kb),
                ("overlap", self.overlap, not self.overlap),
                ("shard_update", self.shard_update, not self.shard_update),
                ("comm_dtype", self.comm_dtype, self.comm_dtype != "bfloat16"),
                ("checkpoint_every", self.checkpoint_every, not self.checkpoint_every),
            ]
            if not ok
        ]
        if clash:
            raise ValueError(
                f"sync_every={self.sync_every!r} (local SGD) averages the parameters in a fixed "
                f"replica order, with the native transport, and writes its checkpoints at the "
                f"end of each epoch (where the replicas are averaged); it cannot run with "
                f"{', '.join(clash)}"
            )
        if self.checkpoint and self.local_momentum == "local":
            raise ValueError(
                "local_momentum='local' keeps a momentum per replica, which a checkpoint "
                "(one model) cannot hold: use 'average' or 'reset' to write checkpoints"
            )

    def _check_model_memory(self) -> None:
        """ValueError naming --hidden when the MLP's widths alone need more memory than this
        machine has: its buffers (params, grads, velocity) and one batch's activations, for
        the fewest features and classes (1 and 2), a lower bound of what any data needs."""
        memory = memory_bytes()
        if self.model != "mlp" or memory is None:
            return
        widths = (1, *self.hidden, 2)
        n_params = sum((a + 1) * b for a, b in zip(widths, widths[1:]))
        itemsize = 8 if self.dtype == "float64" else 4
        batch = self.global_batch(self.split()[0])
        need = itemsize * (_MODEL_BUFFERS * n_params + batch * sum(self.hidden))
        if need > memory:
            raise ValueError(
                f"hidden={self.hidden} needs at least {size_text(need)} of memory "
                f"({n_params:,} parameters, times {_MODEL_BUFFERS} buffers, and a batch of "
                f"{batch}'s activations), more than this machine's {size_text(memory)}"
            )

    @property
    def augmentation(self) -> tuple[int, bool] | None:
        """(pad, flip) of ``augment``, or None."""
        if not self.augment:
            return None
        pad, flip, seen = 0, False, set()
        for part in self.augment.split(","):
            part = part.strip()
            kind = "crop" if part.startswith("crop") else part
            if kind in seen:  # crop2,crop4 or flip,flip: which was meant?
                raise ValueError(f"augment is {self.augment!r}: {kind} is given twice")
            seen.add(kind)
            if part == "flip":
                flip = True
            elif part.startswith("crop") and part[4:].isdigit() and int(part[4:]) > 0:
                pad = int(part[4:])
            else:
                raise ValueError(
                    f"augment is {self.augment!r}: {part!r} is not cropP (P a positive number "
                    f"of pixels, e.g. crop4) or flip; e.g. 'crop4,flip'"
                )
        return pad, flip

    def _check_step_options(self, set_) -> None:
        """What a step does besides the optimizer: augment's spec and clip_norm's value."""
        if self.augment is not None:
            if not isinstance(self.augment, str):
                raise ValueError(
                    f"augment must be a string such as 'crop4,flip', got {self.augment!r}"
                )
            self.augmentation  # noqa: B018  (its ValueError names a bad part)
        if self.clip_norm is not None:
            if (
                isinstance(self.clip_norm, bool)
                or not isinstance(self.clip_norm, numbers.Real)
                or not (0 < self.clip_norm < math.inf)
            ):
                raise ValueError(f"clip_norm must be a finite number > 0, got {self.clip_norm!r}")
            set_("clip_norm", float(self.clip_norm))

    def _check_schedule(self, set_) -> None:
        """The schedule's own options: each named where it is missing, bad, or another
        schedule's."""
        sched = self.lr_schedule
        if sched == "step" and self.lr_gamma is None:
            set_("lr_gamma", 0.1)  # torch's StepLR's default
        if sched == "step" and self.lr_step_epochs is None:
            raise ValueError(
                "lr_schedule='step' needs lr_step_epochs (--lr-step-epochs E: the learning rate "
                "is multiplied by lr_gamma every E epochs)"
            )
        if sched == "exponential" and self.lr_gamma is None:
            raise ValueError(
                "lr_schedule='exponential' needs lr_gamma (--lr-gamma G: the learning rate is "
                "multiplied by G every epoch, e.g. 0.9)"
            )
        for name, used in (
            ("lr_gamma", sched in ("step", "exponential")),
            ("lr_step_epochs", sched == "step"),
        ):
            if getattr(self, name) is not None and not used:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not an option of lr_schedule="
                    f"{sched!r}: lr_gamma is the step and exponential schedules', "
                    f"lr_step_epochs the step schedule's"
                )
        if self.lr_gamma is not None:
            g = self.lr_gamma
            if isinstance(g, bool) or not isinstance(g, numbers.Real) or not (0 < g <= 1):
                raise ValueError(f"lr_gamma must be a number in (0, 1], got {g!r}")
            set_("lr_gamma", float(g))
        if self.lr_step_epochs is not None:
            set_("lr_step_epochs", _positive_int("lr_step_epochs", self.lr_step_epochs))
        if sched == "onecycle" and self.warmup_epochs:
            raise ValueError(
                f"warmup_epochs={self.warmup_epochs!r} cannot run with lr_schedule='onecycle', "
                f"whose first 30 % of the steps are its own warm-up"
            )
        if isinstance(self.epochs, int) and self.warmup_epochs and self.warmup_epochs > self.epochs:
            raise ValueError(
                f"warmup_epochs={self.warmup_epochs!r} is longer than the run "
                f"(epochs={self.epochs}): the learning rate would never reach lr"
            )

    def _check_optimizer(self, set_) -> None:
        """The optimizer's options: its own checks, and the other optimizers' options left at
        their defaults (an SGD momentum given to Adam would otherwise be silently ignored)."""
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer is {self.optimizer!r}, expected one of {tuple(OPTIMIZERS)}"
            )
        sgd, rms = self.optimizer == "sgd", self.optimizer == "rmsprop"
        if self.momentum is None and (sgd or rms):
            set_("momentum", 0.9 if sgd else 0.0)
        if self.lr is None:
            # the usual starting rates (PyTorch's for Adam and RMSprop)
            set_("lr", 0.1 if sgd else 1e-2 if rms else 1e-3)
        if (
            isinstance(self.lr, bool)
            or not isinstance(self.lr, numbers.Real)
            or not (0 < self.lr < math.inf)
        ):  # before the optimizers' checks: they allow 0, with which nothing learns
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if self.weight_decay is None:
            set_("weight_decay", 1e-2 if self.optimizer == "adamw" else 0.0)  # PyTorch's
        if isinstance(self.betas, (list, tuple)):  # as JSON gives them back: a list
            set_("betas", tuple(self.betas))
        defaults = {f.name: f.default for f in fields(self)}
        takes = OPTIMIZER_OPTIONS[self.optimizer]
        for name in sorted(set().union(*OPTIMIZER_OPTIONS.values()) - takes):
            if getattr(self, name) != defaults[name]:
                owners = [o for o, names in OPTIMIZER_OPTIONS.items() if name in names]
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not an option of "
                    f"optimizer={self.optimizer!r}: {name} is {' and '.join(owners)}'s "
                    f"({self.optimizer} takes {', '.join(sorted(takes))}); "
                    + (
                        "leave it out"
                        if defaults[name] is None
                        else f"leave it at its default {defaults[name]!r}"
                    )
                )
        SGD.check(
            lr=self.lr,
            # adam's None: checked as sgd's default, so that nesterov is refused as adam's
            momentum=0.9 if self.momentum is None else self.momentum,
            dampening=self.dampening,
            weight_decay=self.weight_decay,
            nesterov=self.nesterov,
        )
        Adam.check(lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)
        RMSprop.check(
            lr=self.lr,
            alpha=self.rms_alpha,
            eps=self.eps,
            momentum=self.momentum if rms else 0.0,
            centered=self.centered,
        )
        for name in ("lr", "momentum", "dampening", "weight_decay", "eps", "rms_alpha"):
            if getattr(self, name) is not None:
                set_(name, float(getattr(self, name)))
        set_("betas", tuple(float(b) for b in self.betas))

    # ---- construction
    @classmethod
    def from_kwargs(cls, **kwargs) -> "TrainConfig":
        """A validated config from keyword arguments; an unknown name is a TypeError that
        lists the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(
                f"unknown option(s) {', '.join(unknown)}; the options are "
                f"{', '.join(sorted(known))}"
            )
        return cls(**kwargs)

    def split(self, cores: int | None = None) -> tuple[int, int]:
        """(workers, threads), each 'auto' chosen for `cores` CPUs (default: those this
        process may use); see comm.placement.auto_split."""
        return auto_split(self.workers, self.threads, cores or cpu_count())

    # ---- what depends on the number of workers (settled once per run, in its Job)
    def global_batch(self, world: int) -> int:
        """The global batch on `world` workers: batch_size, or batch_per_worker x world (weak
        scaling)."""
        if self.batch_per_worker is not None:
            return self.batch_per_worker * world
        return self.batch_size

    def peak_lr(self, world: int) -> float:
        """The learning rate on `world` workers: lr, times world with scale_lr (the linear
        scaling rule)."""
        return self.lr * world if self.scale_lr else self.lr

    def check_world(self, world: int, backend: str) -> None:
        """ValueError, naming the option, for what a run on `world` workers of `backend`
        cannot do."""
        if backend == "mpi" and self.deterministic and world > CHUNKS:
            raise ValueError(
                f"deterministic mode supports up to {CHUNKS} workers, got an MPI world of "
                f"{world} ranks"
            )
        if self.straggle is not None and self.straggle[0] >= world:
            raise ValueError(
                f"straggle must be (rank, ms) with 0 <= rank < workers={world}, "
                f"got {self.straggle!r}"
            )
        if self.fault is not None and self.fault[0] >= world:
            raise ValueError(f"fault names rank {self.fault[0]}, but there are {world} workers")
        if self.local:
            replicas = self.replicas or world
            if replicas % world:
                raise ValueError(
                    f"replicas={replicas} cannot be split evenly over {world} workers: give a "
                    f"multiple of the workers (each worker runs replicas / workers of them)"
                )
            if self.global_batch(world) < replicas:
                raise ValueError(
                    f"batch_size={self.global_batch(world)} is smaller than replicas="
                    f"{replicas}: every replica needs at least one sample of each global batch"
                )
        batch = self.global_batch(world)
        if batch < world:
            raise ValueError(
                f"batch_size={batch} is smaller than workers={world}: every "
                f"worker needs at least one sample of each global batch"
            )
        if self.fault and self.fault[2] == "kill" and backend not in ("process", "mpi"):
            raise ValueError(
                "fault kind 'kill' kills the worker's process: use backend='process' (or MPI)"
            )
        if self.fault and self.fault[2] == "stop" and world == 1:
            raise ValueError(
                "fault kind 'stop' stalls a worker until another names it: give 2 workers or more"
            )
        if self.fault and self.fault[2] == "stop" and not self.timeout:
            raise ValueError(
                "fault kind 'stop' stalls a worker for good: give a timeout (--timeout), after "
                "which the others name it (and an elastic run goes on without it)"
            )
        if self.elastic and self.min_workers > world:
            raise ValueError(f"min_workers={self.min_workers} is more than the {world} workers")

    def as_dict(self) -> dict:
        """Plain values (tuples as lists), for JSON."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# the options that name a file the run writes; and those that name one it reads
OUTPUT_PATHS = ("out", "save_weights", "checkpoint", "trace", "steps_csv")
_MODEL_BUFFERS = 3  # params, grads, velocity


def _option_name(name: str) -> str:
    """'save_weights (--save-weights)': how a message names an option for the API and the
    command line at once; a name that already is a flag (a CLI-only input) as it is."""
    if name.startswith("--"):
        return name
    meta = {f.name: f.metadata for f in option_fields()}[name]
    return f"{name} ({meta['flag'] or '--' + name.replace('_', '-')})"


def _files_named(name: str, value) -> set:
    """The files an option's path names, resolved (links too): the path, and for
    save_weights also the path with the .npz that Model.save appends (``--out P
    --save-weights P`` is a mistake even though the model goes to P.npz)."""
    paths = {Path(value).expanduser()}
    if name == "save_weights":
        paths.add(npz_path(value))
    return {os.path.realpath(p) for p in paths}


def check_paths(config: "TrainConfig", inputs: dict | None = None) -> None:
    """ValueError naming both options when two outputs name the same file, or an output
    names a file the run reads: resume's checkpoint (except checkpoint itself: a run goes on
    writing the checkpoint it resumed) and ``inputs`` ({option: path}, e.g. the command
    line's {'--train-x': 'x.npy'}). Paths are compared resolved."""
    written = {}
    for name in OUTPUT_PATHS:
        value = getattr(config, name)
        if value is None:
            continue
        for path in _files_named(name, value):
            if written.get(path, name) != name:
                raise ValueError(
                    f"{_option_name(written[path])} and {_option_name(name)} both name "
                    f"{path}: one would overwrite the other; give each output its own file"
                )
            written[path] = name
    for name, value in {"resume": config.resume, **(inputs or {})}.items():
        for path in set() if value is None else _files_named(name, value):
            out = written.get(path)
            if out is not None and not (name == "resume" and out == "checkpoint"):
                raise ValueError(
                    f"{_option_name(out)} names {path}, the file that {_option_name(name)} "
                    f"reads: writing it would destroy the input; give the output another name"
                )


def _int(name, value, minimum=None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or (minimum is not None and value < minimum)
    ):
        more = f" >= {minimum}" if minimum is not None else ""
        raise ValueError(f"{name} must be an integer{more}, got {value!r}")
    return int(value)


def _is_positive_int(value) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, numbers.Real)
        and math.isfinite(value)
        and int(value) == value
        and int(value) >= 1
    )


def _positive_int(name, value) -> int:
    if not _is_positive_int(value):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def option_fields():
    """The options, in declaration order (fields with their metadata)."""
    return [f for f in fields(TrainConfig)]


def add_train_arguments(parser, only=None, defaults=None) -> None:
    """Adds the TrainConfig options to an argparse parser, grouped, as --kebab-case flags: a
    boolean that defaults to False is a switch; one that defaults to True has a --no-x flag
    (in its metadata, with the help of what the flag does); tuples and parsed values take
    their CLI text form. only: the names of the options to add (default: every one);
    defaults: other defaults, by name (a sweep runs one epoch)."""
    groups = {}
    for f in option_fields():
        meta = f.metadata
        if not meta.get("cli", True) or (only is not None and f.name not in only):
            continue
        group = groups.get(meta["group"])
        if group is None:
            group = groups[meta["group"]] = parser.add_argument_group(meta["group"])
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        default = (defaults or {}).get(f.name, f.default if f.default is not MISSING else None)
        kw = {"dest": f.name, "help": meta["help"]}
        if meta["metavar"]:
            kw["metavar"] = meta["metavar"]
        if meta.get("nargs"):
            kw["nargs"] = meta["nargs"]
        kw["action"] = _Given
        if f.type == "bool | None":  # --x sets True, --no-x False, neither leaves None
            group.add_argument(flag, dest=f.name, action=_GivenConst, const=True, help=kw["help"])
            no_help = f"{meta['flag_help']} (dptrain.train: {f.name}=False)"
            group.add_argument(
                _no_flag(flag), dest=f.name, action=_GivenConst, const=False, help=no_help
            )
            continue
        if isinstance(default, bool):
            kw["action"] = _GivenFalse if default else _GivenTrue
            kw["default"] = default
            kw.pop("metavar", None)
            if default:  # a --no-x flag: say what it does, and what it sets
                kw["help"] = f"{meta['flag_help']} (dptrain.train: {f.name}=False)"
        else:
            kw["default"] = default
            parse = meta["parse"]
            if parse is not None:
                if not meta["late"]:
                    kw["type"] = _argparse_type(parse)
            elif f.name in _NONNEGATIVE_INTS:
                kw["type"] = _argparse_type(_nonneg_int)
            elif f.type in ("int", "int | None"):
                kw["type"] = _argparse_type(_pos_int_text)
            elif f.name in _POSITIVE_FLOATS:
                kw["type"] = _argparse_type(_pos_float_text)
            elif f.type in ("float", "float | None"):
                kw["type"] = _argparse_type(_nonneg_float_text)
            if meta["choices"]:
                kw["choices"] = meta["choices"]
        group.add_argument(flag, **kw)


def _given_action(base):
    """argparse's action ``base`` that also records its option's name in the namespace's
    ``given`` (the options the command line named, whatever their value: ``--dataset mnist``
    is a choice, the default is not)."""

    class Given(base):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            namespace.given = getattr(namespace, "given", frozenset()) | {self.dest}

    return Given


_Given = _given_action(argparse._StoreAction)
_GivenTrue = _given_action(argparse._StoreTrueAction)
_GivenFalse = _given_action(argparse._StoreFalseAction)
_GivenConst = _given_action(argparse._StoreConstAction)


def _no_flag(flag: str) -> str:
    """'--pin' -> '--no-pin'."""
    return "--no-" + flag[2:]


def given(args) -> frozenset:
    """The TrainConfig options that parsed arguments (of add_train_arguments) name."""
    return getattr(args, "given", frozenset())


_NONNEGATIVE_INTS = ("checkpoint_every", "mpi_nodes", "seed", "local_after")
_POSITIVE_FLOATS = ("lr", "clip_norm", "lr_gamma")  # > 0 (TrainConfig says the rest)


def _pos_int_text(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"expected an integer >= 0, got {text!r}") from None
    if v < 0:
        raise ValueError(f"expected an integer >= 0, got {text!r}")
    return v


def _nonneg_float_text(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not (v >= 0) or v == float("inf"):
        raise ValueError(f"expected a finite number >= 0, got {text!r}")
    return v


def _pos_float_text(text: str) -> float:
    try:
        v = _nonneg_float_text(text)
    except ValueError:
        v = 0.0  # one message for every number it refuses
    if v == 0:
        raise ValueError(f"expected a finite number > 0, got {text!r}")
    return v


def _argparse_type(parse):
    def convert(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__.replace("parse_", "")
    return convert


def _fraction_text(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = 0.0  # one message for every text it refuses
    if not 0 < v < 1:
        raise ValueError(f"expected a fraction between 0 and 1 (e.g. 0.1), got {text!r}")
    return v


def fraction(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1 (its error names the text)."""
    return _argparse_type(_fraction_text)(text)


def positive_int(text: str) -> int:
    """An argparse type: a positive integer (its error names the text)."""
    return _argparse_type(_pos_int_text)(text)


def config_from_args(args) -> TrainConfig:
    """The TrainConfig of parsed CLI arguments (add_train_arguments' dests); options parsed
    late are parsed here (ValueError)."""
    values = {}
    for f in option_fields():
        if not f.metadata.get("cli", True):
            continue
        value = getattr(args, f.name)
        if f.metadata["late"] and isinstance(value, str):
            value = f.metadata["parse"](value)
        values[f.name] = value
    return TrainConfig.from_kwargs(**values)


def flag(name: str) -> str:
    """The command line's flag of the option ``name`` ('save_weights' -> '--save-weights')."""
    meta = {f.name: f.metadata for f in option_fields()}[name]
    return meta["flag"] or "--" + name.replace("_", "-")


def cli_message(exc: Exception) -> str:
    """An error's message as the command line says it: the options it names as the API
    spells them (an OptionError's first word, ``name=value`` anywhere) named by their flags,
    as the user typed them: 'threads must be ...' -> '--threads must be ...',
    "optimizer='adam'" -> '--optimizer adam'."""
    text = str(exc)
    options = [f for f in option_fields() if f.metadata.get("cli", True)]
    flags = {f.name: flag(f.name) for f in options}
    switched = {f.name: repr(not f.default) for f in options if isinstance(f.default, bool)}
    # a switch of both ways (pin): its True is --x, its False --no-x
    both = {f.name for f in options if f.type == "bool | None"}
    option = getattr(exc, "option", None)
    if option in flags:
        lead = re.match(rf"{option}(\[\d+\])?(?![\w=])", text)
        if lead:  # 'betas[0] must be' -> '--betas must be': the value it shows says which
            text = flags[option] + text[lead.end() :]
        elif not text.startswith(option + "="):
            text = f"{flags[option]}: {text}"

    def as_typed(m):
        value = m.group(2)
        if switched.get(m.group(1)) == value:  # nesterov=True: the switch --nesterov
            return flags[m.group(1)]
        if m.group(1) in both and value in ("True", "False"):  # pin=False: --no-pin
            return flags[m.group(1)] if value == "True" else _no_flag(flags[m.group(1)])
        if value[0] == "'" and value[-1] == "'" and " " not in value and len(value) > 2:
            value = value[1:-1]
        return f"{flags[m.group(1)]} {value}"

    names = "|".join(sorted(flags, key=len, reverse=True))
    return re.sub(rf"\b({names})=('[^']*'|\([^)]*\)|[^\s,:;)]+)", as_typed, text)


def options_doc() -> str:
    """The options as documentation lines (for help(dptrain.train))."""
    lines = []
    for f in option_fields():
        default = f.default if f.default is not MISSING else None
        lines.append(f"    {f.name}={default!r}: {f.metadata['help']}")
    return "\n".join(lines)
