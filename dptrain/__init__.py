"""dptrain: synchronous data-parallel training on CPUs, with a C core.

Quick start::

    import dptrain
    result = dptrain.train(model="mlp", dataset="mnist", epochs=2)

The C extension ``dptrain._core`` holds the kernels (GEMM, layers, losses, SGD, buffer
reductions); ``dptrain.reference`` is their pure-NumPy twin and test oracle.
"""
from ._version import __version__

try:
    from . import _core
except ImportError as exc:          # say so if this is a source tree with _core not built
    from ._source_tree import unbuilt_core_error
    if (unbuilt := unbuilt_core_error()) is None:
        raise
    raise unbuilt from exc
from .models import CNN, MLP, LogisticRegression, Model, SoftmaxRegression, load_model
from .optim import SGD
from .training import train

__all__ = ["CNN", "MLP", "LogisticRegression", "Model", "SoftmaxRegression", "SGD", "load_model",
           "train", "build_info", "__version__"]


def build_info() -> dict:
    """How the C core was built: SIMD level, dtypes, compiler, threading, MPI availability."""
    info = dict(_core.build_info())
    try:
        import mpi4py  # noqa: F401
        from mpi4py import MPI
        info["mpi"] = f"mpi4py {mpi4py.__version__}, {MPI.Get_library_version().splitlines()[0]}"
    except Exception as exc:  # no mpi4py, or no MPI library behind it
        info["mpi"] = f"not available ({type(exc).__name__}: {exc})"
    return info

