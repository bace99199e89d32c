"""``python -m dptrain plot SWEEP_DIR --out DIR``: read the command's arguments, fit the
performance model to the sweep (unless given or told not to), print its verdict, and draw
every figure the data allows (dptrain.measure.plots).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .._files import check_out_dir, read_json, write_text_atomically
from .plots import load_sweep, machine_cores, model_verdict, plot_sweep
from .plots.labels import _context
from .plots.performance import _ILLUSTRATION


def main_plot(args) -> int:
    """``python -m dptrain plot SWEEP_DIR --out DIR``: args from dptrain.cli's ``plot`` parser."""
    quiet = getattr(args, "quiet", False)
    say = (lambda msg: None) if quiet else print
    try:
        sweep = load_sweep(args.sweep)
        if args.out:  # before the model is fitted and its model.json written there
            check_out_dir(args.out, "--out")
        say(f"sweep: {_context(sweep['summary'], sweep=sweep)}")
        validation = _read_model_file(
            getattr(args, "validation", None), "--validation", "validation"
        )
        projection = _read_model_file(
            getattr(args, "projection", None), "--projection", "projection"
        )
        if validation is None and projection is None and not getattr(args, "no_model", False):
            validation, projection = _fit_model(args.sweep, args.out, say)
        if validation is not None or projection is not None:
            verdict = model_verdict(validation)
            say(
                f"performance model: {verdict['text']}"
                + (
                    f"; {_ILLUSTRATION} (marked so on the figure)"
                    if projection is not None and not verdict["validated"]
                    else ""
                )
            )
        files = plot_sweep(
            args.sweep,
            args.out,
            formats=tuple(args.formats),
            trace=getattr(args, "trace", None),
            validation=validation,
            projection=projection,
            report=say,
        )
    except (ImportError, ValueError, OSError) as exc:  # no matplotlib, bad or no data
        print(f"dptrain: error: {exc}", file=sys.stderr)
        return 1
    for path in files:
        say(f"wrote {path}")
    return 0


def _fit_model(sweep, out_dir, say):
    """The performance model's validation (perfmodel's dict) and projection rows for a sweep
    directory (also written to out_dir/model.json), or (None, None) with the reason told when
    the sweep cannot be fitted. The projection adds the hierarchical all-reduce on nodes of
    as many ranks as the sweep's machine has cores. With a single worker count above 1 the
    transport's latency cannot be told from its bandwidth: the shared-memory preset's alpha
    is then used, and said so."""
    from . import perfmodel

    try:
        runs = perfmodel.load_runs(sweep)
    except ValueError as exc:
        say(f"no performance model: {exc}")
        return None, None
    # runs with more workers x threads than the sweep machine's cores time-share the cores: the
    # model has no term for that (see dptrain.measure.perfmodel), so they are left out of the fit
    cores = machine_cores(load_sweep(sweep))
    if cores:
        fitting = [r for r in runs if r["workers"] * r.get("threads", 1) <= cores]
        if len(fitting) < len(runs):
            say(
                f"performance model: {len(runs) - len(fitting)} run(s) with more workers x "
                f"threads than the {cores} cores left out of the fit (oversubscribed)"
            )
            runs = fitting
    # the hierarchical all-reduce projected on nodes like the sweep's machine (its cores)
    per_node = cores if cores and cores > 1 else None
    try:
        analysis = perfmodel.analyze(runs, ranks_per_node=per_node)
    except ValueError:
        alpha = perfmodel.NETWORKS["shared memory"].alpha
        try:
            analysis = perfmodel.analyze(runs, alpha=alpha, ranks_per_node=per_node)
        except ValueError as exc:
            say(f"no performance model: {exc}")
            return None, None
        say(
            f"performance model: alpha fixed at the shared-memory preset ({alpha:.2g} s): "
            f"the sweep has too few worker counts to fit it"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / "model.json", json.dumps(analysis, indent=1) + "\n")
    say(f"performance model: wrote {out / 'model.json'}")
    return analysis.get("validation"), analysis["projection"]


def _read_model_file(path, option: str, key: str):
    """A JSON list of rows, or a dict: perfmodel's ``key`` entry of a model.json, or (for
    the validation) perfmodel's validation dict with its 'rows'."""
    if path is None:
        return None
    doc = read_json(path, f"for {option}: the model.json that plot writes (or its rows)")
    if isinstance(doc, dict) and key in doc:  # a model.json written by plot
        doc = doc[key]
    if key == "validation" and isinstance(doc, dict) and isinstance(doc.get("rows"), list):
        return doc
    if not isinstance(doc, list):
        raise ValueError(
            f"{option} {path} holds a {type(doc).__name__}, expected a JSON "
            f"list of rows (or the model.json that plot writes)"
        )
    return doc
