"""_core.cpu_features() and _core.fma_peak(): CPU feature detection and the measured FMA peak.

What is checked is what must hold on any machine: the documented keys with bool flags, the
implications that CPUID guarantees (every AVX-512 sub-feature implies AVX-512F; FMA and AVX2
need AVX), agreement with the flags Linux reports in /proc/cpuinfo (the kernel reads the same
CPUID and also hides what the OS does not save), a positive finite rate for every ISA the CPU
has, a ValueError naming each ISA it lacks, and clear errors for bad arguments. No wall-clock
threshold is asserted anywhere: the figures themselves live in bench/ (bench/_util.py).
"""

import gc
import math
import platform
import sys

import numpy as np
import pytest

from dptrain import _core as core

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

FLAGS = (
    "avx",
    "fma",
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
)
ISAS = ("generic", "avx2", "avx512")
SHORT = 0.01  # seconds per measurement: enough for a positive rate, cheap on 2 shared cores


def available(isa):
    """Whether `isa`'s peak loop can run here, from cpu_features (the same rule as the C)."""
    f = core.cpu_features()
    return {"generic": True, "avx2": f["avx2"] and f["fma"], "avx512": f["avx512f"]}[isa]


def test_cpu_features_keys_and_types():
    f = core.cpu_features()
    assert set(f) == {"vendor", "brand", "widest_fma", *FLAGS}, sorted(f)
    for name in FLAGS:
        assert type(f[name]) is bool, f"cpu_features()[{name!r}] is {f[name]!r}, expected a bool"
    assert isinstance(f["vendor"], str) and isinstance(f["brand"], str)
    assert f["widest_fma"] in ISAS
    assert f == core.cpu_features(), "two calls disagree"


def test_cpu_features_implications():
    f = core.cpu_features()
    for sub in ("avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"):
        assert f["avx512f"] or not f[sub], f"{sub} without avx512f: {f}"
    assert f["avx"] or not (f["fma"] or f["avx2"]), f"fma/avx2 without avx (OS YMM state): {f}"
    assert f["amx_tile"] or not f["amx_bf16"], f"amx_bf16 without amx_tile: {f}"
    widest = "avx512" if available("avx512") else "avx2" if available("avx2") else "generic"
    assert f["widest_fma"] == widest, f


def _proc_cpuinfo_flags():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


@pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or platform.machine() not in ("x86_64", "AMD64", "i686", "i386"),
    reason="/proc/cpuinfo x86 flags: Linux on x86 only",
)
def test_cpu_features_agree_with_proc_cpuinfo():
    flags = _proc_cpuinfo_flags()
    if flags is None:
        pytest.skip("no flags line in /proc/cpuinfo")
    f = core.cpu_features()
    for name in FLAGS:
        assert f[name] == (name in flags), (
            f"cpu_features()[{name!r}] is {f[name]}, /proc/cpuinfo "
            f"{'lists' if name in flags else 'does not list'} {name!r}"
        )


@pytest.mark.skipif(
    platform.machine() in ("x86_64", "AMD64", "i686", "i386"),
    reason="x86: the flags come from CPUID",
)
def test_cpu_features_all_false_off_x86():
    f = core.cpu_features()
    assert not any(f[name] for name in FLAGS), f
    assert f["widest_fma"] == "generic"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("isa", ISAS + ("widest",))
def test_fma_peak_positive_where_available(isa, dtype):
    if isa != "widest" and not available(isa):
        pytest.skip(f"this CPU ({core.cpu_features()['brand']}) lacks {isa}")
    g = core.fma_peak(isa, dtype, SHORT)
    assert type(g) is float and math.isfinite(g) and g > 0, f"fma_peak({isa!r}, {dtype}) = {g!r}"


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_fma_peak_refuses_missing_isa(isa):
    if available(isa):
        pytest.skip(f"this CPU has {isa}: nothing to refuse")
    with pytest.raises(ValueError, match=f"isa '{isa}' is not available on this CPU"):
        core.fma_peak(isa, "float32", SHORT)


def test_fma_peak_defaults_and_dtype_spellings():
    assert core.fma_peak(seconds=SHORT) > 0
    for dtype in (np.float64, np.dtype("float32"), "f8"):
        assert core.fma_peak("generic", dtype, SHORT) > 0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"isa": "sse9"},
            ValueError,
            r"isa must be 'widest', 'avx512', 'avx2' or 'generic', got 'sse9'",
        ),
        ({"isa": None}, TypeError, "str"),
        ({"seconds": 0.0}, ValueError, r"seconds must be a finite number in \(0, 60\], got 0"),
        ({"seconds": -1.0}, ValueError, "got -1"),
        ({"seconds": float("nan")}, ValueError, "got nan"),
        ({"seconds": float("inf")}, ValueError, "got inf"),
        ({"seconds": 61.0}, ValueError, "got 61"),
        ({"seconds": "0.1"}, TypeError, "real number"),
        ({"dtype": "int8"}, ValueError, r"dtype must be float32 or float64, got dtype\('int8'\)"),
        ({"dtype": np.float16}, ValueError, "float16"),
        ({"dtype": "float99"}, TypeError, "float99"),
    ],
)
def test_fma_peak_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        core.fma_peak(**{"isa": "generic", "seconds": SHORT, **kwargs})


def test_fma_peak_no_reference_leak():
    # float64's dtype is a shared singleton whose count other live objects (garbage of
    # earlier tests, collected at any time) also move by a few: a leak here would add one
    # reference per call, 100 over the loop
    dt = np.dtype("float64")
    gc.collect()
    before = sys.getrefcount(dt)
    for _ in range(50):
        core.fma_peak("generic", dt, 1e-4)
        with pytest.raises(ValueError):
            core.fma_peak("generic", np.dtype("int8"), 1e-4)
    gc.collect()
    assert abs(sys.getrefcount(dt) - before) < 10


def test_fma_peak_releases_gil(gil_probe):
    assert gil_probe(lambda: core.fma_peak("generic", "float32", 0.002), max_calls=200)
