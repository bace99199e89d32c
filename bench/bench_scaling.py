"""Data-parallel scaling on 2 workers: our train_seconds at 1 and 2 workers on every transport,
against the machine's ceiling (2 uncoupled runs) and PyTorch DDP.

Workloads (everything else is `dptrain.train`'s default: lr 0.1, cosine schedule, shuffled
batches, seed 0, one kernel thread per worker):

- mlp:     MLP 784-256-128-10 on MNIST (the first 30,000 training samples, float32), global
           batch 128, SGD momentum 0.9, 1 epoch = 235 steps;
- softmax: softmax regression 784->10, the same data, batch and optimizer;
- logreg:  logistic regression on synthetic_binary(1,000,000, 20) float64, batch 8192 PER
           WORKER (global 8192 x N), lr 0.1, momentum 0, 2 epochs.

MNIST is read from /work/shared/data/mnist; where it is absent, dptrain's announced synthetic
stand-in is used on every side (the header says which).

Configurations, each timed by dptrain's own `train_seconds` (rank 0, the training loop alone,
between barriers: no start-up, data loading or evaluation):

- 1 worker:       `train(workers=1)` in this process (sequential, no communicator): T1;
- thread x2, process x2: `train(workers=2, backend=...)` in this process;
- mpi -n 1, mpi -n 2: `mpiexec -n N python -m dptrain train ... --backend mpi --out FILE`
  (the ranks of this machine reduce over a shared window: dptrain.comm.hier);
- mpi -n 2 flat: the same with --no-mpi-shm (MPI_Allreduce over both ranks);
- independent pair: 2 uncoupled 1-worker runs, each doing half of the 2-worker job (mlp and
  softmax: batch 64 on the first 15,000 samples, 235 steps; logreg: batch 8192 on
  synthetic_binary(500,000, 20), the same steps as the 2-worker run), started together as 2
  processes ('spawn'); each loads its data, then both wait at a multiprocessing.Barrier placed
  in front of dptrain's training loop (a wrapper around engine.run.train_worker), so the two loops
  really run at the same time. T_pair = the slower one's train_seconds. The ceiling speedup
  T1 / T_pair is what 2 workers could reach with free communication on this machine (memory
  bandwidth, shared caches and the host's time-sharing included);
- DDP (mlp only): PyTorch 2.13 DistributedDataParallel, gloo backend, 1 and 2 ranks
  (1 thread each), the same MLP, global batch 128 (64 per rank at 2 ranks, the contiguous
  shards of a seeded shuffled order), 235 steps, SGD momentum 0.9, lr 0.1; 3 untimed warm-up
  steps, then the epoch between barriers. Its ranks fork from a server process that imported
  torch (bench/_scale_util.py's run_torch), so this process never imports torch.

speedup = T1 / T (T1 our 1 worker, medians of the same run); % of ceiling = speedup / ceiling
speedup. Every configuration runs `repeats` times, interleaved (the order reversed every other
repeat), after one untimed warm-up of the in-process configurations; figures are medians with
min/max, noise = (max - min) / median. `comm %` is rank 0's communication phase (all-reduce,
including waiting for the other worker) as a share of its train_seconds.

Checks (after the tables): every run takes the expected number of steps; runs of the same
global batch end with the same mean training loss (relative 2e-2 across worker counts, 1e-3
among 2-worker transports).

Targets (from the issues): mlp 2-worker speedup >= 1.75x on the best transport, >= 90 % of the
ceiling, and >= 4x DDP's 2-rank throughput; softmax >= 1.6x; logreg >= 1.3x and >= 90 % of the
ceiling; mlp under mpiexec -n 2: speedup >= 0.95x the process transport's.

Run: python bench/bench_scaling.py [--quick] [--json PATH]  (about 90 s; --quick: 1 repeat, 40 s)
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import _scale_util as su  # noqa: E402

import math  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import dptrain  # noqa: E402
from dptrain.comm import describe  # noqa: E402
from dptrain.config import TrainConfig  # noqa: E402

MNIST_DIR = "/work/shared/data/mnist"
WORKERS = 2
MLP_LIMIT = 30_000
LOGREG_N, LOGREG_D, LOGREG_BATCH = 1_000_000, 20, 8192

SPEEDUP_TARGETS = {"mlp": 1.75, "softmax": 1.6, "logreg": 1.3}
CEILING_TARGETS = {"mlp": 0.90, "logreg": 0.90}
DDP_TARGET = 4.0  # ours (2 workers, best transport) / DDP (2 ranks), samples/s
MPI_OVER_PROCESS_TARGET = 0.95  # mlp: speedup of mpi -n 2 / speedup of process x2

SEQ, THREAD, PROCESS, MPI1, MPI2, MPI2F, PAIR, DDP1, DDP2 = (
    "1 worker",
    "thread x2",
    "process x2",
    "mpi -n 1",
    "mpi -n 2",
    "mpi -n 2 flat",
    "independent pair",
    "DDP gloo x1",
    "DDP gloo x2",
)
TWO_WORKER = (THREAD, PROCESS, MPI2, MPI2F)


def mnist_dir() -> str | None:
    return MNIST_DIR if os.path.isdir(MNIST_DIR) else None


def workload_config(name: str, workers: int, *, half: bool = False) -> dict:
    """dptrain.train keyword arguments of one run of the workload at `workers` workers; with
    half=True, one member of the independent pair (1 worker, half of the 2-worker job)."""
    if name in ("mlp", "softmax"):
        cfg = dict(
            model=name,
            dataset="mnist",
            data_dir=mnist_dir(),
            allow_download=False,
            limit=MLP_LIMIT // 2 if half else MLP_LIMIT,
            epochs=1,
            batch_size=128 // 2 if half else 128,
            lr=0.1,
            momentum=0.9,
        )
    elif name == "logreg":
        cfg = dict(
            model="logreg",
            dataset="synthetic",
            n_samples=LOGREG_N // 2 if half else LOGREG_N,
            n_features=LOGREG_D,
            dtype="float64",
            epochs=2,
            batch_size=LOGREG_BATCH * (1 if half else workers),
            lr=0.1,
            momentum=0.0,
        )
    else:
        raise ValueError(f"unknown workload {name!r}")
    return cfg


def cli_args(cfg: dict) -> list[str]:
    """The same configuration as `python -m dptrain train` options."""
    out = [
        "--model",
        cfg["model"],
        "--dataset",
        cfg["dataset"],
        "--epochs",
        str(cfg["epochs"]),
        "--batch-size",
        str(cfg["batch_size"]),
        "--lr",
        str(cfg["lr"]),
        "--momentum",
        str(cfg["momentum"]),
    ]
    if cfg.get("dtype"):
        out += ["--dtype", cfg["dtype"]]
    if cfg.get("limit"):
        out += ["--limit", str(cfg["limit"])]
    if cfg.get("n_samples"):
        out += ["--n-samples", str(cfg["n_samples"]), "--n-features", str(cfg["n_features"])]
    if cfg.get("data_dir"):
        out += ["--data-dir", cfg["data_dir"]]
    if cfg["dataset"] == "mnist" and not cfg.get("allow_download", True):
        out += ["--no-download"]
    return out


# ------------------------------------------------------------------ the configurations
def run_in_process(name: str, workers: int, backend: str) -> dict:
    cfg = workload_config(name, workers)
    return su.run_summary(dptrain.train(workers=workers, backend=backend, quiet=True, **cfg))


def run_mpi(name: str, ranks: int, mpiexec: str, *extra: str) -> dict:
    args = [*cli_args(workload_config(name, ranks)), "--backend", "mpi", *extra]
    return su.run_mpi_train(mpiexec, ranks, args)


def run_pair(name: str) -> dict:
    """The independent pair: 2 uncoupled 1-worker runs, each on half the job."""
    config = TrainConfig.from_kwargs(workers=1, quiet=True, **workload_config(name, 1, half=True))
    return su.run_ceiling(config, WORKERS)


def run_ddp(world: int) -> dict:
    """The DDP reference (_scale_util.run_torch): the MLP workload, `world` ranks."""
    cfg = workload_config("mlp", world)
    return su.run_torch(
        {
            "kind": "mlp",
            "load": {
                "name": "mnist",
                "data_dir": cfg["data_dir"],
                "allow_download": False,
            },
            "n_features": 784,
            "limit": cfg["limit"],
            "global_batch": cfg["batch_size"],
            "epochs": cfg["epochs"],
            "steps_per_epoch": math.ceil(cfg["limit"] / cfg["batch_size"]),
            "lr": cfg["lr"],
            "momentum": cfg["momentum"],
            "world": world,
            "threads": 1,
        }
    )


# ------------------------------------------------------------------ the benchmark
def configurations(name: str, mpiexec: str | None, with_ddp: bool) -> dict:
    runs = {
        SEQ: lambda: run_in_process(name, 1, "thread"),
        THREAD: lambda: run_in_process(name, WORKERS, "thread"),
        PROCESS: lambda: run_in_process(name, WORKERS, "process"),
    }
    if mpiexec:
        runs[MPI1] = lambda: run_mpi(name, 1, mpiexec)
        runs[MPI2] = lambda: run_mpi(name, WORKERS, mpiexec)
        runs[MPI2F] = lambda: run_mpi(name, WORKERS, mpiexec, "--no-mpi-shm")
    runs[PAIR] = lambda: run_pair(name)
    if with_ddp and name == "mlp":
        runs[DDP1] = lambda: run_ddp(1)
        runs[DDP2] = lambda: run_ddp(WORKERS)
    return runs


def measure(name: str, runs: dict, repeats: int) -> dict:
    """{config: [summary per repeat]} (a failed run is {'error': ...} and is reported)."""
    for cfg in (SEQ, THREAD, PROCESS):  # warm-up: first-run costs of this process
        runs[cfg]()
    out = {cfg: [] for cfg in runs}
    names = list(runs)
    for r in range(repeats):
        for cfg in names if r % 2 == 0 else names[::-1]:
            try:
                out[cfg].append(runs[cfg]())
            except Exception as exc:  # reported in the table and the checks, not hidden
                out[cfg].append({"error": describe(exc)})
                print(f"# {name} / {cfg}: FAILED: {exc}", flush=True)
    return out


def _seconds(results: list) -> list[float]:
    return [r["train_seconds"] for r in results if "error" not in r]


def report(name: str, measured: dict, repeats: int) -> tuple[list, dict]:
    """Prints the workload's table; returns its rows and its headline figures."""
    med = {cfg: _util.median(_seconds(rs)) for cfg, rs in measured.items() if _seconds(rs)}
    t1 = med.get(SEQ)
    ceiling = t1 / med[PAIR] if t1 and PAIR in med else None
    samples = {"mlp": MLP_LIMIT, "softmax": MLP_LIMIT, "logreg": 2 * LOGREG_N}[name]
    rows, table = [], []
    for cfg, rs in measured.items():
        ok = [r for r in rs if "error" not in r]
        row = {
            "config": cfg,
            "failed": len(rs) - len(ok),
            "seconds": _seconds(rs),
            "errors": [r["error"] for r in rs if "error" in r],
        }
        if not ok:
            rows.append(row)
            table.append([cfg, "-", "FAILED", "", "", "", "", "", ""])
            continue
        m, secs = med[cfg], _seconds(rs)
        row.update(
            median=m,
            min=min(secs),
            max=max(secs),
            noise=_util.spread(secs),
            steps=ok[0]["steps"],
            samples_per_second=samples / m,
        )
        if cfg in (DDP1, DDP2):
            # DDP's own scaling: against its own 1 rank
            base = med.get(DDP1)
            row["speedup"] = base / m if base else None
            speed, pct = (f"{row['speedup']:.2f}x (vs DDP x1)" if row["speedup"] else "-"), "-"
        elif cfg == PAIR:
            row["speedup"] = ceiling
            row["member_seconds"] = [r["member_seconds"] for r in ok]
            speed, pct = f"{ceiling:.2f}x (ceiling)", "100%"
        else:
            row["speedup"] = t1 / m
            speed, pct = f"{row['speedup']:.2f}x", "-"
            if cfg in TWO_WORKER and ceiling:
                row["of_ceiling"] = row["speedup"] / ceiling
                pct = f"{100 * row['of_ceiling']:.0f}%"
        comm = [
            r["phase_seconds"]["communication"] / r["train_seconds"]
            for r in ok
            if "phase_seconds" in r
        ]
        row["comm_share"] = _util.median(comm) if comm else None
        rows.append(row)
        table.append(
            [
                cfg,
                f"{row['steps']}",
                f"{m:.3f}",
                f"{min(secs):.3f} / {max(secs):.3f}",
                f"{samples / m:,.0f}",
                speed,
                pct,
                f"{100 * row['comm_share']:.0f}%" if comm else "-",
                f"{100 * row['noise']:.0f}%"
                + (f" ({row['failed']} failed)" if row["failed"] else ""),
            ]
        )
    titles = {
        "mlp": f"MLP 784-256-128-10, MNIST first {MLP_LIMIT:,}, global batch 128, 1 epoch",
        "softmax": f"softmax regression 784->10, MNIST first {MLP_LIMIT:,}, global batch "
        f"128, 1 epoch",
        "logreg": f"logistic regression {LOGREG_N:,} x {LOGREG_D} float64, batch "
        f"{LOGREG_BATCH} per worker, 2 epochs",
    }
    print()
    _util.print_table(
        [
            "config",
            "steps",
            "train s",
            "min / max",
            "samples/s",
            "speedup",
            "of ceiling",
            "comm %",
            "noise",
        ],
        table,
        title=f"{titles[name]}: median of {repeats}",
    )
    best = min((c for c in TWO_WORKER if c in med), key=lambda c: med[c], default=None)
    head = {
        "t1": t1,
        "ceiling": ceiling,
        "best": best,
        "best_speedup": t1 / med[best] if best and t1 else None,
        "best_of_ceiling": (t1 / med[best]) / ceiling if best and t1 and ceiling else None,
        "ddp2": med.get(DDP2),
    }
    if best and DDP2 in med:
        head["ours_over_ddp"] = med[DDP2] / med[best]  # same samples: throughput ratio
    if MPI2 in med and PROCESS in med:
        head["mpi_over_process"] = med[PROCESS] / med[MPI2]  # ratio of their speedups
    return rows, head


def checks(name: str, measured: dict) -> list[str]:
    """Problems found: unexpected step counts, losses that disagree."""
    problems = []
    cfg1, cfg2 = workload_config(name, 1), workload_config(name, WORKERS)
    n = cfg1["limit"] if name != "logreg" else LOGREG_N
    expect = {
        c: cfg1["epochs"] * math.ceil(n / (cfg1 if c in (SEQ, MPI1) else cfg2)["batch_size"])
        for c in (SEQ, MPI1) + TWO_WORKER
    }
    expect[PAIR] = expect[THREAD]
    loss = {}
    for cfg, rs in measured.items():
        for r in rs:
            if "error" in r:
                problems.append(f"{name} / {cfg}: {r['error']}")
                continue
            if cfg in expect and r["steps"] != expect[cfg]:
                problems.append(f"{name} / {cfg}: {r['steps']} steps, expected {expect[cfg]}")
            if cfg in (SEQ, MPI1) + TWO_WORKER:
                loss.setdefault(cfg, r["train_loss"])

    def close(a, b, rtol):
        return a in loss and b in loss and abs(loss[a] - loss[b]) <= rtol * abs(loss[a])

    for c in TWO_WORKER[1:]:
        if c in loss and not close(THREAD, c, 1e-3):
            problems.append(
                f"{name}: final mean training loss of {c} is {loss[c]:.6g}, of "
                f"{THREAD} {loss.get(THREAD, float('nan')):.6g}"
            )
    if MPI1 in loss and not close(SEQ, MPI1, 1e-3):
        problems.append(
            f"{name}: final mean training loss of {MPI1} is {loss[MPI1]:.6g}, of "
            f"{SEQ} {loss[SEQ]:.6g}"
        )
    if name != "logreg" and THREAD in loss and not close(SEQ, THREAD, 2e-2):
        problems.append(
            f"{name}: final mean training loss at 2 workers is {loss[THREAD]:.6g}, "
            f"at 1 worker {loss[SEQ]:.6g}"
        )
    return problems


def main(argv=None):
    def extra(p):
        p.add_argument(
            "--workloads",
            default="mlp,softmax,logreg",
            help="comma-separated subset of mlp,softmax,logreg",
        )
        p.add_argument("--no-ddp", action="store_true", help="skip the PyTorch DDP reference")

    args = _util.parse_args(
        "2-worker scaling of dptrain's transports, against the independent-"
        "pair ceiling and PyTorch DDP",
        extra,
        argv=argv,
    )
    repeats = 1 if args.quick else 3
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    mpiexec, mpi_reason = su.find_mpiexec()
    mpi_version, torch_version = su.package_version("mpi4py"), su.package_version("torch")
    with_ddp = torch_version is not None and not args.no_ddp
    env = _util.environment(mpi4py=mpi_version, mpiexec=mpiexec, torch_installed=torch_version)
    _util.print_environment(env)
    print(
        f"# MNIST: {mnist_dir() or 'not found: the announced synthetic stand-in'}; mpiexec: "
        f"{mpiexec or mpi_reason + ', MPI rows left out'}; torch: "
        f"{torch_version or 'not installed'}{'' if with_ddp else ' (DDP rows left out)'}"
    )
    if env["loadavg_1min"] and env["loadavg_1min"] > 0.5:
        print(
            f"# WARNING: load average {env['loadavg_1min']:.2f} before the start: other "
            f"processes compete with the 2 workers for the 2 cores"
        )

    t_start = time.perf_counter()
    all_rows, heads, problems, sources = {}, {}, [], set()
    for name in workloads:
        runs = configurations(name, mpiexec, with_ddp)
        measured = measure(name, runs, repeats)
        for rs in measured.values():
            sources.update(r.get("source", "") for r in rs if "error" not in r)
        all_rows[name], heads[name] = report(name, measured, repeats)
        problems += checks(name, measured)

    targets = []
    for name in workloads:
        h = heads[name]
        if h["best_speedup"] is not None:
            targets.append(
                [
                    f"{name}: speedup, best transport ({h['best']})",
                    f"{h['best_speedup']:.2f}x",
                    f">= {SPEEDUP_TARGETS[name]:.2f}x",
                    _util.verdict(h["best_speedup"], SPEEDUP_TARGETS[name], True),
                ]
            )
        if name in CEILING_TARGETS and h["best_of_ceiling"] is not None:
            targets.append(
                [
                    f"{name}: % of the independent-pair ceiling ({h['ceiling']:.2f}x)",
                    f"{100 * h['best_of_ceiling']:.0f}%",
                    f">= {100 * CEILING_TARGETS[name]:.0f}%",
                    _util.verdict(h["best_of_ceiling"], CEILING_TARGETS[name], True),
                ]
            )
        if "ours_over_ddp" in h:
            targets.append(
                [
                    f"{name}: samples/s ours ({h['best']}) / DDP gloo x2",
                    f"{h['ours_over_ddp']:.2f}x",
                    f">= {DDP_TARGET:.0f}x",
                    _util.verdict(h["ours_over_ddp"], DDP_TARGET, True),
                ]
            )
        if name == "mlp" and "mpi_over_process" in h:
            targets.append(
                [
                    f"{name}: speedup of {MPI2} / of {PROCESS}",
                    f"{h['mpi_over_process']:.2f}x",
                    f">= {MPI_OVER_PROCESS_TARGET}x",
                    _util.verdict(h["mpi_over_process"], MPI_OVER_PROCESS_TARGET, True),
                ]
            )
    print()
    _util.print_table(["target", "measured", "target", "met"], targets, align="lrrl")
    print(f"# data: {'; '.join(sorted(s for s in sources if s))}")
    print(f"# {time.perf_counter() - t_start:.0f} s")
    _util.write_json(
        args.json,
        "scaling",
        env,
        {
            "workers": WORKERS,
            "repeats": repeats,
            "quick": args.quick,
            "workloads": {
                w: {
                    "one_worker": workload_config(w, 1),
                    "two_workers": workload_config(w, WORKERS),
                    "pair_member": workload_config(w, 1, half=True),
                }
                for w in workloads
            },
            "headline": heads,
            "problems": problems,
        },
        [{"workload": w, **row} for w in workloads for row in all_rows[w]],
    )
    if problems:
        raise AssertionError("scaling runs disagree or failed:\n  " + "\n  ".join(problems))
    print("# checks: expected step counts; the same final training loss across transports")
    return all_rows


if __name__ == "__main__":
    main()
