"""The training engine: a run from end to end in the launching process (``run``: ``train``,
``fit``, and ``run.run`` for a TrainConfig), what it trains on (``data``) and what it trains
(``model``: the model's spec), the job every worker is given (``job``), the training loop it
runs (``loop``, with ``hooks`` from outside), the gradient exchange strategies
(``exchange``), checkpoints (``checkpoint``), and what a run returns and writes (``result``:
``TrainResult``)."""

from .exchange import (
    AllReduce,
    Bf16AllReduce,
    Deterministic,
    Exchange,
    Overlap,
    ParameterServer,
    gradient_buckets,
    make_exchange,
)
from .hooks import Hooks
from .job import Job
from .loop import run_worker, train_worker
from .result import TrainResult

# the module engine.run keeps its name (its run(config, ...) is engine.run.run)
from .run import fit, train

__all__ = [
    "AllReduce",
    "Bf16AllReduce",
    "Deterministic",
    "Exchange",
    "Hooks",
    "Job",
    "Overlap",
    "ParameterServer",
    "TrainResult",
    "fit",
    "gradient_buckets",
    "make_exchange",
    "run_worker",
    "train",
    "train_worker",
]
