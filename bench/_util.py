"""Shared plumbing for the benchmarks in bench/: thread pinning, timing, tables, JSON.

Import this module FIRST in a benchmark script (before numpy, torch or dptrain): it sets the
BLAS/OpenMP thread counts to one in os.environ, which OpenBLAS, MKL and OpenMP read only
once, when they are loaded. It also puts the repository root first on sys.path, so the
checkout's dptrain (with its in-place built _core) is measured, not a copy installed in
site-packages.

Timing rules used by every script (the machine is small and shared, timings are noisy):
- time.perf_counter around a loop of `number` calls; the figure of one repeat is seconds per
  call;
- several repeats, ours and the reference's interleaved (the order alternates every repeat),
  after untimed warm-up calls; the reported figure is the median of the repeats;
- ours and the reference are compared as a ratio of figures taken in the same run.

Peaks are measured, never written in: the first call of peaks() (environment() makes it, so
once per benchmark process, after the imports) times _core.fma_peak for the widest FMA the CPU
has and for the ISA our kernels use (build_info()["simd"]), in float32 and float64, one
thread. Tables state the percentage of both (peak_columns, peak_legend).

Reference libraries at their best: this machine may force NumPy's OpenBLAS onto older kernels
through OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the environment (old OpenBLAS builds misbehave
without them, so they stay set everywhere else). A benchmark measures OpenBLAS twice: in its
own process, as users of the machine get it, and in a child process whose environment lacks
those two variables (run_blas_best_child: the script re-runs itself with --blas-best-helper),
and names the kernel each one picked (threadpoolctl's `architecture`).

What is left out on purpose: statistics beyond the median and the spread (min/max), and any
CPU frequency control (the VM gives no access to it).
"""

from __future__ import annotations

import os
import sys

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
if "numpy" in sys.modules:
    raise RuntimeError(
        "bench/_util.py must be imported before numpy: the BLAS thread count "
        "is read from the environment when the library loads"
    )
for _var in _THREAD_VARS:
    os.environ[_var] = "1"

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import argparse  # noqa: E402
import ctypes  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Callable, Sequence  # noqa: E402

import numpy as np  # noqa: E402

# Variables with which a machine forces OpenBLAS's kernel choice. Removed only in the
# environment of a benchmark's own child process (run_blas_best_child), never anywhere else.
OPENBLAS_FORCING_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
PEAK_SECONDS = 0.2  # per fma_peak measurement (4 of them at most)


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def parse_args(
    description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None, argv=None
) -> argparse.Namespace:
    """The options every script shares: --quick, --json PATH, --cpu N."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer repeats and shorter runs (a smoke run, noisier figures)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument(
        "--cpu",
        type=int,
        metavar="N",
        help="pin the process to CPU N (sched_setaffinity); default: no pinning",
    )
    p.add_argument("--blas-best-helper", metavar="OUT", help=argparse.SUPPRESS)
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    return args


# ---------------------------------------------------------------------------------------
# Threads and environment
# ---------------------------------------------------------------------------------------


def _openblas_lib():
    """ctypes handle on the OpenBLAS that numpy loaded, or None where it cannot be found."""
    here = os.path.dirname(np.__file__)
    for pattern in ("../numpy.libs/*openblas*.so*", ".libs/*openblas*.so*"):
        for path in glob.glob(os.path.join(here, pattern)):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


def _openblas_call(names: Sequence[str], restype):
    lib = _openblas_lib()
    if lib is None:
        return None
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = restype
            return fn()
    return None


def threadpool_openblas() -> dict | None:
    """threadpoolctl's entry for the OpenBLAS numpy loaded (internal_api, architecture,
    version, num_threads, ...), {"error": ...} without threadpoolctl, None if none loaded."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {"error": "threadpoolctl is not installed (pip install -e '.[bench]')"}
    for entry in threadpool_info():
        if entry.get("internal_api") == "openblas":
            return {
                k: entry.get(k)
                for k in (
                    "internal_api",
                    "architecture",
                    "version",
                    "num_threads",
                    "threading_layer",
                    "filepath",
                )
            }
    return None


def openblas_kernel(info: dict) -> str:
    """The kernel OpenBLAS picked, as threadpoolctl names it (else OpenBLAS's corename)."""
    tp = info.get("threadpoolctl_openblas") or {}
    return tp.get("architecture") or info.get("openblas_core") or "unknown"


def blas_info() -> dict:
    """numpy's BLAS: its name/version, OpenBLAS's chosen core and its thread count, what
    threadpoolctl reports, and the forcing variables of this process's environment."""
    info = {"numpy": np.__version__}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception as exc:  # older numpy without mode="dicts"
        info["blas"] = f"unknown ({type(exc).__name__})"
    core = _openblas_call(
        (
            "scipy_openblas_get_corename64_",
            "scipy_openblas_get_corename",
            "openblas_get_corename64_",
            "openblas_get_corename",
        ),
        ctypes.c_char_p,
    )
    threads = _openblas_call(
        (
            "scipy_openblas_get_num_threads64_",
            "scipy_openblas_get_num_threads",
            "openblas_get_num_threads64_",
            "openblas_get_num_threads",
        ),
        ctypes.c_int,
    )
    info["openblas_core"] = core.decode() if core else None
    info["openblas_threads"] = threads
    info["threadpoolctl_openblas"] = threadpool_openblas()
    info["openblas_forcing_env"] = {
        v: os.environ[v] for v in OPENBLAS_FORCING_VARS if v in os.environ
    }
    return info


def describe_openblas(info: dict) -> str:
    """'OpenBLAS 0.3.31 Haswell, 1 thread, forced by OPENBLAS_CORETYPE=Haswell' or similar."""
    tp = info.get("threadpoolctl_openblas") or {}
    version = tp.get("version") or info.get("blas", "?")
    threads = tp.get("num_threads", info.get("openblas_threads"))
    forced = info.get("openblas_forcing_env") or {}
    how = (
        "forced by " + " ".join(f"{k}={v}" for k, v in forced.items())
        if forced
        else "no " + "/".join(OPENBLAS_FORCING_VARS) + " set: OpenBLAS's own choice"
    )
    note = f" [{tp['error']}]" if "error" in tp else ""
    return f"OpenBLAS {version} {openblas_kernel(info)}, {threads} thread(s), {how}{note}"


def run_blas_best_child(script: str, args: Sequence[str] = (), timeout: float = 600) -> dict:
    """Runs `script --blas-best-helper OUT *args` in a child process whose environment is this
    one without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (so OpenBLAS picks its kernel for this
    CPU), and returns the JSON the child wrote to OUT. The thread variables stay at 1."""
    import subprocess
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_FORCING_VARS}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "blas_best.json")
        cmd = [sys.executable, os.path.abspath(script), "--blas-best-helper", out, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd[:3])} ... (OpenBLAS at its best, child process) "
                f"exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        with open(out) as f:
            return json.load(f)


def write_helper_json(path: str, payload: dict) -> None:
    """A helper mode's result for its parent (see run_blas_best_child); adds blas_info()."""
    with open(path, "w") as f:
        json.dump(_jsonable({"blas": blas_info(), **payload}), f)


# ---------------------------------------------------------------------------------------
# Peaks: measured once per process, on first use
# ---------------------------------------------------------------------------------------

# Vector width of each _core.fma_peak ISA (dp_isa_bits in csrc/dp_cpu.c), for the labels.
ISA_BITS = {"avx512": 512, "avx2": 256, "generic": 128}


def kernel_isa() -> str:
    """The ISA our kernels run (build_info()['isa']: the widest this CPU has, or DPTRAIN_ISA's),
    as an fma_peak ISA."""
    from dptrain import _core

    return _core.build_info()["isa"]


@functools.lru_cache(maxsize=None)
def peaks() -> dict:
    """One thread's FMA peak in GFLOP/s, measured here (_core.fma_peak, PEAK_SECONDS each):
    {"widest": {"isa", "bits", "float32", "float64"}, "kernels": {...}}: the widest FMA this
    CPU has, and the ISA our kernels use (the same measurement when they coincide)."""
    from dptrain import _core

    measured = {}
    out = {}
    for role, isa in (("widest", _core.cpu_features()["widest_fma"]), ("kernels", kernel_isa())):
        if isa not in measured:
            measured[isa] = {
                dt: _core.fma_peak(isa, dt, PEAK_SECONDS) for dt in ("float32", "float64")
            }
        out[role] = {"isa": isa, "bits": ISA_BITS[isa], **measured[isa]}
    return out


def peak_columns(dtype: str = "float32") -> list[tuple[str, float]]:
    """[(column label, GFLOP/s)] for the '% of peak' columns: the widest FMA's peak, then our
    kernels' where it is another ISA. Labels: '%512b', '%256b', ..."""
    p = peaks()
    cols = [(f"%{p['widest']['bits']}b", p["widest"][dtype])]
    if p["kernels"]["isa"] != p["widest"]["isa"]:
        cols.append((f"%{p['kernels']['bits']}b", p["kernels"][dtype]))
    return cols


def pct_of_peaks(gflops: float, dtype: str = "float32") -> dict[str, float]:
    """{label: percent} of gflops against each of peak_columns(dtype)."""
    return {label: 100.0 * gflops / peak for label, peak in peak_columns(dtype)}


def peak_legend(dtypes: Sequence[str] = ("float32",)) -> str:
    """What the % columns divide by, e.g. '%512b = % of the 512-bit FMA peak (avx512, 266.1
    GF/s f32, measured); %256b = % of the 256-bit peak our kernels use (avx2, 134.0 GF/s)'."""
    p = peaks()

    def figures(d):
        return ", ".join(f"{d[dt]:.1f} GF/s {dt.replace('float', 'f')}" for dt in dtypes)

    w, k = p["widest"], p["kernels"]
    if w["isa"] == k["isa"]:
        return (
            f"%{w['bits']}b = % of the {w['bits']}-bit FMA peak ({w['isa']}, {figures(w)}, "
            f"measured): the widest this CPU has, and the one our kernels use"
        )
    return (
        f"%{w['bits']}b = % of the {w['bits']}-bit FMA peak ({w['isa']}, {figures(w)}, "
        f"measured), the widest this CPU has; %{k['bits']}b = % of the {k['bits']}-bit "
        f"peak our kernels use ({k['isa']}, {figures(k)})"
    )


def torch_cnn(torch, in_channels: int, fc_in: int, channels=(32, 64), hidden=128, classes=10):
    """The studies' CNN in PyTorch: conv(in->32, 3x3) -> ReLU -> maxpool 2 -> conv(32->64,
    3x3) -> ReLU -> maxpool 2 -> fc(fc_in->128) -> ReLU -> fc(128->10), its parameters in
    the order of dptrain's models.CNN.layers()."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(in_channels, channels[0], 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels[0], channels[1], 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(fc_in, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def torch_info(torch) -> dict:
    """PyTorch's version, threads, and the BLAS / ISA it says it uses."""
    info = {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    try:
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        info["torch_cpu_capability"] = None
    try:  # "Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, ..."
        found = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
        info["torch_blas"] = found.group(1) if found else None
    except AttributeError:  # a build without __config__: leave it unknown
        info["torch_blas"] = None
    info["torch_mkldnn"] = torch.backends.mkldnn.is_available()
    return info


def pin_torch(torch) -> None:
    """One intra-op and one inter-op thread for PyTorch."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # can only be set before the first parallel work; harmless then
        pass
    if torch.get_num_threads() != 1:
        raise RuntimeError(f"torch.get_num_threads() is {torch.get_num_threads()}, expected 1")


def _git_state() -> dict:
    """The checkout's commit and whether csrc/ or dptrain/ differ from it (figures depend on
    the build, and the build on the sources)."""
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "csrc", "dptrain", "setup.py"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        return {"commit": head, "core_sources_modified": [ln[3:] for ln in dirty if ln.strip()]}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "core_sources_modified": None}


def _core_build_id(core) -> dict:
    """sha256 prefix and mtime of the loaded _core binary: which build was measured."""
    import hashlib

    path = core.__file__
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    mtime = datetime.datetime.fromtimestamp(os.path.getmtime(path)).isoformat(timespec="seconds")
    return {"core_path": path, "core_sha256": digest, "core_mtime": mtime}


def environment(**extra) -> dict:
    """What the figures depend on: machine, library versions, threads, load."""
    import dptrain  # the checkout's (REPO_ROOT is first on sys.path)

    env = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": dptrain.cpu_name(),
        "cpus": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "dptrain_path": os.path.dirname(dptrain.__file__),
        "dptrain_build": _jsonable(dptrain._core.build_info()),
        **_core_build_id(dptrain._core),
        **_git_state(),
        "thread_env": {v: os.environ.get(v) for v in _THREAD_VARS},
        "fma_peaks_gflops_per_thread": peaks(),
        **blas_info(),
    }
    env.update(extra)
    return env


def child_env() -> dict:
    """This process's environment with the repository first on PYTHONPATH: a benchmark's
    child process (mpiexec, a helper) imports the same dptrain."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return env


def run_mpi_helper(
    mpiexec: str, world: int, script: str, args: Sequence[str], timeout: float = 600
) -> object:
    """Runs `script --mpi-helper OUT *args` under `mpiexec -n world` and returns the JSON its
    rank 0 wrote to OUT (a benchmark's MPI column: the script times itself as MPI ranks)."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "mpi.json")
        cmd = [
            mpiexec,
            "-n",
            str(world),
            sys.executable,
            os.path.abspath(script),
            "--mpi-helper",
            out,
            *args,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd[:4])} ... --mpi-helper exited with "
                f"{proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        with open(out) as f:
            return json.load(f)


def paired_steps(model, opt, net, x, y, xt, yt, *, lr: float, momentum: float, label: str):
    """(ours, theirs, check, final_losses) for one training step of a dptrain model and of a
    PyTorch network holding the same initial weights (net.parameters() in the order of
    dptrain's flattened model.layers()), on the same batch: each step function does
    zero_grad + forward + loss + backward + SGD (momentum). check() runs one step of each and
    asserts that the losses and every parameter tensor agree; label names the case."""
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    t_opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    batch = len(y)
    last = {}

    def ours():
        model.zero_grad()
        last["ours"], _ = model.loss_grad(x, y)
        opt.step()

    def theirs():
        t_opt.zero_grad()
        loss = loss_fn(net(xt), yt)
        loss.backward()
        t_opt.step()
        last["torch"] = loss

    def check():
        ours()
        theirs()
        loss_ours, loss_torch = last["ours"] / batch, last["torch"].item()
        if not np.isclose(loss_ours, loss_torch, rtol=1e-5, atol=1e-6):
            raise AssertionError(
                f"step {label} B={batch}: loss {loss_ours} (dptrain) vs {loss_torch} (torch)"
            )
        ours_arrays = [a for wb in model.layers() for a in wb]
        for i, (p, a) in enumerate(zip(net.parameters(), ours_arrays)):
            np.testing.assert_allclose(
                a,
                p.detach().numpy(),
                rtol=1e-4,
                atol=1e-6,
                err_msg=f"step {label} B={batch}: parameter tensor {i} after one step",
            )

    def final_losses():
        return {"ours": float(last["ours"]) / batch, "torch": last["torch"].item()}

    return ours, theirs, check, final_losses


def threads_case(
    label: str,
    build,
    threads: int,
    *,
    repeats: int,
    seconds: float,
    min_steps: int = 20,
    same_bits: bool = True,
) -> dict:
    """One training step at 1 and at `threads` threads, dptrain's and PyTorch's, the four
    interleaved. build(t) -> (ours, theirs, check, model): paired_steps' step functions and
    the dptrain model on t threads (PyTorch's step is run under torch.set_num_threads(t)).
    Each pair's check() runs first; then the t-thread model must hold the 1-thread model's
    parameters: bit for bit, or (same_bits False: a model whose threads add partial sums in
    thread order, dp_model.h) to within a relative 1e-5."""
    import torch

    sides, models = {}, {}
    for t in (1, threads):
        ours, theirs, check, model = build(t)
        check()

        def on_threads(step=theirs, n=t):
            if torch.get_num_threads() != n:
                torch.set_num_threads(n)
            step()

        sides[f"ours_{t}"], sides[f"torch_{t}"], models[t] = ours, on_threads, model
    a, b = models[1].params, models[threads].params
    if not (np.array_equal(a, b) if same_bits else np.allclose(a, b, rtol=1e-5, atol=1e-7)):
        raise AssertionError(
            f"{label}: {threads} threads took another step than 1 (largest "
            f"difference {np.abs(a - b).max():.3g})"
        )
    number = max(min_steps, min(calibrate(f, seconds) for f in sides.values()))
    times = interleaved(sides, repeats=repeats, number=number, warmup=max(2, min_steps // 2))
    torch.set_num_threads(1)
    ms = {k: 1e3 * median(v) for k, v in times.items()}
    return {
        "case": label,
        "threads": threads,
        "steps_per_repeat": number,
        "repeats": repeats,
        "same_step": "bit for bit" if same_bits else "to within a relative 1e-5",
        "ours_1_ms": ms["ours_1"],
        "ours_T_ms": ms[f"ours_{threads}"],
        "torch_1_ms": ms["torch_1"],
        "torch_T_ms": ms[f"torch_{threads}"],
        "ours_speedup": ms["ours_1"] / ms[f"ours_{threads}"],
        "torch_speedup": ms["torch_1"] / ms[f"torch_{threads}"],
        "ratio_at_T": ms[f"ours_{threads}"] / ms[f"torch_{threads}"],
        "spread": max(spread(v) for v in times.values()),
        "seconds_per_step": times,
    }


def print_threads_table(rows: list, threads: int, repeats: int) -> None:
    """threads_case's rows as a table."""
    T = threads
    print()
    print_table(
        [
            "case",
            "ours 1 ms",
            f"ours {T} ms",
            "speedup",
            "torch 1 ms",
            f"torch {T} ms",
            "speedup",
            f"ours/torch at {T}",
            "noise",
        ],
        [
            [
                r["case"],
                f"{r['ours_1_ms']:.3f}",
                f"{r['ours_T_ms']:.3f}",
                f"{r['ours_speedup']:.2f}x",
                f"{r['torch_1_ms']:.3f}",
                f"{r['torch_T_ms']:.3f}",
                f"{r['torch_speedup']:.2f}x",
                f"{r['ratio_at_T']:.2f}",
                f"{100 * r['spread']:.0f}%",
            ]
            for r in rows
        ],
        align="lrrrrrrrr",
        title=f"The same step on 1 and {T} threads inside one worker (dptrain threads={T}, "
        f"torch.set_num_threads({T})), float32, median of {repeats} interleaved repeats "
        f"({os.cpu_count()} CPUs here)",
    )
    for r in rows:
        print(f"{r['case']}: the {T}-thread model took the 1-thread model's step {r['same_step']}")
    print(f"speedup = 1-thread ms / {T}-thread ms")


def add_threads_option(p: argparse.ArgumentParser) -> None:
    """--threads T of the step benchmarks' threads table."""
    p.add_argument(
        "--threads",
        type=int,
        default=2,
        metavar="T",
        help="threads of the threads table's steps (default 2; 1 leaves it out)",
    )


def print_environment(env: dict) -> None:
    b = env["dptrain_build"]
    print(
        f"# {env['date']}  cpu: {env['cpu']} ({env['cpus']} cpus, load {env['loadavg_1min']:.2f})"
    )
    print(f"# dptrain: {env['dptrain_path']}  simd={b.get('simd')}  compiler={b.get('compiler')}")
    modified = env.get("core_sources_modified")
    print(
        f"# commit {env['commit']}"
        + (f" + uncommitted changes in {', '.join(modified)}" if modified else "")
        + f"; _core built {env['core_mtime']}, sha256 {env['core_sha256']}"
    )
    print(f"# numpy {env['numpy']}, BLAS {env['blas']}: {describe_openblas(env)}")
    if "torch" in env:
        print(
            f"# torch {env['torch']} (threads {env['torch_threads']}, BLAS "
            f"{env.get('torch_blas')}, CPU capability {env.get('torch_cpu_capability')}, "
            f"oneDNN {'yes' if env.get('torch_mkldnn') else 'no'}; the OpenBLAS variables "
            f"do not reach it)"
        )
    p = env["fma_peaks_gflops_per_thread"]
    same = p["widest"]["isa"] == p["kernels"]["isa"]
    for role, what in (
        ("widest", "the widest FMA on this CPU" + (", and our kernels' ISA" if same else "")),
        ("kernels", "our kernels' ISA"),
    ):
        d = p[role]
        if role == "kernels" and same:
            break
        print(
            f"# FMA peak, one thread, measured: {d['bits']}-bit {d['isa']} ({what}) "
            f"{d['float32']:.1f} GFLOP/s float32, {d['float64']:.1f} float64"
        )


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


def timed_loop(call: Callable[[], object], number: int, warmup: int) -> list[float]:
    """Seconds of each of `number` back-to-back calls (a perf_counter pair around each), after
    `warmup` untimed calls."""
    clock = time.perf_counter
    for _ in range(warmup):
        call()
    out = [0.0] * number
    for i in range(number):
        t0 = clock()
        call()
        out[i] = clock() - t0
    return out


def mpi_allreduce_call(world, hier, n: int):
    """(buf, call): one all-reduce of n float32 values under MPI, as the mpi backend runs it:
    HierComm.allreduce_sum_ of an array from hier.zeros (hier: a dptrain.comm.HierComm), or
    MPI_Allreduce(IN_PLACE) of a NumPy array on the communicator `world` (hier None)."""
    if hier is not None:
        buf = hier.zeros(n, np.float32)
        return buf, lambda: hier.allreduce_sum_(buf)
    from mpi4py import MPI

    buf = np.zeros(n, np.float32)
    return buf, lambda: world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)


def time_calls(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of fn over one loop of `number` calls."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def calibrate(
    fn: Callable[[], object], target_seconds: float, *, minimum: int = 1, maximum: int = 1_000_000
) -> int:
    """Calls per repeat so that one repeat of fn lasts about target_seconds."""
    number = 1
    while True:
        t = time_calls(fn, number) * number
        if t >= target_seconds / 4 or number >= maximum:
            break
        number *= 4 if t < target_seconds / 40 else 2
    per_call = t / number
    return int(min(maximum, max(minimum, round(target_seconds / max(per_call, 1e-9)))))


def interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    repeats: int,
    number: int,
    warmup: int = 1,
    setup: Callable[[str], None] | None = None,
) -> dict[str, list]:
    """Per-call seconds of each fn, `repeats` times, interleaved: {name: [s, s, ...]}.

    Each repeat times every fn once (`number` calls); the order is reversed every other
    repeat so that neither side always runs right after the other. `warmup` untimed calls
    of each fn come first. setup(name), when given, runs untimed before each timed loop.
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    out = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            if setup is not None:
                setup(name)
            out[name].append(time_calls(fns[name], number))
    return out


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def spread(xs: Sequence[float]) -> float:
    """(max - min) / median: how noisy the repeats were."""
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m else float("nan")


# ---------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence],
    *,
    title: str | None = None,
    align: str | None = None,
) -> None:
    """A plain text table. align: one letter per column, 'l' or 'r' (default: first column
    left, the rest right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or ("l" + "r" * (len(headers) - 1))

    def fmt(row):
        return "  ".join(
            c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)
        ).rstrip()

    if title:
        print(title)
    print(fmt(cells[0]))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print(fmt(row))


def verdict(ratio: float, target: float | None, higher_is_better: bool) -> str:
    """'yes' / 'NO' against the target, '-' where there is none."""
    if target is None:
        return "-"
    ok = ratio >= target if higher_is_better else ratio <= target
    return "yes" if ok else "NO"


def _jsonable(obj):
    from dptrain._plain import plain  # dptrain loads after this module pins the threads

    return plain(obj)


def write_json(path: str | None, benchmark: str, env: dict, config: dict, rows: list) -> None:
    if not path:
        return
    payload = {"benchmark": benchmark, "environment": env, "config": config, "rows": rows}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        json.dump(_jsonable(payload), f, indent=2)
        f.write("\n")
    print(f"# results written to {path}")
