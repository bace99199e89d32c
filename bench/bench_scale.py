"""Data-parallel scaling from 1 to N workers, against the machine's uncoupled ceiling and
PyTorch (issue 34): samples per second of the training loop, speedup, share of the ceiling,
and where dptrain's time goes, at N = 1, 2, 4, ... up to the cores this process may use
(os.sched_getaffinity; and the core count itself where it is not a power of 2).

Workloads (`--workloads`; dptrain's defaults otherwise: SGD momentum 0.9, cosine schedule,
shuffled batches, seed 0, float32):

- mlp:        MLP 784-256-128-10 on MNIST, 128 samples per worker per step (weak scaling:
              the global batch is 128 N), lr 0.1;
- mlp-global: the same MLP, global batch 1024 at every N (strong scaling), lr 0.1;
- cnn:        the studies' CNN (`--model cnn`: conv 3->32 and 32->64 3x3, ReLU, 2x2 max-pool,
              fc 2304->128->10) on 3x32x32 images, 32 samples per worker per step, lr 0.01.

MNIST comes from --data-dir, else $DPTRAIN_DATA, else ../shared/data/mnist beside the clone;
where none holds it, from dptrain's announced synthetic stand-in. CIFAR-10 comes from
$DPTRAIN_DATA or dptrain's cache, else (always, on the machines this was written on) from
dptrain's announced synthetic CIFAR-10-shaped stand-in: the header, the tables' titles and the
JSON name the data each workload used. The data is loaded once in this process and handed to
every run from one .npz file (the first rows a run needs, 256 test rows: the evaluation after
each epoch is outside the timed loop).

Every run takes about `--steps` steps (defaults: mlp 120, mlp-global 60, cnn 32): whole
epochs of full batches over the first rows of the data (E epochs of ceil(steps / E) batches,
E the fewest epochs the data allows). Configurations at each N, all on the same batches:

- process, thread: `python -m dptrain train ARGS --workers N --backend process|thread`,
  run in this process (the CLI's parser and engine.run.run, on the loaded data);
- mpi: `mpiexec -n N python -m dptrain train ARGS --backend mpi --data FILE.npz` (where
  mpi4py and an mpiexec are found: on PATH, or beside this Python as the mpich wheel puts
  it; else the column is left out, saying why);
- threads: one worker with `--threads N` on the global batch (at N = 1 it is thread x1, the
  same command, run once);
- ceiling: N independent 1-worker runs of the per-worker job (batch ceil(global / N), the
  same steps) started together as N processes; each loads its data, then all wait at a
  barrier in front of dptrain's training loop. Throughput = the global batch x steps /
  the slowest one's train_seconds: what N workers could do with free communication, clock
  drop, memory and cache contention included. `ceiling pinned`: the same with each process
  on its own core (os.sched_setaffinity). The share of the ceiling is against the higher;
- DDP gloo: PyTorch DistributedDataParallel, N ranks of 1 thread, the same network, batches
  and shards; torch threads: one PyTorch process on N threads (torch.set_num_threads), the
  global batch per step. Both where torch is installed, timed between barriers after 3
  untimed warm-up steps (dptrain's train_seconds leaves none out).

Figures: samples/s of the training loop (dptrain's own train_seconds; PyTorch's timed loop),
medians of `--repeats` (default 3) interleaved repeats (every configuration at every N once
per repeat, the order reversed every other repeat) with [min-max]; speedup over the same
column's N = 1; share of the ceiling; dptrain's phase shares (compute, sync_wait,
communication, update, data, other: each phase's seconds, mean over ranks, over their sum, as
dptrain's own breakdown line) and its straggler verdict (breakdown["stragglers"]: pattern and
wait_share). `--train-arg=ARG` (repeatable, shell-split) is added to every dptrain run,
the ceiling's included, so that its members run the same per-worker job (e.g. `--dtype
bfloat16`). An option that places a run's workers on cores (`--pin`) reaches each member's
single worker too: the ceiling stays fair only where it leaves a 1-worker run on the cores
the member was given (the unpinned members may use any core).

Checks: every run takes the planned steps; the dptrain runs of one N (the same global batch
on the same data) end with the same mean training loss (relative 1e-3).

Time: on the 2-core development VM (N = 1, 2; 117 runs) the whole run took 1.8 minutes from
load 0.6 and 3.7-4.6 at load 2-6 (other sessions' work); `--quick` (1 repeat, a quarter of
the steps) well under a minute. On a 16-core machine (N = 1, 2, 4, 8, 16: 351 runs) it
should take 5-6 minutes, estimated: the training loops about 150 s at issue 34's 16-core
per-step figures (per repeat: mlp 14 s, mlp-global 13 s, cnn 22 s), and the start-up of
each run about 170 s in all (measured on 2 cores: 0.03-0.15 s for a run in this process,
0.1-0.4 s for PyTorch's, 0.5-1.6 s for an mpiexec or a ceiling group, whose N processes
start in parallel).

Run: python bench/bench_scale.py [--quick] [--workers 1,2,4] [--workloads mlp,cnn]
     [--repeats R] [--steps S] [--limit ROWS] [--train-arg=--pin] [--json PATH]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import _scale_util as su

import math
import os
import shlex
import sys
import tempfile
import time

import numpy as np

from dptrain import _core
from dptrain.cli import build_parser
from dptrain.config import cli_message, config_from_args
from dptrain.data import from_npz, load_dataset
from dptrain.data.cifar10 import CIFAR10_TRAIN_SIZE
from dptrain.engine.run import run as run_config
from dptrain.measure.timing import PHASES

MNIST_TRAIN_SIZE = 60_000
TEST_ROWS = 256  # evaluated after each epoch, outside the timed loop
DEFAULT_MNIST_DIR = os.path.join(os.path.dirname(_util.REPO_ROOT), "shared", "data", "mnist")
LOSS_RTOL = 1e-3


def _workload(title, model, data, lr, steps, *, per_worker=None, global_batch=None) -> dict:
    """A workload: per_worker samples per worker per step (weak scaling), or global_batch at
    every N (strong scaling); lr and the default steps per run."""
    out = dict(title=title, model=model, data=data, lr=lr, steps=steps)
    return out | ({"per_worker": per_worker} if per_worker else {"global_batch": global_batch})


MLP_TITLE = "MLP 784-256-128-10"
WORKLOADS = {
    "mlp": _workload(
        f"{MLP_TITLE}, 128 samples per worker per step (weak scaling)",
        "mlp",
        "mnist",
        0.1,
        120,
        per_worker=128,
    ),
    "mlp-global": _workload(
        f"{MLP_TITLE}, global batch 1024 (strong scaling)",
        "mlp",
        "mnist",
        0.1,
        60,
        global_batch=1024,
    ),
    "cnn": _workload(
        "the studies' CNN on 3x32x32, 32 samples per worker per step (weak scaling)",
        "cnn",
        "cifar10",
        0.01,
        32,
        per_worker=32,
    ),
}
CEILING, PINNED = "ceiling", "ceiling pinned"
PROCESS, MPI, THREAD, THREADS = "process", "mpi", "thread", "threads"
DDP, TORCH_THREADS = "DDP gloo", "torch threads"
CONFIGS = (CEILING, PINNED, PROCESS, MPI, THREAD, THREADS, DDP, TORCH_THREADS)
DPTRAIN_CONFIGS = (PROCESS, MPI, THREAD, THREADS)
TRANSPORTS = (PROCESS, MPI, THREAD)  # N workers: the best of these carries the targets
HEADS = {
    CEILING: "ceiling",
    PINNED: "pinned",
    PROCESS: "process",
    MPI: "mpi",
    THREAD: "thread",
    THREADS: "1 worker --threads N",
    DDP: "DDP gloo",
    TORCH_THREADS: "torch N threads",
}

# issue 34's targets (16 workers, medians of >= 3 interleaved repeats)
TARGET_N = 16
CEILING_TARGET = 0.9  # mlp, cnn: best transport's share of the ceiling
SYNC_WAIT_TARGET = 0.10  # mlp, cnn: sync_wait share of the training time, best transport
GLOBAL_SPEEDUP_TARGET = 9.0  # mlp-global: speedup at 16 workers
THREADS_TARGET = 0.8  # mlp, cnn: --threads 16's speedup over 16 processes'
THREADS_VS_TORCH_AT = (2, 4, 8, 16)  # --threads N's speedup >= torch's N threads'


# ------------------------------------------------------------------ the plan
def default_workers() -> list[int]:
    cores = len(os.sched_getaffinity(0))
    out = [1 << k for k in range(cores.bit_length()) if 1 << k <= cores]
    return out + ([cores] if cores not in out else [])


def plan(name: str, n: int, rows: int, steps: int) -> dict:
    """The batches of the workload at n workers: global batch, epochs, steps per epoch, the
    rows they cover (limit), and the ceiling member's batch and rows."""
    w = WORKLOADS[name]
    batch = w.get("global_batch") or w["per_worker"] * n
    most = rows // batch
    if most < 1:
        raise ValueError(
            f"{name} at {n} workers takes {batch} samples per step, but the data holds "
            f"{rows} rows (--limit): give at least {batch}"
        )
    epochs = math.ceil(steps / most)
    per_epoch = math.ceil(steps / epochs)
    member = -(-batch // n)
    return {
        "workers": n,
        "global_batch": batch,
        "epochs": epochs,
        "steps_per_epoch": per_epoch,
        "steps": epochs * per_epoch,
        "limit": per_epoch * batch,
        "member_batch": member,
        "member_limit": per_epoch * member,
    }


def train_args(name: str, p: dict, config: str, extra: list[str]) -> list[str]:
    """`python -m dptrain train` options of one configuration (without the data)."""
    w = WORKLOADS[name]
    base = ["--model", w["model"], "--epochs", str(p["epochs"]), "--lr", str(w["lr"])]
    base += ["--momentum", "0.9", "--seed", "0", "--no-progress", "--quiet"]
    n = p["workers"]
    if config in (CEILING, PINNED):
        own = ["--limit", str(p["member_limit"]), "--batch-size", str(p["member_batch"])]
        return base + own + ["--workers", "1", "--backend", "thread"] + extra
    batch = (
        ["--batch-per-worker", str(w["per_worker"])]
        if "per_worker" in w
        else ["--batch-size", str(w["global_batch"])]
    )
    base += ["--limit", str(p["limit"])]
    if config == THREADS:
        own = ["--batch-size", str(p["global_batch"]), "--workers", "1", "--threads", str(n)]
        return base + own + ["--backend", "thread"] + extra
    if config == MPI:
        return base + batch + ["--backend", "mpi"] + extra
    return base + batch + ["--workers", str(n), "--backend", config] + extra


def parse_config(args: list[str]):
    """The TrainConfig of `python -m dptrain train ARGS` (the CLI's own parser)."""
    return config_from_args(build_parser().parse_args(["train", *args]))


def torch_spec(name: str, p: dict, config: str, npz: str, n_features: int) -> dict:
    w = WORKLOADS[name]
    n = p["workers"]
    return {
        "kind": w["model"],
        "npz": npz,
        "n_features": n_features,
        "limit": p["limit"],
        "global_batch": p["global_batch"],
        "epochs": p["epochs"],
        "steps_per_epoch": p["steps_per_epoch"],
        "lr": w["lr"],
        "momentum": 0.9,
        "world": n if config == DDP else 1,
        "threads": n if config == TORCH_THREADS else 1,
    }


# ------------------------------------------------------------------ the data
def resolve_mnist_dir(given: str | None) -> str | None:
    if given:
        return given
    if os.environ.get("DPTRAIN_DATA"):
        return None  # dptrain reads $DPTRAIN_DATA itself
    return DEFAULT_MNIST_DIR if os.path.isdir(DEFAULT_MNIST_DIR) else None


def load_workload_data(name: str, rows: int, mnist_dir: str | None, tmp: str) -> dict:
    """The first `rows` training rows (and TEST_ROWS test rows) of the workload's data set,
    loaded once: written to an .npz that every run reads; what the data is, in words."""
    notes, kind = [], WORKLOADS[name]["data"]
    ds = load_dataset(
        kind,
        data_dir=mnist_dir if kind == "mnist" else None,
        limit=rows,
        allow_download=False,
        announce=notes.append,
    )
    if ds.n_train < rows:
        raise ValueError(f"{ds.name} holds {ds.n_train} training rows, the runs need {rows}")
    path = os.path.join(tmp, f"{name}-{ds.name}.npz")
    np.savez(
        path,
        x_train=ds.x_train[:rows],
        y_train=ds.y_train[:rows],
        x_test=ds.x_test[:TEST_ROWS],
        y_test=ds.y_test[:TEST_ROWS],
    )
    synthetic = ds.name.startswith("synthetic")
    what = (
        f"SYNTHETIC stand-in for {'MNIST' if kind == 'mnist' else 'CIFAR-10'} "
        f"(dptrain's {ds.name}: {ds.source})"
        if synthetic
        else f"{ds.name} from {ds.source}"
    )
    return {
        "npz": path,
        "dataset": from_npz(path),
        "name": ds.name,
        "source": ds.source,
        "synthetic": synthetic,
        "describe": what,
        "announced": notes,
        "n_features": ds.n_features,
    }


# ------------------------------------------------------------------ one run
def one_run(name: str, p: dict, config: str, ctx: dict) -> dict:
    """One run of a configuration: a dict with samples_per_second and what the run kept
    (wall_seconds: the whole run, start-up and data loading included)."""
    t0 = time.perf_counter()
    data = ctx["data"][name]
    if config in (CEILING, PINNED):
        cfg = parse_config(ctx["args"][(name, p["workers"], config)])
        cores = ctx["cores"][: p["workers"]] if config == PINNED else None
        out = su.run_ceiling(cfg, p["workers"], npz=data["npz"], cores=cores)
        out["samples"] = p["global_batch"] * out["steps"]
    elif config in (DDP, TORCH_THREADS):
        out = su.run_torch(torch_spec(name, p, config, data["npz"], data["n_features"]))
    elif config == MPI:
        args = ctx["args"][(name, p["workers"], config)] + ["--data", data["npz"]]
        out = su.run_mpi_train(ctx["mpiexec"], p["workers"], args)
    else:
        cfg = parse_config(ctx["args"][(name, p["workers"], config)])
        out = su.run_summary(run_config(cfg, data=data["dataset"]))
    out["samples_per_second"] = out["samples"] / out["train_seconds"]
    out["wall_seconds"] = time.perf_counter() - t0
    return out


def skipped(config: str, n: int, ctx: dict) -> str | None:
    """Why a configuration is left out at n workers (None: it runs)."""
    if config not in ctx["configs"] and not (
        config == THREAD and n == 1 and THREADS in ctx["configs"]
    ):  # (`threads` at N = 1 is `thread` x1: its speedups' base)
        return "not in --configs"
    if config == MPI and not ctx["mpiexec"]:
        return f"no MPI: {ctx['mpi_reason']}"
    if config in (DDP, TORCH_THREADS) and not ctx["torch"]:
        return "torch is not installed"
    if config == PINNED and n > len(ctx["cores"]):
        return f"{n} members, {len(ctx['cores'])} cores to pin them to"
    if config == THREADS and n > ctx["max_threads"]:
        return f"dptrain's threads are at most {ctx['max_threads']}"
    return None


def runs_of(name: str, ctx: dict) -> list[tuple[int, str]]:
    """The (N, configuration) pairs to run, in order; at N = 1 `threads` is `thread` x1."""
    return [
        (n, c)
        for n in ctx["workers"]
        for c in CONFIGS
        if not (n == 1 and c == THREADS) and skipped(c, n, ctx) is None
    ]


def measure(name: str, ctx: dict, repeats: int) -> dict:
    """{(N, config): [run per repeat]} (a failed run is {'error': ...}, reported)."""
    from dptrain.comm import describe

    pairs = runs_of(name, ctx)
    for n, c in [(ctx["workers"][0], THREAD), (max(ctx["workers"]), PROCESS)]:
        one_run(name, ctx["plans"][name][n], c, ctx)  # first-run costs of this process
    out = {pair: [] for pair in pairs}
    for r in range(repeats):
        for n, c in pairs if r % 2 == 0 else pairs[::-1]:
            try:
                out[(n, c)].append(one_run(name, ctx["plans"][name][n], c, ctx))
            except Exception as exc:  # reported in the tables and the checks, not hidden
                out[(n, c)].append({"error": describe(exc)})
                print(f"# {name} / {c} x{n}: FAILED: {describe(exc)}", flush=True)
    if 1 in ctx["workers"] and (1, THREAD) in out and THREADS in ctx["configs"]:
        out[(1, THREADS)] = out[(1, THREAD)]
    return out


# ------------------------------------------------------------------ figures
def figures(name: str, measured: dict, ctx: dict) -> dict:
    """{(N, config): row}: the medians, speedups, shares of the ceiling and phase shares."""
    rows = {}
    for (n, c), runs in measured.items():
        ok = [r for r in runs if "error" not in r]
        row = {"workload": name, "workers": n, "config": c, "failed": len(runs) - len(ok)}
        row["errors"] = [r["error"] for r in runs if "error" in r]
        row["runs"] = runs
        if ok:
            sps = [r["samples_per_second"] for r in ok]
            row["samples_per_second"] = {
                "median": _util.median(sps),
                "min": min(sps),
                "max": max(sps),
                "noise": _util.spread(sps),
            }
        if ok and c in DPTRAIN_CONFIGS:
            shares = [phase_shares(r["phase_seconds"]) for r in ok]
            row["phase_shares"] = {k: _util.median([s[k] for s in shares]) for k in PHASES}
            strag = [r["stragglers"] for r in ok]
            waits = [s["wait_share"] for s in strag if s.get("wait_share") is not None]
            row["stragglers"] = {
                "patterns": [s.get("pattern") for s in strag],
                "stragglers": [s.get("straggler") for s in strag],
                "wait_share": _util.median(waits) if waits else None,
            }
        rows[(n, c)] = row

    def med(n, c):
        r = rows.get((n, c))
        return r["samples_per_second"]["median"] if r and "samples_per_second" in r else None

    for (n, c), row in rows.items():
        m, base = med(n, c), med(1, c)
        row["speedup"] = m / base if m and base else None
        ceilings = [x for x in (med(n, CEILING), med(n, PINNED)) if x]
        row["ceiling"] = max(ceilings) if ceilings else None
        row["of_ceiling"] = m / row["ceiling"] if m and row["ceiling"] else None
    return rows


def phase_shares(seconds: dict) -> dict:
    total = sum(seconds.values()) or 1.0
    return {k: seconds.get(k, 0.0) / total for k in PHASES}


def fmt_k(x: float) -> str:
    return f"{x / 1e3:,.1f}k"


def report(name: str, rows: dict, ctx: dict, repeats: int) -> None:
    w, data = WORKLOADS[name], ctx["data"][name]
    present = [c for c in CONFIGS if any(c == k[1] for k in rows)]
    ns = ctx["workers"]
    steps = {n: ctx["plans"][name][n]["steps"] for n in ns}
    title = (
        f"{name}: {w['title']}, on {data['describe']}; about {ctx['steps'][name]} steps a run "
        f"({', '.join(f'N={n}: {s}' for n, s in steps.items())})"
    )
    print()
    print(title)

    def cells(fn):
        out = []
        for n in ns:
            line = [str(n)]
            for c in present:
                r = rows.get((n, c))
                line.append(fn(r) if r and "samples_per_second" in r else "-")
            out.append(line)
        return out

    _util.print_table(
        ["N"] + [HEADS[c] for c in present],
        cells(
            lambda r: (
                fmt_k(r["samples_per_second"]["median"])
                + (
                    f" [{fmt_k(r['samples_per_second']['min'])}-"
                    f"{fmt_k(r['samples_per_second']['max'])}]"
                    if repeats > 1
                    else ""
                )
            )
        ),
        title=f"samples/s of the training loop, median of {repeats}"
        + (" [min-max]" if repeats > 1 else ""),
    )
    print()
    _util.print_table(
        ["N"] + [HEADS[c] for c in present],
        cells(
            lambda r: (
                (f"{r['speedup']:.2f}x" if r["speedup"] else "-")
                + (f" {r['of_ceiling']:.2f}" if r["of_ceiling"] else "")
            )
        ),
        title="speedup over the column's N=1, then the share of the ceiling (the higher of "
        "ceiling and pinned)",
    )
    table = []
    for n in ns:
        for c in DPTRAIN_CONFIGS:
            r = rows.get((n, c))
            if not r or "phase_shares" not in r or (n == 1 and c == THREADS):
                continue
            s, st = r["phase_shares"], r["stragglers"]
            pats = [p or "-" for p in st["patterns"]]
            verdict = ", ".join(f"{p} x{pats.count(p)}" for p in dict.fromkeys(pats))
            verdict = "-" if set(pats) == {"-"} else verdict
            named = sorted({k for k in st["stragglers"] if k is not None})
            if named:
                verdict += f" (rank {', '.join(map(str, named))})"
            table.append(
                [str(n), HEADS[c]]
                + [f"{100 * s[k]:.0f}%" for k in PHASES]
                + [verdict, f"{100 * st['wait_share']:.1f}%" if st["wait_share"] else "-"]
            )
    if table:
        print()
        _util.print_table(
            ["N", "dptrain"] + list(PHASES) + ["stragglers", "wait share"],
            table,
            align="ll" + "r" * len(PHASES) + "lr",
            title="where dptrain's time goes (share of the phases' sum, mean over ranks; "
            "median of the repeats) and the straggler verdict of each repeat",
        )


def targets(all_rows: dict, ctx: dict) -> list[dict]:
    """Issue 34's targets: met, NOT MET, or not measured (and why)."""
    out = []

    def add(what, value, goal, ok, why=None):
        out.append(
            {
                "target": what,
                "measured": value,
                "goal": goal,
                "verdict": why or ("met" if ok else "NOT MET"),
            }
        )

    def get(name, n, c, key):
        r = all_rows.get(name, {}).get((n, c))
        if not r or "samples_per_second" not in r:
            return None
        return r["samples_per_second"]["median"] if key == "sps" else r.get(key)

    def best(name, n):
        found = [(get(name, n, c, "sps"), c) for c in TRANSPORTS if get(name, n, c, "sps")]
        return max(found)[1] if found else None

    def missing(name, n=TARGET_N):
        if name not in all_rows:
            return f"not measured ({name} not run)"
        if n not in ctx["workers"]:
            return f"not measured (N={n} not reached: {len(ctx['cores'])} cores)"
        return "not measured (no run)"

    for name in ("mlp", "cnn"):
        b = best(name, TARGET_N) if name in all_rows else None
        share = get(name, TARGET_N, b, "of_ceiling") if b else None
        add(
            f"{name}: share of the ceiling at {TARGET_N} workers, best transport"
            + (f" ({b})" if b else ""),
            f"{share:.2f}" if share else "-",
            f">= {CEILING_TARGET}",
            share is not None and share >= CEILING_TARGET,
            None if share is not None else missing(name),
        )
        r = all_rows.get(name, {}).get((TARGET_N, b)) if b else None
        wait = r["phase_shares"]["sync_wait"] if r and "phase_shares" in r else None
        add(
            f"{name}: sync_wait share at {TARGET_N} workers" + (f" ({b})" if b else ""),
            f"{100 * wait:.0f}%" if wait is not None else "-",
            f"<= {100 * SYNC_WAIT_TARGET:.0f}%",
            wait is not None and wait <= SYNC_WAIT_TARGET,
            None if wait is not None else missing(name),
        )
    b = best("mlp-global", TARGET_N) if "mlp-global" in all_rows else None
    sp = get("mlp-global", TARGET_N, b, "speedup") if b else None
    add(
        f"mlp-global: speedup at {TARGET_N} workers" + (f" ({b})" if b else ""),
        f"{sp:.2f}x" if sp else "-",
        f">= {GLOBAL_SPEEDUP_TARGET:.0f}x",
        sp is not None and sp >= GLOBAL_SPEEDUP_TARGET,
        None if sp else missing("mlp-global"),
    )
    for name in ("mlp", "cnn"):
        t = get(name, TARGET_N, THREADS, "speedup")
        p = get(name, TARGET_N, PROCESS, "speedup")
        ratio = t / p if t and p else None
        add(
            f"{name}: --threads {TARGET_N} speedup / process x{TARGET_N} speedup",
            f"{ratio:.2f}" if ratio else "-",
            f">= {THREADS_TARGET}",
            ratio is not None and ratio >= THREADS_TARGET,
            None if ratio else missing(name),
        )
        for n in THREADS_VS_TORCH_AT:
            t = get(name, n, THREADS, "speedup")
            tt = get(name, n, TORCH_THREADS, "speedup")
            why = None
            if not (t and tt):
                why = missing(name, n)
                if not ctx["torch"] and n in ctx["workers"]:
                    why = "not measured (torch is not installed)"
            add(
                f"{name}: --threads {n} speedup vs torch's {n} threads",
                f"{t:.2f}x vs {tt:.2f}x" if t and tt else "-",
                ">= torch's",
                bool(t and tt and t >= tt),
                why,
            )
    return out


def checks(name: str, measured: dict, ctx: dict) -> list[str]:
    """Problems: failed runs, step counts other than planned, losses that disagree."""
    problems = []
    for (n, c), runs in measured.items():
        expect = ctx["plans"][name][n]["steps"]
        for r in runs:
            if "error" in r:
                problems.append(f"{name} / {c} x{n}: {r['error']}")
            elif r["steps"] != expect:
                problems.append(f"{name} / {c} x{n}: {r['steps']} steps, expected {expect}")
    for n in ctx["workers"]:
        losses = {
            c: r["train_loss"]
            for c in DPTRAIN_CONFIGS
            for r in measured.get((n, c), [])[:1]
            if "error" not in r
        }
        if len(losses) > 1:
            ref_c, ref = next(iter(losses.items()))
            for c, loss in losses.items():
                if not abs(loss - ref) <= LOSS_RTOL * abs(ref):
                    problems.append(
                        f"{name} x{n}: final mean training loss of {c} is {loss:.6g}, of "
                        f"{ref_c} {ref:.6g}"
                    )
    return problems


# ------------------------------------------------------------------ command line
def parse_workers(text: str) -> list[int]:
    try:
        ns = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise SystemExit(f"bench_scale.py: --workers is {text!r}, expected e.g. 1,2,4") from None
    if not ns or ns[0] < 1:
        raise SystemExit(f"bench_scale.py: --workers is {text!r}: worker counts are >= 1")
    return ns


def steps_per_run(given: int | None, quick: bool) -> dict:
    steps = {k: given or w["steps"] for k, w in WORKLOADS.items()}
    return {k: max(4, v // 4) if quick else v for k, v in steps.items()}


def main(argv=None):
    def extra(p):
        p.add_argument(
            "--workers", help="comma-separated worker counts (default: 1, 2, 4, ... the cores)"
        )
        p.add_argument(
            "--workloads",
            default=",".join(WORKLOADS),
            help=f"comma-separated subset of {','.join(WORKLOADS)}",
        )
        p.add_argument("--repeats", type=int, help="interleaved repeats (default 3; --quick 1)")
        p.add_argument(
            "--steps",
            type=int,
            help="steps per run, every workload (default: mlp 120, mlp-global 60, cnn 32; "
            "--quick: a quarter)",
        )
        p.add_argument(
            "--limit", type=int, metavar="ROWS", help="use at most ROWS training rows of the data"
        )
        p.add_argument(
            "--data-dir",
            help="the MNIST IDX files (default: $DPTRAIN_DATA, else ../shared/data/mnist)",
        )
        p.add_argument(
            "--configs",
            help=f"comma-separated subset of {','.join(CONFIGS)} (default: all; e.g. leave "
            f"mpi out for a --train-arg that MPI refuses, such as --shard-update)",
        )
        p.add_argument(
            "--train-arg",
            action="append",
            default=[],
            metavar="ARG",
            help="added to every dptrain run (shell-split; write --train-arg=--pin)",
        )

    args = _util.parse_args(
        "Data-parallel scaling to N workers against the uncoupled ceiling and PyTorch",
        extra,
        argv=argv,
    )
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        raise SystemExit(
            f"bench_scale.py: --workloads {args.workloads!r}: expected names from "
            f"{', '.join(WORKLOADS)}"
        )
    for option in ("repeats", "steps", "limit"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            raise SystemExit(
                f"bench_scale.py: --{option} is {getattr(args, option)}, expected >= 1"
            )
    repeats = args.repeats or (1 if args.quick else 3)
    extra_args = [a for text in args.train_arg for a in shlex.split(text)]
    configs = CONFIGS
    if args.configs is not None:
        configs = tuple(c.strip() for c in args.configs.split(",") if c.strip())
        unknown = [c for c in configs if c not in CONFIGS]
        if unknown or not configs:
            raise SystemExit(
                f"bench_scale.py: --configs {args.configs!r}: expected names from "
                f"{', '.join(CONFIGS)}"
            )
    ctx = {
        "configs": configs,
        "workers": parse_workers(args.workers) if args.workers else default_workers(),
        "cores": sorted(os.sched_getaffinity(0)),
        "max_threads": _core.build_info()["max_threads"],
        "steps": steps_per_run(args.steps, args.quick),
        "torch": su.package_version("torch"),
    }
    ctx["mpiexec"], ctx["mpi_reason"] = su.find_mpiexec()
    try:  # the extra options must be dptrain's: refused here, once, not in every run
        parse_config(train_args("mlp", plan("mlp", 1, 128, 1), THREAD, extra_args))
    except SystemExit:
        raise SystemExit(
            f"bench_scale.py: --train-arg {' '.join(extra_args)}: not options of "
            f"`python -m dptrain train` (its message is above)"
        ) from None
    except ValueError as exc:
        raise SystemExit(f"bench_scale.py: --train-arg: {cli_message(exc)}") from None

    sizes = {"mnist": MNIST_TRAIN_SIZE, "cifar10": CIFAR10_TRAIN_SIZE}
    mnist_dir = resolve_mnist_dir(args.data_dir)
    tmp = tempfile.TemporaryDirectory(prefix="bench_scale_")
    ctx.update(plans={}, data={}, args={})
    try:
        for name in workloads:
            w = WORKLOADS[name]
            rows = min(sizes[w["data"]], args.limit or sizes[w["data"]])
            ctx["plans"][name] = {
                n: plan(name, n, rows, ctx["steps"][name]) for n in ctx["workers"]
            }
            need = max(p["limit"] for p in ctx["plans"][name].values())
            ctx["data"][name] = load_workload_data(name, need, mnist_dir, tmp.name)
            for n, p in ctx["plans"][name].items():
                for c in CONFIGS:
                    ctx["args"][(name, n, c)] = train_args(name, p, c, extra_args)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"bench_scale.py: {exc}") from None

    env = _util.environment(
        mpiexec=ctx["mpiexec"],
        mpi4py=su.package_version("mpi4py"),
        mpich=su.package_version("mpich"),
        torch_installed=ctx["torch"],
    )
    _util.print_environment(env)
    print(
        f"# workers: {', '.join(map(str, ctx['workers']))} ({len(ctx['cores'])} cores this "
        f"process may use); {repeats} interleaved repeat(s); dptrain's extra options: "
        f"{' '.join(extra_args) or 'none'}"
    )
    print(
        f"# mpiexec: {ctx['mpiexec'] or 'none, MPI left out: ' + ctx['mpi_reason']}; torch: "
        f"{ctx['torch'] or 'not installed: DDP and torch threads left out'}"
    )
    for name in workloads:
        d = ctx["data"][name]
        print(f"# data of {name}: {d['describe']}")
        for line in d["announced"]:
            print(f"#   dptrain: {line}")
    left_out = {}
    for n in ctx["workers"]:
        for c in CONFIGS:
            if skipped(c, n, ctx):
                left_out.setdefault((c, skipped(c, n, ctx)), []).append(str(n))
    for (c, why), ns in left_out.items():
        print(f"# {HEADS[c]} left out at N = {', '.join(ns)}: {why}")

    t_start = time.perf_counter()
    all_rows, problems, seconds = {}, [], {}

    def write(goals):  # after every workload: a run cut short still leaves its figures
        _util.write_json(
            args.json,
            "scale",
            env,
            {
                "workers": ctx["workers"],
                "cores": ctx["cores"],
                "repeats": repeats,
                "quick": args.quick,
                "steps": ctx["steps"],
                "limit": args.limit,
                "train_args": extra_args,
                "workloads": {name: workload_record(name, ctx) for name in all_rows},
                "workloads_left": [name for name in workloads if name not in all_rows],
                "seconds": seconds,
                "skipped": {
                    f"{c} x{n}": skipped(c, n, ctx)
                    for n in ctx["workers"]
                    for c in CONFIGS
                    if skipped(c, n, ctx)
                },
                "targets": goals,
                "problems": problems,
            },
            [row for name in all_rows for row in all_rows[name].values()],
        )

    try:
        for name in workloads:
            t0 = time.perf_counter()
            measured = measure(name, ctx, repeats)
            all_rows[name] = figures(name, measured, ctx)
            report(name, all_rows[name], ctx, repeats)
            problems += checks(name, measured, ctx)
            seconds[name] = time.perf_counter() - t0
            print(f"# {name}: {seconds[name]:.0f} s", flush=True)
            if name != workloads[-1]:
                write(None)
    finally:
        tmp.cleanup()
    goals = targets(all_rows, ctx)
    print()
    _util.print_table(
        ["target (issue 34)", "measured", "goal", "verdict"],
        [[g["target"], g["measured"], g["goal"], g["verdict"]] for g in goals],
        align="lrrl",
        title=f"targets: at {TARGET_N} workers, medians of the repeats",
    )
    print(f"# {time.perf_counter() - t_start:.0f} s")
    write(goals)
    if problems:
        print("# PROBLEMS:\n#   " + "\n#   ".join(problems))
        raise SystemExit(1)
    print("# checks: planned step counts; the same final training loss across dptrain's runs")
    return all_rows


def workload_record(name: str, ctx: dict) -> dict:
    """The workload as the JSON records it: its definition, data, plans and commands."""
    data = ctx["data"][name]
    return {
        **WORKLOADS[name],
        "data": {k: data[k] for k in ("name", "source", "synthetic", "describe", "announced")},
        "plans": ctx["plans"][name],
        "commands": commands(name, ctx),
    }


def commands(name: str, ctx: dict) -> dict:
    """How each configuration runs, as commands (for the JSON)."""
    npz = os.path.basename(ctx["data"][name]["npz"])
    data = "--data " + npz
    out = {}
    for n in ctx["workers"]:
        for c in CONFIGS:
            a = " ".join(ctx["args"][(name, n, c)])
            if n == 1 and c == THREADS:
                out[f"{c} x{n}"] = f"the {THREAD} x1 run (the same command)"
            elif c == MPI:
                out[f"{c} x{n}"] = f"mpiexec -n {n} python -m dptrain train {a} {data}"
            elif c in (CEILING, PINNED):
                pin = ", each pinned to its own core" if c == PINNED else ""
                out[f"{c} x{n}"] = f"{n} x python -m dptrain train {a} {data}{pin}"
            elif c in (DDP, TORCH_THREADS):
                spec = torch_spec(
                    name, ctx["plans"][name][n], c, npz, ctx["data"][name]["n_features"]
                )
                out[f"{c} x{n}"] = f"PyTorch: {spec}"
            else:
                out[f"{c} x{n}"] = f"python -m dptrain train {a} {data} (in this process)"
    return out


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
