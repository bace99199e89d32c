"""A study's figures as PNG files: the sweep figures of dptrain.measure.plots, saved, and the
one figure of its own, the softmax study's speedup per layout (threads vs workers vs both)."""

from __future__ import annotations

import os
from pathlib import Path


def _save(fig, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    from ..measure.plots import save_figure

    save_figure(fig, out / f"{name}.png")
    plt.close(fig)
    return f"{name}.png"


def _speedup_layouts(out: Path, data, layouts, ups, limit, data_name, quick) -> str:
    """The softmax study's bars: speedup over 1 worker x 1 thread per layout, one bar per
    image size; saved as out/speedup_layouts.png. Returns the file's name."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8), layout="constrained")
    labels = [lab for lab, *_ in layouts]
    width = 0.8 / len(ups)
    for i, up in enumerate(ups):
        ys = [d["speedup"] for d in data if d["pixels"] == 784 * up * up]
        ax.bar(
            [j + i * width for j in range(len(labels))], ys, width, label=f"{784 * up * up} pixels"
        )
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(
        [j + width * (len(ups) - 1) / 2 for j in range(len(labels))],
        labels,
        rotation=15,
        fontsize=8,
    )
    ax.set_ylabel("speedup over 1 worker x 1 thread")
    ax.set_title(
        f"Softmax regression, full-batch GD on {limit} images of {data_name}: "
        f"threads vs workers vs both" + (" (QUICK RUN)" if quick else ""),
        fontsize=9,
    )
    cores = os.cpu_count() or 1
    if any(d["speedup"] > cores for d in data):
        ax.axhline(cores, color="red", lw=0.8, ls=":")
        ax.annotate(
            f"above the {cores} cores: noise or cache effects, not scaling (see report)",
            (0.01, 0.97),
            xycoords="axes fraction",
            va="top",
            fontsize=8,
            color="red",
        )
    ax.legend()
    name = _save(fig, out, "speedup_layouts")
    plt.close("all")
    return name
