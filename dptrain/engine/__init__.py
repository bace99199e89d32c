"""The training engine: the loop every worker runs (``loop``), the gradient exchange
strategies (``exchange``), checkpoints (``checkpoint``), and a run from end to end with its
result (``run``: ``train``, ``fit``, ``TrainResult``)."""
from .exchange import (AllReduce, Bf16AllReduce, Deterministic, Exchange, Overlap,
                       ParameterServer, gradient_buckets, make_exchange)
from .loop import Hooks, Job, run_worker
from .run import TrainResult, fit, train

__all__ = ["AllReduce", "Bf16AllReduce", "Deterministic", "Exchange", "Hooks", "Job", "Overlap",
           "ParameterServer", "TrainResult", "fit", "gradient_buckets", "make_exchange",
           "run_worker", "train"]
