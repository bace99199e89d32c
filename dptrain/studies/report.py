"""A study's report: its template (the prose, in ``templates/NAME.md``) filled with the run's
tables and figures, and the marks no reader may miss (a QUICK run, a speedup above the
machine's cores, an oversubscribed layout, synthetic data).

Each template quotes the original study's published figures on its "Original: " line
(``ORIGINAL``); see the package docstring for what the original studies are."""

from __future__ import annotations

import os
from pathlib import Path

from ..measure import sweep as sweep_mod

STUDIES = ("mnist-mlp", "cifar10-cnn", "logreg-1m", "mnist-softmax-scaled", "local-sgd")

TEMPLATES = Path(__file__).resolve().parent / "templates"


def template(name: str) -> str:
    """A study's report template (Markdown with {fields}): its prose, kept out of the code."""
    return (TEMPLATES / f"{name}.md").read_text()


def _original(name: str) -> str:
    """The original study's published figures, as its template quotes them."""
    line = next(line for line in template(name).splitlines() if line.startswith("Original: "))
    return line[len("Original: ") :]


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


SUPERLINEAR_NOTE = (
    "† A speedup above the number of cores of this machine cannot come from "
    "the added cores alone: it is either a measurement artefact (runs this "
    "short are dominated by noise: the host time-sharing the cores, a cold "
    "baseline) or a cache effect (each worker's share of the data fits in "
    "its cache). Do not read it as scaling."
)


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
    return f"Machine: {m['cpu']}, {m['cores']} cores, SIMD {m['simd']}, Python {m['python']}."


def _oversubscribed(workers: int, threads: int = 1) -> bool:
    return workers * threads > (os.cpu_count() or 1)


def _workers_label(workers: int, threads: int = 1) -> str:
    return f"{workers}" + (" (oversubscribed)" if _oversubscribed(workers, threads) else "")


QUICK_BANNER = (
    "**QUICK RUN**: a reduced form (small data, few epochs, one repeat) that "
    "checks the pipeline. Its numbers are not the study's result; run the study "
    "without --quick for those."
)


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
    path.write_text(re.sub(r"\n{3,}", "\n\n", text))  # an empty field leaves no gap
    return path


def _figures(figs) -> str:
    return "\n".join(f"![{f}]({f})" for f in figs)
