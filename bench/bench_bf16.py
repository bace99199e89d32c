"""bfloat16 mixed precision (``dtype="bfloat16"``) against float32: final MNIST test accuracy
of the MLP and the CNN, and the step time, from one run.

Accuracy: each model is trained on the published MNIST files (``--data-dir``, default
``../shared/data/mnist`` beside the clone; the script stops if they cannot be read: a
synthetic stand-in would say nothing about accuracy) once in float32 and once in bfloat16
per seed, with the same options (one worker, batch 128, lr 0.05, momentum 0.9): same
initial weights, same sample order. The figure is the final test accuracy of each, and their
difference (bfloat16 - float32) in points; the issue's target is |difference| <= 0.3.

Two bfloat16 variants per seed: the model's default (bfloat16 GEMM inputs, float32 gradient,
weights and momentum), and the same with the bfloat16 gradient exchange (comm_dtype=
"bfloat16": the gradient and the sum rounded to bfloat16; at one worker its one slot is
rounded all the same).

Exchange: 2 workers (process backend) train the bfloat16 MLP on MNIST-shaped synthetic data
with the gradient exchanged in float32 and in bfloat16: bytes sent and the communication
phase per step, from the run's own breakdown.

Speed: one training step (zero_grad, loss_grad, SGD with momentum) of the same model on one
fixed batch, float32 and bfloat16 interleaved, median of the repeats; the ratio
float32 / bfloat16 is the speedup (the issue's target on an AVX512_BF16 CPU: >= 1.6). Where
the CPU has AVX512_BF16, more columns time each bfloat16 path forced (``_core.set_bf16_amx``,
``_core.set_bf16_dot``): AMX's tiles (tdpbf16ps, where this process has AMX-BF16; the
default wherever it runs), the vdpbf16ps micro-kernel (two k per instruction) and the
rounding path (inputs rounded while packed, float32 micro-kernel; the same numbers as
vdpbf16ps); the default takes vdpbf16ps only where it was measured to do >= 1.2x the float32
FMA's flop (the header prints the ratio). Elsewhere only the rounding path exists, and the
ratio measures its cost, not a gain.

GEMM: _core.gemm on the MLP's and the conv's shapes with a float32 context and a bfloat16
one (Context(gemm_inputs="bfloat16")), interleaved, on each bfloat16 path this CPU has.

Run: python bench/bench_bf16.py [--quick] [--json PATH] [--data-dir DIR] [--seeds N]
     [--parts accuracy,gemm,steps,exchange]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy/torch load)

import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

import dptrain  # noqa: E402
from dptrain import _core  # noqa: E402
from dptrain.data import synthetic_classification  # noqa: E402

DEFAULT_DATA = os.path.join(os.path.dirname(_util.REPO_ROOT), "shared", "data", "mnist")
TARGET_POINTS = 0.3
TARGET_SPEEDUP = 1.6
# (key, dtype, comm_dtype): float32; bfloat16 GEMM inputs; and also the gradient rounded to
# bfloat16 by the bfloat16 exchange (at one worker its one slot is rounded all the same)
VARIANTS = (
    ("float32", "float32", None),
    ("bfloat16", "bfloat16", None),
    ("bfloat16_comm", "bfloat16", "bfloat16"),
)
# (name, dptrain.train options, epochs full / quick)
MODELS = (
    ("MLP 784-256-128-10", dict(model="mlp", hidden=(256, 128)), 10, 3),
    ("CNN 1x28x28 (32, 64 conv, fc 128)", dict(model="cnn"), 3, 1),
)


PARTS = ("accuracy", "gemm", "steps", "exchange")
GEMM_SHAPES = (
    (128, 256, 784, False, True),
    (256, 784, 128, True, False),
    (128, 784, 256, False, False),
    (128, 10, 128, False, True),
    (10, 128, 128, True, False),
    (6272, 32, 27, False, False),
)


def add_args(p):
    p.add_argument("--data-dir", default=DEFAULT_DATA, help="directory of the MNIST IDX files")
    p.add_argument("--seeds", type=int, default=None, help="seeds per model (default 3, quick 1)")
    p.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated subset of {','.join(PARTS)} (default: all)",
    )


# the bfloat16 paths a run can force (set_bf16_amx, set_bf16_dot): label, (amx, dot) settings
PATHS = {
    "amx": ("AMX path", True, None),
    "dot": ("vdpbf16ps path", False, True),
    "round": ("rounding path", False, False),
}


def paths_here() -> list[str]:
    """The bfloat16 paths that can run here beside the rounding path: AMX where this process
    has it, vdpbf16ps where the CPU has AVX512_BF16; each with the avx512 ISA active. Empty
    where the rounding path is the only one."""
    info = _core.build_info()
    if _core.isa() != "avx512":
        return []
    here = (["amx"] if info["bfloat16_amx"] else []) + (
        ["dot"] if info["bfloat16_dot_vs_fma"] is not None else []
    )
    return here + ["round"] if here else []


def on_path(fn, path: str):
    """fn run on one bfloat16 path: set_bf16_amx and set_bf16_dot around it (atomic stores)."""
    _, amx, dot = PATHS[path]

    def run():
        before = _core.set_bf16_amx(amx), _core.set_bf16_dot(dot)
        try:
            fn()
        finally:
            _core.set_bf16_amx(before[0])
            _core.set_bf16_dot(before[1])

    return run


def with_paths(fns: dict) -> dict:
    """fns plus 'bfloat16_<path>' for each path of paths_here(): the bfloat16 entry forced onto
    it (the 'bfloat16' entry is the default's choice)."""
    for path in paths_here():
        fns[f"bfloat16_{path}"] = on_path(fns["bfloat16"], path)
    return fns


def gemm_rows(args) -> list[dict]:
    """_core.gemm with a float32 context and with a bfloat16-inputs one (and its rounding path
    where the dot path runs), interleaved, per shape (the MLP's three GEMMs, its output
    layer's two skinny ones, the conv's K = 27)."""
    rng = np.random.default_rng(0)
    ctxs = {"float32": _core.Context(1), "bfloat16": _core.Context(1, gemm_inputs="bfloat16")}
    rows = []
    for M, N, K, ta, tb in GEMM_SHAPES:
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        c = np.zeros((M, N), np.float32)
        fns = with_paths(
            {
                k: (lambda ctx=ctx: _core.gemm(a, b, c, trans_a=ta, trans_b=tb, ctx=ctx))
                for k, ctx in ctxs.items()
            }
        )
        number = _util.calibrate(fns["float32"], 0.02 if args.quick else 0.1)
        t = _util.interleaved(fns, repeats=5 if args.quick else 11, number=number, warmup=2)
        med = {k: _util.median(v) for k, v in t.items()}
        f32, bf = med["float32"], med["bfloat16"]
        row = {
            "shape": f"{M}x{N}x{K}{' A^T' if ta else ''}{' B^T' if tb else ''}",
            "float32_us": 1e6 * f32,
            "bfloat16_us": 1e6 * bf,
            "ratio": bf / f32,
            "gflops_f32": 2 * M * N * K / f32 / 1e9,
            "gflops_bf16": 2 * M * N * K / bf / 1e9,
        }
        for path in PATHS:
            if f"bfloat16_{path}" in med:
                row[f"bfloat16_{path}_us"] = 1e6 * med[f"bfloat16_{path}"]
        rows.append(row)
    return rows


def accuracy_rows(args) -> list[dict]:
    seeds = args.seeds or (1 if args.quick else 3)
    rows = []
    for name, opts, epochs, quick_epochs in MODELS:
        ep = quick_epochs if args.quick else epochs
        for seed in range(seeds):
            acc = {}
            for key, dtype, comm in VARIANTS:
                r = dptrain.train(
                    dataset="mnist",
                    data_dir=args.data_dir,
                    allow_download=False,
                    dtype=dtype,
                    comm_dtype=comm,
                    seed=seed,
                    epochs=ep,
                    batch_size=128,
                    lr=0.05,
                    momentum=0.9,
                    workers=1,
                    log=lambda *a: None,
                    progress=False,
                    **opts,
                )
                acc[key] = 100.0 * r.history[-1]["test_accuracy"]
            row = {"model": name, "seed": seed, "epochs": ep, **acc}
            for key in ("bfloat16", "bfloat16_comm"):
                row[f"diff_{key}"] = acc[key] - acc["float32"]
            rows.append(row)
            print(
                f"  {name} seed {seed}: float32 {acc['float32']:.2f} %, bfloat16 "
                f"{acc['bfloat16']:.2f} % ({row['diff_bfloat16']:+.2f} points), with the "
                f"bfloat16 exchange {acc['bfloat16_comm']:.2f} % "
                f"({row['diff_bfloat16_comm']:+.2f})",
                flush=True,
            )
    return rows


def step_rows(args) -> list[dict]:
    ds = synthetic_classification(128, 784, 10, seed=0, dtype=np.float32)
    x, y = ds.x_train, ds.y_train
    builds = {
        "MLP 784-256-128-10, batch 128": lambda dt: dptrain.MLP((784, 256, 128, 10), dtype=dt),
        "CNN 1x28x28, batch 128": lambda dt: dptrain.CNN((1, 28, 28), 10, dtype=dt),
    }
    rows = []
    for name, build in builds.items():
        fns = {}
        for dt in ("float32", "bfloat16"):
            model = build(dt)
            opt = dptrain.SGD(model, 0.01, momentum=0.9)

            def step(model=model, opt=opt):
                model.zero_grad()
                model.loss_grad(x, y)
                opt.step()

            fns[dt] = step
        fns = with_paths(fns)
        number = _util.calibrate(fns["float32"], 0.05 if args.quick else 0.2)
        times = _util.interleaved(fns, repeats=5 if args.quick else 11, number=number, warmup=2)
        f32, bf = _util.median(times["float32"]), _util.median(times["bfloat16"])
        row = {
            "step": name,
            "float32_ms": 1e3 * f32,
            "bfloat16_ms": 1e3 * bf,
            "speedup": f32 / bf,
            "spread_f32": _util.spread(times["float32"]),
            "spread_bf16": _util.spread(times["bfloat16"]),
        }
        for path in PATHS:
            if f"bfloat16_{path}" in times:
                row[f"bfloat16_{path}_ms"] = 1e3 * _util.median(times[f"bfloat16_{path}"])
                row[f"spread_bf16_{path}"] = _util.spread(times[f"bfloat16_{path}"])
        rows.append(row)
    return rows


def exchange_rows(args) -> list[dict]:
    """2 workers (process backend) training the MLP on MNIST-shaped synthetic data, global batch
    128: the communication phase's median per step and the bytes sent, with the gradient
    exchanged in float32 and in bfloat16, runs interleaved."""
    rounds = 2 if args.quick else 3
    n = 8192 if args.quick else 30000
    out = {cd: [] for cd in ("float32", "bfloat16")}
    for _ in range(rounds):
        for cd in out:
            r = dptrain.train(
                model="mlp",
                dataset="synthetic",
                n_samples=n,
                n_features=784,
                epochs=1,
                batch_size=128,
                lr=0.05,
                momentum=0.9,
                workers=2,
                backend="process",
                dtype="bfloat16",
                comm_dtype=cd,
                log=lambda *a: None,
                progress=False,
            )
            b = r.breakdown
            out[cd].append(
                (
                    b["step_median_seconds"]["communication"],
                    b["step_median_seconds"]["sync_wait"],
                    b["bytes_sent_per_epoch"] / r["steps"],
                    r["train_seconds"] / r["steps"],
                )
            )
    rows = []
    for cd, runs in out.items():
        comm = [x[0] for x in runs]
        rows.append(
            {
                "comm_dtype": cd,
                "communication_ms": 1e3 * _util.median(comm),
                "spread": _util.spread(comm),
                "sync_wait_ms": 1e3 * _util.median([x[1] for x in runs]),
                "bytes_per_step": runs[0][2],
                "step_ms": 1e3 * _util.median([x[3] for x in runs]),
            }
        )
    return rows


def main():
    args = _util.parse_args(__doc__, add_args)
    env = _util.environment()
    _util.print_environment(env)
    feats = _core.cpu_features()
    has_bf16 = bool(feats.get("avx512_bf16"))
    info = _core.build_info()
    ratio = info["bfloat16_dot_vs_fma"]
    print(
        f"CPU AVX512_BF16: {'yes' if has_bf16 else 'no'}; AMX-BF16: "
        f"{'yes' if info['bfloat16_amx'] else 'no (' + info['bfloat16_amx_why'] + ')'}; "
        f"dptrain's bfloat16 GEMMs "
        f"(isa {_core.isa()}): {info['bfloat16_gemm']}"
        + (
            f"; vdpbf16ps measured at {ratio:.2f}x the float32 FMA's flop here (the default "
            f"takes it from 1.2x)"
            if ratio is not None
            else ""
        )
    )
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        sys.exit(f"bench_bf16: --parts names {sorted(parts - set(PARTS))}, expected {PARTS}")
    acc, gemm, steps, exch = [], [], [], []
    if "accuracy" in parts:
        acc = accuracy_part(args)
    if "gemm" in parts:
        gemm = gemm_rows(args)
        forced = [p for p in PATHS if f"bfloat16_{p}_us" in gemm[0]]
        _util.print_table(
            [
                "GEMM (M x N x K)",
                "float32 us",
                "bfloat16 us",
                "bf16 / f32 time",
                "float32 GFLOP/s",
                "bfloat16 GFLOP/s",
            ]
            + [f"{PATHS[p][0]} us" for p in forced],
            [
                [
                    r["shape"],
                    f"{r['float32_us']:.1f}",
                    f"{r['bfloat16_us']:.1f}",
                    f"{r['ratio']:.2f}",
                    f"{r['gflops_f32']:.1f}",
                    f"{r['gflops_bf16']:.1f}",
                ]
                + [f"{r[f'bfloat16_{p}_us']:.1f}" for p in forced]
                for r in gemm
            ],
            title="_core.gemm, one thread: float32 against bfloat16 inputs (the "
            "default path: "
            + _core.build_info()["bfloat16_gemm"]
            + ("; each path forced beside it" if forced else "")
            + ")",
        )
    if "steps" in parts:
        steps = step_part(args, has_bf16)
    if "exchange" in parts:
        exch = exchange_part(args)
    _util.write_json(
        args.json,
        "bench_bf16",
        env,
        {
            "quick": args.quick,
            "data_dir": args.data_dir,
            "avx512_bf16": has_bf16,
            "parts": sorted(parts),
        },
        {"accuracy": acc, "gemm": gemm, "steps": steps, "exchange": exch},
    )


def accuracy_part(args) -> list[dict]:
    if not os.path.isdir(args.data_dir):
        sys.exit(
            f"bench_bf16: the MNIST files are not at {args.data_dir} (--data-dir): the "
            f"accuracy comparison needs the real data"
        )
    print("\naccuracy (training on MNIST, one worker):", flush=True)
    acc = accuracy_rows(args)
    table = []
    for name, *_ in MODELS:
        mine = [r for r in acc if r["model"] == name]
        for key, label in (("bfloat16", "bfloat16"), ("bfloat16_comm", "+ bf16 exchange")):
            diffs = [r[f"diff_{key}"] for r in mine]
            worst = max(abs(d) for d in diffs)
            table.append(
                [
                    name,
                    label,
                    mine[0]["epochs"],
                    len(mine),
                    f"{np.median([r['float32'] for r in mine]):.2f}",
                    f"{np.median([r[key] for r in mine]):.2f}",
                    f"{np.median(diffs):+.2f}",
                    f"{worst:.2f}",
                    "met" if worst <= TARGET_POINTS else "NOT met",
                ]
            )
    _util.print_table(
        [
            "model",
            "variant",
            "epochs",
            "seeds",
            "float32 %",
            "variant %",
            "median diff",
            "max |diff|",
            f"|diff| <= {TARGET_POINTS}",
        ],
        table,
        title="final MNIST test accuracy, float32 vs bfloat16 mixed precision (medians over seeds)",
    )
    return acc


def step_part(args, has_bf16) -> list[dict]:
    steps = step_rows(args)
    forced = [p for p in PATHS if f"bfloat16_{p}_ms" in steps[0]]
    _util.print_table(
        ["step", "float32 ms", "bfloat16 ms", "f32/bf16", f"target >= {TARGET_SPEEDUP}"]
        + [f"{PATHS[p][0]} ms" for p in forced],
        [
            [
                r["step"],
                f"{r['float32_ms']:.3f} (+-{r['spread_f32']:.0%})",
                f"{r['bfloat16_ms']:.3f} (+-{r['spread_bf16']:.0%})",
                f"{r['speedup']:.2f}",
                ("met" if r["speedup"] >= TARGET_SPEEDUP else "NOT met")
                if has_bf16
                else "n/a: no AVX512_BF16",
            ]
            + [f"{r[f'bfloat16_{p}_ms']:.3f} (+-{r[f'spread_bf16_{p}']:.0%})" for p in forced]
            for r in steps
        ],
        title="training step, one thread (median of interleaved repeats)",
    )
    return steps


def exchange_part(args) -> list[dict]:
    exch = exchange_rows(args)
    _util.print_table(
        [
            "gradient exchange",
            "bytes sent / step",
            "communication ms / step",
            "of which sync wait",
            "train ms / step",
        ],
        [
            [
                r["comm_dtype"],
                f"{r['bytes_per_step']:,.0f}",
                f"{r['communication_ms']:.3f} (+-{r['spread']:.0%})",
                f"{r['sync_wait_ms']:.3f}",
                f"{r['step_ms']:.2f}",
            ]
            for r in exch
        ],
        title="2 workers (process backend), bfloat16 MLP, global batch 128: the "
        "exchange in float32 and in bfloat16 (medians over steps and runs)",
    )
    return exch


if __name__ == "__main__":
    main()
