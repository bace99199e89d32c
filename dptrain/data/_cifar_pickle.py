"""The restricted unpickler for CIFAR-10's Python-format batches: it runs nothing.

A published batch is a Python 2 pickle of a dict whose b"data" is a uint8 NumPy array. The
unpickler below hands out inert stand-ins for the four globals such a pickle needs and
refuses every other global before it is called; the array is then made with np.frombuffer
from the recorded bytes. What the batch must hold (its shape, its labels) is checked in
cifar10.py.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable

import numpy as np

from .dataset import DataError


class _RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.qualified = f"{module}.{name}"


class _BadArrayPickle(ValueError):
    """A stand-in below was given arguments that NumPy never writes for a uint8 array."""


class _StandIn:
    """What `_CifarUnpickler.find_class` hands out instead of a real global.

    Calling it calls `make`. It has no __dict__ and refuses BUILD, so a pickle cannot attach
    anything to these module-level objects either.
    """

    __slots__ = ("qualified", "make")

    def __init__(self, qualified: str, make: Callable):
        self.qualified = qualified
        self.make = make

    def __call__(self, *args):
        return self.make(*args)

    def __setstate__(self, state):
        raise _BadArrayPickle(f"BUILD applied to {self.qualified}")


def _not_callable(*args):
    raise _BadArrayPickle("numpy.ndarray called directly; NumPy never pickles an array so")


_NDARRAY = _StandIn("numpy.ndarray", _not_callable)  # only an argument of _reconstruct


class _PickledDtype:
    """Stands for numpy.dtype("u1"): the only dtype a CIFAR-10 batch holds.

    NumPy pickles a dtype as dtype(spec, align, copy) followed by BUILD with a state tuple
    (version, byte order, subarray, names, fields, ...); for uint8 the byte order is "|".
    """

    __slots__ = ()

    def __init__(self, spec, align=False, copy=True):
        if spec not in ("u1", b"u1"):
            raise _BadArrayPickle(f"dtype {spec!r} is not uint8 ('u1')")

    def __setstate__(self, state):
        if not (
            isinstance(state, tuple)
            and len(state) >= 5
            and state[1] in ("|", b"|")
            and state[2:5] == (None, None, None)
        ):
            raise _BadArrayPickle(f"unexpected uint8 dtype state {state!r}")


class _PickledArray:
    """Stands for an ndarray being unpickled: records the BUILD state, builds nothing.

    NumPy pickles an array as _reconstruct(ndarray, (0,), b"b") followed by BUILD with
    (version=1, shape, dtype, is_fortran, raw bytes); `to_uint8` checks that state and
    makes the array with np.frombuffer.
    """

    __slots__ = ("state",)

    def __init__(self):
        self.state = None

    def __setstate__(self, state):
        self.state = state

    def to_uint8(self, where: str, row_size: int) -> np.ndarray:
        """The (n, row_size) uint8 array with n >= 1; DataError naming `where` otherwise."""
        state = self.state
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
            raise DataError(
                f"{where}: the data array's pickled state is not NumPy's "
                f"(1, shape, dtype, is_fortran, bytes) layout"
            )
        _, shape, dtype, fortran, raw = state
        if not isinstance(dtype, _PickledDtype):
            raise DataError(f"{where}: the data array has no uint8 dtype")
        if not (
            isinstance(shape, tuple)
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
        ):
            raise DataError(f"{where}: the data array has an invalid shape {shape!r}")
        if len(shape) != 2 or shape[1] != row_size or shape[0] == 0:
            raise DataError(
                f"{where}: data has shape {shape}, expected (n, {row_size}) with n >= 1"
            )
        if not isinstance(raw, (bytes, bytearray)):
            raise DataError(
                f"{where}: the data array's pixels are a {type(raw).__name__}, expected bytes"
            )
        if len(raw) != math.prod(shape):
            raise DataError(
                f"{where}: data of shape {shape} needs {math.prod(shape)} bytes, "
                f"the file holds {len(raw)}"
            )
        if fortran not in (False, True, 0, 1):
            raise DataError(f"{where}: the data array has an invalid is_fortran flag {fortran!r}")
        if fortran:
            return np.frombuffer(raw, dtype=np.uint8).reshape(shape[::-1]).T
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape)


def _reconstruct_array(subtype, shape, typecode):
    # numpy.core.multiarray._reconstruct(ndarray, (0,), b"b") starts every pickled ndarray
    if subtype is not _NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise _BadArrayPickle(
            f"_reconstruct{(subtype, shape, typecode)!r} is not how NumPy starts a plain ndarray"
        )
    return _PickledArray()


def _latin1_encode(text, encoding):
    # _codecs.encode(text, "latin1") is how Python 3 writes bytes at pickle protocol 2
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _BadArrayPickle(
            f"_codecs.encode with {type(text).__name__} and {encoding!r} is "
            f"not a protocol-2 bytes object"
        )
    return text.encode("latin-1")


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR-10 batch, refusing every global except the stand-ins below.

    Unpickling runs code only through globals: GLOBAL / STACK_GLOBAL / INST and the
    extension registry all go through `find_class`, and REDUCE / BUILD / NEWOBJ can only call
    what it returned. Without globals a pickle builds inert data (dict, list, tuple, str,
    bytes, int, float, bool, None). But the published batches do need globals: Python 2
    pickled (protocol 2) a dict whose b"data" is a numpy.ndarray, and NumPy pickles an array
    as numpy.core.multiarray._reconstruct(numpy.ndarray, (0,), b"b") plus BUILD state, with
    numpy.dtype("u1", 0, 1) plus BUILD state inside. So exactly these are allowed:
      numpy.core.multiarray._reconstruct (numpy._core.multiarray._reconstruct when the file
      was re-pickled by NumPy 2), numpy.ndarray, numpy.dtype, and _codecs.encode, which
      Python 3 uses for every bytes object at protocol 2 (so a batch re-pickled with
      pickle.dump(batch, f, 2) loads too).
    None of them is the real object: each maps to a stand-in above that accepts only the
    arguments NumPy writes for a plain uint8 array and records the state, and the array is
    then made with np.frombuffer from the recorded bytes. So no NumPy code (whose
    __setstate__ also accepts object arrays) and no other code runs on the file's behalf.
    Anything else (os.system, builtins.eval, numpy.load, ...) is refused before it is called.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _StandIn("_reconstruct", _reconstruct_array),
        ("numpy._core.multiarray", "_reconstruct"): _StandIn("_reconstruct", _reconstruct_array),
        ("numpy", "ndarray"): _NDARRAY,
        ("numpy", "dtype"): _StandIn("numpy.dtype", _PickledDtype),
        ("_codecs", "encode"): _StandIn("_codecs.encode", _latin1_encode),
    }

    def find_class(self, module, name):
        try:
            return self._ALLOWED[(module, name)]
        except (KeyError, TypeError):
            raise _RefusedGlobal(str(module), str(name)) from None


_ALLOWED_GLOBALS_TEXT = ", ".join(sorted({f"{m}.{n}" for m, n in _CifarUnpickler._ALLOWED}))
