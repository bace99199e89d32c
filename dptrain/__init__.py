"""dptrain: synchronous data-parallel training on CPUs, with a C core.

Three ways in, one engine underneath::

    import dptrain
    result = dptrain.train("mlp", "mnist", epochs=2, workers=2)        # named model and data
    model = dptrain.MLP([784, 256, 10]); dptrain.fit(model, X, y, workers=2)   # your arrays
    model = dptrain.nn.lenet5(); dptrain.fit(model, X, y, workers=2)   # your model (nn)
    dptrain.launch(my_loop, workers=4, backend="process")              # your own loop

and scikit-learn estimators in ``dptrain.sklearn``. The package's layers: ``_core`` (the C
kernels; ``reference`` is their NumPy twin and test oracle), ``nn``, ``models`` and ``optim``
(layers, the models built from them, SGD), ``data`` (data sets and your arrays), ``comm``
(the communicator and its transports), ``engine`` (the training loop, the gradient
exchanges, checkpoints, a run), ``measure`` (step timing, sweeps, the performance model,
plots), ``studies``, ``cli``.
"""

from ._version import __version__

try:
    from . import _core
except ImportError as exc:  # say so if this is a source tree with _core not built
    from ._source_tree import unbuilt_core_error

    if (unbuilt := unbuilt_core_error()) is None:
        raise
    raise unbuilt from exc
from . import nn
from .comm import CollectiveMismatch, Communicator, WorkerError, launch
from .config import TrainConfig
from .engine import TrainResult, fit, train
from .models import CNN, MLP, LogisticRegression, Model, Sequential, SoftmaxRegression, load_model
from .optim import SGD, Adam, AdamW, RMSprop

__all__ = [
    "CNN",
    "CollectiveMismatch",
    "Communicator",
    "MLP",
    "LogisticRegression",
    "Model",
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "Sequential",
    "SoftmaxRegression",
    "nn",
    "TrainConfig",
    "TrainResult",
    "WorkerError",
    "__version__",
    "build_info",
    "cpu_name",
    "fit",
    "launch",
    "load_model",
    "train",
]


def build_info() -> dict:
    """How the C core was built: SIMD level, dtypes, compiler, threading, MPI availability;
    and the CPU it runs on (``cpu``: its brand string)."""
    info = dict(_core.build_info())
    info["cpu"] = cpu_name()
    try:
        import mpi4py  # noqa: F401
        from mpi4py import MPI

        # Open MPI's version string ends in a NUL character
        library = MPI.Get_library_version().strip("\x00 \n").splitlines()[0]
        info["mpi"] = f"mpi4py {mpi4py.__version__}, {library}"
    except Exception as exc:  # no mpi4py, or no MPI library behind it
        info["mpi"] = f"not available ({type(exc).__name__}: {exc})"
    return info


def cpu_name() -> str:
    """The CPU's name: its brand string as CPUID gives it (what Linux shows as "model name"),
    else what the platform says (other architectures)."""
    import platform

    return _core.cpu_features().get("brand") or platform.processor() or platform.machine()
