"""The PyTorch twin of a layer list (for the parity tests and benchmarks; torch is never a
dependency): torch.nn modules holding a copy of a flat parameter buffer, layer by layer in
the layout of ``_core.model_plan``, and the flat gradient read back from them."""

from __future__ import annotations

import math

import numpy as np

from .reference.model import _projection_stride


def torch_sequential(plan: dict, params: np.ndarray, torch):
    """(torch.nn.Sequential, {layer index: module}) of plan's layers with params' values, in
    params' dtype. Dropout is nn.Dropout (its own random masks); a residual block is a module
    adding its input (through its 1x1 projection) to its block's output."""
    nn = torch.nn
    dtype = torch.float64 if params.dtype == np.float64 else torch.float32
    views = {e["layer"]: e for e in plan["params"]}
    shapes = [tuple(plan["input_shape"])] + [tuple(s) for s in plan["shapes"]]
    owners = {}

    class Residual(nn.Module):
        def __init__(self, block, proj):
            super().__init__()
            self.block, self.proj = block, proj

        def forward(self, x):
            return self.block(x) + (x if self.proj is None else self.proj(x))

    def build(lo, hi):
        """nn modules of layers [lo, hi) (a residual block's layers nested in one)."""
        modules, i = [], lo
        while i < hi:
            kind = plan["layers"][i][0]
            if kind != "res_begin":
                modules.append(one(i).to(dtype))
                i += 1
                continue
            depth, end = 0, i + 1
            while not (plan["layers"][end][0] == "res_end" and depth == 0):
                depth += {"res_begin": 1, "res_end": -1}.get(plan["layers"][end][0], 0)
                end += 1
            proj = None
            if end in views:
                src, dst = shapes[i], shapes[end + 1]
                stride = _projection_stride(src[1], src[2], dst[1], dst[2])
                proj = owners[end] = nn.Conv2d(src[0], dst[0], 1, stride).to(dtype)
            modules.append(Residual(nn.Sequential(*build(i + 1, end)), proj))
            i = end + 1
        return modules

    def one(i):
        kind, *sizes = plan["layers"][i]
        shape = shapes[i]
        if kind == "dense":
            mod = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), sizes[0]))
            owners[i] = mod[1]
            return mod
        if kind == "conv":
            stride = sizes[3] if len(sizes) > 3 else 1
            owners[i] = nn.Conv2d(shape[0], sizes[0], sizes[1], stride, sizes[2])
            return owners[i]
        if kind == "layernorm":
            owners[i] = nn.LayerNorm(list(shape))
            return owners[i]
        if kind == "batchnorm":
            owners[i] = (nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d)(shape[0])
            return owners[i]
        if kind == "dropout":
            return nn.Dropout(sizes[0])
        if kind == "globalavgpool":
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        return {
            "maxpool2": lambda: nn.MaxPool2d(2),
            "avgpool2": lambda: nn.AvgPool2d(2),
            "relu": nn.ReLU,
            "tanh": nn.Tanh,
            "sigmoid": nn.Sigmoid,
            "gelu": nn.GELU,
            "flatten": nn.Flatten,
        }[kind]()

    modules = build(0, len(plan["layers"]))
    for i, mod in owners.items():
        e = views[i]
        w = params[e["weight"] : e["weight"] + math.prod(e["weight_shape"])]
        b = params[e["bias"] : e["bias"] + e["bias_shape"][0]]
        with torch.no_grad():
            mod.weight.copy_(torch.from_numpy(w.copy()).reshape(mod.weight.shape))
            mod.bias.copy_(torch.from_numpy(b.copy()).reshape(mod.bias.shape))
    return nn.Sequential(*modules), owners


def torch_flat(plan: dict, owners: dict, what: str = "grad") -> np.ndarray:
    """The modules' parameters (what="data") or gradients (what="grad") in the flat layout."""
    parts = []
    for e in plan["params"]:
        mod = owners[e["layer"]]
        for t in (mod.weight, mod.bias):
            t = t.grad if what == "grad" else t
            parts.append(t.detach().numpy().reshape(-1))
    return np.concatenate(parts)
