"""The layers of issue 36 beside PyTorch's, one thread, float32: a training step (zero_grad,
forward, loss, backward; no update) of a small network built around each layer, on a batch
of 128, dptrain's engine against torch.nn on the same weights. The networks:

- conv-s2: conv(3->32, 3x3, padding 1, stride 2) -> ReLU -> flatten -> dense 10, on 3x32x32;
- avgpool2: conv(3->32, 3x3, padding 1) -> ReLU -> avgpool2 -> flatten -> dense 10, 3x32x32;
- gap: conv(3->32, 3x3, padding 1) -> ReLU -> global average pool -> dense 10, 3x32x32;
- batchnorm: conv(3->32, 3x3, padding 1) -> batch norm -> ReLU -> flatten -> dense 10;
- layernorm: dense(784->512) -> layernorm -> ReLU -> dense 10 (a transformer-style block);
- dropout: dense(784->1024) -> ReLU -> dropout 0.5 -> dense 10;
- batchnorm alone: batch norm -> flatten -> dense 10 on 32 x 32 x 32 maps (16 MiB a batch:
  the layer on its own, no conv before it to fuse its sums into);
- base rows without the layer (conv -> ReLU -> flatten -> dense; dense -> ReLU -> dense;
  flatten -> dense on the 32 x 32 x 32 maps), so that the layer's own cost is the difference,
  which a second table gives for each layer (issue 36's batch norm target: "batch norm
  alone", ours against torch's);
- resnet8: ``nn.resnet(8, (3, 32, 32))`` (He et al.'s CIFAR ResNet, batch norm), issue 36's
  step target, and the same without batch norm (the difference: batch norm's cost inside
  the ResNet).

A layer's own cost is a paired difference: its network and the base network are timed in
the same rounds (with torch's two, interleaved: bench/_util.interleaved), and the figure is
the median over the rounds of (network - base) within a round, with its quartiles. The host
time-shares its vCPUs and its memory bandwidth: a difference of two medians taken a minute
apart gave 7x ratios from noise alone. A cost can still be negative where the layer makes
what follows it cheaper: the average pool's network has a dense layer a quarter of its base's
after it.

Each row also gives its convolutions' and dense layers' multiply-adds as a floor: a training
step's 2 B OC OH OW C K K flops per conv forward, twice that backward (the input's and the
weights' gradients; the first layer's input gradient is not computed), at the FMA peak
measured here; the floor's share is the step's time spent at the peak on those alone.

Before timing, each pair must agree: the same loss to 1e-4 relative (dropout: torch's masks
differ, so the dropout row checks in eval mode). The figure is the median repeat's
milliseconds per step, interleaved (bench/_util.interleaved), with the spread ((max - min) /
median).

Run: python bench/bench_layers.py [--quick] [--json PATH]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy/torch load)

import numpy as np  # noqa: E402

from dptrain import nn  # noqa: E402
from dptrain._torch import torch_sequential  # noqa: E402

BATCH = 128
CASES = {
    "conv-s2": (
        [nn.Conv2d(32, 3, padding=1, stride=2), nn.ReLU(), nn.Flatten(), nn.Dense(10)],
        (3, 32, 32),
    ),
    "conv (base)": (
        [nn.Conv2d(32, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Dense(10)],
        (3, 32, 32),
    ),
    "batchnorm": (
        [nn.Conv2d(32, 3, padding=1), nn.BatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.Dense(10)],
        (3, 32, 32),
    ),
    "avgpool2": (
        [nn.Conv2d(32, 3, padding=1), nn.ReLU(), nn.AvgPool2(), nn.Flatten(), nn.Dense(10)],
        (3, 32, 32),
    ),
    "gap": (
        [nn.Conv2d(32, 3, padding=1), nn.ReLU(), nn.GlobalAvgPool(), nn.Dense(10)],
        (3, 32, 32),
    ),
    "dense (base)": ([nn.Dense(512), nn.ReLU(), nn.Dense(10)], (784,)),
    "layernorm": ([nn.Dense(512), nn.LayerNorm(), nn.ReLU(), nn.Dense(10)], (784,)),
    "dropout": ([nn.Dense(1024), nn.ReLU(), nn.Dropout(0.5), nn.Dense(10)], (784,)),
    "dense 1024 (base)": ([nn.Dense(1024), nn.ReLU(), nn.Dense(10)], (784,)),
    "batchnorm alone": ([nn.BatchNorm2d(), nn.Flatten(), nn.Dense(10)], (32, 32, 32)),
    "maps (base)": ([nn.Flatten(), nn.Dense(10)], (32, 32, 32)),
    "resnet8": (nn.resnet(8, (3, 32, 32)).plan["layers"], (3, 32, 32)),
    "resnet8 (no norm)": (nn.resnet(8, (3, 32, 32), norm=None).plan["layers"], (3, 32, 32)),
}


# each layer's own cost: (its network, the same network without it)
LAYER_ROWS = {
    "batch norm, after a conv": ("batchnorm", "conv (base)"),
    "batch norm alone": ("batchnorm alone", "maps (base)"),
    "batch norm in resnet8": ("resnet8", "resnet8 (no norm)"),
    "average pool": ("avgpool2", "conv (base)"),
    "layer norm": ("layernorm", "dense (base)"),
    "dropout": ("dropout", "dense 1024 (base)"),
}


def timing_groups() -> list[list[str]]:
    """CASES's networks in groups timed together: a base network with every network that
    LAYER_ROWS differences against it (a network alone where none does), in CASES's order
    (a base is no other row's network)."""
    base_of = {net: base for net, base in LAYER_ROWS.values()}
    groups: dict[str, list[str]] = {}
    for name in CASES:
        groups.setdefault(base_of.get(name, name), []).append(name)
    return list(groups.values())


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = np.percentile(xs, [25, 50, 75])
    return float(q1), float(q2), float(q3)


def step_flops(plan: dict, batch: int) -> float:
    """The flops of a training step's convolutions and dense layers (see the docstring)."""
    total, first = 0.0, True
    for p in plan["params"]:
        shape = p["weight_shape"]
        if len(shape) not in (2, 4):  # a norm's scale
            continue
        out = plan["shapes"][p["layer"]]
        macs = np.prod(shape) * (np.prod(out[1:]) if len(shape) == 4 else 1)
        total += 2.0 * batch * macs * (2 if first else 3)
        first = False
    return total


def main() -> None:
    args = _util.parse_args(__doc__.splitlines()[0])
    import torch

    torch.set_num_threads(1)
    _util.pin_torch(torch)
    env = _util.environment(**_util.torch_info(torch))
    _util.print_environment(env)
    repeats, number = (3, 3) if args.quick else (9, 10)
    rows, results, times = [], {}, {}
    peak = _util.peaks()["kernels"]["float32"] * 1e9
    rng = np.random.default_rng(0)
    for group in timing_groups():
        fns = {}
        for name in group:
            layers, shape = CASES[name]
            model = nn.Sequential(layers, input_shape=shape, seed=1, threads=1)
            x = rng.standard_normal((BATCH, int(np.prod(shape)))).astype(np.float32)
            y = rng.integers(0, 10, BATCH).astype(np.int64)
            net, _ = torch_sequential(model.plan, model.params, torch)
            tx, ty = torch.from_numpy(x.reshape(BATCH, *shape)), torch.from_numpy(y)
            dropout = any(spec[0] == "dropout" for spec in model.plan["layers"])
            if dropout:
                net.eval()  # the check: torch's masks are its own
            with torch.no_grad():
                want = torch.nn.functional.cross_entropy(net(tx), ty).item()
            got = model.evaluate(x, y)[0] if dropout else model.loss_grad(x, y)[0] / BATCH
            assert abs(got - want) <= 1e-4 * abs(want), f"{name}: loss {got} vs torch {want}"
            net.train()

            def ours(model=model, x=x, y=y):
                model.zero_grad()
                model.loss_grad(x, y)

            def theirs(net=net, tx=tx, ty=ty):
                net.zero_grad()
                torch.nn.functional.cross_entropy(net(tx), ty).backward()

            fns[("dptrain", name)] = ours
            fns[("torch", name)] = theirs
            results[name] = {"floor_ms": step_flops(model.plan, BATCH) / peak * 1e3}
        t = _util.interleaved(fns, repeats=repeats, number=number)
        times.update(t)
    for name in CASES:
        ta, tb = times[("dptrain", name)], times[("torch", name)]
        a, b = _util.median(ta), _util.median(tb)
        floor = results[name]["floor_ms"] / 1e3
        results[name].update(
            {
                "dptrain_ms": a * 1e3,
                "torch_ms": b * 1e3,
                "ratio": a / b,
                "spread": [_util.spread(ta), _util.spread(tb)],
            }
        )
        rows.append(
            (
                name,
                f"{a * 1e3:.3f}",
                f"{b * 1e3:.3f}",
                f"{a / b:.2f}",
                f"{_util.spread(ta):.0%} / {_util.spread(tb):.0%}",
                f"{floor * 1e3:.3f}",
                f"{floor / a:.0%} / {floor / b:.0%}",
            )
        )
    _util.print_table(
        ["network", "dptrain ms", "torch ms", "ours / torch", "spread", "floor ms", "floor share"],
        rows,
        title=f"training step (no update), batch {BATCH}, float32, 1 thread; floor: the "
        f"convs' and dense layers' flops at {peak / 1e9:.1f} GFLOP/s (measured peak)",
    )
    layers = []
    for name, (net, base) in LAYER_ROWS.items():
        own = {}
        for side in ("dptrain", "torch"):
            pairs = zip(times[(side, net)], times[(side, base)])
            own[side] = quartiles([(n - b) * 1e3 for n, b in pairs])
        a, b = own["dptrain"][1], own["torch"][1]
        results[name] = {
            "dptrain_ms": a,
            "torch_ms": b,
            "ratio": a / b if b > 0 else None,
            "quartiles_ms": {"dptrain": own["dptrain"], "torch": own["torch"]},
        }
        layers.append(
            (
                name,
                f"{a:.3f}",
                f"{own['dptrain'][0]:.2f} .. {own['dptrain'][2]:.2f}",
                f"{b:.3f}",
                f"{own['torch'][0]:.2f} .. {own['torch'][2]:.2f}",
                f"{a / b:.2f}" if b > 0 else "-",
            )
        )
    _util.print_table(
        ["layer", "dptrain ms", "quartiles", "torch ms", "quartiles", "ours / torch"],
        layers,
        title="the layer's own cost: the median over rounds of its network's step minus its "
        "base network's, timed in the same round",
    )
    if args.json:
        _util.write_helper_json(args.json, {"environment": env, "results": results})


if __name__ == "__main__":
    main()
