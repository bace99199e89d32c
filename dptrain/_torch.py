"""The PyTorch twin of a layer list (for the parity tests and benchmarks; torch is never a
dependency): torch.nn modules holding a copy of a flat parameter buffer, layer by layer in
the layout of ``_core.model_plan``, and the flat gradient read back from them."""

from __future__ import annotations

import math

import numpy as np


def torch_sequential(plan: dict, params: np.ndarray, torch):
    """(torch.nn.Sequential, {layer index: module}) of plan's layers with params' values, in
    params' dtype. Dropout is nn.Dropout (its own random masks)."""
    nn = torch.nn
    dtype = torch.float64 if params.dtype == np.float64 else torch.float32
    views = {e["layer"]: e for e in plan["params"]}
    shapes = [tuple(plan["input_shape"])] + [tuple(s) for s in plan["shapes"]]
    modules, owners = [], {}
    for i, (kind, *sizes) in enumerate(plan["layers"]):
        shape = shapes[i]
        if kind == "dense":
            mod = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), sizes[0]))
            owners[i] = mod[1]
        elif kind == "conv":
            stride = sizes[3] if len(sizes) > 3 else 1
            mod = owners[i] = nn.Conv2d(shape[0], sizes[0], sizes[1], stride, sizes[2])
        elif kind == "layernorm":
            mod = owners[i] = nn.LayerNorm(list(shape))
        elif kind == "dropout":
            mod = nn.Dropout(sizes[0])
        elif kind == "globalavgpool":
            mod = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        else:
            mod = {
                "maxpool2": lambda: nn.MaxPool2d(2),
                "avgpool2": lambda: nn.AvgPool2d(2),
                "relu": nn.ReLU,
                "tanh": nn.Tanh,
                "sigmoid": nn.Sigmoid,
                "gelu": nn.GELU,
                "flatten": nn.Flatten,
            }[kind]()
        modules.append(mod.to(dtype))
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
