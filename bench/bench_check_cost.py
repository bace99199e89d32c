"""What the collectives' argument check costs (issue 37 item 6): one all-reduce of a float32
buffer between 2 workers (64 B and 0.94 MB, the MLP's gradient), `comm.allreduce_sum_` on an
array from `comm.zeros` as the training loop calls it, with one checkout against another (e.g.
the commit before the check), interleaved: a fresh pair of workers per run, the checkouts'
order swapped every other repeat. Each run's figure is rank 0's per-call p50 over back-to-back
calls after warm-up calls (as bench_allreduce.py times them); the table gives the median of
the repeats' p50s with their range, and after / before.

Both checkouts need a built extension (the same build serves both where the older tree's
Python calls nothing new). Run:
    python bench/bench_check_cost.py --before ../old-checkout [--after .] [--backend process]
        [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = (("64 B", 16, 20000), ("0.94 MB", 235146, 3000))
WARMUP = 500


def _worker(comm):
    import numpy as np

    out = {}
    for label, n, calls in SIZES:
        buf = comm.zeros(n, np.float32)
        t = []
        for _ in range(calls + WARMUP):
            t0 = time.perf_counter()
            comm.allreduce_sum_(buf)
            t.append(time.perf_counter() - t0)
        out[label] = float(np.median(t[WARMUP:]) * 1e6)
    return out


def _one_run(backend: str) -> None:
    import dptrain
    from dptrain.comm import launch

    r = launch(_worker, workers=2, backend=backend)
    print(json.dumps({"file": dptrain.__file__, **r[0]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the other checkout (built)")
    p.add_argument("--after", default=".", help="this checkout (default: .)")
    p.add_argument("--backend", default="process", choices=("process", "thread"))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_run:
        return _one_run(args.backend)
    trees = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    runs = {"before": [], "after": []}
    for rep in range(args.repeats):
        order = ("before", "after") if rep % 2 == 0 else ("after", "before")
        for name in order:
            r = subprocess.run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--before",
                    trees["before"],
                    "--backend",
                    args.backend,
                    "--one-run",
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": trees[name]},
                cwd=trees[name],
                timeout=300,
            )
            if r.returncode:
                sys.exit(f"a {name} run failed:\n{r.stderr[-2000:]}")
            d = json.loads(r.stdout.strip().splitlines()[-1])
            if not d["file"].startswith(trees[name]):
                sys.exit(f"the {name} run imported {d['file']}, not its checkout's dptrain")
            runs[name].append(d)
    print(
        f"# {args.backend} transport, 2 workers, {args.repeats} interleaved repeats; "
        f"before {trees['before']}, after {trees['after']}"
    )
    print(f"{'buffer':>8}  {'before p50 us':>22}  {'after p50 us':>22}  after / before")
    for label, _, _ in SIZES:
        b = [d[label] for d in runs["before"]]
        a = [d[label] for d in runs["after"]]
        mb, ma = statistics.median(b), statistics.median(a)
        print(
            f"{label:>8}  {mb:8.2f} [{min(b):.2f}-{max(b):.2f}]  "
            f"{ma:8.2f} [{min(a):.2f}-{max(a):.2f}]  {ma / mb:.3f}"
        )


if __name__ == "__main__":
    main()
