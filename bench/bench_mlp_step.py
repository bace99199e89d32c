"""One training step, dptrain against PyTorch (one thread each): milliseconds per step.

A step is zero_grad + forward + loss + backward + SGD-with-momentum update, on one fixed batch
of MNIST-shaped data (`dptrain.data.synthetic_classification`, float32, 784 features, 10
classes). Both sides start from the same weights (dptrain's init, copied into torch) and take
the same kind of step:

- dptrain: `model.zero_grad(); model.loss_grad(x, y); opt.step()` (MLP / SoftmaxRegression
  and dptrain.SGD(momentum=0.9));
- PyTorch: nn.Sequential(Linear, ReLU, Linear, ReLU, Linear), nn.CrossEntropyLoss (mean),
  torch.optim.SGD(momentum=0.9), the idiomatic loop: `opt.zero_grad()` (set_to_none default),
  `loss_fn(net(x), y).backward()`, `opt.step()`.

Before timing, one step of each from the same weights must give the same loss and the same
updated parameters (so both do the same work). Then repeats of `steps` steps each, ours and
torch's interleaved, after warm-up steps; the figure is the median repeat's ms per step.

GFLOP/s counts only the GEMMs, 2*B*IN*OUT flop each: per layer one forward, one dW, and one
dX except for the first layer (the input needs no gradient).

Two rows carry issue 12's targets: MLP 784-256-128-10 at batch 128, ours / torch <= 0.45
(stretch 0.35), and softmax regression 784-10 at batch 128, <= 0.25 (they replace the first
version's <= 0.7, stretch 0.6, on the MLP row); the other rows are for information.

A second table is the step inside one worker on more threads (`--threads T`, default 2: the
model's `threads=T`, whose GEMMs, SGD step and zero_grad split over T threads; PyTorch's
`torch.set_num_threads(T)`): the same step at 1 and at T threads, both sides, all four
interleaved; the speedup is the 1-thread time over the T-thread time. The T-thread model must
take exactly the step of the 1-thread one (the same parameters, bit for bit).

Run: python bench/bench_mlp_step.py [--quick] [--threads T] [--json PATH]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy/torch load)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import dptrain  # noqa: E402
from dptrain.data import synthetic_classification  # noqa: E402

MLP_SIZES = (784, 256, 128, 10)
SOFTMAX_SIZES = (784, 10)
LR = 0.01
MOMENTUM = 0.9
# (target, stretch) of the rows that carry one (issue 12's), by (model, batch)
TARGETS = {("mlp", 128): (0.45, 0.35), ("softmax", 128): (0.25, None)}

# (model name, sizes, batch, the main row: a fixed step count)
CASES = [
    ("mlp", MLP_SIZES, 128, True),
    ("mlp", MLP_SIZES, 32, False),
    ("mlp", MLP_SIZES, 512, False),
    ("softmax", SOFTMAX_SIZES, 128, False),
    ("softmax", SOFTMAX_SIZES, 32, False),
    ("softmax", SOFTMAX_SIZES, 512, False),
]


def step_flop(sizes, batch) -> float:
    """GEMM flop of one training step: forward + dW on every layer, dX on all but the first."""
    flop = 0.0
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        gemms = 2 if i == 0 else 3
        flop += gemms * 2.0 * batch * n_in * n_out
    return flop


def build(sizes, batch, threads=1):
    """(ours, theirs, check, final_losses, model): two step functions on the same batch and the
    same initial weights, a function asserting that one step of each agrees, and dptrain's model
    (on `threads` threads)."""
    ds = synthetic_classification(
        batch, n_features=sizes[0], n_classes=sizes[-1], seed=0, n_test=1, dtype=np.float32
    )
    x, y = ds.x_train, ds.y_train

    model = (
        dptrain.MLP(sizes, seed=0, dtype="float32", threads=threads)
        if len(sizes) > 2
        else dptrain.SoftmaxRegression(sizes[0], sizes[1], seed=0, dtype="float32", threads=threads)
    )
    opt = dptrain.SGD(model, lr=LR, momentum=MOMENTUM)

    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        if i:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(n_in, n_out))
    net = torch.nn.Sequential(*layers)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for lin, (w, b) in zip(linears, model.layers()):
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    ours, theirs, check, final_losses = _util.paired_steps(
        model, opt, net, x, y, xt, yt, lr=LR, momentum=MOMENTUM, label=str(sizes)
    )
    return ours, theirs, check, final_losses, model


def run_case(name, sizes, batch, main_row, *, repeats, steps, seconds):
    ours, theirs, check, final_losses, _ = build(sizes, batch)
    check()
    warmup = 20
    if main_row:
        number = steps
    else:  # the other rows: about `seconds` per repeat, at least 50 steps
        number = max(50, min(_util.calibrate(ours, seconds), _util.calibrate(theirs, seconds)))
    times = _util.interleaved(
        {"ours": ours, "torch": theirs}, repeats=repeats, number=number, warmup=warmup
    )
    t_ours, t_torch = _util.median(times["ours"]), _util.median(times["torch"])
    ratio = t_ours / t_torch
    flop = step_flop(sizes, batch)
    target, stretch = TARGETS.get((name, batch), (None, None))
    met = _util.verdict(ratio, target, False)
    if met == "yes" and stretch is not None and ratio <= stretch:
        met = "stretch"
    losses = final_losses()
    for side, value in losses.items():
        if not np.isfinite(value):
            raise FloatingPointError(f"{name} B={batch}: {side}'s loss became {value}")
    return {
        "model": name,
        "sizes": list(sizes),
        "batch": batch,
        "steps_per_repeat": number,
        "repeats": repeats,
        "warmup_steps": warmup,
        "ours_ms": 1e3 * t_ours,
        "torch_ms": 1e3 * t_torch,
        "ratio": ratio,
        "target": target,
        "stretch": stretch,
        "met": met,
        "gemm_flop_per_step": flop,
        "ours_gflops": flop / t_ours / 1e9,
        "torch_gflops": flop / t_torch / 1e9,
        "ours_pct_peaks": _util.pct_of_peaks(flop / t_ours / 1e9),
        "torch_pct_peaks": _util.pct_of_peaks(flop / t_torch / 1e9),
        "ours_spread": _util.spread(times["ours"]),
        "torch_spread": _util.spread(times["torch"]),
        "final_loss_finite_check": losses,  # step counts differ (calibration)
        "ours_seconds_per_step": times["ours"],
        "torch_seconds_per_step": times["torch"],
    }


# (model name, sizes, batch) of the threads table
THREAD_CASES = [("mlp", MLP_SIZES, 128), ("mlp", MLP_SIZES, 512)]


def threads_row(name, sizes, batch, threads, *, repeats, seconds):
    def build_on(t):
        ours, theirs, check, _, model = build(sizes, batch, threads=t)
        return ours, theirs, check, model

    label = f"{name} " + "-".join(map(str, sizes)) + f" B={batch}"
    return _util.threads_case(label, build_on, threads, repeats=repeats, seconds=seconds)


def pct_cell(gflops, pcts):
    """'45.1 (17%/34%)': GF/s and its share of each measured peak (bench/_util.peak_columns)."""
    return f"{gflops:.1f} (" + "/".join(f"{v:.0f}%" for v in pcts.values()) + ")"


def main(argv=None):
    args = _util.parse_args(
        "ms per training step: dptrain vs PyTorch, one thread, and at --threads T",
        extra=_util.add_threads_option,
        argv=argv,
    )
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    _util.pin_torch(torch)
    repeats, steps, seconds = (3, 50, 0.1) if args.quick else (7, 200, 0.5)
    env = _util.environment(**_util.torch_info(torch))
    _util.print_environment(env)

    rows = [
        run_case(name, sizes, batch, main_row, repeats=repeats, steps=steps, seconds=seconds)
        for name, sizes, batch, main_row in CASES
    ]

    pct_head = "/".join(label for label, _ in _util.peak_columns())
    table = []
    for r in rows:
        target = (
            "-"
            if r["target"] is None
            else f"<= {r['target']:.2f}"
            + (f" ({r['stretch']:.2f})" if r["stretch"] is not None else "")
        )
        table.append(
            [
                r["model"] + " " + "-".join(map(str, r["sizes"])),
                r["batch"],
                r["steps_per_repeat"],
                f"{r['ours_ms']:.3f}",
                f"{r['torch_ms']:.3f}",
                f"{r['ratio']:.2f}",
                target,
                r["met"],
                pct_cell(r["ours_gflops"], r["ours_pct_peaks"]),
                pct_cell(r["torch_gflops"], r["torch_pct_peaks"]),
                f"{100 * max(r['ours_spread'], r['torch_spread']):.0f}%",
            ]
        )
    print()
    _util.print_table(
        [
            "model",
            "batch",
            "steps",
            "ours ms",
            "torch ms",
            "ratio",
            "target (stretch)",
            "met",
            f"ours GF/s ({pct_head})",
            f"torch GF/s ({pct_head})",
            "noise",
        ],
        table,
        align="lrrrrrrlrrr",
        title=f"Training step (zero_grad+fwd+bwd+SGD momentum), float32, 1 thread, median of "
        f"{repeats} interleaved repeats (ratio = ours / torch, lower is better)",
    )
    print(
        "GF/s counts GEMM flop only (fwd + dW per layer, dX except layer 1); "
        "noise = largest (max - min) / median"
    )
    print(_util.peak_legend())

    thread_rows = []
    if args.threads > 1:
        thread_rows = [
            threads_row(name, sizes, batch, args.threads, repeats=repeats, seconds=seconds)
            for name, sizes, batch in THREAD_CASES
        ]
        _util.print_threads_table(thread_rows, args.threads, repeats)
    _util.write_json(
        args.json,
        "mlp_step",
        env,
        {
            "repeats": repeats,
            "steps_main_row": steps,
            "seconds_per_repeat_other_rows": seconds,
            "lr": LR,
            "momentum": MOMENTUM,
            "quick": args.quick,
            "threads": args.threads,
        },
        rows + thread_rows,
    )
    return rows + thread_rows


if __name__ == "__main__":
    main()
