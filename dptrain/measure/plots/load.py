"""What the figures are drawn from, read and checked: a sweep (``sweep.json``, its directory,
or SUMMARY rows), a Chrome trace, the performance model's validation and projection rows;
and the questions a figure asks of them (which rows vary, the machine's cores, whether a
worker count is oversubscribed).

Every check raises ``ValueError`` naming the row and the field, so the figures can trust
the data; ``NotEnoughData`` says a figure needs more than the data holds.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..._files import read_json
from ..timing import PHASES  # the one list of phases


class NotEnoughData(ValueError):
    """The data cannot make this figure (e.g. one worker count only); plot_sweep skips it."""


# What makes a configuration (besides the worker count), in the order labels name them.
CONFIG_DIMS = ("model", "dataset", "backend", "allreduce", "n_samples")


def load_sweep(source) -> dict:
    """A sweep as a dict: from a directory holding sweep.json, the file itself, or a dict.

    A bare list of SUMMARY rows is accepted too (wrapped as ``{"summary": rows}``). The rows
    are checked here (``ValueError`` naming the row and the field), so the figures can trust them.
    """
    if not isinstance(source, (str, Path)):
        return _checked_sweep(source)
    path = sweep_json(source)
    sweep = read_json(path, SWEEP_EXPECTED)
    if not isinstance(sweep, (dict, list)) or (isinstance(sweep, dict) and "summary" not in sweep):
        raise ValueError(
            f"{path} holds a JSON {type(sweep).__name__}"
            + (f" with keys {sorted(sweep)[:8]}" if isinstance(sweep, dict) else "")
            + f", not a sweep (a dict with a 'summary' list): expected {SWEEP_EXPECTED}"
        )
    try:
        return _checked_sweep(sweep)
    except ValueError as exc:  # the file is named: it holds something else
        raise ValueError(f"{path}: {exc} (expected {SWEEP_EXPECTED})") from None


# what a sweep file is, in every message about one that is not
SWEEP_EXPECTED = (
    "a sweep directory or its sweep.json, written by `python -m dptrain sweep --out DIR`"
)


def sweep_json(source) -> Path:
    """The sweep.json of a sweep directory, or the file given; FileNotFoundError naming it
    when it does not exist."""
    path = Path(source)
    if path.is_dir():
        path = path / "sweep.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no sweep found: {path} does not exist (expected {SWEEP_EXPECTED})"
        )
    return path


def _checked_sweep(sweep) -> dict:
    if isinstance(sweep, list):
        sweep = {"summary": sweep}
    if not isinstance(sweep, dict) or "summary" not in sweep:
        raise ValueError(
            f"sweep must be a dict with a 'summary' list (sweep.json), a list of "
            f"SUMMARY rows, or a path; got {type(sweep).__name__}"
            + (f" with keys {sorted(sweep)}" if isinstance(sweep, dict) else "")
        )
    _check_summary(sweep["summary"])
    return sweep


def _check_summary(rows) -> None:
    if not isinstance(rows, list) or not rows:
        raise ValueError(
            "sweep summary is empty: there is no configuration to plot (did the sweep finish?)"
        )
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"summary[{i}] is a {type(row).__name__}, expected a dict")
        for key in ("workers", "n_samples", "time"):
            if key not in row:
                raise ValueError(f"summary[{i}] has no {key!r} (keys: {sorted(row)})")
        for key in ("workers", "n_samples"):
            v = row[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"summary[{i}].{key} is {v!r}, expected an integer >= 1")
        for key in ("time", "speedup", "efficiency"):
            stat = row.get(key)
            if stat is None and key != "time":
                continue  # no baseline for this size: no speedup to draw
            where = f"summary[{i}] ({_config_text(row)}).{key}"
            if not isinstance(stat, dict) or not _is_number(stat.get("median")):
                raise ValueError(
                    f"{where} is {stat!r}, expected {{'median': .., 'min': .., 'max': ..}}"
                )
            med, lo, hi = _stat(row, key)
            if not lo <= med <= hi:
                raise ValueError(
                    f"{where} has min {lo}, median {med}, max {hi}; expected min <= median <= max"
                )
        phases = row.get("phases")
        if phases is not None:
            _check_phases(phases, f"summary[{i}] ({_config_text(row)}).phases")


def _check_phases(phases, where: str) -> None:
    if not isinstance(phases, dict):
        raise ValueError(
            f"{where} is a {type(phases).__name__}, expected a dict of seconds per phase"
        )
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise ValueError(f"{where} has unknown phase(s) {unknown}; the phases are {PHASES}")
    for name, value in phases.items():
        if not _is_number(value) or value < 0:
            raise ValueError(f"{where}[{name!r}] is {value!r}, expected seconds >= 0")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _summary(data) -> tuple[list, dict]:
    """(SUMMARY rows, the sweep dict) from whatever the public functions were given."""
    sweep = load_sweep(data)
    return sweep["summary"], sweep


def _stat(row, key):
    """(median, min, max) of a ``{median, min, max}`` field, or None where it is missing."""
    stat = row.get(key)
    if not isinstance(stat, dict) or not _is_number(stat.get("median")):
        return None
    med = stat["median"]
    lo = stat.get("min") if _is_number(stat.get("min")) else med
    hi = stat.get("max") if _is_number(stat.get("max")) else med
    return med, lo, hi


def _phase_seconds(row) -> dict:
    """The row's phases as seconds, every phase present (a phase not recorded counts as 0)."""
    phases = row.get("phases") or {}
    return {p: float(phases.get(p, 0.0)) for p in PHASES}


def _config_text(row) -> str:
    return ", ".join(f"{d}={row[d]}" for d in (*CONFIG_DIMS, "workers") if d in row)


def _varying(rows, dims=CONFIG_DIMS) -> list:
    return [d for d in dims if len({repr(r.get(d)) for r in rows}) > 1]


def _sweep_config(sweep) -> dict:
    config = (sweep or {}).get("config") if isinstance(sweep, dict) else None
    return config if isinstance(config, dict) else {}


def machine_cores(sweep):
    """The core count the sweep recorded for its machine (``machine.cores``), or None."""
    machine = (sweep or {}).get("machine") if isinstance(sweep, dict) else None
    for key in ("cores", "cpus", "cpu_count"):
        value = (machine or {}).get(key) if isinstance(machine, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def _threads(sweep) -> int:
    """Threads per worker: the sweep config's ``threads``, else the most any run used, else 1."""
    value = _sweep_config(sweep).get("threads")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    runs = (sweep or {}).get("runs") if isinstance(sweep, dict) else None
    used = [r.get("threads") for r in runs or () if isinstance(r, dict)]
    return max(
        (t for t in used if isinstance(t, int) and not isinstance(t, bool) and t >= 1), default=1
    )


def _oversubscribed(workers: int, sweep) -> bool:
    """More workers x threads than the machine's cores: they time-share them (the command
    line leaves such runs out of the model fit for the same reason)."""
    cores = machine_cores(sweep)
    return cores is not None and workers * _threads(sweep) > cores


def _series(rows, dims) -> dict:
    """Rows grouped by the values of ``dims``: {key tuple: rows sorted by (n_samples, workers)}."""
    groups: dict = {}
    for row in rows:
        groups.setdefault(tuple(row.get(d) for d in dims), []).append(row)
    for key in groups:
        groups[key].sort(key=lambda r: (r.get("n_samples") or 0, r["workers"]))
    return dict(sorted(groups.items(), key=lambda kv: tuple(map(_order, kv[0]))))


def _order(value):
    """A sort key for mixed values: numbers by value, then everything else by its text."""
    return (0, value, "") if _is_number(value) else (1, 0, str(value))


def load_trace(path) -> dict:
    """A Chrome trace-event JSON file as a dict (a bare event list is wrapped)."""
    trace = read_json(path, "a Chrome trace (JSON), as a run's --trace or a sweep's traces/ hold")
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    return trace


def _pick_trace(sweep_dir: Path):
    """The trace with the most ranks (then the first by name) in sweep_dir/traces, or None."""
    best = None
    for path in sorted((sweep_dir / "traces").glob("*.json")):
        trace = load_trace(path)
        ranks = {
            (e.get("pid", 0), e.get("tid", 0))
            for e in trace.get("traceEvents", [])
            if isinstance(e, dict) and e.get("ph") == "X"
        }
        if best is None or len(ranks) > best[0]:
            best = (len(ranks), trace)
    return best[1] if best else None


def _trace_slices(trace) -> tuple[list, dict]:
    """([(row key, phase, start us, dur us, step)], {row key: name}) from a Chrome trace."""
    if isinstance(trace, dict):
        events = trace.get("traceEvents")
    else:
        events = trace
    if not isinstance(events, list):
        raise ValueError(
            "trace must be a Chrome trace dict with a 'traceEvents' list (or "
            f"that list); got {type(trace).__name__}"
        )
    slices, names = [], {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise ValueError(f"trace event {i} is a {type(ev).__name__}, expected a dict")
        row = (ev.get("pid", 0), ev.get("tid", 0))
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[row] = str((ev.get("args") or {}).get("name", row))
            continue
        if ev.get("ph") != "X":
            continue
        name = ev.get("name")
        if name not in PHASES:
            if ev.get("cat", "phase") == "phase":
                raise ValueError(
                    f"trace event {i} has unknown phase {name!r}; the phases are {PHASES}"
                )
            continue  # other categories (e.g. markers) are not drawn
        ts, dur = ev.get("ts"), ev.get("dur")
        if not _is_number(ts) or not _is_number(dur) or dur < 0:
            raise ValueError(
                f"trace event {i} ({name}) has ts={ts!r}, dur={dur!r}; expected "
                f"microseconds, dur >= 0"
            )
        step = (ev.get("args") or {}).get("step")
        slices.append((row, name, float(ts), float(dur), step))
    if not slices:
        raise ValueError("trace has no phase slices (events with ph 'X' named after a phase)")
    return slices, names


def _check_rows(rows, keys, what: str) -> list:
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError(f"{what} rows are empty: nothing to plot")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{what} row {i} is a {type(row).__name__}, expected a dict")
        missing = [k for k in keys if k not in row]
        if missing:
            raise ValueError(f"{what} row {i} has no {missing} (expected keys {list(keys)})")
    return list(rows)


def _validation_rows(validation) -> list:
    """The rows of a validation given as perfmodel's dict (``Validation.to_dict()``) or as
    the rows themselves."""
    if isinstance(validation, dict):
        return validation.get("rows")
    return validation
