"""The four studies dptrain grew from, each one command away, each writing its report.

``python -m dptrain study NAME --out DIR [--quick]`` (or ``study(NAME, out=DIR)``) runs the
study's configurations and writes into DIR: ``report.md`` (configuration, machine, our figures
beside the original study's, what explains the difference), the figures (PNG) and the data
(CSV, JSON). ``--quick`` runs a reduced form (small data, few epochs) that checks the whole
pipeline in a minute; its figures are not the study's result.

- ``mnist-mlp``: MLP on MNIST subsets (5k..40k) with 1, 2, 4 workers: time, speedup,
  efficiency against data-set size.
- ``cifar10-cnn``: the CNN, batch 128, SGD lr 0.01 momentum 0.9, 2 epochs, 1 vs 2 (and 4)
  workers: communication calls per epoch, communication time, iteration time,
  compute-to-communication ratio, speedup.
- ``logreg-1m``: logistic regression on 1,000,000 x 20 synthetic samples, 8 epochs, batch
  8192 per worker, lr 0.1 scaled by workers with one warm-up epoch: sequential vs parallel.
- ``mnist-softmax-scaled``: softmax regression on MNIST enlarged to 784, 3136 and 12544
  pixels, full-batch gradient descent: threads in a worker vs workers vs both, parameter
  server vs all-reduce.

Each report's prose (what the original study found, what explains the difference) is its
template in ``templates/NAME.md``, filled with the run's figures. What is left out on purpose:
the original studies' code (we compare against their published figures, quoted in the
templates), and runs that need more cores than the machine has, which are
run but flagged (oversubscribed) in the report.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..measure import sweep as sweep_mod

STUDIES = ("mnist-mlp", "cifar10-cnn", "logreg-1m", "mnist-softmax-scaled")

TEMPLATES = Path(__file__).resolve().parent / "templates"


def template(name: str) -> str:
    """A study's report template (Markdown with {fields}): its prose, kept out of the code."""
    return (TEMPLATES / f"{name}.md").read_text()


def _original(name: str) -> str:
    """The original study's published figures, as its template quotes them."""
    line = next(line for line in template(name).splitlines() if line.startswith("Original: "))
    return line[len("Original: "):]


# The original studies' published figures, quoted in the reports (from the templates).
ORIGINAL = {name: _original(name) for name in STUDIES}


def _md_table(headers, rows, quick: bool = False) -> str:
    """A Markdown table; a quick run's table starts with a "run" column saying QUICK on
    every row, so that no row copied out of it passes for a result."""
    if quick:
        headers, rows = ["run"] + list(headers), [["QUICK"] + list(r) for r in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _speedup_cell(speedup: float) -> str:
    """A speedup, marked (see SUPERLINEAR_NOTE) when it exceeds the machine's cores."""
    return f"{speedup:.2f}" + (" †" if speedup > (os.cpu_count() or 1) else "")


SUPERLINEAR_NOTE = ("† A speedup above the number of cores of this machine cannot come from "
                    "the added cores alone: it is either a measurement artefact (runs this "
                    "short are dominated by noise: the host time-sharing the cores, a cold "
                    "baseline) or a cache effect (each worker's share of the data fits in "
                    "its cache). Do not read it as scaling.")


def _notes(speedups) -> str:
    return SUPERLINEAR_NOTE if any(s > (os.cpu_count() or 1) for s in speedups) else ""


def _dataset_text(name: str) -> str:
    """How a report names the data: the real name, or the synthetic stand-in's, loudly."""
    if name.startswith("synthetic-"):
        real = {"mnist": "MNIST", "cifar10": "CIFAR-10"}.get(name.split("-")[1], name)
        return f"SYNTHETIC {real}-shaped data ({name}; {real} was not found)"
    return {"mnist": "MNIST", "cifar10": "CIFAR-10"}.get(name, name)


def _machine_md() -> str:
    m = sweep_mod.machine_info()
    return (f"Machine: {m['cpu']}, {m['cores']} cores, SIMD {m['simd']}, Python "
            f"{m['python']}.")


def _save(fig, out: Path, name: str) -> str:
    from ..measure.plots import save_figure
    import matplotlib.pyplot as plt
    save_figure(fig, out / f"{name}.png")
    plt.close(fig)
    return f"{name}.png"


def _oversubscribed(workers: int, threads: int = 1) -> bool:
    return workers * threads > (os.cpu_count() or 1)


def _workers_label(workers: int, threads: int = 1) -> str:
    return f"{workers}" + (" (oversubscribed)" if _oversubscribed(workers, threads) else "")


QUICK_BANNER = ("**QUICK RUN**: a reduced form (small data, few epochs, one repeat) that "
                "checks the pipeline. Its numbers are not the study's result; run the study "
                "without --quick for those.")


def _write(out: Path, name: str, quick: bool, **fields) -> Path:
    """Renders the study's template into out/report.md; a quick run says so in the title and
    in a banner under it."""
    import re
    fields.setdefault("machine", _machine_md())
    text = template(name).format_map(fields)
    if quick:
        title, rest = text.split("\n", 1)
        text = f"# QUICK RUN - {title[2:]}\n\n{QUICK_BANNER}\n{rest}"
    path = out / "report.md"
    path.write_text(re.sub(r"\n{3,}", "\n\n", text))     # an empty field leaves no gap
    return path


def _figures(figs) -> str:
    return "\n".join(f"![{f}]({f})" for f in figs)


# ------------------------------------------------------------------ 1. mnist-mlp
def _mnist_mlp(out: Path, quick: bool, say) -> dict:
    from ..measure import plots
    sizes = (1000, 2000) if quick else (5000, 10000, 20000, 40000)
    workers = (1, 2) if quick else (1, 2, 4)
    res = sweep_mod.sweep("mlp", "mnist", sizes=sizes, workers=workers, backend="process",
                          repeat=1 if quick else 3, epochs=1, batch_size=128, out=out,
                          quiet=True, quick=quick)
    data = _dataset_text(res["config"]["dataset"])
    figs = [_save(plots.plot_speedup(res), out, "speedup"),
            _save(plots.plot_efficiency_vs_size(res), out, "efficiency_vs_size"),
            _save(plots.plot_time_vs_size(res), out, "time_vs_size"),
            _save(plots.plot_breakdown(res), out, "breakdown")]
    rows = [[s["n_samples"], _workers_label(s["workers"]), f"{s['time']['median']:.3g}",
             _speedup_cell(s["speedup"]["median"]),
             f"{s['efficiency']['median']:.2f}",
             f"{s['ceiling_speedup']:.2f}" if s["ceiling_speedup"] else "-"]
            for s in res["summary"]]
    best = max((s for s in res["summary"] if s["workers"] == 2),
               key=lambda s: s["speedup"]["median"])
    _write(out, "mnist-mlp", quick, data=data, sizes=list(sizes), workers=list(workers),
           repeat=res["config"]["repeat"],
           table=_md_table(["samples", "workers", "time s", "speedup", "efficiency",
                            "ceiling"], rows, quick),
           notes=_notes(s["speedup"]["median"] for s in res["summary"]),
           best_speedup=f"{best['speedup']['median']:.2f}", best_samples=best["n_samples"],
           figures=_figures(figs))
    return res


# ------------------------------------------------------------------ 2. cifar10-cnn
def _cifar10_cnn(out: Path, quick: bool, say) -> dict:
    from ..measure import plots
    limit = 512 if quick else None
    workers = (1, 2) if quick else (1, 2, 4)
    n = limit or 50000
    res = sweep_mod.sweep("cnn", "cifar10", sizes=(n,), workers=workers, backend="process",
                          repeat=1, epochs=1 if quick else 2, batch_size=128, lr=0.01,
                          momentum=0.9, out=out, quiet=True, ceiling=not quick, quick=quick)
    data = _dataset_text(res["config"]["dataset"])
    figs = [_save(plots.plot_speedup(res), out, "speedup"),
            _save(plots.plot_breakdown(res), out, "breakdown"),
            _save(plots.plot_baseline_vs_distributed(res), out, "baseline_vs_distributed")]
    rows = []
    for s, r in zip(res["summary"], sorted(res["runs"], key=lambda r: r["workers"])):
        ph = s["phases"]
        comm = ph["communication"] + ph["sync_wait"]
        epochs = r["epochs"]
        rows.append([_workers_label(s["workers"]),
                     f"{s['time']['median']:.2f}",
                     f"{r['collective_calls'] / epochs:.0f}",
                     f"{comm:.3f}", f"{1e3 * s['time']['median'] / s['steps']:.1f}",
                     f"{ph['compute'] / comm:.1f}" if comm > 0 else "-",
                     _speedup_cell(s["speedup"]["median"]),
                     f"{r['final_test_accuracy']:.3f}"])
    _write(out, "cifar10-cnn", quick, data=data, epochs=res["config"]["epochs"], samples=n,
           table=_md_table(["workers", "time s", "collective calls / epoch",
                            "communication s (incl. wait)", "iteration ms",
                            "compute / communication", "speedup", "test acc"], rows, quick),
           notes=_notes(s["speedup"]["median"] for s in res["summary"]),
           figures=_figures(figs))
    return res


# ------------------------------------------------------------------ 3. logreg-1m
def _logreg_1m(out: Path, quick: bool, say) -> dict:
    from ..measure import plots
    n = 50_000 if quick else 1_000_000
    workers = (1, 2) if quick else (1, 2, 4)
    res = sweep_mod.sweep("logreg", "synthetic", sizes=(n,), workers=workers,
                          backend="process", repeat=1 if quick else 3,
                          epochs=2 if quick else 8, batch_size=8192, batch_per_worker=8192,
                          lr=0.1, scale_lr=True, warmup_epochs=1, momentum=0.0,
                          lr_schedule="constant", n_features=20, dtype="float64",
                          shuffle=False, out=out, quiet=True, quick=quick)
    figs = [_save(plots.plot_speedup(res), out, "speedup"),
            _save(plots.plot_breakdown(res), out, "breakdown")]
    rows = []
    for s in res["summary"]:
        r = next(x for x in res["runs"] if x["workers"] == s["workers"])
        rows.append([_workers_label(s["workers"]),
                     f"{s['time']['median']:.3g}", _speedup_cell(s["speedup"]["median"]),
                     f"{s['ceiling_speedup']:.2f}" if s["ceiling_speedup"] else "-",
                     f"{r['final_test_accuracy']:.4f}", r["collective_calls"],
                     f"{r['bytes_sent'] / 1e6:.2f}"])
    _write(out, "logreg-1m", quick, samples=f"{n:,}", epochs=res["config"]["epochs"],
           table=_md_table(["workers", "time s", "speedup", "ceiling", "test accuracy",
                            "synchronizations", "MB sent (rank max)"], rows, quick),
           notes=_notes(s["speedup"]["median"] for s in res["summary"]),
           figures=_figures(figs))
    return res


# ------------------------------------------------------------------ 4. mnist-softmax-scaled
def _softmax_scaled(out: Path, quick: bool, say) -> dict:
    import matplotlib.pyplot as plt
    from ..engine import train
    ups = (1, 2) if quick else (1, 2, 4)
    limit = 1000 if quick else 60000
    epochs = 3 if quick else 100
    layouts = [("1 worker x 1 thread", 1, 1, "native"), ("1 worker x 2 threads", 1, 2, "native"),
               ("2 workers x 1 thread", 2, 1, "native"), ("2 workers x 1 thread, ps", 2, 1, "ps")]
    if not quick:
        layouts.append(("2 workers x 2 threads", 2, 2, "native"))
    rows, data = [], []
    for up in ups:
        base = None
        for label, w, t, alg in layouts:
            r = train(model="softmax", dataset="mnist", limit=limit, upscale=up, epochs=epochs,
                      batch_size=limit, lr=0.5, momentum=0.0, lr_schedule="constant",
                      workers=w, threads=t, allreduce=alg, backend="process", quiet=True)
            base = base or r["train_seconds"]
            dataset = r["config"]["dataset"]
            d = {"pixels": 784 * up * up, "layout": label, "workers": w, "threads": t,
                 "allreduce": alg, "seconds": r["train_seconds"],
                 "speedup": base / r["train_seconds"],
                 "test_accuracy": r["final_test_accuracy"],
                 "oversubscribed": _oversubscribed(w, t)}
            data.append(d)
            rows.append([d["pixels"], label + (" (oversubscribed)" if d["oversubscribed"] else ""),
                         f"{d['seconds']:.3g}", _speedup_cell(d["speedup"]),
                         f"{d['test_accuracy']:.4f}"])
            say(f"{d['pixels']} pixels, {label}: {d['seconds']:.2f} s")
    data_name = _dataset_text(dataset.split("-x")[0])
    for d in data:
        d.update(dataset=dataset, quick=quick)
    (out / "results.json").write_text(json.dumps(data, indent=1))
    sweep_mod.write_csv(data, out / "results.csv")
    fig, ax = plt.subplots(figsize=(9, 4.8), layout="constrained")
    labels = [lab for lab, *_ in layouts]
    width = 0.8 / len(ups)
    for i, up in enumerate(ups):
        ys = [d["speedup"] for d in data if d["pixels"] == 784 * up * up]
        ax.bar([j + i * width for j in range(len(labels))], ys, width,
               label=f"{784 * up * up} pixels")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks([j + width * (len(ups) - 1) / 2 for j in range(len(labels))], labels,
                  rotation=15, fontsize=8)
    ax.set_ylabel("speedup over 1 worker x 1 thread")
    ax.set_title(f"Softmax regression, full-batch GD on {limit} images of {data_name}: "
                 f"threads vs workers vs both" + (" (QUICK RUN)" if quick else ""), fontsize=9)
    cores = os.cpu_count() or 1
    if any(d["speedup"] > cores for d in data):
        ax.axhline(cores, color="red", lw=0.8, ls=":")
        ax.annotate(f"above the {cores} cores: noise or cache effects, not scaling (see report)",
                    (0.01, 0.97), xycoords="axes fraction", va="top", fontsize=8, color="red")
    ax.legend()
    figs = [_save(fig, out, "speedup_layouts")]
    plt.close("all")
    _write(out, "mnist-softmax-scaled", quick, data=data_name, samples=limit,
           factors=list(ups), pixels=", ".join(str(784 * u * u) for u in ups), epochs=epochs,
           cores=os.cpu_count() or 1,
           table=_md_table(["pixels", "layout", "time s", "speedup", "test accuracy"], rows,
                           quick),
           notes=_notes(d["speedup"] for d in data), figures=_figures(figs))
    return {"runs": data}


_RUNNERS = {"mnist-mlp": _mnist_mlp, "cifar10-cnn": _cifar10_cnn, "logreg-1m": _logreg_1m,
            "mnist-softmax-scaled": _softmax_scaled}


def study(name: str, out="study", *, quick: bool = False, log=print) -> dict:
    """Runs one study (see the module docstring) and writes its report into `out`."""
    if name not in _RUNNERS:
        raise ValueError(f"study is {name!r}, expected one of {STUDIES}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = _RUNNERS[name](out, quick, log)
    log(f"wrote {out / 'report.md'}")
    return res
