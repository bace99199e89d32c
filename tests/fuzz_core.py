#!/usr/bin/env python3
"""fuzz_core: a fuzzer for the C boundary of dptrain._core.

    python tests/fuzz_core.py --calls N [--seed S] [--jobs J]      # fuzz, print the counts
    python tests/fuzz_core.py --seed S --replay CASE [-v]          # re-run one case, in-process
    python tests/fuzz_core.py --list                               # the coverage table

Every public callable of the extension (module functions, class constructors, methods and
getters: `public_callables()` reads them from dir(_core), and COVERAGE must name each one)
is called with hostile arguments: wrong dtypes (object, float16, int, bool, complex,
structured, byte-swapped), wrong ndim and shapes, zero and huge sizes, non-contiguous,
misaligned and read-only arrays, arrays aliasing each other (the same array, overlapping
views, partial overlaps cut from one buffer, across dtypes), out-of-range and huge integers,
NaN/inf, wrong Python types, missing and extra arguments, hostile layer lists (unknown kinds,
names with a NUL, sizes out of range or of the wrong type, shapes a layer cannot take, more
layers than the engine holds); the classes get random method sequences (forward_loss /
backward_layer / loss_grad / evaluate / logits interleavings, held arrays re-typed in place
with `arr.dtype = ...` and `arr.shape = ...`, calls from two threads).

Verdicts, per call:
  rejected  it raised TypeError/ValueError/IndexError/RuntimeError/OverflowError/MemoryError
            with a message, and left every array as it was;
  accepted  it returned, and the return value, the outputs and any held array the call may
            write agree with dptrain.reference (run on copies of the arguments taken before the
            call, so aliasing means "as if the inputs were read first"), within a per-dtype
            tolerance; no other array changed; object arrays' reference counts are right;
  wrong     anything else: a wrong value, a modified input, an accepted call that the
            reference refuses, another exception type (SystemError, ...), an empty message;
  crash     the batch process died of a signal (the call logged last is the culprit);
  hang      the batch process logged nothing for --hang-timeout seconds.

Design. A *case* is everything drawn from one generator, np.random.default_rng([seed, case]):
either one call of a module function (SPECS: a builder of a valid call, an oracle with the
function's own signature, then 0-3 MUTATIONS) or a scenario on one object (SCENARIOS: a random
sequence of steps with a model of the object's state). Cases are independent, so one case
replays alone. Batches of cases run in child processes (the same interpreter and environment:
an LD_PRELOAD of libasan applies to them), --jobs at a time; each call is logged and flushed
before it is made; a batch that crashed or hung resumes at the next case. The result does not
depend on --jobs.

Left out on purpose: timing-dependent interleavings (two threads interleave by hand-off, in
an order drawn from the case's generator, so a case replays), writes into a ShmGroup control
block (the shared protocol memory is the callers' to keep), NaN/inf in the input of a Model
with a conv layer (see make_batch), and the speed of anything.
"""

import argparse
import collections
import ctypes
import faulthandler
import gc
import math
import operator
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np
from _core_helpers import conv_blocks, dense_stack

from dptrain import _core as core
from dptrain import reference as ref

ALLOWED_ERRORS = (TypeError, ValueError, IndexError, RuntimeError, OverflowError, MemoryError)
F32, F64, I64, U8 = (np.dtype(t) for t in (np.float32, np.float64, np.int64, np.uint8))
FLOATS = (F32, F64)
# |actual - expected| <= RTOL * (|expected| + scale), scale from the oracle (the same sum over
# absolute values for linear kernels, so cancellation does not make the check flaky)
RTOL = {F32: 1e-4, F64: 1e-10}

CASE_STRIDE = 10**7  # batch b runs the cases b * CASE_STRIDE, b * CASE_STRIDE + 1, ...
BATCH_CALLS = 1000  # calls per batch (a batch finishes the case it is in)
HANG_TIMEOUT_S = 30.0  # a batch that logs nothing for this long is killed as a hang
GROUP_TIMEOUT_S = 5.0  # ShmGroup waits of a group whose every rank takes part
MAX_THREADS = 256  # DP_MAX_THREADS (csrc/dp_gemm.h)


# =======================================================================================
# drawing values


DIMS = np.array([0, 1, 2, 3, 4, 5, 7, 8, 13, 17, 33])
DIM_P = np.array([4, 8, 8, 8, 6, 5, 5, 4, 3, 2, 2], float)
DIM_P /= DIM_P.sum()


def dim(rng, lo=0):
    """A size biased to the edges: 0, 1, odd, just past a power of two."""
    while True:
        d = int(rng.choice(DIMS, p=DIM_P))
        if d >= lo:
            return d


def pick(rng, options, weights=None):
    """One of `options` (any objects), drawn with the rng."""
    if weights is None:
        return options[int(rng.integers(len(options)))]
    w = np.asarray(weights, float)
    return options[int(rng.choice(len(options), p=w / w.sum()))]


def pick_dtype(rng):
    return pick(rng, FLOATS)


def pick_style(rng):
    return pick(rng, ("normal", "quant", "special"), (7, 2, 1))


def draw(rng, shape, dt, style="normal"):
    """Floats of dtype dt: normal, quantized to quarters (exact sums: no rounding ties), or
    normal with a few NaN/inf."""
    shape = tuple(int(s) for s in shape)
    if style == "quant":
        v = rng.integers(-4, 5, size=shape) / 4.0
    else:
        v = rng.standard_normal(shape)
    a = np.array(v, dtype=dt)
    if style == "special" and a.size:
        flat = a.reshape(-1)
        for _ in range(int(rng.integers(1, 4))):
            flat[rng.integers(flat.size)] = pick(rng, (np.nan, np.inf, -np.inf))
    return a


def labels_for(rng, batch, classes):
    return rng.integers(0, classes, size=batch).astype(np.int64)


def aligned_bytes(nbytes, align=64):
    """A zeroed writeable uint8 array of nbytes whose first byte is `align`-aligned."""
    raw = np.zeros(nbytes + align, U8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + nbytes]


class Token:
    """A fresh object for object arrays: its reference count is ours alone to watch."""

    __slots__ = ("i", "__weakref__")

    def __init__(self, i):
        self.i = i

    def __repr__(self):
        return f"Token({self.i})"


def object_array(rng, shape):
    flat = [Token(int(i)) for i in rng.integers(0, 1000, size=int(np.prod(shape, dtype=np.int64)))]
    a = np.empty(len(flat), dtype=object)
    a[:] = flat
    return a.reshape(shape)


class SubArray(np.ndarray):
    """An ndarray subclass (passes PyArray_Check)."""


# =======================================================================================
# hostile values, by argument kind

# Kinds of an argument: "F" float array ("Fq": never given NaN/inf), "L" int64 labels,
# "I" int64 index or output, "U" uint8 array, "A" array of any dtype, "FL" list of float
# arrays, "f" float, "f?" float or None, "i" int, "i?" int or None, "b" truth value, "ctx"
# Context or None, "s" str, "sizes" sequence of ints, "layers" a Model's layer list, "O" not
# mutated.

HOSTILE_DTYPES = [
    np.dtype(t)
    for t in (
        np.float16,
        np.float32,
        np.float64,
        np.int32,
        np.int64,
        np.uint8,
        np.int8,
        np.uint64,
        np.bool_,
        np.complex64,
        np.complex128,
        object,
        np.longlong,
        np.longdouble,
        ">f4",
        ">f8",
        ">i8",
        "V8",
        "M8[ns]",
        "U2",
        "S8",
        [("a", "<f8")],
        [("a", "<f4"), ("b", "<f4")],
        [("o", "O")],
    )
]


def convert(a, dt):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return a.astype(dt)
    except Exception:
        return np.zeros(a.shape, dt)


def relayout(rng, a, how):
    """The same values in another memory layout."""
    if max(a.shape, default=0) > 2**20:  # an empty array with a huge dimension
        return a.copy()
    if how == "strided" and a.ndim:
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1] + 1,), a.dtype)
        v = big[..., 1::2]
        v[...] = a
        return v
    if how == "fortran":
        return np.asfortranarray(a)
    if how == "reversed" and a.ndim:
        return a[::-1].copy()[::-1]
    if how == "misaligned" and a.dtype.itemsize > 1 and not a.dtype.hasobject:
        raw = np.zeros(a.nbytes + a.dtype.itemsize + 1, U8)
        v = raw[1 : 1 + a.nbytes].view(a.dtype).reshape(a.shape)
        v[...] = a
        return v
    if how == "readonly":
        v = a.copy()
        v.setflags(write=False)
        return v
    if how == "swapped" and a.dtype.itemsize > 1 and a.dtype.kind in "fiuc":
        return a.astype(a.dtype.newbyteorder())
    if how == "subclass":
        return a.copy().view(SubArray)
    if how == "broadcast":
        first = a.reshape(-1)[:1] if a.size else np.zeros(1, a.dtype)
        return np.broadcast_to(first.reshape(()), a.shape)
    return a.copy()


LAYOUTS = (
    "strided",
    "fortran",
    "reversed",
    "misaligned",
    "readonly",
    "swapped",
    "subclass",
    "broadcast",
)


def m_array_dtype(rng, a):
    dt = pick(rng, HOSTILE_DTYPES)
    return f"dtype={dt.str if dt.names is None else 'struct'}", convert(a, dt)


def m_array_ndim(rng, a):
    options = ["lead", "trail"]
    if a.ndim > 1:
        options.append("flat")
    if a.ndim >= 1 and a.shape[-1] > 0:
        options.append("drop")
    if a.size:
        options.append("0-d")
    how = pick(rng, options)
    if how == "lead":
        return "ndim+1", a[None].copy()
    if how == "trail":
        return "ndim+1", a.reshape(a.shape + (1,)).copy()
    if how == "flat":
        return "ndim=1", a.reshape(-1).copy()
    if how == "drop":
        return "ndim-1", a[..., 0].copy()
    return "ndim=0", np.array(a.reshape(-1)[0])


def m_array_shape(rng, a):
    if a.ndim == 0:
        return "ndim+1", a.reshape(1).copy()
    ax = int(rng.integers(a.ndim))
    how = pick(rng, ("grow", "shrink", "zero", "huge"))
    shape = list(a.shape)
    if how == "grow" or (how == "shrink" and shape[ax] == 0):
        shape[ax] += 1
    elif how == "shrink":
        shape[ax] -= 1
    elif how == "zero":
        shape[ax] = 0
    else:  # a dimension past INT_MAX, the array still empty
        shape[ax] = pick(rng, (2**31, 2**31 - 1, 2**40))
        if a.ndim == 1:
            return f"shape:{how}", np.empty((0, shape[0]), a.dtype)
        shape[(ax + 1) % a.ndim] = 0
    if math.prod(shape) * a.dtype.itemsize > 2**24:  # a huge dimension stays empty
        shape[int(np.argmin(shape))] = 0
    b = np.zeros(shape, a.dtype)
    common = tuple(slice(0, min(s, t)) for s, t in zip(a.shape, shape))
    if b.size:
        b[common] = a[common]
    return f"shape:{how}", b


def m_array_layout(rng, a):
    how = pick(rng, LAYOUTS)
    return f"layout={how}", relayout(rng, a, how)


def m_not_array(rng, a):
    options = [
        None,
        0,
        1.5,
        "x",
        tuple(a.reshape(-1)[:4].tolist()),
        b"\0" * 8,
        np.float64(1.0),
        object(),
        bytearray(16),
    ]
    if max(a.shape, default=0) <= 4096:
        options.append(a.tolist())
    if a.flags.c_contiguous and a.dtype.kind in "biufc":
        options.append(memoryview(a.copy()))
    v = pick(rng, options)
    return f"not-array={type(v).__name__}", v


def m_special_values(rng, a):
    if a.dtype.kind != "f" or not a.size:
        return m_array_layout(rng, a)
    b = a.copy()
    flat = b.reshape(-1)
    for _ in range(int(rng.integers(1, 4))):
        flat[rng.integers(flat.size)] = pick(rng, (np.nan, np.inf, -np.inf))
    return "nan/inf", b


def m_int_values(rng, a, values):
    """One entry of an integer array set to a hostile value (labels, index, idx codes)."""
    if not a.size or a.dtype.kind not in "iu":
        return m_array_dtype(rng, a)
    b = a.copy()
    v = pick(rng, values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b.reshape(-1)[rng.integers(b.size)] = np.array(v).astype(b.dtype)
    return f"value={v}", b


BAD_LABELS = (-1, 2, 3, 1000000, 2**31, 2**62, 2**63 - 1, -(2**63))
BAD_CODES = (4, 5, 128, 255)

ARRAY_MUTATORS = {
    "F": [
        (3, m_array_dtype),
        (2, m_array_ndim),
        (3, m_array_shape),
        (4, m_array_layout),
        (2, m_not_array),
        (2, m_special_values),
    ],
    "Fq": [
        (3, m_array_dtype),
        (2, m_array_ndim),
        (3, m_array_shape),
        (4, m_array_layout),
        (2, m_not_array),
    ],  # floats that must stay finite (x of a conv model)
    "L": [
        (3, m_array_dtype),
        (1, m_array_ndim),
        (2, m_array_shape),
        (2, m_array_layout),
        (1, m_not_array),
        (4, lambda rng, a: m_int_values(rng, a, BAD_LABELS)),
    ],
    "I": [
        (3, m_array_dtype),
        (1, m_array_ndim),
        (2, m_array_shape),
        (2, m_array_layout),
        (1, m_not_array),
        (3, lambda rng, a: m_int_values(rng, a, BAD_LABELS)),
    ],
    "U": [
        (3, m_array_dtype),
        (1, m_array_ndim),
        (2, m_array_shape),
        (3, m_array_layout),
        (1, m_not_array),
        (2, lambda rng, a: m_int_values(rng, a, BAD_CODES)),
    ],
    "A": [
        (3, m_array_dtype),
        (1, m_array_ndim),
        (2, m_array_shape),
        (3, m_array_layout),
        (1, m_not_array),
    ],
}

BAD_FLOATS = [
    math.nan,
    math.inf,
    -math.inf,
    -1.0,
    0.0,
    1e308,
    5e-324,
    2**63,
    2**1100,
    "1.0",
    None,
    1j,
    [1.0],
    np.float32(0.5),
    True,
    np.float32("nan"),
]
BAD_INTS = [
    -1,
    0,
    1,
    2**31 - 1,
    2**31,
    -(2**31) - 1,
    2**63 - 1,
    2**63,
    -(2**63),
    2**64,
    1.0,
    "1",
    None,
    True,
    np.int64(1),
    np.uint64(2**63),
    [1],
]
BAD_BOOLS = [None, 0, 2, "yes", "", np.bool_(True), np.array([1, 2]), 1.5]
BAD_STRS = [
    "",
    "softmax",
    "SOFTMAX_XENT",
    "softmax_xent\0",
    None,
    b"softmax_xent",
    1,
    "\udcff",
    "native ",
    "ring\0",
]
BAD_SIZES = [
    [],
    [5],
    None,
    "12",
    [2, 0],
    [3, -1],
    [2**31, 2],
    [2**63, 2],
    [1.5, 2],
    [2, "3"],
    [[2], 3],
    [3] * 20,
    [2**32, 2**32],
    [2**62, 4],
    [1, 2**40],
]


def m_sizes(rng, v):
    if not isinstance(v, (list, tuple)) or not v or rng.random() < 0.6:
        return pick(rng, BAD_SIZES)
    out = list(v)
    out[int(rng.integers(len(out)))] = pick(rng, BAD_INTS)
    return out


# Layer specs a Model refuses (or takes: a NumPy integer size, a bool, an array of names), and
# whole lists that are no list of specs.
BAD_LAYER_SPECS = [
    None,
    3,
    1.5,
    "",
    "foo",
    "RELU",
    "relu\0",
    "dense\0junk",
    "\udcff",
    b"relu",
    (),
    [],
    ("dense",),
    ("dense", 0),
    ("dense", -1),
    ("dense", 2**31),
    ("dense", 2**63),
    ("dense", 2**31 - 1),
    ("dense", 2.0),
    ("dense", "3"),
    ("dense", None),
    ("dense", True),
    ("dense", np.int64(3)),
    ("dense", np.uint64(2**63)),
    ("dense", 1, 1),
    ("DENSE", 3),
    (3, "dense"),
    {"dense": 3},
    ("conv", 2),
    ("conv", 2, 3, -1),
    ("conv", 2, 3, 1, 1),
    ("conv", 0, 3),
    ("conv", 2, 0),
    ("conv", 2, 2**31 - 1),
    ("conv", 2**31 - 1, 1),
    ("conv", 1, 1, 2**30),
    ("conv", 1, 1, 2**29),
    ("conv", 2, 3, 2**31),
    ("relu", 1),
    ("maxpool2", 2),
    ("maxpool2",),
    "maxpool2",
    "flatten",
    ("flatten",),
    "gelu",
    np.array(["relu"]),
    ["tanh"],
    ("sigmoid",),
    object(),
]


def object_layers():
    """An object array of layer specs (its items appear in no returned plan: the reference
    count probe watches them)."""
    a = np.empty(2, object)
    a[0], a[1] = "tanh", ("dense", 3)
    return a


BAD_LAYER_LISTS = [
    None,
    "relu",
    b"relu",
    (),
    [],
    {"dense": 3},
    3,
    iter([("dense", 2)]),
    [("dense", 2)] * 65,
    ["relu"] * 64,
    ["relu", "flatten"],
    object_layers(),
    [("dense", 2**31 - 1)] * 3,
]


def m_layers(rng, v):
    """A layer list made hostile: an entry replaced, added or removed, the list made longer
    than the engine takes, or something else in its place."""
    if not isinstance(v, list) or rng.random() < 0.15:
        return pick(rng, BAD_LAYER_LISTS)
    out = list(v)
    how = pick(rng, ("replace", "replace", "insert", "delete", "tuple", "long"))
    i = int(rng.integers(len(out) + 1))
    if how == "replace" and out:
        out[min(i, len(out) - 1)] = pick(rng, BAD_LAYER_SPECS)
    elif how == "insert":
        out.insert(i, pick(rng, BAD_LAYER_SPECS[-12:] + [("conv", 2, 3), ("dense", 3), "maxpool2"]))
    elif how == "delete" and out:
        del out[min(i, len(out) - 1)]
    elif how == "tuple":
        return tuple(out)
    else:  # DP_MODEL_MAX_LAYERS layers (taken) or one more (not)
        out += ["relu"] * (pick(rng, (64, 65)) - len(out))
    return out


def uninitialized(cls):
    return cls.__new__(cls)


SCALAR_MUTATORS = {
    "f": lambda rng, v: pick(rng, BAD_FLOATS),
    "f?": lambda rng, v: pick(rng, BAD_FLOATS),
    "i": lambda rng, v: pick(rng, BAD_INTS),
    "i?": lambda rng, v: pick(rng, BAD_INTS),
    "b": lambda rng, v: pick(rng, BAD_BOOLS),
    "s": lambda rng, v: pick(rng, BAD_STRS),
    "ctx": lambda rng, v: pick(rng, (None, "ctx", 1, uninitialized(core.Context), object())),
    "sizes": lambda rng, v: m_sizes(rng, v),
    "layers": lambda rng, v: m_layers(rng, v),
}


# =======================================================================================
# a call: its arguments, its oracle, and the mutations that made it hostile


@dataclass
class Arg:
    name: str
    value: object
    kind: str = "O"
    keyword: bool = False  # passed as name=value
    output: bool = False  # written by the callee
    omit: bool = False  # left out of the call


@dataclass
class Expect:
    """What the oracle expects of an accepted call (the outputs are the oracle's copies)."""

    ret: object = None  # the return value (None: must return None)
    ret_check: object = None  # or ret_check(actual) -> message or None
    ret_scale: float = 0.0  # tolerance scale of a float return value
    rtol: float = 0.0  # 0: from the dtype of the outputs (float64's if none)
    scale: dict = field(default_factory=dict)  # output name -> tolerance scale
    exact: bool = False  # outputs must agree bit for bit (NaN == NaN)
    held: dict = field(default_factory=dict)  # held array name -> expected contents
    held_scale: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # anything a scenario needs afterwards


class Refuse(Exception):
    """Raised by an oracle: the contract refuses these arguments."""


class CaseOver(Exception):
    """Raised by Fuzz.run after a wrong result: the rest of the case would only report its
    consequences (and the memory may be corrupt), so the case ends there."""


@dataclass
class Call:
    label: str  # the public name: "gemm", "Model.loss_grad", ...
    fn: object
    args: list
    oracle: object  # oracle(before, *args, **kwargs) -> Expect; raises: refuses
    held: dict = field(default_factory=dict)  # arrays the callee may write, not arguments
    extra_pos: list = field(default_factory=list)
    extra_kw: dict = field(default_factory=dict)
    tags: list = field(default_factory=list)  # mutations and state notes, for grouping
    allowed: tuple = ALLOWED_ERRORS
    writes_on_error: bool = False  # a failed call may have written (collectives)
    expect_error: object = None  # check(exc) -> message, for a known refusal
    thread: str = ""

    def bind(self, values):
        pos = [v for a, v in zip(self.args, values) if not a.omit and not a.keyword]
        kw = {a.name: v for a, v in zip(self.args, values) if not a.omit and a.keyword}
        kw.update(self.extra_kw)
        return pos + list(self.extra_pos), kw

    def arg(self, name):
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(name)


def mutate_arg(rng, call):
    """One argument replaced by a hostile value of its kind."""
    candidates = [a for a in call.args if a.kind != "O" and not a.omit]
    if not candidates:
        return mutate_structure(rng, call)
    a = pick(rng, candidates)
    v = a.value
    if a.kind in ARRAY_MUTATORS and isinstance(v, np.ndarray):
        ws, fns = zip(*ARRAY_MUTATORS[a.kind])
        tag, a.value = pick(rng, fns, ws)(rng, v)
    elif a.kind == "FL" and isinstance(v, (list, tuple)):
        how = pick(rng, ("item", "item", "empty", "many", "tuple", "2-D", "None"))
        if how == "item" and v:
            i = int(rng.integers(len(v)))
            ws, fns = zip(*ARRAY_MUTATORS["F"])
            tag, item = (
                pick(rng, fns, ws)(rng, v[i]) if isinstance(v[i], np.ndarray) else ("x", None)
            )
            a.value = list(v[:i]) + [item] + list(v[i + 1 :])
            tag = f"[{i}]:{tag}"
        elif how == "empty":
            tag, a.value = "empty", []
        elif how == "many":
            tag, a.value = "1025 arrays", [v[0] if v else np.zeros(1)] * 1025
        elif how == "tuple":
            tag, a.value = "tuple", tuple(v)
        elif how == "2-D" and v and isinstance(v[0], np.ndarray):
            tag, a.value = (
                "2-D array",
                np.stack([np.asarray(x) for x in v])
                if len({np.shape(x) for x in v}) == 1
                else np.zeros((2, 3)),
            )
        else:
            tag, a.value = "with None", list(v) + [None]
    elif a.kind in SCALAR_MUTATORS:
        a.value = SCALAR_MUTATORS[a.kind](rng, v)
        tag = f"={value_class(a.value)}"
    else:
        return mutate_structure(rng, call)
    call.tags.append(f"{a.name}:{tag}")


def array_slots(call):
    """(arg index, item index or None) of every array argument that can share a buffer."""
    slots = []
    for i, a in enumerate(call.args):
        if a.omit:
            continue
        items = (
            [(None, a.value)]
            if isinstance(a.value, np.ndarray)
            else (
                list(enumerate(a.value))
                if a.kind == "FL" and isinstance(a.value, (list, tuple))
                else []
            )
        )
        for j, v in items:
            if isinstance(v, np.ndarray) and v.nbytes and not v.dtype.hasobject:
                slots.append((i, j))
    return slots


def slot_get(call, slot):
    i, j = slot
    v = call.args[i].value
    return v if j is None else v[j]


def slot_set(call, slot, new):
    i, j = slot
    if j is None:
        call.args[i].value = new
    else:
        items = list(call.args[i].value)
        items[j] = new
        call.args[i].value = items


def slot_name(call, slot):
    i, j = slot
    return call.args[i].name + ("" if j is None else f"[{j}]")


def mutate_alias(rng, call):
    """Two array arguments made to share memory: the same array, one inside the other, or a
    partial overlap, cut from one buffer (across dtypes: labels inside dlogits, ...)."""
    slots = array_slots(call)
    if len(slots) < 2:
        return mutate_arg(rng, call)
    outs = [s for s in slots if call.args[s[0]].output]
    sa = pick(rng, outs) if outs and rng.random() < 0.7 else pick(rng, slots)
    sb = pick(rng, [s for s in slots if s != sa])
    a, b = slot_get(call, sa), slot_get(call, sb)
    mode = pick(rng, ("same", "inside", "partial"), (1, 2, 3))
    if mode == "same":
        slot_set(call, sb, a)
    else:
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        step = max(a.dtype.itemsize, b.dtype.itemsize, 8)
        if mode == "inside":
            outer, inner = (a, b) if a.nbytes >= b.nbytes else (b, a)
            room = (outer.nbytes - inner.nbytes) // step
            off_outer, off_inner = 0, step * int(rng.integers(room + 1))
            size = outer.nbytes
        else:
            overlap = step * int(rng.integers(1, max(1, min(a.nbytes, b.nbytes) // step) + 1))
            outer, inner = a, b
            off_outer, off_inner = 0, max(0, a.nbytes - overlap) // step * step
            size = max(off_inner + b.nbytes, a.nbytes)
        raw = aligned_bytes(size + step)
        vo = raw[off_outer : off_outer + outer.nbytes].view(outer.dtype).reshape(outer.shape)
        vi = raw[off_inner : off_inner + inner.nbytes].view(inner.dtype).reshape(inner.shape)
        vo[...] = outer
        vi[...] = inner  # the inner array keeps its values (valid labels, index)
        new_a, new_b = (vo, vi) if outer is a else (vi, vo)
        slot_set(call, sa, new_a)
        slot_set(call, sb, new_b)
    call.tags.append(f"alias:{slot_name(call, sa)}~{slot_name(call, sb)}:{mode}")


def mutate_structure(rng, call):
    """A missing argument, an extra one, an unknown keyword, a keyword passed by position."""
    how = pick(rng, ("omit", "extra", "unknown-kw", "flip"))
    live = [a for a in call.args if not a.omit]
    if how == "omit" and live:
        a = pick(rng, live)
        a.omit = True
        call.tags.append(f"omit:{a.name}")
    elif how == "flip" and live:
        a = pick(rng, live)
        a.keyword = not a.keyword
        call.tags.append(f"{'kw' if a.keyword else 'pos'}:{a.name}")
    elif how == "unknown-kw":
        call.extra_kw["bogus"] = 1
        call.tags.append("kw:bogus")
    else:
        call.extra_pos.append(np.zeros(2))
        call.tags.append("extra-positional")


MUTATIONS = [(6, mutate_arg), (2, mutate_alias), (1, mutate_structure)]


def mutate(rng, call, n):
    ws, fns = zip(*MUTATIONS)
    for _ in range(n):
        pick(rng, fns, ws)(rng, call)
    return call


def hostile_count(rng, p):
    """0 mutations with probability 1 - p, else 1 to 3."""
    return 0 if rng.random() >= p else int(rng.choice([1, 1, 1, 2, 2, 3]))


# =======================================================================================
# describing values (the log line of a call)


def value_class(v):
    """A hostile scalar's class, for grouping failures: nan, inf, int<0, int>=2**31, str, ..."""
    if isinstance(v, (float, np.floating)):
        return "nan" if v != v else "inf" if abs(v) == math.inf else "float"
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        v = int(v)
        return "int<0" if v < 0 else "int>=2**31" if v >= 2**31 else "int"
    return type(v).__name__


def short(v, n=40):
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def describe(v, full=False):
    if isinstance(v, np.ndarray):
        dt = v.dtype.str if v.dtype.names is None else "struct"
        s = f"{dt}{list(v.shape)}"
        flags = [
            f
            for f, on in (
                ("noncontig", not v.flags.c_contiguous),
                ("misaligned", not v.flags.aligned),
                ("readonly", not v.flags.writeable),
                (type(v).__name__, type(v) is not np.ndarray),
            )
            if on
        ]
        if v.base is not None and v.nbytes:
            flags.append(f"@{v.ctypes.data % 100000:05d}")
        s += ("{" + ",".join(flags) + "}") if flags else ""
        if full and v.size <= 64:
            s += "=" + np.array2string(v, threshold=64, precision=4).replace("\n", "")
        return s
    if isinstance(v, (list, tuple)) and any(isinstance(x, np.ndarray) for x in v):
        body = ", ".join(describe(x, full) for x in v[:6]) + (", ..." if len(v) > 6 else "")
        return ("[%s]" if isinstance(v, list) else "(%s)") % body
    if isinstance(v, (core.Context, core.Model, core.ShmGroup)):
        return f"<{type(v).__name__}#{id(v) % 10000:04d}>"
    return short(v, 200 if full else 60)


def describe_call(call, full=False):
    parts = []
    for a in call.args:
        if a.omit:
            continue
        d = describe(a.value, full)
        parts.append(f"{a.name}={d}" if a.keyword else d)
    parts += [describe(v, full) for v in call.extra_pos]
    parts += [f"{k}={describe(v, full)}" for k, v in call.extra_kw.items()]
    return f"{call.label}({', '.join(parts)})"


# =======================================================================================
# comparing results


def copy_value(v):
    """A copy that keeps what the contract looks at: dtype (byte order too), shape, the
    address modulo 64 and writeability (an oracle writing into a read-only copy refuses)."""
    if isinstance(v, np.ndarray):
        if v.dtype.hasobject:
            c = np.array(v, copy=True, subok=False)
        else:
            off = v.__array_interface__["data"][0] % 64
            c = aligned_bytes(v.nbytes + 64)[off : off + v.nbytes].view(v.dtype).reshape(v.shape)
            c[...] = v
        if not v.flags.writeable:
            c.setflags(write=False)
        return c
    if isinstance(v, list):
        return [copy_value(x) for x in v]
    if isinstance(v, tuple):
        return tuple(copy_value(x) for x in v)
    return v


def arrays_in(v):
    if isinstance(v, np.ndarray):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, np.ndarray)]
    return []


def same_bytes(a, b):
    try:
        return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    except Exception:
        return False


def compare(name, actual, expected, rtol, scale=None, exact=False):
    """None, or a message naming the first element that disagrees."""
    if not isinstance(actual, np.ndarray):
        return f"{name} is a {type(actual).__name__}, expected an array"
    if actual.shape != expected.shape:
        return f"{name} has shape {actual.shape}, expected {expected.shape}"
    if expected.dtype.hasobject or expected.dtype.kind not in "fc":
        if same_bytes(np.ascontiguousarray(actual), np.ascontiguousarray(expected)):
            return None
        a, e = actual.reshape(-1), expected.reshape(-1)
        bad = [
            i
            for i in range(a.size)
            if not (a[i] is e[i] or (not expected.dtype.hasobject and a[i] == e[i]))
        ]
        i = bad[0] if bad else 0
        idx = np.unravel_index(i, actual.shape) if actual.ndim else ()
        return f"{name}{list(idx)} is {short(a[i])}, expected {short(e[i])} ({len(bad)} differ)"
    a = actual.astype(np.complex128 if expected.dtype.kind == "c" else np.float64)
    e = expected.astype(a.dtype)
    with np.errstate(all="ignore"):
        nan_a, nan_e = np.isnan(a), np.isnan(e)
        if exact:
            ok = (a == e) | (nan_a & nan_e)
        else:
            s = np.zeros(()) if scale is None else np.abs(np.asarray(scale, np.float64))
            s = np.where(np.isfinite(s), s, np.inf)
            tiny = np.finfo(expected.dtype).tiny if expected.dtype.kind in "fc" else 0.0
            tol = rtol * (np.abs(np.where(np.isfinite(e), e, 0)) + s) + 4 * tiny  # subnormals
            finite = np.isfinite(e)
            ok = np.where(
                finite, np.isfinite(a) & (np.abs(a - e) <= tol), (a == e) | (nan_a & nan_e)
            )
    if ok.all():
        return None
    bad = np.flatnonzero(~ok.reshape(-1))
    i = int(bad[0])
    idx = [int(j) for j in np.unravel_index(i, a.shape)] if a.ndim else []
    only = not (np.isfinite(a.reshape(-1)[bad]) & np.isfinite(e.reshape(-1)[bad])).any()
    return (
        f"{'NaN/inf only: ' if only else ''}{name}{idx} is {a.reshape(-1)[i]!r}, expected "
        f"{e.reshape(-1)[i]!r} ({bad.size} of {a.size} differ)"
    )


def compare_float(name, actual, expected, rtol, scale=0.0):
    if not isinstance(actual, float):
        return f"{name} is {short(actual)}, expected a float"
    return compare(name, np.array(actual), np.array(expected), rtol, scale)


def compare_int(name, actual, expected):
    if type(actual) is not int or actual != expected:
        return f"{name} is {short(actual)}, expected {expected!r}"
    return None


def check_ctx(ctx):
    """The contract: ctx is None or an initialized Context."""
    if ctx is not None and not (isinstance(ctx, core.Context) and ctx.threads > 0):
        raise Refuse(f"ctx must be a Context or None, got {type(ctx).__name__}")


def rtol_of(*arrays):
    for a in arrays:
        if isinstance(a, np.ndarray) and a.dtype in RTOL:
            return RTOL[a.dtype]
    return RTOL[F64]


# =======================================================================================
# running one call: log it, make it, judge it


def signature(category, tags):
    """What groups failures: the category and the mutations/state, without the numbers."""
    norm = sorted({re.sub(r"@\d+|\[\d+\]", "", t) for t in tags})
    return clean(f"{category} [{' '.join(norm)}]")


def clean(text):
    return str(text).replace("\t", " ").replace("\n", " ")[:2000]


def object_probe(values):
    """The distinct objects held by the object arrays among values, with their refcounts."""
    objs = {}
    for v in values:
        for a in arrays_in(v):
            if a.dtype == object:
                for o in a.reshape(-1):
                    objs[id(o)] = o
    return list(objs.values())


def occurrences(arrays):
    c = collections.Counter()
    for a in arrays:
        if isinstance(a, np.ndarray) and a.dtype == object:
            c.update(id(o) for o in a.reshape(-1))
    return c


@dataclass
class Outcome:
    status: str  # "A" accepted, "R" rejected, "W" wrong, "E" bad exception
    ret: object = None
    exc: object = None
    expect: object = None

    @property
    def accepted(self):
        """The call returned (whatever the verdict on its result)."""
        return self.exc is None


def differs(what, message):
    return f"{what} differs{' (NaN/inf only)' if message.startswith('NaN/inf only') else ''}"


class Fuzz:
    """The child's side: makes the calls of one case after another and logs every one."""

    def __init__(self, out, seed, verbose=False):
        self.out = out
        self.seed = seed
        self.verbose = verbose
        self.case = -1
        self.calls = 0
        self.next_id = 0
        self.lock = threading.Lock()
        self.raise_errors = False
        self.poisoned = False  # a wrong result was seen: memory may be corrupt

    # -- the log ------------------------------------------------------------------------
    def write(self, line, flush=False):
        with self.lock:
            self.out.write(line + "\n")
            if flush:
                self.out.flush()

    def setup(self, text):
        """A step that is not a call of _core (re-typing an array, building inputs)."""
        self.write(f"S\t{self.case}\t{clean(text)}", flush=True)

    def wrong(self, label, category, detail, tags=()):
        """A failure found by a check that spans calls (a collective's result, ...)."""
        sig = signature(category, tags)
        self.poisoned = True
        self.write(f"F\t{self.case}\t{label}\t{sig}\t{clean(detail)}", flush=True)
        raise CaseOver(category)

    # -- a call ---------------------------------------------------------------------------
    def run(self, call):
        values = [a.value for a in call.args]
        snaps = [copy_value(v) for v in values]
        held_before = {k: v.copy() for k, v in call.held.items()}
        probe = object_probe(values)
        with self.lock:
            cid = self.next_id
            self.next_id += 1
            self.calls += 1
        self.write(
            f"C\t{cid}\t{self.case}\t{call.label}\t{call.thread}\t"
            f"{clean(describe_call(call, self.verbose))}",
            flush=True,
        )
        pos, kw = call.bind(values)
        counts = [sys.getrefcount(o) for o in probe]
        ret = exc = None
        try:
            ret = call.fn(*pos, **kw)
        except BaseException as e:  # judged below; a KeyboardInterrupt still stops the run
            if isinstance(e, KeyboardInterrupt):
                raise
            exc = e
        counts_after = [sys.getrefcount(o) for o in probe]
        del pos, kw
        if exc is not None:
            status, category, detail = self.judge_error(call, exc, values, snaps, held_before)
            expect = None
        else:
            status, category, detail, expect = self.judge_return(
                call, ret, values, snaps, held_before, probe, counts, counts_after
            )
        sig = signature(category, call.tags) if status in "WE" else ""
        self.poisoned |= status in "WE"
        self.write(f"R\t{cid}\t{status}\t{sig}\t{clean(detail)}", flush=True)
        if self.verbose:
            print(f"    -> {status} {category} {detail}"[:800], file=sys.stderr)
        if status in "WE":
            raise CaseOver(category)
        return Outcome(status, ret=ret, exc=exc, expect=expect)

    def judge_error(self, call, e, values, snaps, held_before):
        msg = f"{type(e).__name__}: {e}"
        if not isinstance(e, call.allowed):
            return "E", f"raised {type(e).__name__}", msg
        if not str(e).strip():
            return "E", f"{type(e).__name__} with an empty message", msg
        if call.expect_error is not None:
            bad = call.expect_error(e)
            if bad:
                return "W", "wrong exception", f"{bad}; got {msg}"
        if not call.writes_on_error:
            for a, v, s in zip(call.args, values, snaps):
                for x, y in zip(arrays_in(v), arrays_in(s)):
                    if not same_bytes(np.array(x, copy=True, subok=False), y):
                        return "W", f"refused, but wrote {a.name}", msg
            for k, before in held_before.items():
                if not same_bytes(call.held[k], before):
                    return "W", f"refused, but wrote the held {k}", msg
        return "R", "", msg

    def judge_return(self, call, ret, values, snaps, held_before, probe, counts, counts_after):
        copies = [copy_value(s) for s in snaps]
        pos, kw = call.bind(copies)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                before = {k: v.copy() for k, v in held_before.items()}
                before["args"] = {a.name: v for a, v in zip(call.args, values)}  # the originals
                exp = call.oracle(before, *pos, **kw)
        except Exception as e:  # the reference (or the contract) refuses these arguments
            why = re.sub(r"-?\d+", "N", str(e))[:70]
            return (
                "W",
                f"accepted, but the reference refuses: {why}",
                f"{type(e).__name__}: {e}",
                None,
            )
        outputs = [i for i, a in enumerate(call.args) if a.output and not a.omit]
        rtol = exp.rtol or rtol_of(*[copies[i] for i in outputs], *call.held.values(), *copies)
        problems = []
        for i in outputs:
            for j, (act, want) in enumerate(zip(arrays_in(values[i]), arrays_in(copies[i]))):
                name = call.args[i].name + (
                    f"[{j}]" if isinstance(values[i], (list, tuple)) else ""
                )
                scale = exp.scale.get(call.args[i].name, 0.0)
                if scale is None:  # the oracle cannot tell (an overflowing sum)
                    continue
                p = compare(name, act, want, rtol, scale, exp.exact)
                if p:
                    problems.append((differs("output", p), p))
        for k, act in call.held.items():
            want = exp.held.get(k, held_before[k])
            scale = exp.held_scale.get(k, 0.0)
            if scale is None:
                continue
            p = compare(f"held {k}", act, want, rtol, scale, k not in exp.held)
            if p:
                problems.append(
                    (differs(f"held {k}", p) if k in exp.held else f"held {k} changed", p)
                )
        p = self.check_return(exp, ret, rtol)
        if p:
            problems.append(("return value differs", p))
        written = [x for i in outputs for x in arrays_in(values[i])]
        for i, a in enumerate(call.args):
            if a.output or a.omit:
                continue
            for x, s in zip(arrays_in(values[i]), arrays_in(snaps[i])):
                if any(x is w or np.may_share_memory(x, w) for w in written):
                    continue
                if not same_bytes(np.array(x, copy=True, subok=False), s):
                    problems.append(("input modified", f"{a.name} was modified"))
        if probe:
            p = self.check_refcounts(call, probe, counts, counts_after, values, snaps, outputs)
            if p:
                problems.append(("reference counts wrong", p))
        if problems:
            return "W", problems[0][0], "; ".join(p for _, p in problems[:3]), exp
        return "A", "", "", exp

    @staticmethod
    def check_return(exp, ret, rtol):
        if exp.ret_check is not None:
            return exp.ret_check(ret)
        if exp.ret is None:
            return None if ret is None else f"returned {short(ret)}, expected None"
        if isinstance(exp.ret, float):
            return compare_float("return value", ret, exp.ret, rtol, exp.ret_scale)
        if isinstance(exp.ret, int):
            return compare_int("return value", ret, exp.ret)
        return None if ret == exp.ret else f"returned {short(ret)}, expected {short(exp.ret)}"

    @staticmethod
    def check_refcounts(call, probe, counts, counts_after, values, snaps, outputs):
        """Every reference an object array gained or lost shows in its objects' counts; a
        miscount is repaired (so the process survives to report it) and reported."""
        before = occurrences([x for i in outputs for x in arrays_in(snaps[i])])
        after = occurrences([x for i in outputs for x in arrays_in(values[i])])
        bad = []
        for o, c0, c1 in zip(probe, counts, counts_after):
            want = after[id(o)] - before[id(o)]
            if c1 - c0 != want:
                bad.append(f"{o!r}: {c1 - c0:+d} references, expected {want:+d}")
                fix = want - (c1 - c0)
                for _ in range(abs(fix)):
                    (ctypes.pythonapi.Py_IncRef if fix > 0 else ctypes.pythonapi.Py_DecRef)(
                        ctypes.py_object(o)
                    )
        return f"{len(bad)} objects: " + "; ".join(bad[:3]) if bad else None


# =======================================================================================
# module functions: a builder of a valid call and an oracle with the function's signature
# (the oracle gets `before`, the held arrays, first; it runs on copies, writes the expected
# outputs into them, and returns an Expect; raising means the contract refuses the call)


def new_context(fz, threads, bf16=False):
    gi = "bfloat16" if bf16 else None
    fz.setup(f"ctx = Context(threads={threads}, gemm_inputs={gi!r})")
    return core.Context(threads=threads, gemm_inputs=gi)


def ctx_arg(rng, fz):
    if rng.random() < 0.6:
        return Arg("ctx", None, "ctx", keyword=True, omit=rng.random() < 0.5)
    return Arg("ctx", new_context(fz, int(rng.integers(1, 4))), "ctx", keyword=True)


def absolute(v):
    """|v| for the tolerance scales (a linear kernel run on |inputs| bounds its rounding)."""
    return np.abs(v) if isinstance(v, np.ndarray) else abs(v)


ALPHAS = (1.0, 0.0, -0.5, 2.5, 1e-3)
BETAS = (0.0, 1.0, 0.5, -2.0)


def build_gemm(rng, fz, label, fn):
    dt, style = pick_dtype(rng), pick_style(rng)
    m, n, k = dim(rng), dim(rng), dim(rng)
    if rng.random() < 0.05:
        m, n, k = 96, 100, 40  # enough work for a Context's threads
    ta, tb = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
    return Call(
        label,
        fn,
        [
            Arg("a", draw(rng, (k, m) if ta else (m, k), dt, style), "F"),
            Arg("b", draw(rng, (n, k) if tb else (k, n), dt, style), "F"),
            Arg("c", draw(rng, (m, n), dt, pick_style(rng)), "F", output=True),
            Arg("trans_a", ta, "b", keyword=True, omit=not ta and rng.random() < 0.5),
            Arg("trans_b", tb, "b", keyword=True, omit=not tb and rng.random() < 0.5),
            Arg("alpha", pick(rng, ALPHAS), "f", keyword=True),
            Arg("beta", pick(rng, BETAS), "f", keyword=True),
            ctx_arg(rng, fz),
        ],
        oracle_gemm,
    )


def oracle_gemm(before, a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, ctx=None):
    check_ctx(ctx)
    c0 = c.copy()
    ref.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    k = a.shape[0] if trans_a else a.shape[1]
    if c.dtype.type(alpha) == 0 or k == 0:
        # the contract (BLAS): alpha == 0 never reads a or b; an empty product is no product
        # (not alpha * 0, which is NaN for an alpha that overflows to inf in float32)
        c[...] = 0 if beta == 0 else c.dtype.type(beta) * c0
    scale = np.abs(c0)
    ref.gemm(
        np.abs(a),
        np.abs(b),
        scale,
        trans_a=trans_a,
        trans_b=trans_b,
        alpha=abs(alpha),
        beta=abs(beta),
    )
    return Expect(scale={"c": scale})


def build_dense_forward(rng, fz):
    dt, style = pick_dtype(rng), pick_style(rng)
    b_, i_, o_ = dim(rng), dim(rng), dim(rng)
    return Call(
        "dense_forward",
        core.dense_forward,
        [
            Arg("x", draw(rng, (b_, i_), dt, style), "F"),
            Arg("w", draw(rng, (o_, i_), dt, style), "F"),
            Arg("b", draw(rng, (o_,), dt, style), "F"),
            Arg("y", draw(rng, (b_, o_), dt), "F", output=True),
            ctx_arg(rng, fz),
        ],
        oracle_dense_forward,
    )


def oracle_dense_forward(before, x, w, b, y, *, ctx=None):
    check_ctx(ctx)
    ref.dense_forward(x, w, b, y)
    scale = np.empty_like(y)
    ref.dense_forward(np.abs(x), np.abs(w), np.abs(b), scale)
    return Expect(scale={"y": scale})


def build_dense_backward(rng, fz):
    dt, style = pick_dtype(rng), pick_style(rng)
    b_, i_, o_ = dim(rng), dim(rng), dim(rng)
    with_dx = rng.random() < 0.7
    return Call(
        "dense_backward",
        core.dense_backward,
        [
            Arg("dy", draw(rng, (b_, o_), dt, style), "F"),
            Arg("x", draw(rng, (b_, i_), dt, style), "F"),
            Arg("w", draw(rng, (o_, i_), dt, style), "F"),
            Arg("dw", draw(rng, (o_, i_), dt), "F", output=True),
            Arg("db", draw(rng, (o_,), dt), "F", output=True),
            Arg(
                "dx",
                draw(rng, (b_, i_), dt) if with_dx else None,
                "F",
                output=True,
                omit=not with_dx and rng.random() < 0.5,
            ),
            ctx_arg(rng, fz),
        ],
        oracle_dense_backward,
    )


def oracle_dense_backward(before, dy, x, w, dw, db, dx=None, *, ctx=None):
    check_ctx(ctx)
    sdw, sdb = np.abs(dw), np.abs(db)
    ref.dense_backward(dy, x, w, dw, db, dx)
    sdx = None if dx is None else np.empty_like(dx)
    ref.dense_backward(np.abs(dy), np.abs(x), np.abs(w), sdw, sdb, sdx)
    return Expect(scale={"dw": sdw, "db": sdb, "dx": sdx})


def any_shape(rng):
    return tuple(dim(rng) for _ in range(int(rng.integers(0, 4))))


def build_relu_forward(rng, fz):
    dt, shape = pick_dtype(rng), any_shape(rng)
    x = draw(rng, shape, dt, pick_style(rng))
    y = x if rng.random() < 0.3 else draw(rng, shape, dt)
    return Call(
        "relu_forward",
        core.relu_forward,
        [Arg("x", x, "F"), Arg("y", y, "F", output=True)],
        oracle_relu_forward,
    )


def oracle_relu_forward(before, x, y):
    ref.relu_forward(x, y)
    return Expect(exact=True)


def build_relu_backward(rng, fz):
    dt, shape = pick_dtype(rng), any_shape(rng)
    dy = draw(rng, shape, dt, pick_style(rng))
    y = np.maximum(draw(rng, shape, dt, pick_style(rng)), 0)
    dx = dy if rng.random() < 0.3 else draw(rng, shape, dt)
    return Call(
        "relu_backward",
        core.relu_backward,
        [Arg("dy", dy, "F"), Arg("y", y, "F"), Arg("dx", dx, "F", output=True)],
        oracle_relu_backward,
    )


def oracle_relu_backward(before, dy, y, dx):
    ref.relu_backward(dy, y, dx)
    return Expect(exact=True)


def grad_scale_arg(rng, batch):
    v = pick(rng, (None, None, 0.5, 1.0 / max(batch, 1), -1.0, 0.0, 3.0))
    return Arg(
        "grad_scale", v, "f?", keyword=rng.random() < 0.5, omit=v is None and rng.random() < 0.5
    )


def loss_scale(logits, classes):
    """Tolerance scale of a loss sum: its terms are of the size of the logits."""
    if not logits.size:
        return 0.0
    z = np.abs(np.where(np.isfinite(logits), logits, 0)).reshape(len(logits), -1)
    return float(np.sum(z.max(axis=1, initial=0) + math.log(max(classes, 2)) + 1))


def build_loss(rng, fz, label, fn, binary):
    dt, b_ = pick_dtype(rng), dim(rng)
    c_ = 1 if binary else dim(rng, lo=1)
    shape = (b_,) if binary and rng.random() < 0.5 else (b_, c_)
    logits = draw(rng, shape, dt, pick_style(rng))
    how = pick(rng, ("none", "array", "in-place"), (3, 5, 1))
    dlogits = None if how == "none" else logits if how == "in-place" else draw(rng, shape, dt)
    return Call(
        label,
        fn,
        [
            Arg("logits", logits, "F"),
            Arg("labels", labels_for(rng, b_, 2 if binary else c_), "L"),
            Arg("dlogits", dlogits, "F", output=True, omit=how == "none" and rng.random() < 0.5),
            grad_scale_arg(rng, b_),
        ],
        oracle_sigmoid_bce if binary else oracle_softmax_xent,
    )


def loss_expect(logits, dlogits, grad_scale, loss, classes):
    b_ = len(logits)
    gs = abs(1.0 / b_ if grad_scale is None else float(grad_scale)) if b_ else 0.0
    return Expect(
        ret=loss, ret_scale=loss_scale(logits, classes), rtol=rtol_of(logits), scale={"dlogits": gs}
    )


def oracle_softmax_xent(before, logits, labels, dlogits=None, grad_scale=None):
    loss = ref.softmax_xent(logits, labels, dlogits, grad_scale)
    return loss_expect(logits, dlogits, grad_scale, loss, logits.shape[1])


def oracle_sigmoid_bce(before, logits, labels, dlogits=None, grad_scale=None):
    loss = ref.sigmoid_bce(logits, labels, dlogits, grad_scale)
    return loss_expect(logits, dlogits, grad_scale, loss, 2)


def build_argmax(rng, fz):
    dt, b_, c_ = pick_dtype(rng), dim(rng), dim(rng, lo=1)
    return Call(
        "argmax",
        core.argmax,
        [
            Arg("x", draw(rng, (b_, c_), dt, pick(rng, ("quant", "special", "normal"))), "F"),
            Arg("out", np.full(b_, -7, np.int64), "I", output=True),
        ],
        oracle_argmax,
    )


def oracle_argmax(before, x, out):
    if not (isinstance(x, np.ndarray) and x.dtype in FLOATS):
        raise Refuse("x must be a float32 or float64 array")
    ref.argmax(x, out)
    return Expect(exact=True)


def build_count_correct(rng, fz):
    dt, b_ = pick_dtype(rng), dim(rng)
    form = pick(rng, ("(B,)", "(B, 1)", "(B, C)"))
    c_ = dim(rng, lo=2) if form == "(B, C)" else 1
    shape = (b_,) if form == "(B,)" else (b_, c_)
    return Call(
        "count_correct",
        core.count_correct,
        [
            Arg("logits", draw(rng, shape, dt, pick(rng, ("quant", "special", "normal"))), "F"),
            Arg("labels", labels_for(rng, b_, max(c_, 2)), "L"),
        ],
        oracle_count_correct,
    )


def oracle_count_correct(before, logits, labels):
    if not (isinstance(logits, np.ndarray) and logits.dtype in FLOATS):
        raise Refuse("logits must be a float32 or float64 array")
    return Expect(ret=ref.count_correct(logits, labels))


def build_sgd_step(rng, fz):
    dt, n = pick_dtype(rng), dim(rng)
    momentum = pick(rng, (0.0, 0.9, 0.5))
    dampening = pick(rng, (0.0, 0.0, 0.1))
    nesterov = bool(momentum > 0 and dampening == 0 and rng.random() < 0.4)
    velocity = draw(rng, (n,), dt) if momentum or rng.random() < 0.3 else None
    return Call(
        "sgd_step",
        core.sgd_step,
        [
            Arg("params", draw(rng, (n,), dt, pick_style(rng)), "F", output=True),
            Arg("grads", draw(rng, (n,), dt, pick_style(rng)), "F"),
            Arg("velocity", velocity, "F", output=True),
            Arg("lr", pick(rng, (0.1, 0.0, 1.0, 1e-3)), "f", keyword=True),
            Arg("momentum", momentum, "f", keyword=True, omit=momentum == 0 and rng.random() < 0.5),
            Arg("dampening", dampening, "f", keyword=True),
            Arg("weight_decay", pick(rng, (0.0, 1e-2, 0.5)), "f", keyword=True),
            Arg("nesterov", nesterov, "b", keyword=True),
            Arg("first_step", bool(rng.random() < 0.3), "b", keyword=True),
        ],
        oracle_sgd_step,
    )


def oracle_sgd_step(
    before,
    params,
    grads,
    velocity,
    *,
    lr,
    momentum=0.0,
    dampening=0.0,
    weight_decay=0.0,
    nesterov=False,
    first_step=False,
):
    # the contract: velocity is neither read nor written when momentum == 0 (any value then)
    v = velocity if momentum != 0 else None
    p0 = np.abs(params)
    v0 = np.abs(v) if isinstance(v, np.ndarray) else 0.0
    ref.sgd_step(
        params,
        grads,
        v,
        lr=lr,
        momentum=momentum,
        dampening=dampening,
        weight_decay=weight_decay,
        nesterov=nesterov,
        first_step=first_step,
    )
    d = np.abs(grads) + abs(weight_decay) * p0
    sv = d if first_step else abs(momentum) * v0 + abs(1 - dampening) * d
    # with momentum == 0 velocity is no output: whatever it is (params itself) is not checked
    return Expect(
        scale={
            "params": p0 + abs(lr) * (d + abs(momentum) * sv),
            "velocity": sv if momentum != 0 else None,
        }
    )


def build_adam_step(rng, fz):
    dt, n = pick_dtype(rng), dim(rng)
    amsgrad = bool(rng.random() < 0.4)
    v = np.abs(draw(rng, (n,), dt, pick_style(rng)))
    vmax = v + np.abs(draw(rng, (n,), dt)) if amsgrad or rng.random() < 0.3 else None
    return Call(
        "adam_step",
        core.adam_step,
        [
            Arg("params", draw(rng, (n,), dt, pick_style(rng)), "F", output=True),
            Arg("grads", draw(rng, (n,), dt, pick_style(rng)), "F"),
            Arg("exp_avg", draw(rng, (n,), dt), "F", output=True),
            Arg("exp_avg_sq", v, "F", output=True),
            Arg("max_exp_avg_sq", vmax, "F", output=True),
            Arg("step", int(pick(rng, (1, 2, 10, 1000))), "i", keyword=True),
            Arg("lr", pick(rng, (1e-3, 0.1, 0.0, 1.0)), "f", keyword=True),
            Arg("beta1", pick(rng, (0.9, 0.0, 0.5)), "f", keyword=True, omit=rng.random() < 0.5),
            Arg("beta2", pick(rng, (0.999, 0.0, 0.9)), "f", keyword=True, omit=rng.random() < 0.5),
            Arg("eps", pick(rng, (1e-8, 0.0, 0.1)), "f", keyword=True, omit=rng.random() < 0.5),
            Arg("weight_decay", pick(rng, (0.0, 1e-2, 0.5)), "f", keyword=True),
            Arg("amsgrad", amsgrad, "b", keyword=True, omit=not amsgrad and rng.random() < 0.5),
            Arg("decoupled", bool(rng.random() < 0.5), "b", keyword=True),
        ],
        oracle_adam_step,
    )


def build_rmsprop_step(rng, fz):
    dt, n = pick_dtype(rng), dim(rng)
    centered = bool(rng.random() < 0.4)
    momentum = float(pick(rng, (0.0, 0.9, 0.5)))
    sq = np.abs(draw(rng, (n,), dt, pick_style(rng)))
    gavg = draw(rng, (n,), dt) if centered or rng.random() < 0.3 else None
    buf = draw(rng, (n,), dt) if momentum > 0 or rng.random() < 0.3 else None
    return Call(
        "rmsprop_step",
        core.rmsprop_step,
        [
            Arg("params", draw(rng, (n,), dt, pick_style(rng)), "F", output=True),
            Arg("grads", draw(rng, (n,), dt, pick_style(rng)), "F"),
            Arg("square_avg", sq, "F", output=True),
            Arg("grad_avg", gavg, "F", output=True),
            Arg("momentum_buffer", buf, "F", output=True),
            Arg("lr", pick(rng, (1e-3, 0.1, 0.0, 1.0)), "f", keyword=True),
            Arg(
                "alpha",
                pick(rng, (0.99, 0.0, 0.5, 1.0)),
                "f",
                keyword=True,
                omit=rng.random() < 0.5,
            ),
            # centered with eps 0: where the variance cancels, the step is g / 0 or g / its
            # rounding residue (inf or a huge finite number): no contract to check there
            Arg(
                "eps",
                pick(rng, (1e-8, 0.1) if centered else (1e-8, 0.0, 0.1)),
                "f",
                keyword=True,
                omit=rng.random() < 0.5,
            ),
            Arg("weight_decay", pick(rng, (0.0, 1e-2, 0.5)), "f", keyword=True),
            Arg("momentum", momentum, "f", keyword=True, omit=momentum == 0 and rng.random() < 0.5),
            Arg("centered", centered, "b", keyword=True, omit=not centered and rng.random() < 0.5),
        ],
        oracle_rmsprop_step,
    )


def oracle_rmsprop_step(
    before,
    params,
    grads,
    square_avg,
    grad_avg,
    momentum_buffer,
    *,
    lr,
    centered=False,
    momentum=0.0,
    **kw,
):
    # the contract: grad_avg is used only when centered, momentum_buffer only with momentum
    gavg = grad_avg if centered else None
    buf = momentum_buffer if momentum > 0 else None
    p0, s0 = params.copy(), np.abs(square_avg)
    ga0 = np.abs(gavg) if centered else None
    b0 = np.abs(buf) if buf is not None else None
    ref.rmsprop_step(
        params, grads, square_avg, gavg, buf, lr=lr, centered=centered, momentum=momentum, **kw
    )
    g = np.abs(grads) + abs(kw.get("weight_decay", 0.0)) * np.abs(p0)
    with np.errstate(all="ignore"):
        # the update is a ratio of rounded values: a few ulps of its size, plus p's
        update = np.abs(params - p0)
        step = np.abs(buf) if buf is not None else None
        if centered:
            # the variance sq - gavg^2 is known to a few ulps of sq + gavg^2 (delta: how the
            # kernel rounds it, with or without FMA); where it is small, that decides the
            # denominator sqrt(var) + eps, and g / denominator lies between its values at
            # var - delta and var + delta: the difference of those two is the bound (between
            # g / eps and nothing where the variance cancels; the scale is in ulps of it)
            fi = np.finfo(params.dtype)
            var = square_avg - gavg * gavg
            delta = 8 * fi.eps * (square_avg + gavg * gavg)
            e = abs(kw.get("eps", 1e-8))
            low = np.sqrt(np.maximum(var - delta, 0)) + e + fi.tiny
            high = np.sqrt(np.maximum(var + delta, 0)) + e + fi.tiny
            worst = (g / low - g / high) / fi.eps
            update = update + abs(lr) * worst
            if step is not None:
                step = step + worst
    return Expect(
        scale={
            "params": np.abs(p0) + 8 * update,
            "square_avg": s0 + g * g,
            "grad_avg": ga0 + g if centered else None,
            "momentum_buffer": b0 + 8 * step if buf is not None else None,
        }
    )


def oracle_adam_step(
    before, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, *, step, lr, amsgrad=False, **kw
):
    # the contract: max_exp_avg_sq is neither read nor written without amsgrad (any value then)
    vmax = max_exp_avg_sq if amsgrad else None
    p0, m0, v0 = params.copy(), np.abs(exp_avg), np.abs(exp_avg_sq)
    vmax0 = np.abs(vmax) if amsgrad else None
    ref.adam_step(params, grads, exp_avg, exp_avg_sq, vmax, step=step, lr=lr, amsgrad=amsgrad, **kw)
    g = np.abs(grads) + abs(kw.get("weight_decay", 0.0)) * np.abs(p0)
    with np.errstate(all="ignore"):
        # the update is a ratio of rounded values: a few ulps of its size, plus p's
        update = np.abs(params - p0)
    return Expect(
        scale={
            "params": np.abs(p0) + 8 * update,
            "exp_avg": m0 + g,
            "exp_avg_sq": v0 + g * g,
            "max_exp_avg_sq": vmax0 + v0 + g * g if amsgrad else None,
        }
    )


def range_args(rng, n):
    start = int(rng.integers(0, n + 1)) if rng.random() < 0.5 else None
    stop = int(rng.integers(start or 0, n + 1)) if rng.random() < 0.5 else None
    return [
        Arg("start", start, "i?", keyword=True, omit=start is None and rng.random() < 0.7),
        Arg("stop", stop, "i?", keyword=True, omit=stop is None and rng.random() < 0.7),
    ]


def build_sum_buffers(rng, fz):
    dt, n, k = pick_dtype(rng), dim(rng), int(rng.integers(1, 5))
    if rng.random() < 0.05:
        n = 5000  # past one 2048-element chunk of the kernel
    if rng.random() < 0.2:  # bfloat16 buffers (uint16 bits): the bf16 exchange's sum
        inputs = [bf16_bits(draw(rng, (n,), F32, pick_style(rng))) for _ in range(k)]
        out = inputs[int(rng.integers(k))] if rng.random() < 0.3 else np.zeros(n, np.uint16)
        return Call(
            "sum_buffers",
            core.sum_buffers,
            [
                Arg("out", out, "A", output=True),
                Arg("inputs", inputs, "FL"),
                Arg("scale", pick(rng, (1.0, 0.5, -2.0)), "f", keyword=True),
            ]
            + range_args(rng, n),
            oracle_sum_buffers,
        )
    inputs = [draw(rng, (n,), dt, pick_style(rng)) for _ in range(k)]
    out = inputs[int(rng.integers(k))] if rng.random() < 0.3 else draw(rng, (n,), dt)
    return Call(
        "sum_buffers",
        core.sum_buffers,
        [
            Arg("out", out, "F", output=True),
            Arg("inputs", inputs, "FL"),
            Arg("scale", pick(rng, (1.0, 0.5, -2.0)), "f", keyword=True),
        ]
        + range_args(rng, n),
        oracle_sum_buffers,
    )


def oracle_sum_buffers(before, out, inputs, *, scale=1.0, start=0, stop=None):
    start = 0 if start is None else start  # C reads start=None as the default 0
    if isinstance(out, np.ndarray) and out.dtype == np.uint16:
        return oracle_sum_bf16(before, out, inputs, scale, start, stop)
    out0 = np.abs(out)
    ref.sum_buffers(out, inputs, scale=scale, start=start, stop=stop)
    ref.sum_buffers(out0, [np.abs(a) for a in inputs], scale=abs(scale), start=start, stop=stop)
    return Expect(scale={"out": out0})


def bf16_bits(x):
    """float32 -> the bits (uint16) of its nearest bfloat16: reference.to_bf16's."""
    out = np.empty(np.shape(x), np.uint16)
    ref.to_bf16(np.asarray(x, F32), out)
    return out


def build_to_bf16(rng, fz):
    shape = any_shape(rng)
    x = draw(rng, shape, F32, pick_style(rng))
    return Call(
        "to_bf16",
        core.to_bf16,
        [Arg("x", x, "A"), Arg("out", np.zeros(shape, np.uint16), "A", output=True)],
        oracle_to_bf16,
    )


def check_bf16_pair(before, x, x_dt, out, out_dt):
    """to_bf16 / from_bf16's contract: C-contiguous x of x_dt, writeable out of out_dt and x's
    shape, not overlapping."""
    for name, a, dt, w in (("x", x, x_dt, False), ("out", out, out_dt, True)):
        if not (
            isinstance(a, np.ndarray)
            and a.dtype == dt
            and a.flags.c_contiguous
            and a.flags.aligned
            and (a.flags.writeable or not w)
        ):
            raise Refuse(f"{name} must be a C-contiguous {dt} array")
    if out.shape != x.shape or np.may_share_memory(before["args"]["x"], before["args"]["out"]):
        raise Refuse("out must be x's shape and not overlap it")


def oracle_to_bf16(before, x, out):
    check_bf16_pair(before, x, F32, out, np.dtype(np.uint16))
    ref.to_bf16(x, out)
    return Expect(exact=True)


def build_from_bf16(rng, fz):
    shape = any_shape(rng)
    x = bf16_bits(draw(rng, shape, F32, pick_style(rng)))
    return Call(
        "from_bf16",
        core.from_bf16,
        [Arg("x", x, "A"), Arg("out", np.zeros(shape, F32), "A", output=True)],
        oracle_from_bf16,
    )


def oracle_from_bf16(before, x, out):
    check_bf16_pair(before, x, np.dtype(np.uint16), out, F32)
    ref.from_bf16(x, out)
    return Expect(exact=True)


def oracle_sum_bf16(before, out, inputs, scale, start, stop):
    """uint16 out and inputs hold bfloat16 (reference.sum_buffers: the float32 sum in input
    order, scaled, rounded), after the C boundary's own rules."""
    if not (out.ndim == 1 and out.flags.c_contiguous and out.flags.aligned and out.flags.writeable):
        raise Refuse("out must be a writeable 1-D C-contiguous array")
    try:
        inputs = list(inputs)  # any sequence (a 2-D array is one of its rows)
    except TypeError:
        raise Refuse("inputs must be a sequence") from None
    if not 1 <= len(inputs) <= 64:
        raise Refuse("inputs must hold 1 to 64 arrays")
    orig_out = before["args"]["out"]
    for i, a in enumerate(inputs):
        if not (
            isinstance(a, np.ndarray)
            and a.dtype == np.uint16
            and a.shape == out.shape
            and a.flags.c_contiguous
            and a.flags.aligned
        ):
            raise Refuse(f"inputs[{i}] must be a uint16 array like out")
        orig = before["args"]["inputs"][i]
        if orig.ctypes.data != orig_out.ctypes.data and np.may_share_memory(orig, orig_out):
            raise Refuse(f"inputs[{i}] partly overlaps out")  # (out may BE an input)
    n = out.size
    lo, hi, _ = slice(start, stop).indices(n)
    if (
        not (isinstance(start, int) and 0 <= start <= n)
        or (stop is not None and not 0 <= stop <= n)
        or lo > hi
    ):
        raise Refuse("start/stop must be 0 <= start <= stop <= n")
    ref.sum_buffers(out, inputs, scale=scale, start=lo, stop=hi)
    return Expect(exact=True)


def build_scale(rng, fz):
    dt, n = pick_dtype(rng), dim(rng)
    return Call(
        "scale_",
        core.scale_,
        [
            Arg("buf", draw(rng, (n,), dt, pick_style(rng)), "F", output=True),
            Arg("alpha", pick(rng, (0.5, -1.0, 0.0, 3.0)), "f"),
        ]
        + range_args(rng, n),
        oracle_scale,
    )


def oracle_scale(before, buf, alpha, *, start=0, stop=None):
    start = 0 if start is None else start
    ref.scale_(buf, alpha, start=start, stop=stop)
    return Expect(scale={"buf": np.abs(buf)})


def build_augment_images(rng, fz):
    dt = pick_dtype(rng)
    c, h, w = (int(pick(rng, v)) for v in ((1, 3, 2), (1, 5, 8, 28), (1, 4, 7, 28)))
    n = int(pick(rng, (0, 1, 3, 17)))
    pad = int(pick(rng, (0, 1, 2, 4)))
    return Call(
        "augment_images",
        core.augment_images,
        [
            Arg("x", draw(rng, (n, c * h * w), dt, pick_style(rng)), "F"),
            Arg("out", draw(rng, (n, c * h * w), dt), "F", output=True),
            Arg("ids", rng.integers(-(2**62), 2**62, n), "I"),
            Arg("shape", (c, h, w), "O", keyword=True),
            Arg("pad", pad, "i", keyword=True),
            Arg("flip", bool(rng.random() < 0.5), "b", keyword=True),
            Arg("seed", int(rng.integers(0, 2**63)), "O", keyword=True),
            Arg("epoch", int(pick(rng, (0, 1, 99))), "O", keyword=True),
        ],
        oracle_augment_images,
    )


def oracle_augment_images(before, x, out, ids, *, shape, pad, flip, seed, epoch):
    if pad >= min(shape[1:]):
        raise Refuse("pad not smaller than the image")
    ref.augment_images(x, out, ids, shape=shape, pad=pad, flip=flip, seed=seed, epoch=epoch)
    return Expect(exact=True)  # a copy: the same bits, NaN where x has one


def build_sum_squares(rng, fz):
    dt, n = pick_dtype(rng), dim(rng)
    return Call(
        "sum_squares",
        core.sum_squares,
        [Arg("x", draw(rng, (n,), dt, pick_style(rng)), "F")],
        oracle_sum_squares,
    )


def oracle_sum_squares(before, x):
    # the contract: the reference's lanes and order, so float32 gives the same bits; a
    # float64 square may be fused with its add where the build has FMA (an ulp of the sum)
    want = ref.sum_squares(x)
    if x.dtype == np.float32:
        return Expect(ret=want, exact=True)
    with np.errstate(all="ignore"):
        return Expect(ret=want, ret_scale=float(np.sum(x.astype(np.float64) ** 2)))


GATHER_DTYPES = [
    np.dtype(t)
    for t in (
        np.float32,
        np.float64,
        np.int64,
        np.uint8,
        np.bool_,
        np.complex64,
        [("a", "<f8"), ("b", "<i4")],
        object,
    )
]


def build_gather_rows(rng, fz):
    dt = pick(rng, GATHER_DTYPES, (3, 3, 2, 1, 1, 1, 1, 2))
    shape = (dim(rng),) + tuple(dim(rng, lo=1) for _ in range(int(rng.integers(0, 3))))
    rows, n = shape[0], dim(rng) if shape[0] else 0
    if dt is object:
        x, out = object_array(rng, shape), object_array(rng, (n,) + shape[1:])
    else:
        x = convert(draw(rng, shape, F64, "quant") * 4, dt)
        out = np.zeros((n,) + shape[1:], dt)
    index = rng.integers(0, max(rows, 1), size=n).astype(np.int64)
    return Call(
        "gather_rows",
        core.gather_rows,
        [Arg("x", x, "A"), Arg("index", index, "I"), Arg("out", out, "A", output=True)],
        oracle_gather_rows,
    )


def oracle_gather_rows(before, x, index, out):
    """The contract (docs/core_api.md, no twin in dptrain.reference): out[i] = x[index[i]]."""
    for name, a in (("x", x), ("index", index), ("out", out)):
        if not isinstance(a, np.ndarray):
            raise Refuse(f"{name} must be an array")
    if index.dtype != I64 or index.ndim != 1:
        raise Refuse("index must be 1-D int64")
    if x.ndim < 1 or x.dtype != out.dtype:
        raise Refuse("x must have a row axis and out its dtype")
    if out.shape != (len(index),) + x.shape[1:] or not out.flags.writeable:
        raise Refuse("out must be writeable, (len(index),) + x.shape[1:]")
    if index.size and (index.min() < 0 or index.max() >= x.shape[0]):
        raise Refuse("index out of range")
    out[...] = x[index]
    return Expect(exact=True)


def build_zero(rng, fz):
    return Call(
        "zero_",
        core.zero_,
        [Arg("buf", draw(rng, any_shape(rng), pick_dtype(rng), pick_style(rng)), "F", output=True)],
        oracle_zero,
    )


def oracle_zero(before, buf):
    if not (isinstance(buf, np.ndarray) and buf.dtype in FLOATS and buf.flags.writeable):
        raise Refuse("buf must be a writeable float32 or float64 array")
    buf[...] = 0
    return Expect(exact=True)


def conv_dims(rng):
    """(B, C, H, W, OC, KH, KW, P) with the kernel inside the padded image."""
    p = pick(rng, (0, 0, 1, 2))
    h, w = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    kh, kw = (
        int(rng.integers(1, min(h + 2 * p, 4) + 1)),
        int(rng.integers(1, min(w + 2 * p, 4) + 1)),
    )
    return (
        pick(rng, (0, 1, 1, 2, 3)),
        int(rng.integers(1, 4)),
        h,
        w,
        int(rng.integers(1, 4)),
        kh,
        kw,
        p,
    )


def build_conv_forward(rng, fz, label, fn, naive):
    dt, style = pick_dtype(rng), pick_style(rng)
    b_, c_, h, w, oc, kh, kw, p = conv_dims(rng)
    args = [
        Arg("x", draw(rng, (b_, c_, h, w), dt, style), "F"),
        Arg("w", draw(rng, (oc, c_, kh, kw), dt, style), "F"),
        Arg("b", draw(rng, (oc,), dt, style), "F"),
        Arg("y", draw(rng, (b_, oc, h + 2 * p - kh + 1, w + 2 * p - kw + 1), dt), "F", output=True),
        Arg("padding", p, "i", keyword=True, omit=p == 0 and rng.random() < 0.5),
    ]
    if not naive:
        args.append(ctx_arg(rng, fz))
    return Call(label, fn, args, oracle_conv2d_forward_naive if naive else oracle_conv2d_forward)


def oracle_conv2d_forward(before, x, w, b, y, *, padding=0, ctx=None):
    check_ctx(ctx)
    return oracle_conv2d_forward_naive(before, x, w, b, y, padding=padding)


def oracle_conv2d_forward_naive(before, x, w, b, y, *, padding=0):
    ref.conv2d_forward(x, w, b, y, padding=padding)
    scale = np.empty_like(y)
    ref.conv2d_forward(np.abs(x), np.abs(w), np.abs(b), scale, padding=padding)
    return Expect(scale={"y": scale})


def build_conv_backward(rng, fz, label, fn, naive):
    dt, style = pick_dtype(rng), pick_style(rng)
    b_, c_, h, w, oc, kh, kw, p = conv_dims(rng)
    with_dx = rng.random() < 0.7
    args = [
        Arg("dy", draw(rng, (b_, oc, h + 2 * p - kh + 1, w + 2 * p - kw + 1), dt, style), "F"),
        Arg("x", draw(rng, (b_, c_, h, w), dt, style), "F"),
        Arg("w", draw(rng, (oc, c_, kh, kw), dt, style), "F"),
        Arg("dw", draw(rng, (oc, c_, kh, kw), dt), "F", output=True),
        Arg("db", draw(rng, (oc,), dt), "F", output=True),
        Arg(
            "dx",
            draw(rng, (b_, c_, h, w), dt) if with_dx else None,
            "F",
            output=True,
            omit=not with_dx and rng.random() < 0.5,
        ),
        Arg("padding", p, "i", keyword=True, omit=p == 0 and rng.random() < 0.5),
    ]
    if not naive:
        args.append(ctx_arg(rng, fz))
    return Call(label, fn, args, oracle_conv2d_backward_naive if naive else oracle_conv2d_backward)


def oracle_conv2d_backward(before, dy, x, w, dw, db, dx=None, *, padding=0, ctx=None):
    check_ctx(ctx)
    return oracle_conv2d_backward_naive(before, dy, x, w, dw, db, dx, padding=padding)


def oracle_conv2d_backward_naive(before, dy, x, w, dw, db, dx=None, *, padding=0):
    sdw, sdb = np.abs(dw), np.abs(db)
    ref.conv2d_backward(dy, x, w, dw, db, dx, padding=padding)
    sdx = None if dx is None else np.empty_like(dx)
    ref.conv2d_backward(np.abs(dy), np.abs(x), np.abs(w), sdw, sdb, sdx, padding=padding)
    return Expect(scale={"dw": sdw, "db": sdb, "dx": sdx})


def pool_dims(rng):
    return (
        pick(rng, (0, 1, 2, 3)),
        int(rng.integers(1, 4)),
        int(rng.integers(2, 8)),
        int(rng.integers(2, 8)),
    )


def build_maxpool_forward(rng, fz):
    dt = pick_dtype(rng)
    b_, c_, h, w = pool_dims(rng)
    return Call(
        "maxpool2_forward",
        core.maxpool2_forward,
        [
            Arg("x", draw(rng, (b_, c_, h, w), dt, pick(rng, ("quant", "special", "normal"))), "F"),
            Arg("y", draw(rng, (b_, c_, h // 2, w // 2), dt), "F", output=True),
            Arg("idx", np.full((b_, c_, h // 2, w // 2), 9, np.uint8), "U", output=True),
        ],
        oracle_maxpool2_forward,
    )


def oracle_maxpool2_forward(before, x, y, idx):
    ref.maxpool2_forward(x, y, idx)
    return Expect(exact=True)


def build_maxpool_backward(rng, fz):
    dt = pick_dtype(rng)
    b_, c_, h, w = pool_dims(rng)
    pooled = (b_, c_, h // 2, w // 2)
    return Call(
        "maxpool2_backward",
        core.maxpool2_backward,
        [
            Arg("dy", draw(rng, pooled, dt, pick_style(rng)), "F"),
            Arg("idx", rng.integers(0, 4, size=pooled).astype(np.uint8), "U"),
            Arg("dx", draw(rng, (b_, c_, h, w), dt), "F", output=True),
        ],
        oracle_maxpool2_backward,
    )


def oracle_maxpool2_backward(before, dy, idx, dx):
    ref.maxpool2_backward(dy, idx, dx)
    return Expect(exact=True)


BUILD_INFO_KEYS = {
    "isa",
    "isas_available",
    "simd",
    "compiler",
    "dtypes",
    "bfloat16_gemm",
    "bfloat16_dot_vs_fma",
    "bfloat16_amx",
    "bfloat16_amx_why",
    "threads",
    "openmp",
    "max_threads",
    "gemm_blocking_mr_nr_kc_mc_nc",
    "numpy_build_api",
}
ISA_NAMES = ("generic", "avx2", "avx512")


def build_build_info(rng, fz):
    return Call("build_info", core.build_info, [], oracle_build_info)


def oracle_build_info(before):
    def check(info):
        if not isinstance(info, dict) or set(info) != BUILD_INFO_KEYS:
            return (
                f"returned {short(info)}, expected a dict with the keys {sorted(BUILD_INFO_KEYS)}"
            )
        if info["max_threads"] != MAX_THREADS or info["dtypes"] != ("float32", "float64"):
            return f"returned {short(info, 200)}"
        if info["isas_available"] != cpu_isas() or info["isa"] not in info["isas_available"]:
            return f"isa {info['isa']!r} of {info['isas_available']!r}; this CPU has {cpu_isas()}"
        if info["bfloat16_amx"] is not (info["bfloat16_amx_why"] is None):
            return f"bfloat16_amx {info['bfloat16_amx']!r} with why {info['bfloat16_amx_why']!r}"
        if info["bfloat16_amx"] and not cpu_amx():
            return "bfloat16_amx is True on a CPU without AMX-BF16"
        return None

    return Expect(ret_check=check)


def cpu_isas():
    """The kernel ISAs this CPU has, from its flags (dp_cpu_has_isa's rule)."""
    f = core.cpu_features()
    avx2 = f["avx2"] and f["fma"]
    avx512 = avx2 and all(f[k] for k in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
    return ["generic"] + (["avx2"] if avx2 else []) + (["avx512"] if avx512 else [])


def build_isa(rng, fz):
    return Call("isa", core.isa, [], oracle_isa)


def oracle_isa(before):
    def check(ret):
        return None if ret in cpu_isas() else f"returned {ret!r}; this CPU has {cpu_isas()}"

    return Expect(ret_check=check)


def build_set_isa(rng, fz):
    """Every ISA name, 'widest', and names that are none; the kernel calls that follow run on
    whichever build it left selected, so the fuzzer covers every build this CPU has."""
    name = pick(
        rng, ISA_NAMES + ("widest", "widest", "AVX2", "avx512f", "", "sse", 2, None, b"avx2")
    )
    return Call("set_isa", core.set_isa, [Arg("isa", name, "s")], oracle_set_isa)


def oracle_set_isa(before, isa):
    if not isinstance(isa, str) or (isa not in ISA_NAMES and isa != "widest"):
        raise Refuse(f"isa {isa!r} is not an ISA name")
    if isa != "widest" and isa not in cpu_isas():
        raise Refuse(f"this CPU lacks {isa}")
    want = cpu_isas()[-1] if isa == "widest" else isa

    def check(ret):
        # (the previous ISA is not known here: the harness may ask the oracle after the call)
        if ret not in cpu_isas():
            return f"returned {ret!r}, not one of this CPU's isas {cpu_isas()}"
        if core.isa() != want:
            return f"isa() is {core.isa()!r} after set_isa({isa!r})"
        return None

    return Expect(ret_check=check)


def cpu_bf16():
    """The CPU side of dp_gemm_bf16_dot_available: AVX-512 (the four subsets) and AVX512_BF16."""
    return "avx512" in cpu_isas() and bool(core.cpu_features()["avx512_bf16"])


def cpu_amx():
    """The CPU side of dp_gemm_bf16_amx_available: AVX-512 with AVX512_BF16, and AMX-BF16."""
    return cpu_bf16() and bool(core.cpu_features()["amx_bf16"])


def amx_now(info):
    """build_info's bfloat16_gemm names the AMX path, and it may run: this process has it and
    the avx512 ISA is active."""
    amx = info["bfloat16_gemm"].startswith("AMX")
    if amx and not (info["bfloat16_amx"] and core.isa() == "avx512"):
        raise AssertionError(f"bfloat16_gemm is {info['bfloat16_gemm']!r} without AMX here")
    return amx


def bf16_dot_available():
    """The vdpbf16ps path exists: the CPU has it and the compiler had its intrinsics, which
    build_info shows as a measured ratio."""
    return core.build_info()["bfloat16_dot_vs_fma"] is not None


def build_set_bf16_dot(rng, fz):
    """True, False and None (auto), and objects that are none of them; True where the CPU
    lacks AVX512_BF16 is refused. The GEMMs with bfloat16 inputs that follow run on whichever
    path it left."""
    on = pick(rng, (True, False, None, None, 1, 0, "", "x", [1], np.bool_(True)))
    return Call("set_bf16_dot", core.set_bf16_dot, [Arg("on", on)], oracle_set_bf16_dot)


def oracle_set_bf16_dot(before, on):
    if on is not None and not isinstance(on, bool):
        raise Refuse(f"on is {type(on).__name__}, not True, False or None")
    if on is True and not bf16_dot_available():
        raise Refuse("this CPU lacks AVX512_BF16")

    def check(ret):
        if ret not in (True, False, None):
            return f"returned {ret!r}, not True, False or None"
        info = core.build_info()
        dot = info["bfloat16_gemm"].startswith("vdpbf16ps")
        ratio = info["bfloat16_dot_vs_fma"]
        if ratio is not None and not (cpu_bf16() and ratio >= 0):
            return f"bfloat16_dot_vs_fma is {ratio!r} on a CPU without AVX512_BF16"
        can = bf16_dot_available() and core.isa() == "avx512"
        want = can and (on is True or (on is None and ratio >= 1.2)) and not amx_now(info)
        if dot != want:
            return f"bfloat16_gemm is {info['bfloat16_gemm']!r} after set_bf16_dot({on!r})"
        return None

    return Expect(ret_check=check)


def build_set_bf16_amx(rng, fz):
    """True, False and None (auto), and objects that are none of them; True where this
    process cannot run AMX is refused."""
    on = pick(rng, (True, False, None, None, 1, 0, "", [1], np.bool_(True)))
    return Call("set_bf16_amx", core.set_bf16_amx, [Arg("on", on)], oracle_set_bf16_amx)


def oracle_set_bf16_amx(before, on):
    if on is not None and not isinstance(on, bool):
        raise Refuse(f"on is {type(on).__name__}, not True, False or None")
    if on is True and not core.build_info()["bfloat16_amx"]:
        raise Refuse("this process cannot run AMX")

    def check(ret):
        if ret not in (True, False, None):
            return f"returned {ret!r}, not True, False or None"
        info = core.build_info()
        want = info["bfloat16_amx"] and core.isa() == "avx512" and on is not False
        if amx_now(info) != want:
            return f"bfloat16_gemm is {info['bfloat16_gemm']!r} after set_bf16_amx({on!r})"
        return None

    return Expect(ret_check=check)


BARRIER_MAGIC = 0x64706272  # DP_BARRIER_MAGIC (csrc/dp_sync.h): the control block's word 5


def control_block(rng, fz, n=None, nbytes=64):
    """A 64-byte aligned control block, initialized for n workers unless n is None."""
    control = aligned_bytes(nbytes + 64)[:nbytes]
    if n is not None:
        fz.setup(f"init_group_control(control, {n})")
        core.init_group_control(control, n)
    return control


def valid_control(control):
    """The contract of a control block argument (docs/core_api.md)."""
    if not (
        isinstance(control, np.ndarray)
        and control.dtype == U8
        and control.ndim == 1
        and control.flags.c_contiguous
        and control.flags.writeable
        and control.size >= 64
        and control.ctypes.data % 64 == 0
    ):
        raise Refuse("control must be a writeable uint8 array of >= 64 bytes, 64-byte aligned")


def initialized_control(control):
    valid_control(control)
    if int(control[20:24].view(np.uint32)[0]) != BARRIER_MAGIC:
        raise Refuse("control is not initialized")


def abort_code(code):
    """The code an abort records: a 32-bit unsigned int, 0 meaning 1."""
    code = int(code.__index__())
    if not 0 <= code < 2**32:
        raise Refuse(f"code {code} is not an unsigned 32-bit int")
    return code or 1


def build_init_group_control(rng, fz):
    return Call(
        "init_group_control",
        core.init_group_control,
        [
            Arg(
                "control", control_block(rng, fz, nbytes=pick(rng, (64, 64, 100))), "U", output=True
            ),
            Arg("n", int(rng.integers(1, 5)), "i"),
        ],
        oracle_init_group_control,
    )


def oracle_init_group_control(before, control, n, /):
    """Writes the 64-byte barrier (csrc/dp_sync.h): zeros, then n (word 4) and the magic
    (word 5); zeros the arrival counters after it as far as group_control_bytes(n) reaches
    inside the array; nothing past that."""
    valid_control(control)
    if not 1 <= n.__index__() <= 1024:
        raise Refuse("n must be in [1, 1024]")
    control[: core.group_control_bytes(n.__index__())] = 0
    words = control[:64].view(np.uint32)
    words[:] = 0
    words[4], words[5] = n.__index__(), BARRIER_MAGIC
    return Expect(exact=True)


def build_abort_group_control(rng, fz):
    control = control_block(rng, fz, n=int(rng.integers(1, 5)))
    code = pick(rng, (None, 1, 0, 7, 2**32 - 1))
    return Call(
        "abort_group_control",
        core.abort_group_control,
        [Arg("control", control, "U", output=True), Arg("code", code, "i", omit=code is None)],
        oracle_abort_group_control,
    )


def oracle_abort_group_control(before, control, code=1, /):
    """The first abort's code goes into word 2; the generation (word 1) moves on."""
    initialized_control(control)
    code = abort_code(code)
    words = control[:64].view(np.uint32)
    if words[2] == 0:
        words[2] = code
    words[1] += np.uint32(1)
    return Expect(exact=True)


def build_watch_mapping(rng, fz):
    """A plain array's range watched for a SIGBUS (none comes: it maps no file), with a line;
    the table may be full (None), an entry is given back by unwatch_mapping's calls."""
    shape = tuple(dim(rng) for _ in range(int(rng.integers(0, 3))))
    text = pick(rng, ("", "dptrain: error: x.npy was truncated\n", "é" * 300, "y" * 767, "z" * 768))
    return Call(
        "watch_mapping",
        core.watch_mapping,
        [Arg("array", np.zeros(shape, pick(rng, (F32, F64, U8))), "A"), Arg("text", text, "s")],
        oracle_watch_mapping,
    )


def oracle_watch_mapping(before, array, text, /):
    """An ndarray and a str of at most 767 bytes in UTF-8: the entry (0..31), or None (an
    empty array, a full table)."""
    if not isinstance(array, np.ndarray):
        raise Refuse("array must be a numpy.ndarray")
    if not isinstance(text, str):
        raise Refuse("text must be a str")
    try:
        text = text.encode()
    except UnicodeEncodeError:
        raise Refuse("text must encode to UTF-8") from None
    if len(text) >= 768:
        raise Refuse("text must have at most 767 bytes")
    return Expect(
        ret_check=lambda r: (
            None
            if r is None or (type(r) is int and 0 <= r < 32)
            else f"returned {r!r}, not an entry in [0, 32) or None"
        )
    )


def build_unwatch_mapping(rng, fz):
    return Call(
        "unwatch_mapping",
        core.unwatch_mapping,
        [Arg("entry", int(rng.integers(-2, 34)), "i")],
        oracle_unwatch_mapping,
    )


def oracle_unwatch_mapping(before, entry, /):
    """An entry in [0, 32): an int, or anything with __index__ (a bool too)."""
    if isinstance(entry, float) or not hasattr(type(entry), "__index__"):
        raise Refuse("entry must be an int")
    i = operator.index(entry)
    if not 0 <= i < 32:
        raise Refuse(f"no watched mapping {i}")
    return Expect(ret=None)


def build_group_control_bytes(rng, fz):
    return Call(
        "group_control_bytes",
        core.group_control_bytes,
        [Arg("n", int(rng.integers(1, 1025)), "i")],
        oracle_group_control_bytes,
    )


def oracle_group_control_bytes(before, n, /):
    """The barrier (64 bytes) and a 4-byte arrival counter per worker, a 64-byte multiple."""
    try:
        n = int(n.__index__())
    except AttributeError:
        raise Refuse(f"n must be an int, got {type(n).__name__}") from None
    if not 1 <= n <= 1024:
        raise Refuse("n must be in [1, 1024]")
    return Expect(ret=-(-(64 + 4 * n) // 64) * 64)


CPU_FLAGS = (
    "avx",
    "fma",
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_vnni",
    "avx512_bf16",
)
AMX_FLAGS = ("amx_tile", "amx_bf16")


def build_cpu_features(rng, fz):
    return Call("cpu_features", core.cpu_features, [], oracle_cpu_features)


def oracle_cpu_features(before):
    def check(info):
        if not isinstance(info, dict) or not set(CPU_FLAGS) <= set(info):
            return f"returned {short(info)}, expected a dict with the flags {CPU_FLAGS}"
        if not all(isinstance(info[f], bool) for f in CPU_FLAGS):
            return f"returned non-boolean flags: {short(info, 200)}"
        if any(info[f] for f in CPU_FLAGS[4:]) and not info["avx512f"]:
            return f"an AVX-512 extension without avx512f: {short(info, 200)}"
        if not all(isinstance(info.get(f), bool) for f in AMX_FLAGS):
            return f"the AMX flags {AMX_FLAGS} are not booleans: {short(info, 200)}"
        if info["amx_bf16"] and not info["amx_tile"]:
            return f"amx_bf16 without amx_tile: {short(info, 200)}"
        if info.get("widest_fma") not in ("generic", "avx2", "avx512"):
            return f"widest_fma is {info.get('widest_fma')!r}"
        return None

    return Expect(ret_check=check)


def build_fma_peak(rng, fz):
    isa = pick(rng, ("widest", "generic", "avx2", "avx512"))
    dtype = pick(rng, ("float32", "float64"))
    seconds = float(pick(rng, (0.001, 0.002, 0.005)))  # short: the fuzzer calls it often
    return Call(
        "fma_peak",
        core.fma_peak,
        [
            Arg("isa", isa, "s", keyword=True),
            Arg("dtype", dtype, "s", keyword=True),
            Arg("seconds", seconds, "f", keyword=True),
        ],
        oracle_fma_peak,
    )


def oracle_fma_peak(before, isa="widest", dtype="float32", seconds=0.2):
    """GFLOP/s of one thread's FMA loop: positive and finite, for an ISA this CPU has."""
    have = {name: name in cpu_isas() for name in ISA_NAMES}
    if not isinstance(isa, str) or (isa not in have and isa != "widest"):
        raise Refuse(f"isa {isa!r} is not an ISA name")
    if isa != "widest" and not have[isa]:
        raise Refuse(f"this CPU lacks {isa}")
    if dtype is not None and dtype not in ("float32", "float64"):  # None: the default
        raise Refuse(f"dtype {dtype!r}")
    # a real number as the other kernels' scalars take it (__float__, so True and np.float32 too)
    if (
        isinstance(seconds, (str, bytes, complex))
        or not hasattr(seconds, "__float__")
        or not (0 < float(seconds) <= 60)
    ):
        raise Refuse(f"seconds {seconds!r}")

    def check(ret):
        if not isinstance(ret, float) or not (0 < ret < 1e5):
            return f"returned {ret!r}, expected a positive GFLOP/s figure"
        return None

    return Expect(ret_check=check)


MODEL_ACTS = ("relu", "tanh", "sigmoid", "gelu")


def model_config_bn(rng):
    """model_config with batch norms among its pieces (scenario_net alone: the running
    statistics a model's evaluate reads follow its calls, which threads would race)."""
    return model_config(rng, batchnorm=True)


def model_config(rng, batchnorm=False):
    """A random valid Model, small: {layers, input_shape, loss}. An image input gets conv
    pieces (the fused patterns conv+relu+maxpool2 and conv+maxpool2+act, and others), then
    maybe a flatten; dense pieces follow, flatten and activations anywhere, mostly a dense
    layer last; the loss fits the output width."""

    def act():
        return pick(rng, MODEL_ACTS)

    def conv():
        oc, k, pad = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(0, 2))
        if rng.random() < 0.2:
            return ("conv", oc, k, pad, int(rng.integers(2, 4)))
        return ("conv", oc, k, pad) if pad or rng.random() < 0.5 else ("conv", oc, k)

    def dropout():
        return ("dropout", pick(rng, (0.0, 0.25, 0.5, 0.9)))

    image_pieces = (
        lambda: [conv(), "relu", "maxpool2"],
        lambda: [conv(), "maxpool2", act()],
        lambda: [conv(), "maxpool2"],
        lambda: [conv(), act()],
        lambda: [conv()],
        lambda: ["maxpool2"],
        lambda: [act()],
        lambda: ["flatten"],
        lambda: ["avgpool2"],
        lambda: ["globalavgpool"],
        lambda: [dropout()],
        lambda: [("layernorm",)],
        lambda: ["res_begin", conv(), act(), "res_end"],
        lambda: ["res_begin", act(), "res_begin", conv(), "res_end", "res_end"],
    ) + ((lambda: [conv(), "batchnorm"], lambda: ["batchnorm", act()]) if batchnorm else ())
    flat_pieces = (
        lambda: [("dense", int(rng.integers(1, 9)))],
        lambda: [("dense", int(rng.integers(1, 9))), act()],
        lambda: [act()],
        lambda: ["flatten"],
        lambda: [dropout()],
        lambda: [("layernorm",)],
        lambda: ["res_begin", act(), ("layernorm",), "res_end"],
    ) + ((lambda: [("dense", int(rng.integers(1, 9))), "batchnorm"],) if batchnorm else ())
    while True:
        image = rng.random() < 0.6
        if image:
            shape = (int(rng.integers(1, 4)), int(rng.integers(2, 11)), int(rng.integers(2, 11)))
        else:
            shape = (pick(rng, (1, 2, 3, 7, 16)),)
        layers = []
        for _ in range(int(rng.integers(0, 4)) if image else 0):
            layers += pick(rng, image_pieces)()
        for _ in range(int(rng.integers(0, 3))):
            layers += pick(rng, flat_pieces)()
        out = int(rng.choice([1, 1, 2, 3, 5]))
        if rng.random() < 0.85 or not layers:
            layers.append(("dense", out))
        try:
            plan = ref.model_plan(layers, shape, "mse")
        except ValueError:
            continue
        width = math.prod(plan["shapes"][-1])
        loss = pick(
            rng, ("sigmoid_bce", "mse") if width == 1 else ("softmax_xent", "softmax_xent", "mse")
        )
        if plan["n_params"] <= 3000 and max(math.prod(s) for s in plan["shapes"]) <= 1500:
            return {"layers": layers, "input_shape": shape, "loss": loss}


def plan_problem(plan, want):
    """None, or what is wrong with model_plan()'s dict: the reference's dict (want) and the
    engine's stages, which must run every layer but the flattens once, in order, each stage
    at most one dense/conv layer, first."""
    if not isinstance(plan, dict):
        return f"returned {short(plan)}, expected a dict"
    got = dict(plan)
    stages = got.pop("stages", None)
    if got != want:
        return f"returned {short(got, 400)}, expected {short(want, 400)}"
    kinds = [spec[0] for spec in want["layers"]]
    try:
        ran = []
        for st in stages:
            assert isinstance(st, dict) and set(st) == {"ops", "layers"}
            run = [i for i in range(st["layers"][0], st["layers"][1] + 1) if kinds[i] != "flatten"]
            assert st["ops"] == "+".join(kinds[i] for i in run), st
            assert not any(kinds[i] in ("dense", "conv") for i in run[1:]), st
            ran += run
        assert ran == [i for i, k in enumerate(kinds) if k != "flatten"], ran
    except (AssertionError, TypeError, IndexError, KeyError, ValueError) as e:
        return f"stages {short(stages, 300)} do not run the layers {kinds} ({short(e, 100)})"
    return None


def refusal_agrees(call, only_tags=None):
    """An expect_error: the reference refuses the call's arguments too, and where it names the
    layer at fault (layers[i]), so does the message. With only_tags, checked only when every
    mutation of the call starts with one of them (the rest are refused by rules of the
    boundary that the oracle does not spell out: contiguity, alignment, ...)."""

    def check(exc):
        if only_tags and not all(t.startswith(only_tags) for t in call.tags):
            return None
        values = [copy_value(a.value) for a in call.args]
        pos, kw = call.bind(values)
        before = {"args": {a.name: a.value for a in call.args}}
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                call.oracle(before, *pos, **kw)
        except Exception as e:
            named = re.match(r"layers\[\d+\]", str(e))
            if named and named.group(0) not in str(exc):
                return (
                    f"the message names no {named.group(0)} (the reference: {short(str(e), 200)})"
                )
            return None
        return "refused, but the reference accepts"

    return check


def hostile_layers(rng, call, p):
    """With probability p, the call's layer list made hostile once or twice (beside the
    mutations every call may get, which spread over all of its arguments)."""
    if rng.random() < p:
        layers = call.arg("layers")
        for _ in range(int(rng.integers(1, 3))):
            layers.value = m_layers(rng, layers.value)
            call.tags.append(f"layers:{value_class(layers.value)}")


def build_model_plan(rng, fz):
    """The plan of a random layer list, or now and then of a dense stack of widths up to 49
    (what the retired param_count counted), its input shape a list, a tuple or an array."""
    cfg = model_config(rng) if rng.random() < 0.8 else dense_stack_config(rng, widths=(1, 50))
    omit_loss = cfg["loss"] == "softmax_xent" and rng.random() < 0.5
    shape = pick(rng, (list, tuple, np.array))(cfg["input_shape"])
    call = Call(
        "model_plan",
        core.model_plan,
        [
            Arg("layers", cfg["layers"], "layers"),
            Arg("input_shape", shape, "sizes"),
            Arg("loss", cfg["loss"], "s", keyword=rng.random() < 0.5, omit=omit_loss),
        ],
        oracle_model_plan,
    )
    hostile_layers(rng, call, 0.5)
    call.expect_error = refusal_agrees(call)
    return call


def oracle_model_plan(before, layers, input_shape, loss="softmax_xent"):
    want = ref.model_plan(layers, input_shape, loss)
    return Expect(ret_check=lambda plan: plan_problem(plan, want))


SPECS = {
    "gemm": lambda rng, fz: build_gemm(rng, fz, "gemm", core.gemm),
    "gemm_naive": lambda rng, fz: build_gemm(rng, fz, "gemm_naive", core.gemm_naive),
    "dense_forward": build_dense_forward,
    "dense_backward": build_dense_backward,
    "relu_forward": build_relu_forward,
    "relu_backward": build_relu_backward,
    "softmax_xent": lambda rng, fz: build_loss(rng, fz, "softmax_xent", core.softmax_xent, False),
    "sigmoid_bce": lambda rng, fz: build_loss(rng, fz, "sigmoid_bce", core.sigmoid_bce, True),
    "argmax": build_argmax,
    "count_correct": build_count_correct,
    "sgd_step": build_sgd_step,
    "adam_step": build_adam_step,
    "rmsprop_step": build_rmsprop_step,
    "sum_buffers": build_sum_buffers,
    "scale_": build_scale,
    "sum_squares": build_sum_squares,
    "augment_images": build_augment_images,
    "to_bf16": build_to_bf16,
    "from_bf16": build_from_bf16,
    "gather_rows": build_gather_rows,
    "zero_": build_zero,
    "conv2d_forward": lambda rng, fz: build_conv_forward(
        rng, fz, "conv2d_forward", core.conv2d_forward, False
    ),
    "conv2d_forward_naive": lambda rng, fz: build_conv_forward(
        rng, fz, "conv2d_forward_naive", core.conv2d_forward_naive, True
    ),
    "conv2d_backward": lambda rng, fz: build_conv_backward(
        rng, fz, "conv2d_backward", core.conv2d_backward, False
    ),
    "conv2d_backward_naive": lambda rng, fz: build_conv_backward(
        rng, fz, "conv2d_backward_naive", core.conv2d_backward_naive, True
    ),
    "maxpool2_forward": build_maxpool_forward,
    "maxpool2_backward": build_maxpool_backward,
    "model_plan": build_model_plan,
    "build_info": build_build_info,
    "isa": build_isa,
    "set_isa": build_set_isa,
    "set_bf16_dot": build_set_bf16_dot,
    "set_bf16_amx": build_set_bf16_amx,
    "init_group_control": build_init_group_control,
    "abort_group_control": build_abort_group_control,
    "group_control_bytes": build_group_control_bytes,
    "watch_mapping": build_watch_mapping,
    "unwatch_mapping": build_unwatch_mapping,
    "cpu_features": build_cpu_features,
    "fma_peak": build_fma_peak,
}


def function_case(name):
    def run(rng, fz):
        call = SPECS[name](rng, fz)
        fz.run(mutate(rng, call, hostile_count(rng, 0.6)))

    run.__name__ = f"function_case_{name}"
    return run


# =======================================================================================
# Model: a model of the object, its oracles, and random method sequences


def index_int(v, name):
    """An int as the C parser reads an "i" argument (bool and __index__ objects too)."""
    try:
        v = int(v.__index__())
    except AttributeError:
        raise Refuse(f"{name} must be an int, got {type(v).__name__}") from None
    if not -(2**31) <= v < 2**31:
        raise Refuse(f"{name} = {v} does not fit a C int")
    return v


def check_flat(before, params, grads, n):
    """params and grads of a Model: 1-D, one float dtype, n long, grads writeable,
    and (on the originals) no shared memory."""
    for name, a in (("params", params), ("grads", grads)):
        if not (isinstance(a, np.ndarray) and a.dtype in FLOATS and a.shape == (n,)):
            raise Refuse(f"{name} must be a 1-D float32/float64 array of {n}")
    if params.dtype != grads.dtype or not grads.flags.writeable:
        raise Refuse("grads must be writeable, of the dtype of params")
    orig = before["args"]
    if np.may_share_memory(orig["params"], orig["grads"]):
        raise Refuse("grads shares memory with params")


def check_threads(threads):
    if not 1 <= index_int(threads, "threads") <= MAX_THREADS:
        raise Refuse(f"threads must be in [1, {MAX_THREADS}]")


def check_gemm_inputs(gemm_inputs, dtype=None):
    """gemm_inputs of Context and Model: None, "bfloat16" (float32 params only), or the
    params' dtype name (any float name when there are no params: a Context). Returns the
    getter's value afterwards: "bfloat16" or None."""
    if gemm_inputs is None:
        return None
    if not isinstance(gemm_inputs, str):
        raise Refuse("gemm_inputs must be a str or None")
    if gemm_inputs == "bfloat16":
        if dtype is not None and dtype != F32:
            raise Refuse("gemm_inputs='bfloat16' needs float32 params")
        return "bfloat16"
    if gemm_inputs in ("float32", "float64") and (dtype is None or dtype.name == gemm_inputs):
        return None
    raise Refuse("gemm_inputs is not 'bfloat16' or the params' dtype")


def oracle_model(before, layers, input_shape, loss, params, grads, *, threads=1, gemm_inputs=None):
    check_flat(before, params, grads, ref.model_plan(layers, input_shape, loss)["n_params"])
    check_threads(threads)
    gi = check_gemm_inputs(gemm_inputs, params.dtype)

    def check(net):
        if not isinstance(net, core.Model):
            return "not a Model"
        return (
            None
            if net.gemm_inputs == gi
            else f"gemm_inputs is {net.gemm_inputs!r}, expected {gi!r}"
        )

    return Expect(ret_check=check)


@dataclass
class Sweep:
    """A backward sweep in progress: the batch of its forward_loss and the next layer."""

    x: np.ndarray
    labels: np.ndarray
    grad_scale: float
    next_layer: int
    grads: np.ndarray = None  # the whole gradient of the batch (computed when needed)
    rng: tuple = (0, 0, 0)  # dropout's key when forward_loss ran (set_rng's)


class NetModel:
    """What a Model must do, from dptrain.reference: its held arrays as viewed at construction
    (so re-typing them in place changes nothing the object may do), its layer list's
    model_plan, and, per thread, the backward sweep in progress (None) and whether that is
    certain. A Model with loss 'mse' takes (B, OUT) targets where the others take labels."""

    def __init__(self, cfg, params, grads, threads):
        self.cfg, self.threads = cfg, threads
        self.name = "Model"
        self.params, self.grads = params, grads  # the objects the net holds
        self.params_view, self.grads_view = params.view(), grads.view()
        self.dtype = params.dtype
        self.x_kind = "Fq"  # see make_batch
        self.labels_kind = "L"
        self.x_style = "quant"
        self.plan = plan = ref.model_plan(cfg["layers"], cfg["input_shape"], cfg["loss"])
        self.in_width, self.out_width = (
            math.prod(plan["input_shape"]),
            math.prod(plan["shapes"][-1]),
        )
        self.classes = {"softmax_xent": self.out_width, "sigmoid_bce": 2, "mse": 0}[cfg["loss"]]
        kinds = [spec[0] for spec in plan["layers"]]
        if "conv" not in kinds:
            self.x_kind = "F"
        # quantized inputs keep the sums exact, so that equal values in a pooling window
        # are equal in both; after tanh, sigmoid or GELU they are not, and the C core and
        # NumPy may round two equal values apart (a tie either argmax serves): inputs
        # drawn from a continuum leave no such ties
        last_pool = max((i for i, kind in enumerate(kinds) if kind == "maxpool2"), default=0)
        if {"tanh", "sigmoid", "gelu", "layernorm", "dropout"} & set(kinds[:last_pool]):
            self.x_style = "normal"
        # a dropout's scale 1 / (1 - p) (not a power of 2) or a norm makes the quantized sums
        # inexact: a sum that cancels to 0 in exact arithmetic lands a few ulps either side,
        # by each one's order, and a ReLU after it takes one side or the other
        rates = [spec[1] for spec in plan["layers"] if spec[0] == "dropout"]
        if any(r not in (0.0, 0.5) for r in rates) or {"layernorm", "batchnorm"} & set(kinds):
            self.x_style = "normal"
        if cfg["loss"] == "mse":
            self.labels_kind = "F"
        self.ranges = [(e["weight"], e["bias"] + e["bias_shape"][0]) for e in plan["params"]]
        self.n_layers = len(self.ranges)
        self.sweeps = {}  # thread -> [Sweep or None, uncertain]
        self.notes = []  # state worth naming in a failure's tags
        self.rng = (0, 0, 0)  # dropout's key (set_rng)
        self.dropout = "dropout" in kinds
        # batch norms' running statistics as the net keeps them (committed after each
        # training call the net accepted), and those of the last call the oracle computed
        self.state = np.zeros(ref.model.model_state_size(plan))
        for _, var in ref.model._bn_views(plan, self.state).values():
            var[...] = 1
        self.next_state = self.state

    # -- the reference ------------------------------------------------------------------
    def ref_loss_grad(self, x, labels, grad_scale, rng=None):
        g = np.zeros_like(self.params_view)
        p = self.params_view.copy()
        self.next_state = self.state.copy()
        loss, correct = ref.model_loss_grad(
            *self.model_args(),
            p,
            g,
            x,
            labels,
            grad_scale,
            rng=rng or self.rng,
            state=self.next_state,
        )
        return loss, correct, g

    def commit_state(self):
        """A training call was accepted: its running statistics are the net's now."""
        self.state = self.next_state

    def model_args(self):
        return self.cfg["layers"], self.cfg["input_shape"], self.cfg["loss"]

    def ref_logits(self, x):
        out = np.empty((len(x), self.out_width), self.dtype)
        ref.model_logits(*self.model_args(), self.params_view.copy(), x, out, state=self.state)
        return out

    def magnitude(self, x):
        """The size of the terms that make the outputs, for tolerances: the outputs on |params|
        and |x| (no layer's output is larger than its output on |input|, and the nonlinear
        ones carry their error along, so this bounds what rounding can do where the outputs
        cancel)."""

        def finite(a):
            return np.where(np.isfinite(a), np.abs(a), 0).astype(a.dtype)

        out = np.empty((len(x), self.out_width), self.dtype)
        ref.model_logits(*self.model_args(), finite(self.params_view), finite(x), out)
        return out

    def ref_evaluate(self, x, labels):
        return ref.model_evaluate(
            *self.model_args(), self.params_view.copy(), x, labels, state=self.state
        )

    # -- the contract's checks ------------------------------------------------------------
    def check_batch(self, x, labels=None):
        if not (
            isinstance(x, np.ndarray)
            and x.dtype == self.dtype
            and x.ndim == 2
            and x.shape[1] == self.in_width
        ):
            raise Refuse(f"x must be ({self.in_width}) columns of {self.dtype}")
        if labels is None:
            return len(x)
        if self.labels_kind == "F":
            if not (
                isinstance(labels, np.ndarray)
                and labels.dtype == self.dtype
                and labels.shape == (len(x), self.out_width)
            ):
                raise Refuse(f"targets must be ({len(x)}, {self.out_width}) of {self.dtype}")
        elif not (
            isinstance(labels, np.ndarray) and labels.dtype == I64 and labels.shape == (len(x),)
        ):
            raise Refuse("labels must be int64 (B,)")
        return len(x)

    def check_grads_arg(self, before, grads, x_name=None):
        if not (
            isinstance(grads, np.ndarray)
            and grads.dtype == self.dtype
            and grads.shape == self.params_view.shape
            and grads.flags.writeable
        ):
            raise Refuse("grads must be a writeable flat array like params")
        orig = before["args"]["grads"]
        if np.may_share_memory(orig, self.params_view):
            raise Refuse("grads shares memory with params")
        if x_name and np.may_share_memory(orig, before["args"][x_name]):
            raise Refuse("grads shares memory with x")

    @staticmethod
    def grad_scale(v, batch):
        if v is None:
            return 1.0 / batch if batch else 0.0
        try:
            return float(v)
        except (TypeError, ValueError) as e:
            raise Refuse(str(e)) from None

    def result_check(self, loss, correct, x, labels):
        rtol = RTOL[self.dtype]
        scale = 0.0
        if len(x) and self.labels_kind == "F":  # squared errors: the size of (|y| + |t|)^2
            z = self.magnitude(x).astype(np.float64) + np.abs(labels.astype(np.float64))
            scale = float(np.sum(np.where(np.isfinite(z), z, 0) ** 2))
        elif len(x):
            scale = loss_scale(self.magnitude(x), self.classes)

        def check(ret):
            if not (isinstance(ret, tuple) and len(ret) == 2):
                return f"returned {short(ret)}, expected (loss_sum, n_correct)"
            problem = compare_float("loss_sum", ret[0], loss, rtol, scale)
            if problem or type(ret[1]) is not int or ret[1] == correct:
                return problem or compare_int("n_correct", ret[1], correct)
            slack = self.near_ties(x)
            return (
                None
                if abs(ret[1] - correct) <= slack
                else f"n_correct is {ret[1]}, expected {correct} (+-{slack} rows near a tie)"
            )

        return check

    def near_ties(self, x):
        """The rows whose prediction rounding may flip: a Model's outputs are inexact (tanh,
        sigmoid, GELU), and the C core and NumPy round two equal or nearly equal ones apart
        (tanh saturates several to 1.0 in float32): top-2 gap, or |z| for one output, within
        the tolerance of the outputs' magnitude."""
        if not len(x):
            return 0
        with np.errstate(all="ignore"):
            z = self.ref_logits(x).astype(np.float64)
            size = self.magnitude(x).astype(np.float64)
            tol = RTOL[self.dtype] * (1 + np.where(np.isfinite(size), size, 0).max(axis=1))
            gap = (
                np.abs(z[:, 0])
                if z.shape[1] == 1
                else np.diff(np.sort(z, axis=1)[:, -2:], axis=1)[:, 0]
            )
        return int(np.sum(gap <= tol))

    def exact_pooling(self, x):
        """False where a pooling window may hold values that differ only below rounding, so
        that the C core and the reference may each pick another maximum (both right to
        rounding, their gradients going to different entries):
        - x with nonzero entries under 2**-60 (label bits aliased into x, say);
        - a window whose two largest values are within rounding of each other, unless both
          are exact (on a 2**-20 grid and under 2**8: sums of quantized values, which both
          compute exactly, so an exact tie stays one). For a pool right after a conv (or a
          conv and ReLU) the values are the conv's sums before its bias: the fused conv +
          pool of the C core takes the max before the bias, the reference after it (b + tiny
          rounds to b: a tie, its first entry), so the rounding there is that of |u| + |b|.
          Elsewhere (after tanh, sigmoid, GELU) the values are the layer's outputs, which the
          C core and NumPy round apart by a few ulps."""
        layers = self.plan["layers"]
        if not any(spec[0] == "maxpool2" for spec in layers):
            return True
        with np.errstate(all="ignore"):
            a = np.abs(np.asarray(x, np.float64))
            if np.any((a > 0) & (a < 2.0**-60)):
                return False
            if not len(x):
                return True
            try:
                acts, _ = ref.model._model_forward(
                    self.plan,
                    self.params_view.copy(),
                    np.asarray(x),
                    self.rng if self.dropout else None,
                )
            except Exception:  # a batch the reference refuses: the call is checked elsewhere
                return True
            weights = ref.model._model_param_views(self.plan, self.params_view.astype(np.float64))
            for i, spec in enumerate(layers):
                if spec[0] != "maxpool2":
                    continue
                # (i >= 1: a pool that is the first layer reads x, and layers[-1] is the last)
                conv = (
                    i - 1
                    if i >= 1 and layers[i - 1][0] == "conv"
                    else i - 2
                    if i >= 2 and layers[i - 1][0] == "relu" and layers[i - 2][0] == "conv"
                    else None
                )
                if conv is None:
                    u, bias = acts[i].astype(np.float64), 0.0
                else:
                    w, b = weights[conv]
                    h = acts[conv].astype(np.float64)
                    u = np.empty(acts[conv + 1].shape, np.float64)
                    spec = layers[conv]
                    ref.conv2d_forward(
                        h,
                        w,
                        np.zeros_like(b),
                        u,
                        padding=spec[3],
                        stride=spec[4] if len(spec) > 4 else 1,
                    )
                    bias = np.abs(b)[None, :, None, None]
                if not self._pool_ties_exact(u, bias):
                    return False
        return True

    def _pool_ties_exact(self, u, bias):
        """No 2x2 window of u (B, C, H, W) whose top two values are within RTOL of |top| +
        |second| + bias apart, unless both are exact grid values (see exact_pooling): exact
        values are ordered alike by both, ties included."""
        B, C, H, W = u.shape
        h2, w2 = H // 2 * 2, W // 2 * 2
        if not h2 or not w2:
            return True
        win = u[:, :, :h2, :w2].reshape(B, C, h2 // 2, 2, w2 // 2, 2).transpose(0, 1, 2, 4, 3, 5)
        top = np.sort(win.reshape(B, C, h2 // 2, w2 // 2, 4), axis=-1)[..., 2:]
        gap = top[..., 1] - top[..., 0]
        size = np.abs(top[..., 0]) + np.abs(top[..., 1]) + bias

        def grid(v):
            return (np.abs(v) < 2.0**8) & (v * 2.0**20 == np.round(v * 2.0**20))

        exact = grid(top[..., 0]) & grid(top[..., 1])
        return not np.any((gap <= RTOL[self.dtype] * size) & ~exact)

    def grads_expect(self, before, delta, x, grad_scale, only_layer=None):
        """before + delta (restricted to one layer's range), with a tolerance that grows with
        the rows of x summed and is at least |grad_scale| * rows (the size of the terms, when
        they cancel to 0); None for the tolerance when grad_scale is so large that the sums
        overflow (to inf or -inf, by the order of summation), or when pooling may break a tie
        apart (exact_pooling)."""
        rows = len(x)
        if only_layer is not None:
            lo, hi = self.ranges[only_layer]
            masked = np.zeros_like(delta)
            masked[lo:hi] = delta[lo:hi]
            delta = masked
        with np.errstate(all="ignore"):
            want = before + delta
        if abs(grad_scale) > 1e30 or not self.exact_pooling(x):
            return want, None
        scale = np.zeros(delta.shape)
        for lo, hi in self.ranges:

            def fin(a, lo=lo, hi=hi):
                return np.abs(a[lo:hi][np.isfinite(a[lo:hi])])

            top = max(fin(before).max(initial=0), fin(delta).max(initial=0))
            scale[lo:hi] = top * (1 + math.sqrt(rows)) + abs(grad_scale) * max(rows, 1)
        return want, scale

    # -- the sweep state --------------------------------------------------------------------
    def sweep(self, thread):
        return self.sweeps.get(thread, [None, False])

    def started(self, thread, sweep):
        for t, s in self.sweeps.items():
            if t != thread:
                s[1] = True
        self.sweeps[thread] = [sweep, False]

    def ended(self, thread):
        self.started(thread, None)

    def unsure(self, thread):
        self.sweeps.setdefault(thread, [None, False])[1] = True


def net_held(model):
    return {"params": model.params_view, "grads": model.grads_view}


def net_tags(model, thread):
    sweep, unsure = model.sweep(thread)
    state = "no sweep" if sweep is None else f"sweep@{sweep.next_layer}"
    return [f"{state}{'?' if unsure else ''}"] + model.notes


def make_batch(rng, model, big_p=0.02):
    rows = pick(rng, (0, 1, 2, 3, 5, 8, 17, 33), (2, 3, 3, 2, 2, 2, 1, 1))
    if rng.random() < big_p:  # big enough that a freed copy goes back to the OS
        rows = 200_000 if model.cfg.get("dense stack") and model.in_width <= 16 else 300
    dt = model.dtype
    current = model.params.dtype
    if current != dt and rng.random() < 0.5:
        dt = current  # the dtype the re-typed params now claim
    # NaN/inf only in the input of a model with no conv layer (x_kind "F"): the conv
    # reference multiplies the conv output's last row/column, which 2x2 pooling drops, by a
    # zero gradient (NaN for a NaN input there), where the C core never computes that row (0):
    # a difference of no consequence
    special = model.x_kind == "F" and rng.random() < 0.05
    x = draw(rng, (rows, model.in_width), F64, "special" if special else model.x_style)
    x = convert(x, dt) if dt.kind in "fc" else np.zeros(x.shape, dt)
    if rng.random() < 0.03 and rows * model.in_width <= model.grads_view.size and dt == model.dtype:
        x = model.grads_view[: rows * model.in_width].reshape(
            rows, model.in_width
        )  # x ~ held grads
    if model.labels_kind == "F":  # mse targets, of the dtype that x has
        targets = draw(rng, (rows, model.out_width), F64, "quant")
        return x, convert(targets, dt) if dt.kind in "fc" else np.zeros(targets.shape, dt)
    return x, labels_for(rng, rows, model.classes)


def net_call(model, net, method, args, oracle, thread):
    call = Call(
        f"{model.name}.{method}",
        getattr(net, method),
        args,
        oracle,
        held=net_held(model),
        thread=thread,
    )
    call.tags += net_tags(model, thread)
    if any(
        isinstance(a.value, np.ndarray) and np.may_share_memory(a.value, model.grads_view)
        for a in args
    ):
        call.tags.append("arg~held grads")
    return call


def step_forward_loss(rng, fz, net, model, thread="", hostile=0.25, big_p=0.02):
    x, labels = make_batch(rng, model, big_p)

    def oracle(before, x, labels, grad_scale=None):
        rows = model.check_batch(x, labels)
        gs = model.grad_scale(grad_scale, rows)
        if model.dropout or model.state.size:  # training: dropout's masks, the batch's stats
            loss, correct = model.ref_loss_grad(x, labels, gs)[:2]
        else:
            loss, correct = model.ref_evaluate(x, labels)
        # a batch of no rows is a sweep too (a worker's empty share): its steps come, add 0
        sweep = Sweep(x.copy(), labels.copy(), gs, model.n_layers - 1, rng=model.rng)
        return Expect(
            ret_check=model.result_check(loss, correct, x, labels),
            extra={"sweep": sweep, "rows": rows},
        )

    call = net_call(
        model,
        net,
        "forward_loss",
        [
            Arg("x", x, model.x_kind),
            Arg("labels", labels, model.labels_kind),
            grad_scale_arg(rng, len(x)),
        ],
        oracle,
        thread,
    )
    del x
    out = fz.run(mutate(rng, call, hostile_count(rng, hostile)))
    x = call.arg("x").value
    model.last_x = weakref.ref(x) if isinstance(x, np.ndarray) and x.base is None else None
    aliased = isinstance(x, np.ndarray) and np.may_share_memory(x, model.grads_view)
    del x, call  # the net alone keeps x alive now
    if out.expect is not None:
        if out.expect.extra["rows"]:  # a batch ran: the running statistics moved
            model.commit_state()
        model.started(thread, out.expect.extra["sweep"])
        if aliased and "pending x~held grads" not in model.notes:
            model.notes.append("pending x~held grads")
    else:
        model.unsure(thread)
    return out


def step_backward_layer(rng, fz, net, model, thread="", hostile=0.25, layer=None):
    sweep = model.sweep(thread)[0]
    if layer is None:
        layer = (
            sweep.next_layer
            if sweep is not None and rng.random() < 0.8
            else pick(rng, (-1, 0, model.n_layers - 1, model.n_layers, 2**31 - 1))
        )
    given = rng.random() < 0.3
    grads = np.zeros_like(model.params_view) if given else None

    def oracle(before, layer, grads=None):
        layer = index_int(layer, "layer")
        sweep, _ = model.sweep(thread)
        if sweep is None:
            raise Refuse("no forward_loss to go back from")
        if layer != sweep.next_layer:
            raise Refuse(f"layer {layer} out of order, next is {sweep.next_layer}")
        if sweep.grads is None:
            sweep.grads = model.ref_loss_grad(
                sweep.x, sweep.labels, sweep.grad_scale, rng=sweep.rng
            )[2]
        exp = Expect()
        if grads is None:
            exp.held["grads"], exp.held_scale["grads"] = model.grads_expect(
                before["grads"], sweep.grads, sweep.x, sweep.grad_scale, layer
            )
        else:
            model.check_grads_arg(before, grads)
            want, exp.scale["grads"] = model.grads_expect(
                grads.copy(), sweep.grads, sweep.x, sweep.grad_scale, layer
            )
            grads[...] = want
        return exp

    call = net_call(
        model,
        net,
        "backward_layer",
        [
            Arg("layer", layer, "i"),
            Arg("grads", grads, "F", output=True, omit=not given, keyword=rng.random() < 0.5),
        ],
        oracle,
        thread,
    )
    out = fz.run(mutate(rng, call, hostile_count(rng, hostile)))
    if out.expect is not None:
        sweep = model.sweep(thread)[0]
        sweep.next_layer -= 1
        model.sweeps[thread] = [sweep if sweep.next_layer >= 0 else None, False]
    else:
        model.unsure(thread)
    return out


def step_sweep(rng, fz, net, model, thread=""):
    """forward_loss, then every backward_layer in order (now and then one out of order)."""
    if step_forward_loss(rng, fz, net, model, thread, hostile=0.1).expect is None:
        return
    for layer in range(model.n_layers - 1, -1, -1):
        if rng.random() < 0.05:
            step_backward_layer(rng, fz, net, model, thread, hostile=0.0, layer=layer - 1)
        step_backward_layer(rng, fz, net, model, thread, hostile=0.05, layer=layer)


def step_stale_sweep(rng, fz, net, model, thread=""):
    """forward_loss (often of a big batch, which goes back to the OS when freed), then a call
    that ends the sweep (loss_grad, evaluate, logits), then the sweep's next backward_layer:
    it must be refused (the net may have let go of the batch)."""
    if step_forward_loss(rng, fz, net, model, thread, hostile=0.0, big_p=0.3).expect is None:
        return
    end = pick(rng, (step_loss_grad, step_loss_grad, step_evaluate, step_logits))
    end(rng, fz, net, model, thread, hostile=0.0)
    step_backward_layer(rng, fz, net, model, thread, hostile=0.0, layer=model.n_layers - 1)


def step_loss_grad(rng, fz, net, model, thread="", hostile=0.25):
    x, labels = make_batch(rng, model)
    given = rng.random() < 0.3
    grads = draw(rng, model.params_view.shape, model.dtype, "quant") if given else None

    def oracle(before, x, labels, grad_scale=None, grads=None):
        rows = model.check_batch(x, labels)
        gs = model.grad_scale(grad_scale, rows)
        loss, correct, delta = model.ref_loss_grad(x, labels, gs)
        exp = Expect(ret_check=model.result_check(loss, correct, x, labels))
        if grads is None:
            exp.held["grads"], exp.held_scale["grads"] = model.grads_expect(
                before["grads"], delta, x, gs
            )
        else:
            model.check_grads_arg(before, grads, "x")
            want, exp.scale["grads"] = model.grads_expect(grads.copy(), delta, x, gs)
            grads[...] = want
        return exp

    call = net_call(
        model,
        net,
        "loss_grad",
        [
            Arg("x", x, model.x_kind),
            Arg("labels", labels, model.labels_kind),
            grad_scale_arg(rng, len(x)),
            Arg("grads", grads, "F", output=True, omit=not given, keyword=True),
        ],
        oracle,
        thread,
    )
    if not given:
        call.arg("grad_scale").keyword = True
    del x
    out = fz.run(mutate(rng, call, hostile_count(rng, hostile)))
    if out.expect is not None:
        model.commit_state()
    (model.ended if out.expect is not None else model.unsure)(thread)
    return out


def step_evaluate(rng, fz, net, model, thread="", hostile=0.25):
    x, labels = make_batch(rng, model, big_p=0.01)

    def oracle(before, x, labels):
        model.check_batch(x, labels)
        loss, correct = model.ref_evaluate(x, labels)
        return Expect(ret_check=model.result_check(loss, correct, x, labels))

    call = net_call(
        model,
        net,
        "evaluate",
        [Arg("x", x, model.x_kind), Arg("labels", labels, model.labels_kind)],
        oracle,
        thread,
    )
    out = fz.run(mutate(rng, call, hostile_count(rng, hostile)))
    (model.ended if out.expect is not None else model.unsure)(thread)
    return out


def step_logits(rng, fz, net, model, thread="", hostile=0.25):
    x, _ = make_batch(rng, model, big_p=0.01)
    out_arr = draw(rng, (len(x), model.out_width), model.dtype)

    def oracle(before, x, out):
        model.check_batch(x)
        if not (isinstance(out, np.ndarray) and out.dtype == model.dtype):
            raise Refuse("out must have the dtype of params")
        if np.may_share_memory(before["args"]["out"], model.params_view):
            raise Refuse("out shares memory with params")
        logits = model.ref_logits(x)
        out[...] = logits  # refuses a read-only or wrongly shaped out
        return Expect(scale={"out": model.magnitude(x)})

    call = net_call(
        model,
        net,
        "logits",
        [Arg("x", x, model.x_kind), Arg("out", out_arr, "F", output=True)],
        oracle,
        thread,
    )
    out = fz.run(mutate(rng, call, hostile_count(rng, hostile)))
    (model.ended if out.expect is not None else model.unsure)(thread)
    return out


def refuses(reason):
    """The oracle of a call that the contract always refuses."""

    def oracle(before, *args, **kwargs):
        raise Refuse(reason)

    return oracle


def getter_call(label, obj, attr, check):
    return Call(
        label,
        getattr,
        [Arg("obj", obj), Arg("name", attr)],
        lambda before, obj, name: Expect(ret_check=check),
    )


def expect_is(want):
    return lambda got: None if got is want else f"returned {short(got)}, expected the held object"


def expect_eq(want):
    return lambda got: (
        None
        if got == want and type(got) is type(want)
        else f"returned {short(got)}, expected {short(want)}"
    )


def net_getters(model):
    c = model.cfg
    g = {
        "params": expect_is(model.params),
        "grads": expect_is(model.grads),
        "threads": expect_eq(model.threads),
        "loss": expect_eq(c.get("loss", "softmax_xent")),
    }
    # the fuzzed models compute in full precision
    g["gemm_inputs"] = lambda got: None if got is None else f"returned {short(got)}, expected None"
    g["n_params"] = expect_eq(model.params_view.size)
    g["plan"] = lambda got: plan_problem(got, model.plan)
    g["sizes"] = expect_eq((model.in_width, *(math.prod(s) for s in model.plan["shapes"])))
    g["input_shape"] = expect_eq(tuple(c["input_shape"]))
    g["n_param_layers"] = expect_eq(model.n_layers)
    g["state"] = lambda got: (
        None
        if isinstance(got, np.ndarray)
        and got.dtype == np.float64
        and got.shape == model.state.shape
        and np.allclose(got, model.state, rtol=1e-3, atol=1e-4, equal_nan=True)
        else f"returned {short(got)}, expected the running statistics {short(model.state)}"
    )
    # a count that only grows, and stays 0 without helper threads
    g["team_jobs"] = lambda got: (
        None
        if type(got) is int and got >= 0 and (model.threads > 1 or got == 0)
        else f"returned {short(got)}, expected a count >= 0 (0 on one thread)"
    )
    return g


def step_getter(rng, fz, net, model, thread=""):
    getters = net_getters(model)
    attr = pick(rng, sorted(getters))
    fz.run(getter_call(f"{model.name}.{attr}", net, attr, getters[attr]))


RETYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.complex128, np.float16]


def retype(rng, fz, arr, name):
    """arr.dtype = ... or arr.shape = ... on an array a _core object holds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if rng.random() < 0.7:
                dt = np.dtype(pick(rng, RETYPES))
                fz.setup(f"{name}.dtype = {dt}  (was {arr.dtype}{list(arr.shape)})")
                arr.dtype = dt
                return f"{name} re-typed to {dt}"
            n = arr.size
            shape = pick(rng, ((1, n), (n, 1), (n // 2, 2) if n % 2 == 0 else (n,), (n,)))
            fz.setup(f"{name}.shape = {shape}  (was {list(arr.shape)})")
            arr.shape = shape
            return f"{name} reshaped"
        except (ValueError, TypeError, AttributeError) as e:
            fz.setup(f"  numpy refused: {e}")
            return None


def step_retype_held(rng, fz, net, model, thread=""):
    name = pick(rng, ("params", "grads"))
    note = retype(rng, fz, getattr(model, name), name)
    if note and note not in model.notes:
        model.notes.append(note)


def step_retype_x(rng, fz, net, model, thread=""):
    """Re-type or reshape the x of the last forward_loss (which the net keeps alive)."""
    x = model.last_x() if getattr(model, "last_x", None) else None
    if x is not None:
        note = retype(rng, fz, x, "x of the last forward_loss")
        if note and note not in model.notes:
            model.notes.append(note)


def step_set_rng(rng, fz, net, model, thread=""):
    """set_rng(seed, step, row0): dropout's key for the sweeps after (int64s; step and row0
    not negative)."""
    vals = [
        int(rng.integers(-(2**63), 2**63 - 1)) if rng.random() < 0.5 else int(rng.integers(0, 9)),
        int(rng.integers(0, 2**40)),
        int(rng.integers(0, 2**20)),
    ]

    def oracle(before, seed, step, row0):
        got = []
        for name, v in (("seed", seed), ("step", step), ("row0", row0)):
            try:
                v = int(v.__index__())
            except AttributeError:
                raise Refuse(f"{name} must be an int, got {type(v).__name__}") from None
            if not -(2**63) <= v < 2**63 or (name != "seed" and v < 0):
                raise Refuse(f"{name} = {v} is not a valid int64 here")
            got.append(v)
        model.rng = tuple(got)
        return Expect()

    call = net_call(
        model,
        net,
        "set_rng",
        [Arg("seed", vals[0]), Arg("step", vals[1]), Arg("row0", vals[2])],
        oracle,
        thread,
    )
    return fz.run(mutate(rng, call, hostile_count(rng, 0.25)))


def step_set_exchange(rng, fz, net, model, thread=""):
    """set_exchange(fn): None, or a sum over one worker (leaves the sums as they are): the
    model computes what it did; anything else callable-or-None is refused."""
    fn = pick(rng, (None, lambda buf: None))

    def oracle(before, fn):
        if fn is not None and not callable(fn):
            raise Refuse("fn must be callable or None")
        return Expect()

    call = net_call(model, net, "set_exchange", [Arg("fn", fn)], oracle, thread)
    return fz.run(mutate(rng, call, hostile_count(rng, 0.25)))


def step_reinit(rng, fz, net, model, thread=""):
    """__init__ again on a live object: refused (it holds arrays and scratch)."""
    fz.run(
        Call(
            model.name,
            net.__init__,
            [Arg("args", a) for a in model.init_args],
            refuses("__init__ of an initialized object"),
        )
    )


NET_STEPS = [
    (3, step_forward_loss),
    (4, step_backward_layer),
    (3, step_sweep),
    (3, step_loss_grad),
    (1, step_stale_sweep),
    (1, step_evaluate),
    (1, step_logits),
    (2, step_getter),
    (0.7, step_retype_held),
    (0.5, step_retype_x),
    (0.3, step_reinit),
    (1, step_set_rng),
    (0.5, step_set_exchange),
]


def dense_stack_config(rng, widths=(1, 2, 5, 12)):
    """A random dense stack (what _core.Network took): dense layers with ReLU between them, a
    logistic regression, a binary or a softmax classifier; {layers, input_shape, loss}."""
    kind = pick(rng, ("logistic", "bce", "softmax"), (2, 1, 3))
    inp = pick(rng, (1, 3, 10, 16))
    if len(widths) == 2:  # a range of widths
        hidden = [int(rng.integers(*widths)) for _ in range(int(rng.integers(1, 3)))]
    else:
        hidden = [pick(rng, widths) for _ in range(int(rng.integers(1, 3)))]
    if kind == "logistic":
        sizes, loss = (inp, 1), "sigmoid_bce"
    elif kind == "bce":
        sizes, loss = (inp, *hidden, 1), "sigmoid_bce"
    else:
        sizes, loss = (
            (inp, *hidden[: int(rng.integers(0, 3))], int(rng.integers(2, 6))),
            "softmax_xent",
        )
    return {
        "layers": dense_stack(sizes),
        "input_shape": sizes[:1],
        "loss": loss,
        "dense stack": True,
    }


def conv_blocks_config(rng):
    """Random conv -> ReLU -> 2x2 max-pool blocks and a dense stack (what _core.ConvNet took),
    softmax cross-entropy; {layers, input_shape, loss}."""
    while True:
        shape = (int(rng.integers(1, 3)), int(rng.integers(3, 10)), int(rng.integers(3, 10)))
        channels = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 3))))
        dense = tuple(
            [int(rng.integers(2, 7))] * int(rng.integers(0, 2)) + [int(rng.integers(2, 5))]
        )
        kernel, padding = int(rng.integers(1, 4)), int(rng.integers(0, 2))
        layers = conv_blocks(channels, dense, kernel, padding)
        try:
            ref.model_plan(layers, shape)
            return {"layers": layers, "input_shape": shape, "loss": "softmax_xent"}
        except ValueError:
            continue


def construct_net(rng, fz, config, hostile=0.3):
    """A Model of a layer list drawn by config (its constructor fuzzed first); (net, model) or
    (None, None)."""
    for attempt in range(2):
        cfg = config(rng)
        dt, threads = pick_dtype(rng), pick(rng, (1, 1, 2, 3))
        n = ref.model_plan(cfg["layers"], cfg["input_shape"], cfg["loss"])["n_params"]
        lead = [
            Arg("layers", list(cfg["layers"]), "layers"),
            Arg("input_shape", pick(rng, (list, tuple))(cfg["input_shape"]), "sizes"),
            Arg("loss", cfg["loss"], "s"),
        ]
        params = draw(rng, (n,), dt, "quant")
        grads = draw(rng, (n,), dt, "quant") if rng.random() < 0.5 else np.zeros(n, dt)
        args = lead + [
            Arg("params", params, "F"),
            Arg("grads", grads, "F", output=True),
            Arg("threads", threads, "i", keyword=True, omit=threads == 1 and rng.random() < 0.5),
        ]
        # the params' own dtype name, None (both: full precision), or bfloat16 on float64
        # params (refused); bfloat16 models are tests/test_bf16.py's (the oracles here
        # compute in full precision)
        gi = pick(rng, (None, dt.name, "bfloat16" if dt == F64 else None))
        args.append(
            Arg("gemm_inputs", gi, "s", keyword=True, omit=gi is None and rng.random() < 0.7)
        )
        call = mutate(
            rng,
            Call("Model", core.Model, args, oracle_model),
            hostile_count(rng, hostile if attempt == 0 else 0),
        )
        hostile_layers(rng, call, hostile / 2 if attempt == 0 else 0)
        call.expect_error = refusal_agrees(call, only_tags=("layers", "input_shape", "loss"))
        out = fz.run(call)
        if out.status == "A":
            v = {a.name: a.value for a in call.args}
            if not call.tags and v.get("gemm_inputs") != "bfloat16":
                model = NetModel(cfg, v["params"], v["grads"], threads)
                model.init_args = [a.value for a in call.args if not a.keyword and not a.omit]
                return out.ret, model
    return None, None


# the layer lists a Model is fuzzed on: any (model_config), a dense stack, conv blocks
CONFIGS = (model_config, dense_stack_config, conv_blocks_config)


def scenario_net(config):
    def run(rng, fz):
        net, model = construct_net(rng, fz, config)
        if net is None:
            return
        ws, steps = zip(*NET_STEPS)
        for _ in range(int(rng.integers(3, 14))):
            pick(rng, steps, ws)(rng, fz, net, model)
        if rng.random() < 0.3:  # every getter, after whatever the steps did
            for attr, check in sorted(net_getters(model).items()):
                fz.run(getter_call(f"{model.name}.{attr}", net, attr, check))

    run.__name__ = f"scenario_{config.__name__}"
    return run


# =======================================================================================
# ShmGroup: a group of n ranks in one process, each rank's calls on its own thread


class RankThreads:
    """One thread per rank; run(r, fn) hands fn to rank r's thread and waits for it,
    run_all(fns) runs fns[r] on every rank at once. A rank that never returns is a hang
    (the parent's watchdog sees the log go quiet)."""

    def __init__(self, n):
        self.queues = [queue.Queue() for _ in range(n)]
        self.threads = [
            threading.Thread(target=self._serve, args=(q,), daemon=True) for q in self.queues
        ]
        for t in self.threads:
            t.start()

    @staticmethod
    def _serve(q):
        while True:
            item = q.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box.append(fn())
            except BaseException as e:  # handed back to the caller, who re-raises it
                box.append(e)
            done.set()

    def run_all(self, fns):
        jobs = []
        for q, fn in zip(self.queues, fns):
            box, done = [], threading.Event()
            q.put((fn, box, done))
            jobs.append((box, done))
        for box, done in jobs:  # every rank finishes before anything is raised
            done.wait()
        for box, done in jobs:
            if isinstance(box[0], BaseException):
                raise box[0]
        return [box[0] for box, done in jobs]

    def run(self, r, fn):
        box, done = [], threading.Event()
        self.queues[r].put((fn, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def close(self):
        for q in self.queues:
            q.put(None)


from dptrain.comm.algorithms import ALLREDUCE_SCHEDULES as ALGORITHMS  # noqa: E402


def finite_float(v, name):
    if isinstance(v, (str, bytes, complex)) or v is None:
        raise Refuse(f"{name} must be a number")
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError) as e:
        raise Refuse(f"{name}: {e}") from None
    if not math.isfinite(f):
        raise Refuse(f"{name} must be finite")
    return f


def group_range(start, stop, length):
    start = 0 if start is None else index_int_any(start, "start")
    stop = length if stop is None else index_int_any(stop, "stop")
    if not 0 <= start <= stop <= length:
        raise Refuse(f"[{start}, {stop}) is not inside [0, {length}]")
    return start, stop


def index_int_any(v, name):
    if not isinstance(v, int):  # PyLong_AsSsize_t: Python ints (and bools) only
        raise Refuse(f"{name} must be an int")
    if not -(2**63) <= v < 2**63:
        raise Refuse(f"{name} does not fit a Py_ssize_t")
    return int(v)


def oracle_shm_group(
    before,
    control,
    buffers,
    rank,
    *,
    out=None,
    spin=2e-4,
    yield_time=2e-3,
    timeout=0.0,
    algorithm="native",
):
    initialized_control(control)
    n = int(control[16:20].view(np.uint32)[0])
    if not 1 <= n <= 1024:
        raise Refuse("control holds no valid group size")
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise Refuse(f"algorithm {algorithm!r}")
    if isinstance(buffers, (str, bytes)) or not hasattr(buffers, "__len__"):
        raise Refuse("buffers must be a sequence of arrays")
    bufs = list(buffers)
    if not 1 <= len(bufs) <= 1024 or (out is None and len(bufs) != n):
        raise Refuse(f"{len(bufs)} buffers for a group of {n}")
    if not 0 <= index_int(rank, "rank") < n:
        raise Refuse("rank out of range")
    for v, name in ((spin, "spin"), (yield_time, "yield_time"), (timeout, "timeout")):
        if finite_float(v, name) < 0:
            raise Refuse(f"{name} < 0")
    for b in bufs + ([] if out is None else [out]):
        if not (
            isinstance(b, np.ndarray)
            and b.dtype in FLOATS
            and b.ndim == 1
            and b.flags.writeable
            and b.dtype == bufs[0].dtype
            and b.shape == bufs[0].shape
        ):
            raise Refuse("buffers (and out) are writeable 1-D arrays of one float dtype and length")
    if algorithm != "native" and (out is not None or len(bufs) != n):
        raise Refuse(f"{algorithm} needs one buffer per worker and no out")
    orig = before["args"]
    arrays = list(orig["buffers"]) + ([] if out is None else [orig["out"]])
    for i, a in enumerate(arrays):
        for b in arrays[:i]:
            if np.may_share_memory(a, b):
                raise Refuse("buffers (and out) overlap")
        if np.may_share_memory(a, orig["control"]):  # its writes would corrupt the barrier
            raise Refuse("a buffer overlaps the control block")
    return Expect(ret_check=lambda g: None if isinstance(g, core.ShmGroup) else "not a ShmGroup")


class GroupModel:
    def __init__(self, n, control, buffers, out, algorithm):
        self.n, self.control, self.algorithm = n, control, algorithm
        self.buffers, self.out = buffers, out  # the objects the groups hold
        self.views = [b.view() for b in buffers]  # as viewed at construction
        self.out_view = None if out is None else out.view()
        self.dtype, self.length = buffers[0].dtype, buffers[0].size
        self.aborted = 0  # the first abort code; None: unknown
        self.notes = []

    def aborted_error(self, e):
        if not isinstance(e, core.GroupAborted):
            return f"expected GroupAborted (the group was aborted with {self.aborted})"
        if self.aborted is not None and tuple(e.args) != ("group aborted", self.aborted):
            return f"GroupAborted{e.args}, expected code {self.aborted}"
        return None


def float_seconds(v):
    ok = isinstance(v, float) and math.isfinite(v) and v >= 0
    return None if ok else f"returned {short(v)}, expected the seconds waited"


# the signature table every rank writes its row of (agree, checked_allreduce): an output the
# oracle cannot tell at a rank's return, the other ranks' rows being theirs to write
UNCHECKED = {"table": None}


def group_call(model, label, fn, args, check_args, thread):
    """A collective call of one rank; check_args(*args) raises Refuse for bad arguments."""

    def oracle(before, *a, **k):
        check_args(*a, **k)
        if model.aborted != 0:
            raise Refuse("the group is aborted")
        return Expect(ret_check=float_seconds, scale=dict(UNCHECKED))

    return Call(
        label, fn, args, oracle, writes_on_error=True, thread=thread, tags=list(model.notes)
    )


def arm_aborted_check(model, call, check_args):
    """A call with good arguments on an aborted group must raise GroupAborted(code)."""
    if model.aborted == 0:
        return
    pos, kw = call.bind([copy_value(a.value) for a in call.args])
    try:
        check_args(*pos, **kw)
    except Exception:
        return
    call.expect_error = model.aborted_error


def run_collective(rng, fz, groups, model, pool, method, args, check_args, hostile, per_rank=None):
    """Every rank calls method with the same (maybe mutated) arguments; per_rank(args, g), if
    given, puts rank g's own values in."""
    template = mutate(rng, Call("", None, args, None), hostile_count(rng, hostile))
    calls = []
    for r, g in enumerate(groups):
        mine = [Arg(a.name, a.value, a.kind, a.keyword, a.output, a.omit) for a in template.args]
        if per_rank is not None:
            per_rank(mine, g)
        c = group_call(
            model, f"ShmGroup.{method}", getattr(g, method), mine, check_args, f"rank{r}"
        )
        c.extra_pos, c.extra_kw, c.tags = (
            list(template.extra_pos),
            dict(template.extra_kw),
            c.tags + template.tags,
        )
        arm_aborted_check(model, c, check_args)
        calls.append(c)
    outs = pool.run_all([lambda c=c: fz.run(c) for c in calls])
    took = [o.exc is None for o in outs]
    if any(took) and not all(took):
        fz.wrong(
            f"ShmGroup.{method}",
            "ranks disagree on the same arguments",
            "; ".join(f"rank{r}: {o.status} {short(o.exc, 80)}" for r, o in enumerate(outs)),
            calls[0].tags,
        )
    return outs, calls


def step_allreduce(rng, fz, groups, model, pool):
    before = [v.copy() for v in model.views]
    out_before = None if model.out_view is None else model.out_view.copy()
    start, stop = pick(rng, (None, 0)), None
    if model.length and rng.random() < 0.4:
        start = int(rng.integers(0, model.length + 1))
        stop = int(rng.integers(start, model.length + 1))
    args = [
        Arg("scale", pick(rng, (1.0, 0.5, -2.0)), "f", keyword=rng.random() < 0.5),
        Arg("start", start, "i?", keyword=True, omit=start is None),
        Arg("stop", stop, "i?", keyword=True, omit=stop is None),
    ]

    def check_args(scale=1.0, start=None, stop=None):
        finite_float(scale, "scale")
        group_range(start, stop, model.length)

    outs, calls = run_collective(rng, fz, groups, model, pool, "allreduce", args, check_args, 0.25)
    if not all(o.expect is not None and o.status == "A" for o in outs):
        return
    kw = {a.name: a.value for a in calls[0].args if not a.omit}
    check_group_sum(fz, model, before, out_before, kw, "ShmGroup.allreduce", calls[0].tags)


def check_group_sum(fz, model, before, out_before, kw, label, tags):
    """The buffers (or out) after an accepted all-reduce of kw's scale, start and stop: the
    sum of the buffers as they were before, in rank order."""
    scale = float(kw.get("scale", 1.0))
    lo, hi = group_range(kw.get("start"), kw.get("stop"), model.length)
    dt = model.dtype
    acc = before[0][lo:hi].copy()
    mag = np.abs(acc)
    for b in before[1:]:
        acc += b[lo:hi]
        mag += np.abs(b[lo:hi])
    if scale != 1.0:
        acc *= dt.type(scale)
    want = [b.copy() for b in before]
    want_out = None if out_before is None else out_before.copy()
    if want_out is not None:
        want_out[lo:hi] = acc
    else:
        for w in want:
            w[lo:hi] = acc
    rtol = RTOL[dt]
    problems = []
    for i, (v, w) in enumerate(zip(model.views, want)):
        s = np.zeros(w.shape)
        s[lo:hi] = abs(scale) * mag
        p = compare(f"buffers[{i}]", v, w, rtol, s)
        if p:
            problems.append(p)
    if want_out is not None:
        s = np.zeros(want_out.shape)
        s[lo:hi] = abs(scale) * mag
        p = compare("out", model.out_view, want_out, rtol, s)
        if p:
            problems.append(p)
    if problems:
        fz.wrong(
            label,
            f"buffers after {label.split('.')[-1]} differ",
            "; ".join(problems[:3]),
            tags + [model.algorithm],
        )


def step_barrier(rng, fz, groups, model, pool):
    run_collective(rng, fz, groups, model, pool, "barrier", [], lambda: None, 0.1)


I64 = np.dtype(np.int64)


def int64_array(v, name, size_ok, output=False):
    """check_array(v, name, NPY_INT64, 1, output) and a size size_ok accepts."""
    if not isinstance(v, np.ndarray):
        raise Refuse(f"{name} must be a numpy.ndarray")
    if v.dtype.num != I64.num or not v.dtype.isnative or v.ndim != 1:
        raise Refuse(f"{name} must be a 1-D int64 array")
    if not (v.flags.c_contiguous and v.flags.aligned) or (output and not v.flags.writeable):
        raise Refuse(f"{name} must be C-contiguous, aligned (and writeable)")
    if not size_ok(v.size):
        raise Refuse(f"{name} has {v.size} values")


def c_long(v, name):
    """PyLong_AsLong: an int (or anything with __index__) that fits a C long."""
    if isinstance(v, float) or not hasattr(type(v), "__index__"):
        raise Refuse(f"{name} must be an int")
    if not -(2**63) <= operator.index(v) < 2**63:
        raise Refuse(f"{name} does not fit a C long")


def check_agree(n):
    def check(table, parity, signature, /):
        int64_array(table, "table", lambda k: k >= 2 * n * 8, output=True)
        int64_array(signature, "signature", lambda k: k == 8)
        if np.may_share_memory(table, signature):
            raise Refuse("signature lies inside table")
        c_long(parity, "parity")

    return check


def signature_args(rng, n):
    table = np.zeros(2 * n * 8 + int(rng.integers(0, 9)), np.int64)
    signature = rng.integers(-3, 3, 8).astype(np.int64)
    return table, signature, pick(rng, (0, 1, 2, 7, True))


def step_agree(rng, fz, groups, model, pool):
    """agree(table, parity, signature): the seconds waited when every rank passed the same
    signature; None on every rank when one rank's differs (no mutation then)."""
    table, signature, parity = signature_args(rng, model.n)
    if model.n > 1 and model.aborted == 0 and rng.random() < 0.3:
        odd = int(rng.integers(model.n))
        field = int(rng.integers(8))
        calls = []
        for r, g in enumerate(groups):
            mine = signature.copy()
            mine[field] += r == odd
            calls.append(
                Call(
                    "ShmGroup.agree",
                    g.agree,
                    [Arg("table", table, "A", output=True), Arg("parity", parity, "i")]
                    + [Arg("signature", mine, "A")],
                    lambda before, *a: Expect(ret=None, scale=dict(UNCHECKED)),
                    writes_on_error=True,
                    thread=f"rank{r}",
                    tags=list(model.notes) + ["mismatch"],
                )
            )
        pool.run_all([lambda c=c: fz.run(c) for c in calls])
        return
    args = [
        Arg("table", table, "A", output=True),
        Arg("parity", parity, "i"),
        Arg("signature", signature, "A"),
    ]
    run_collective(rng, fz, groups, model, pool, "agree", args, check_agree(model.n), 0.3)


def step_checked_allreduce(rng, fz, groups, model, pool):
    """checked_allreduce(world, table, parity, signature, scale, start, stop, publish), each
    rank's own group as the world: agree's check on the group's barrier, then the
    all-reduce of allreduce(...) without its entry barrier."""
    before = [v.copy() for v in model.views]
    out_before = None if model.out_view is None else model.out_view.copy()
    table, signature, parity = signature_args(rng, model.n)
    start, stop = None, None
    if model.length and rng.random() < 0.4:
        start = int(rng.integers(0, model.length + 1))
        stop = int(rng.integers(start, model.length + 1))
    publish = model.out_view is None or rng.random() < 0.7
    hostile_world = rng.random() < 0.05
    args = [
        Arg("world", None, "O"),
        Arg("table", table, "A", output=True),
        Arg("parity", parity, "i"),
        Arg("signature", signature, "A"),
        Arg("scale", pick(rng, (1.0, 0.5, -2.0)), "f"),
        Arg("start", start, "i?"),
        Arg("stop", stop, "i?"),
        Arg("publish", publish, "b"),
    ]

    def check_args(world, table, parity, signature, scale, start, stop, publish, /):
        if not isinstance(world, core.ShmGroup):
            raise Refuse("world must be a ShmGroup")
        check_agree(model.n)(table, parity, signature)
        if model.aborted == 0:  # an aborted group says so before it reads the rest
            finite_float(scale, "scale")
            group_range(start, stop, model.length)
        try:
            publish = bool(publish)
        except Exception:
            raise Refuse("publish has no truth value") from None
        if model.dtype == np.uint16:
            raise Refuse("bfloat16 buffers")
        if not publish and (model.out_view is None or model.algorithm != "native"):
            raise Refuse("publish=False needs out and the native algorithm")

    def own_world(args, g):
        args[0].value = None if hostile_world else g  # the check's barrier: the group's own

    outs, calls = run_collective(
        rng, fz, groups, model, pool, "checked_allreduce", args, check_args, 0.25, own_world
    )
    if not all(o.expect is not None and o.status == "A" for o in outs):
        return
    kw = {a.name: a.value for a in calls[0].args}
    check_group_sum(fz, model, before, out_before, kw, "ShmGroup.checked_allreduce", calls[0].tags)


def record_abort(model, out, code_arg):
    if out.exc is not None:
        return
    if out.expect is None:
        model.aborted = model.aborted or None  # accepted a code the contract refuses
    elif model.aborted == 0:
        model.aborted = abort_code(code_arg)


def step_abort(rng, fz, groups, model, pool):
    r = int(rng.integers(model.n))
    code = pick(rng, (None, 1, 0, 7, 2**32 - 1, 0xFFFFFFFE))
    call = Call(
        "ShmGroup.abort",
        groups[r].abort,
        [Arg("code", code, "i", omit=code is None)],
        lambda before, code=1: (abort_code(code), Expect())[1],
        tags=list(model.notes),
        thread=f"rank{r}",
    )
    call = mutate(rng, call, hostile_count(rng, 0.4))
    arg = call.args[0]
    out = pool.run(r, lambda: fz.run(call))
    record_abort(model, out, 1 if arg.omit else arg.value)


def step_abort_control(rng, fz, groups, model, pool):
    code = pick(rng, (None, 1, 3, 2**31))
    call = mutate(
        rng,
        Call(
            "abort_group_control",
            core.abort_group_control,
            [
                Arg("control", model.control, "U", output=True),
                Arg("code", code, "i", omit=code is None),
            ],
            oracle_abort_group_control,
        ),
        hostile_count(rng, 0.3),
    )
    out = fz.run(call)
    if call.args[0].value is model.control:
        record_abort(model, out, 1 if call.args[1].omit else call.args[1].value)


def step_reset_control(rng, fz, groups, model, pool):
    """init_group_control again, with no call in flight: the group starts over, un-aborted."""
    out = fz.run(
        Call(
            "init_group_control",
            core.init_group_control,
            [Arg("control", model.control, "U", output=True), Arg("n", model.n, "i")],
            oracle_init_group_control,
        )
    )
    if out.exc is None:
        model.aborted = 0


def step_lonely_barrier(rng, fz, groups, model, pool):
    """Rank 0 alone at the barrier of a group of n > 1, with a short timeout: TimeoutError, and
    the group is aborted with 0xfffffffe (its arrival cannot be taken back)."""
    if model.n == 1:
        return step_barrier(rng, fz, groups, model, pool)
    fz.setup("lonely = ShmGroup(control, buffers, 0, timeout=0.05)")
    lonely = core.ShmGroup(
        model.control, model.views, 0, out=model.out_view, timeout=0.05, algorithm=model.algorithm
    )
    call = Call(
        "ShmGroup.barrier",
        lonely.barrier,
        [],
        refuses("nobody else arrives"),
        allowed=ALLOWED_ERRORS + (TimeoutError,),
        writes_on_error=True,
        tags=list(model.notes),
    )
    if model.aborted != 0:
        call.expect_error = model.aborted_error
    else:
        call.expect_error = lambda e: (
            None if isinstance(e, TimeoutError) else "expected TimeoutError"
        )
    out = fz.run(call)
    if out.exc is not None and model.aborted == 0:
        model.aborted = 0xFFFFFFFE


def step_group_getter(rng, fz, groups, model, pool):
    r = int(rng.integers(model.n))
    attr = pick(rng, ("rank", "size", "aborted"))
    want = {"rank": r, "size": model.n, "aborted": model.aborted}[attr]
    check = (
        expect_eq(want)
        if want is not None
        else (
            lambda v: (
                None if isinstance(v, int) and v > 0 else f"returned {short(v)}, expected a code"
            )
        )
    )
    fz.run(getter_call(f"ShmGroup.{attr}", groups[r], attr, check))


def step_retype_buffer(rng, fz, groups, model, pool):
    i = int(rng.integers(len(model.buffers)))
    note = retype(rng, fz, model.buffers[i], f"buffers[{i}]")
    if note and note not in model.notes:
        model.notes.append(note)


def step_reinit_group(rng, fz, groups, model, pool):
    r = int(rng.integers(model.n))
    fz.run(
        Call(
            "ShmGroup",
            groups[r].__init__,
            [Arg("control", model.control), Arg("buffers", model.buffers), Arg("rank", r)],
            refuses("__init__ of an initialized group"),
        )
    )


GROUP_STEPS = [
    (5, step_allreduce),
    (2, step_barrier),
    (1.5, step_agree),
    (2, step_checked_allreduce),
    (1, step_abort),
    (0.7, step_abort_control),
    (1, step_reset_control),
    (0.5, step_lonely_barrier),
    (2, step_group_getter),
    (0.7, step_retype_buffer),
    (0.3, step_reinit_group),
]


def group_args(rng, control, buffers, rank, out, algorithm, timeout):
    return [
        Arg("control", control, "U"),
        Arg("buffers", buffers, "FL"),
        Arg("rank", rank, "i"),
        Arg("out", out, "F", keyword=True, omit=out is None),
        Arg("spin", pick(rng, (2e-4, 0.0, 1e-3)), "f", keyword=True, omit=rng.random() < 0.5),
        Arg("yield_time", pick(rng, (2e-3, 0.0)), "f", keyword=True, omit=rng.random() < 0.5),
        Arg("timeout", timeout, "f", keyword=True, omit=timeout == 0),
        Arg(
            "algorithm",
            algorithm,
            "s",
            keyword=True,
            omit=algorithm == "native" and rng.random() < 0.5,
        ),
    ]


def probe_group(rng, fz, model):
    """A hostile ShmGroup(...) (not used for collectives). If a group of one accepts it, an
    allreduce and a barrier follow: they must neither hang nor time out."""
    call = Call(
        "ShmGroup",
        core.ShmGroup,
        group_args(rng, model.control, list(model.buffers), 0, model.out, model.algorithm, 1.0),
        oracle_shm_group,
    )
    if model.n == 1 and model.out is None and rng.random() < 0.3:
        # the one buffer of a group of one placed in the control block's memory
        call.arg("buffers").value = [
            np.frombuffer(model.control, model.dtype, count=64 // model.dtype.itemsize)
        ]
        call.tags.append("alias:buffers[0]~control")
    mutate(rng, call, int(rng.integers(0, 3)))
    out = fz.run(call)
    if out.exc is None and isinstance(out.ret, core.ShmGroup) and model.n == 1:
        g = out.ret
        for method, args in (
            ("allreduce", [Arg("scale", 2.0, "f")]),
            ("barrier", []),
            ("barrier", []),
        ):
            fz.run(
                Call(
                    f"ShmGroup.{method}",
                    getattr(g, method),
                    args,
                    lambda before, *a, **k: Expect(ret_check=lambda v: None),
                    tags=call.tags + ["after a probe"],
                    writes_on_error=True,
                    expect_error=lambda e: (
                        "a group of one cannot wait for anybody"
                        if isinstance(e, (TimeoutError, core.GroupAborted))
                        else None
                    ),
                )
            )


def scenario_shm_group(rng, fz):
    n, dt = int(rng.integers(1, 5)), pick_dtype(rng)
    length = pick(rng, (0, 1, 3, 8, 33, 100))
    control = control_block(rng, fz)
    init = mutate(
        rng,
        Call(
            "init_group_control",
            core.init_group_control,
            [Arg("control", control, "U", output=True), Arg("n", n, "i")],
            oracle_init_group_control,
        ),
        hostile_count(rng, 0.3),
    )
    if fz.run(init).status != "A" or init.tags:
        fz.setup(f"init_group_control(control, {n})")
        core.init_group_control(control, n)
    use_out = rng.random() < 0.2
    k = int(rng.integers(1, n + 2)) if use_out else n
    algorithm = "native" if use_out else pick(rng, ALGORITHMS, (2, 1, 1))
    timeout = GROUP_TIMEOUT_S if n > 1 else pick(rng, (0.0, GROUP_TIMEOUT_S))
    buffers = [draw(rng, (length,), dt, pick(rng, ("normal", "quant"))) for _ in range(k)]
    out_arr = draw(rng, (length,), dt) if use_out else None
    groups = []
    for r in range(n):
        out = fz.run(
            Call(
                "ShmGroup",
                core.ShmGroup,
                group_args(rng, control, buffers, r, out_arr, algorithm, timeout),
                oracle_shm_group,
            )
        )
        if out.status != "A":
            return
        groups.append(out.ret)
    model = GroupModel(n, control, buffers, out_arr, algorithm)
    for _ in range(int(rng.integers(0, 3))):
        probe_group(rng, fz, model)
    pool = RankThreads(n)
    try:
        ws, steps = zip(*GROUP_STEPS)
        for _ in range(int(rng.integers(2, 10))):
            pick(rng, steps, ws)(rng, fz, groups, model, pool)
    finally:
        pool.close()


# =======================================================================================
# Context, two threads on one object, uninitialized objects


def oracle_context(before, threads=1, *, gemm_inputs=None):
    check_threads(threads)
    gi = check_gemm_inputs(gemm_inputs)

    def check(c):
        if not isinstance(c, core.Context):
            return "not a Context"
        return None if c.gemm_inputs == gi else f"gemm_inputs is {c.gemm_inputs!r}, expected {gi!r}"

    return Expect(ret_check=check)


CTX_SPECS = ("gemm", "dense_forward", "dense_backward", "conv2d_forward", "conv2d_backward")


def call_with_ctx(rng, fz, ctx):
    call = SPECS[pick(rng, CTX_SPECS)](rng, fz)
    a = call.arg("ctx")
    a.value, a.omit = ctx, False
    return call


def scenario_context(rng, fz):
    threads = pick(rng, (1, 2, 3, 4))
    gi = pick(rng, (None, None, "bfloat16", "float32", "float64"))
    call = mutate(
        rng,
        Call(
            "Context",
            core.Context,
            [
                Arg(
                    "threads",
                    threads,
                    "i",
                    keyword=rng.random() < 0.5,
                    omit=threads == 1 and rng.random() < 0.3,
                ),
                Arg("gemm_inputs", gi, "s", keyword=True, omit=gi is None and rng.random() < 0.5),
            ],
            oracle_context,
        ),
        hostile_count(rng, 0.5),
    )
    out = fz.run(call)
    bf16 = gi == "bfloat16"
    if out.status == "A" and not call.tags:
        ctx = out.ret
    else:
        ctx = new_context(fz, threads, bf16)
    del out
    fz.run(getter_call("Context.threads", ctx, "threads", expect_eq(threads)))
    fz.run(
        getter_call(
            "Context.gemm_inputs",
            ctx,
            "gemm_inputs",
            expect_eq("bfloat16")
            if bf16
            else (lambda got: None if got is None else f"returned {short(got)}, expected None"),
        )
    )
    if rng.random() < 0.3:
        fz.run(
            Call(
                "Context",
                ctx.__init__,
                [Arg("threads", 2, "i")],
                refuses("__init__ of a live Context"),
            )
        )
    for _ in range(int(rng.integers(1, 4))):
        call = call_with_ctx(rng, fz, ctx)
        if bf16:
            # float64 arrays are refused with it; float32 ones are rounded to bfloat16, which
            # the full-precision oracles here do not model (tests/test_bf16.py checks them)
            if any(isinstance(a.value, np.ndarray) and a.value.dtype == F32 for a in call.args):
                continue
            call.oracle = refuses("a bfloat16 context takes float32 arrays only")
            fz.run(call)
        else:
            fz.run(mutate(rng, call, hostile_count(rng, 0.2)))


def threads_interleaved(rng, fz):
    """Two threads, each with its own forward_loss then backward_layer(L-1) ... (0) on one
    Model (any layer list, a dense stack or conv blocks), steps handed from one thread to the
    other: each thread's gradients must be its own batch's, or the call must be refused."""
    net, model = construct_net(rng, fz, pick(rng, CONFIGS), hostile=0.0)
    if net is None:
        return
    pool = RankThreads(2)
    try:
        order = [0, 1] if rng.random() < 0.5 else [1, 0]
        for t in order:
            pool.run(
                t, lambda t=t: step_forward_loss(rng, fz, net, model, f"T{t + 1}", hostile=0.0)
            )
        for i in range(model.n_layers):
            for t in order if rng.random() < 0.5 else order[::-1]:
                sweep = model.sweep(f"T{t + 1}")[0]
                layer = sweep.next_layer if sweep is not None else model.n_layers - 1 - i
                pool.run(
                    t,
                    lambda t=t, layer=layer: step_backward_layer(
                        rng, fz, net, model, f"T{t + 1}", hostile=0.0, layer=layer
                    ),
                )
    finally:
        pool.close()


def threads_concurrent(rng, fz):
    """Two threads calling at once, each on its own arrays: a shared Context's kernels, or a
    shared net's loss_grad (into its own grads), evaluate and logits."""
    if rng.random() < 0.5:
        ctx = new_context(fz, pick(rng, (1, 2, 3)))
        plans = [
            [call_with_ctx(rng, fz, ctx) for _ in range(int(rng.integers(2, 6)))] for _ in range(2)
        ]
    else:
        net, model = construct_net(rng, fz, pick(rng, CONFIGS), hostile=0.0)
        if net is None:
            return
        plans = [[], []]
        for t in (0, 1):
            for _ in range(int(rng.integers(2, 6))):
                plan = pick(rng, (plan_loss_grad, plan_evaluate, plan_logits))
                plans[t].append(plan(rng, net, model, f"T{t + 1}"))
    for t, plan in enumerate(plans):
        for c in plan:
            c.thread = f"T{t + 1}"
    over = []

    def work(plan):
        try:
            for c in plan:
                fz.run(c)
        except CaseOver as e:
            over.append(e)

    workers = [threading.Thread(target=work, args=(p,)) for p in plans]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if over:
        raise over[0]


def plan_loss_grad(rng, net, model, thread):
    """A loss_grad into its own grads buffer (concurrent calls must not share one)."""
    x, labels = make_batch(rng, model, big_p=0)
    grads = np.zeros_like(model.params_view)

    def oracle(before, x, labels, grad_scale=None, grads=None):
        rows = model.check_batch(x, labels)
        gs = model.grad_scale(grad_scale, rows)
        loss, correct, delta = model.ref_loss_grad(x, labels, gs)
        model.check_grads_arg(before, grads, "x")
        want, scale = model.grads_expect(grads.copy(), delta, x, gs)
        grads[...] = want
        return Expect(
            ret_check=model.result_check(loss, correct, x, labels), scale={"grads": scale}
        )

    return net_call(
        model,
        net,
        "loss_grad",
        [
            Arg("x", x, model.x_kind),
            Arg("labels", labels, model.labels_kind),
            Arg("grads", grads, "F", output=True, keyword=True),
        ],
        oracle,
        thread,
    )


def plan_evaluate(rng, net, model, thread):
    x, labels = make_batch(rng, model, big_p=0)

    def oracle(before, x, labels):
        model.check_batch(x, labels)
        loss, correct = model.ref_evaluate(x, labels)
        return Expect(ret_check=model.result_check(loss, correct, x, labels))

    return net_call(
        model,
        net,
        "evaluate",
        [Arg("x", x, model.x_kind), Arg("labels", labels, model.labels_kind)],
        oracle,
        thread,
    )


def plan_logits(rng, net, model, thread):
    x, _ = make_batch(rng, model, big_p=0)

    def oracle(before, x, out):
        model.check_batch(x)
        out[...] = model.ref_logits(x)
        return Expect(scale={"out": model.magnitude(x)})

    return net_call(
        model,
        net,
        "logits",
        [
            Arg("x", x, model.x_kind),
            Arg("out", np.zeros((len(x), model.out_width), model.dtype), "F", output=True),
        ],
        oracle,
        thread,
    )


def scenario_threads(rng, fz):
    pick(rng, (threads_interleaved, threads_concurrent))(rng, fz)


def public_attrs(cls):
    return sorted(a for a in vars(cls) if not a.startswith("_"))


def is_getter(cls, attr):
    return type(vars(cls)[attr]).__name__ == "getset_descriptor"


UNINIT_ARGS = {
    "loss_grad": lambda: [np.zeros((2, 3)), np.zeros(2, np.int64)],
    "forward_loss": lambda: [np.zeros((2, 3)), np.zeros(2, np.int64)],
    "backward_layer": lambda: [0],
    "set_rng": lambda: [0, 0, 0],
    "set_exchange": lambda: [None],
    "evaluate": lambda: [np.zeros((2, 3)), np.zeros(2, np.int64)],
    "logits": lambda: [np.zeros((2, 3)), np.zeros((2, 2))],
    "barrier": lambda: [],
    "allreduce": lambda: [],
    "agree": lambda: [np.zeros(16, np.int64), 0, np.zeros(8, np.int64)],
    "checked_allreduce": lambda: [
        uninitialized(core.ShmGroup),
        np.zeros(16, np.int64),
        0,
        np.zeros(8, np.int64),
        1.0,
        None,
        None,
        True,
    ],
    "abort": lambda: [1],
}


def scenario_uninitialized(rng, fz):
    """Methods and getters of an object made by cls.__new__ without __init__: the methods
    refuse, the getters answer something, nothing crashes."""
    cls = pick(rng, (core.Context, core.Model, core.ShmGroup))
    obj = uninitialized(cls)
    for attr in rng.permutation(public_attrs(cls))[: int(rng.integers(1, 5))]:
        attr = str(attr)
        if is_getter(cls, attr):
            fz.run(getter_call(f"{cls.__name__}.{attr}", obj, attr, lambda v: None))
        else:
            fz.run(
                Call(
                    f"{cls.__name__}.{attr}",
                    getattr(obj, attr),
                    [Arg(f"a{i}", v) for i, v in enumerate(UNINIT_ARGS[attr]())],
                    refuses("not initialized"),
                )
            )


# =======================================================================================
# the table of cases, and the coverage of every public callable


SCENARIOS = {
    "Model": (5.0, scenario_net(model_config)),
    "Model batch norm": (2.0, scenario_net(model_config_bn)),
    "Model dense stack": (5.0, scenario_net(dense_stack_config)),
    "Model conv blocks": (4.0, scenario_net(conv_blocks_config)),
    "ShmGroup": (3.0, scenario_shm_group),
    "Context": (1.0, scenario_context),
    "threads": (1.5, scenario_threads),
    "uninitialized": (1.0, scenario_uninitialized),
}
SPEC_WEIGHTS = {"model_plan": 4.0}  # its layer lists have many ways to be wrong
CASES = [(name, SPEC_WEIGHTS.get(name, 1.0), function_case(name)) for name in SPECS] + [
    (f"scenario {name}", w, fn) for name, (w, fn) in SCENARIOS.items()
]
CASE_P = np.array([w for _, w, _ in CASES]) / sum(w for _, w, _ in CASES)

# Who calls each public callable; test_fuzz_core fails when dir(_core) grows a name that is
# not here (add it to a builder or a scenario, then here).
NET_METHODS = (
    "set_rng",
    "set_exchange",
    "state",
    "loss_grad",
    "forward_loss",
    "backward_layer",
    "evaluate",
    "logits",
    "params",
    "grads",
    "sizes",
    "threads",
    "team_jobs",
    "loss",
)
COVERAGE = {
    **{name: f"SPECS[{name!r}]" for name in SPECS},
    "Context": "scenario_context (constructor, __init__ again), Context arguments of the kernels",
    "Context.threads": "scenario_context, scenario_uninitialized",
    "Context.gemm_inputs": (
        "scenario_context (bfloat16: float64 kernel calls refused), scenario_uninitialized"
    ),
    "Model.gemm_inputs": "construct_net (checked by the constructor's oracle), net_getters",
    "Model": (
        "construct_net (random and hostile layer lists, dense stacks, conv blocks), step_reinit"
    ),
    **{
        f"Model.{m}": "scenario_net (each of CONFIGS), scenario_threads, scenario_uninitialized"
        for m in NET_METHODS + ("input_shape", "n_params", "n_param_layers", "plan")
    },
    "ShmGroup": "scenario_shm_group (every rank, probe_group), step_reinit_group",
    **{
        f"ShmGroup.{m}": "scenario_shm_group, scenario_uninitialized"
        for m in ("barrier", "allreduce", "abort", "aborted", "rank", "size")
    },
    "ShmGroup.agree": (
        "scenario_shm_group (step_agree: matched, mismatched), scenario_uninitialized"
    ),
    "ShmGroup.checked_allreduce": (
        "scenario_shm_group (step_checked_allreduce), scenario_uninitialized"
    ),
    "GroupAborted": "raised by ShmGroup.barrier/allreduce after an abort (checked: its code)",
}


def public_callables():
    """Every public name of _core, classes expanded into Class.method / Class.getter."""
    names = []
    for name in dir(core):
        if name.startswith("_"):
            continue
        obj = getattr(core, name)
        if isinstance(obj, type):
            names.append(name)
            if not issubclass(obj, BaseException):
                names += [f"{name}.{attr}" for attr in public_attrs(obj)]
        elif callable(obj):
            names.append(name)
    return names


def uncovered():
    return sorted(set(public_callables()) - set(COVERAGE))


# =======================================================================================
# the child: run cases from `start` until `quota` calls are made, logging every call


def run_case(fz, case):
    rng = np.random.default_rng([fz.seed, case])
    name, _, fn = CASES[int(rng.choice(len(CASES), p=CASE_P))]
    fz.case = case
    fz.write(f"B\t{case}\t{name}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn(rng, fz)
        except CaseOver:
            pass
        except Exception:  # the fuzzer's own bug: reported, never hidden
            if fz.raise_errors:
                raise
            after = " (after a wrong result: memory may be corrupt)" if fz.poisoned else ""
            fz.write(
                f"X\t{case}\t{name}{after}\t{clean(traceback.format_exc()[-1500:])}", flush=True
            )
    fz.write(f"E\t{case}")


def child_main(seed, start, quota, log_path):
    faulthandler.enable()  # a crash prints the Python stack to stderr too
    with open(log_path, "a", buffering=1 << 16) as log:
        fz = Fuzz(log, seed)
        case = start
        while fz.calls < quota and not fz.poisoned:
            run_case(fz, case)
            case += 1
            if case % 200 == 0:
                gc.collect()
        # After a wrong result the process may hold corrupt memory, which would crash a later,
        # innocent call: the batch ends here and the parent goes on in a fresh process.
        fz.write(f"D\t{case}", flush=True)
    os._exit(0)  # no interpreter teardown: the verdicts are in the log


# =======================================================================================
# the parent: batches in child processes, crashes and hangs, the counts


@dataclass
class Failure:
    kind: str  # "wrong", "bad exception", "crash", "hang"
    label: str
    signature: str
    detail: str
    case: int
    call: str
    count: int = 1


@dataclass
class Report:
    seed: int
    calls: int = 0
    per_callable: dict = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    failures: dict = field(default_factory=dict)
    seconds: float = 0.0
    cases: int = 0

    def count(self, label, what):
        self.per_callable[label][what] += 1

    def fail(self, kind, label, signature, detail, case, call):
        key = (kind, label, signature)
        if key in self.failures:
            self.failures[key].count += 1
        else:
            self.failures[key] = Failure(kind, label, signature, detail, case, call)

    def total(self, what):
        return sum(c[what] for c in self.per_callable.values())

    @property
    def crashes(self):
        return self.total("crashes")

    @property
    def hangs(self):
        return self.total("hangs")

    @property
    def wrong(self):
        return self.total("wrong")


def parse_log(path, report, seed):
    """Counts one batch's log into report; returns (next case or None, calls made, in-flight
    call (case, label, description) or None, last case begun)."""
    calls = {}
    open_ids = []
    done = None
    made = 0
    last_case = None
    last_line = ""
    if not os.path.exists(path):  # the child died before its first line (e.g. an import)
        return done, made, None, last_case
    with open(path, errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # a line cut by the crash
            parts = line.rstrip("\n").split("\t")
            tag = parts[0]
            if tag == "C":
                cid, case, label, thread, desc = (
                    parts[1],
                    int(parts[2]),
                    parts[3],
                    parts[4],
                    parts[5],
                )
                calls[cid] = (case, label, desc, thread)
                open_ids.append(cid)
                made += 1
                report.calls += 1
                report.count(label, "calls")
                last_line = f"{label} {desc}"
            elif tag == "R":
                cid, status, sig, detail = parts[1], parts[2], parts[3], parts[4]
                case, label, desc, thread = calls.pop(cid)
                open_ids.remove(cid)
                if status == "A":
                    report.count(label, "accepted")
                elif status == "R":
                    report.count(label, "rejected")
                    if detail.startswith("GroupAborted:"):
                        report.count("GroupAborted", "calls")
                        report.count("GroupAborted", "accepted")
                else:
                    report.count(label, "wrong")
                    report.fail(
                        "wrong" if status == "W" else "bad exception",
                        label,
                        sig,
                        detail,
                        case,
                        f"{label}({desc})" if not desc.startswith(label) else desc,
                    )
            elif tag == "F":
                case, label, sig, detail = int(parts[1]), parts[2], parts[3], parts[4]
                report.count(label, "wrong")
                report.fail("wrong", label, sig, detail, case, "(the calls of the case together)")
            elif tag == "X":
                report.count("(fuzzer)", "wrong")
                report.fail("fuzzer error", "(fuzzer)", parts[2], parts[3], int(parts[1]), parts[2])
            elif tag == "B":
                last_case = int(parts[1])
                report.cases += 1
            elif tag == "S":
                last_line = f"setup: {parts[2]}"
            elif tag == "D":
                done = int(parts[1])
    in_flight = None
    if open_ids:
        case, label, desc, thread = calls[open_ids[-1]]
        in_flight = (case, label, desc)
    elif last_case is not None:
        in_flight = (last_case, "(between calls)", last_line)
    return done, made, in_flight, last_case


class Batch:
    """A child process running cases from `start` until `quota` calls are made."""

    def __init__(self, seed, start, quota, workdir, n):
        self.seed, self.start, self.quota = seed, start, quota
        self.log = os.path.join(workdir, f"batch{n}.log")
        self.err = os.path.join(workdir, f"batch{n}.err")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            str(seed),
            str(start),
            str(quota),
            self.log,
        ]
        # the child imports the dptrain this process runs (an installed one, or a checkout built
        # in place and imported from its root, which the child's sys.path would lack)
        env = os.environ.copy()
        root = os.path.dirname(os.path.dirname(os.path.abspath(core.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True
            )
        self.size, self.quiet_since = -1, time.monotonic()

    def poll(self, hang_s):
        """None while running; else ("done" | "crash" | "hang", returncode)."""
        rc = self.proc.poll()
        if rc is not None:
            return ("done" if rc == 0 else "crash", rc)
        size = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        now = time.monotonic()
        if size != self.size:
            self.size, self.quiet_since = size, now
        elif now - self.quiet_since > hang_s:
            # SIGABRT first: faulthandler writes every thread's stack to the batch's stderr
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # our own child's session only
                self.proc.wait()
            return ("hang", None)
        return None


def crash_summary(stderr):
    """The C library's / Python's complaint and the innermost Python frames of a crash (or a
    sanitizer's summary line and first frames, under ASan)."""
    lines = stderr.splitlines()
    asan = [
        i
        for i, line in enumerate(lines)
        if "ERROR: AddressSanitizer" in line or line.startswith("SUMMARY:")
    ]
    if asan:
        first = lines[asan[0] : asan[0] + 6]
        return " | ".join(line.strip() for line in first + lines[asan[-1] : asan[-1] + 1])[:900]
    head, frames, in_stack = [], [], False
    for line in lines:
        if "most recent call first" in line:
            in_stack = True
        elif in_stack and line.strip().startswith("File"):
            frames.append(line.strip())
        elif in_stack and not line.strip():
            in_stack = False
        elif (
            not in_stack
            and line.strip()
            and not line.startswith(("Extension modules", "Thread 0x"))
        ):
            head.append(line.strip())
    return " | ".join(head[-3:] + frames[:3])[:700]


def signal_name(rc):
    if rc is not None and rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def run_fuzz(
    calls,
    seed=0,
    jobs=2,
    batch_calls=BATCH_CALLS,
    hang_s=HANG_TIMEOUT_S,
    progress=None,
    keep_logs=None,
):
    """Runs `calls` calls (rounded up to whole cases) in child processes; returns a Report."""
    t0 = time.monotonic()
    report = Report(seed)
    n_batches = max(1, math.ceil(calls / batch_calls))
    todo = collections.deque((b * CASE_STRIDE, batch_calls) for b in range(n_batches))
    running = []
    counter = 0
    with tempfile.TemporaryDirectory(prefix="fuzz_core_") as tmp:
        workdir = keep_logs or tmp
        os.makedirs(workdir, exist_ok=True)
        while todo or running:
            while todo and len(running) < jobs:
                start, quota = todo.popleft()
                running.append(Batch(seed, start, quota, workdir, counter))
                counter += 1
            time.sleep(0.02)
            for batch in list(running):
                state = batch.poll(hang_s)
                if state is None:
                    continue
                running.remove(batch)
                how, rc = state
                done, made, in_flight, last_case = parse_log(batch.log, report, seed)
                if how == "done" and done is not None:
                    if made < batch.quota:  # ended early after a wrong result
                        todo.appendleft((done, batch.quota - made))
                elif in_flight is None:
                    with open(batch.err) as f:
                        raise RuntimeError(
                            f"a fuzz batch died before its first case ({signal_name(rc)}):\n"
                            + f.read()[-3000:]
                        )
                else:
                    case, label, desc = in_flight
                    kind = "hang" if how == "hang" else "crash"
                    with open(batch.err, errors="replace") as f:
                        stderr = f.read()[-6000:]
                    report.count(label, "crashes" if kind == "crash" else "hangs")
                    why = signal_name(rc) if kind == "crash" else "no progress"
                    report.fail(
                        kind,
                        label,
                        f"{kind} ({why})",
                        crash_summary(stderr),
                        case,
                        desc if desc.startswith(label) else f"{label} {desc}",
                    )
                    if made < batch.quota:
                        todo.appendleft((case + 1, batch.quota - made))
                if progress:
                    progress(report)
    report.seconds = time.monotonic() - t0
    return report


# =======================================================================================
# the report


def format_report(report, seed_hint=True):
    lines = []
    cols = ("calls", "accepted", "rejected", "wrong", "crashes", "hangs")
    lines.append(f"{'callable':<28}" + "".join(f"{c:>10}" for c in cols))
    for label in sorted(report.per_callable):
        c = report.per_callable[label]
        lines.append(f"{label:<28}" + "".join(f"{c[k]:>10}" for k in cols))
    lines.append(f"{'TOTAL':<28}" + "".join(f"{report.total(k):>10}" for k in cols))
    lines.append(
        f"\n{report.calls} calls in {report.cases} cases, {report.seconds:.1f} s, "
        f"seed {report.seed}: "
        f"{report.crashes} crashes, {report.hangs} hangs, {report.wrong} wrong"
    )
    missing = [n for n in public_callables() if not report.per_callable.get(n, {}).get("accepted")]
    if missing:
        lines.append(f"never accepted (or never raised): {', '.join(missing)}")
    if report.failures:
        lines.append(
            f"\n{len(report.failures)} distinct failures "
            f"(kind | callable | what [mutations/state] x count):"
        )
        order = {"crash": 0, "hang": 1, "bad exception": 2, "wrong": 3, "fuzzer error": 4}
        for f in sorted(report.failures.values(), key=lambda f: (order[f.kind], f.label, -f.count)):
            lines.append(f"- {f.kind} | {f.label} | {f.signature} x{f.count}")
            lines.append(f"    first: case {f.case}: {f.call[:300]}")
            lines.append(f"    {f.detail[:400]}")
            lines.append(
                f"    replay: python tests/fuzz_core.py --seed {report.seed} --replay {f.case} -v"
            )
    return "\n".join(lines)


def replay(seed, case, verbose):
    """One case in this process, every call printed as it is made."""
    faulthandler.enable()
    out = sys.stdout

    class Echo:
        def write(self, line):
            out.write(line)

        def flush(self):
            out.flush()

    fz = Fuzz(Echo(), seed, verbose=verbose)
    fz.raise_errors = True
    run_case(fz, case)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=10_000, help="calls to make (whole cases)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="batches run at once")
    ap.add_argument("--batch-calls", type=int, default=BATCH_CALLS)
    ap.add_argument("--hang-timeout", type=float, default=HANG_TIMEOUT_S)
    ap.add_argument(
        "--replay", type=int, metavar="CASE", help="run one case here, printing its calls"
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="with --replay: the values too")
    ap.add_argument("--list", action="store_true", help="the public callables and who covers them")
    ap.add_argument("--keep-logs", metavar="DIR", help="keep the batch logs in DIR")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        seed, start, quota, log = args.child
        child_main(int(seed), int(start), int(quota), log)
        return 0
    if args.list:
        for name in public_callables():
            print(f"{name:<28} {COVERAGE.get(name, 'NOT COVERED')}")
        return 1 if uncovered() else 0
    if args.replay is not None:
        replay(args.seed, args.replay, args.verbose)
        return 0
    if uncovered():
        print(f"not covered by the fuzzer: {uncovered()}", file=sys.stderr)
        return 2

    def progress(r):
        print(
            f"  {r.calls} calls, {r.crashes} crashes, {r.hangs} hangs, {r.wrong} wrong",
            file=sys.stderr,
        )

    report = run_fuzz(
        args.calls,
        args.seed,
        args.jobs,
        args.batch_calls,
        args.hang_timeout,
        progress,
        args.keep_logs,
    )
    print(format_report(report))
    return 1 if report.crashes or report.hangs or report.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
