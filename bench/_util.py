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

What is left out on purpose: statistics beyond the median and the spread (min/max), and any
CPU frequency control (the VM gives no access to it).
"""
from __future__ import annotations

import os
import sys

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
if "numpy" in sys.modules:
    raise RuntimeError("bench/_util.py must be imported before numpy: the BLAS thread count "
                       "is read from the environment when the library loads")
for _var in _THREAD_VARS:
    os.environ[_var] = "1"

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import argparse  # noqa: E402
import ctypes  # noqa: E402
import datetime  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Callable, Sequence  # noqa: E402

import numpy as np  # noqa: E402

# The brief's per-core peak: 3.24 GHz x 32 float32 flop/cycle (two 256-bit FMA pipes on Zen);
# float64 is half of it. Used only for the "% of peak" columns.
CLOCK_GHZ = 3.24
PEAK_GFLOPS = {"float32": CLOCK_GHZ * 32, "float64": CLOCK_GHZ * 16}


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None,
               argv=None) -> argparse.Namespace:
    """The options every script shares: --quick, --json PATH, --cpu N."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true",
                   help="fewer repeats and shorter runs (a smoke run, noisier figures)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--cpu", type=int, metavar="N",
                   help="pin the process to CPU N (sched_setaffinity); default: no pinning")
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


def blas_info() -> dict:
    """numpy's BLAS: its name/version, OpenBLAS's chosen core and its thread count."""
    info = {"numpy": np.__version__}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception as exc:  # older numpy without mode="dicts"
        info["blas"] = f"unknown ({type(exc).__name__})"
    core = _openblas_call(("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                           "openblas_get_corename64_", "openblas_get_corename"), ctypes.c_char_p)
    threads = _openblas_call(("scipy_openblas_get_num_threads64_",
                              "scipy_openblas_get_num_threads",
                              "openblas_get_num_threads64_", "openblas_get_num_threads"),
                             ctypes.c_int)
    info["openblas_core"] = core.decode() if core else None
    info["openblas_threads"] = threads
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
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "csrc", "dptrain",
                                "setup.py"], cwd=REPO_ROOT, capture_output=True, text=True,
                               check=True).stdout.split("\n")
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
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    env = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "dptrain_path": os.path.dirname(dptrain.__file__),
        "dptrain_build": _jsonable(dptrain._core.build_info()),
        **_core_build_id(dptrain._core),
        **_git_state(),
        "thread_env": {v: os.environ.get(v) for v in _THREAD_VARS},
        "peak_gflops_per_core": PEAK_GFLOPS,
        **blas_info(),
    }
    env.update(extra)
    return env


def run_mpi_helper(mpiexec: str, world: int, script: str, args: Sequence[str],
                   timeout: float = 600) -> object:
    """Runs `script --mpi-helper OUT *args` under `mpiexec -n world` and returns the JSON its
    rank 0 wrote to OUT (a benchmark's MPI column: the script times itself as MPI ranks)."""
    import json
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "mpi.json")
        cmd = [mpiexec, "-n", str(world), sys.executable, os.path.abspath(script),
               "--mpi-helper", out, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:4])} ... --mpi-helper exited with "
                               f"{proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
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
            raise AssertionError(f"step {label} B={batch}: loss {loss_ours} (dptrain) vs "
                                 f"{loss_torch} (torch)")
        ours_arrays = [a for wb in model.layers() for a in wb]
        for i, (p, a) in enumerate(zip(net.parameters(), ours_arrays)):
            np.testing.assert_allclose(a, p.detach().numpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=f"step {label} B={batch}: parameter tensor {i} "
                                               f"after one step")

    def final_losses():
        return {"ours": float(last["ours"]) / batch, "torch": last["torch"].item()}

    return ours, theirs, check, final_losses


def print_environment(env: dict) -> None:
    b = env["dptrain_build"]
    print(f"# {env['date']}  cpu: {env['cpu']} ({env['cpus']} cpus, load {env['loadavg_1min']:.2f})")
    print(f"# dptrain: {env['dptrain_path']}  simd={b.get('simd')}  compiler={b.get('compiler')}")
    modified = env.get("core_sources_modified")
    print(f"# commit {env['commit']}"
          + (f" + uncommitted changes in {', '.join(modified)}" if modified else "")
          + f"; _core built {env['core_mtime']}, sha256 {env['core_sha256']}")
    print(f"# numpy {env['numpy']}, BLAS {env['blas']}, OpenBLAS core {env['openblas_core']}, "
          f"OpenBLAS threads {env['openblas_threads']}")
    if "torch" in env:
        print(f"# torch {env['torch']} (threads {env['torch_threads']})")
    print(f"# peak per core: {PEAK_GFLOPS['float32']:.1f} GFLOP/s float32, "
          f"{PEAK_GFLOPS['float64']:.1f} GFLOP/s float64")


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------

def time_calls(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of fn over one loop of `number` calls."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def calibrate(fn: Callable[[], object], target_seconds: float, *, minimum: int = 1,
              maximum: int = 1_000_000) -> int:
    """Calls per repeat so that one repeat of fn lasts about target_seconds."""
    number = 1
    while True:
        t = time_calls(fn, number) * number
        if t >= target_seconds / 4 or number >= maximum:
            break
        number *= 4 if t < target_seconds / 40 else 2
    per_call = t / number
    return int(min(maximum, max(minimum, round(target_seconds / max(per_call, 1e-9)))))


def interleaved(fns: dict[str, Callable[[], object]], *, repeats: int, number: int,
                warmup: int = 1, setup: Callable[[str], None] | None = None) -> dict[str, list]:
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
        for name in (names if r % 2 == 0 else names[::-1]):
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

def print_table(headers: Sequence[str], rows: Sequence[Sequence], *, title: str | None = None,
                align: str | None = None) -> None:
    """A plain text table. align: one letter per column, 'l' or 'r' (default: first column
    left, the rest right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or ("l" + "r" * (len(headers) - 1))

    def fmt(row):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w)
                         for c, w, a in zip(row, widths, align)).rstrip()

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
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return obj


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
