"""Writes the notebooks of this directory from the cell sources below (outputs empty).

Run: python notebooks/build_notebooks.py. Every notebook reads DPTRAIN_NOTEBOOK_QUICK=1 (set by
the test suite, which executes them) to use small settings. The first code cell (INSTALL)
installs dptrain where it is missing, as in Colab, from the source named in its DPTRAIN_SOURCE.
"""

import re
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
# the version the examples name (dptrain/_version.py, which setup.cfg also reads)
VERSION = re.search(r'__version__ = "(.+)"', (HERE.parent / "dptrain" / "_version.py").read_text())[
    1
]

# The first code cell of every notebook: plain Python (no IPython magic), so that the test
# suite can run it as a script in a fresh virtual environment (tests/test_install_cell.py).
INSTALL = r"""# Installs dptrain with its plotting extra where it is missing (Colab); where
# dptrain is importable already, nothing is installed. dptrain is not on the package index:
# set DPTRAIN_SOURCE to where pip should get it, either
#   a git URL:                  "git+https://github.com/OWNER/dptrain"  (pip builds it, ~1 min)
#   an uploaded sdist or wheel: "/content/dptrain-@VERSION@.tar.gz"
# Left empty, the package index is tried.
DPTRAIN_SOURCE = ""

import importlib, importlib.util, subprocess, sys
from pathlib import Path


def install_dptrain(source):
    # PEP 508 "name[extra] @ URL" serves a git URL, an sdist, a wheel and a directory alike
    if not source:
        requirement = "dptrain[plot]"
    elif "://" in source:
        requirement = f"dptrain[plot] @ {source}"
    elif Path(source).expanduser().exists():
        requirement = f"dptrain[plot] @ {Path(source).expanduser().resolve().as_uri()}"
    else:
        raise SystemExit(f"DPTRAIN_SOURCE is {source!r}, which is neither a URL nor an existing "
                         f"file: set it to a git URL or to the path of an uploaded sdist or wheel")
    print(f"pip install '{requirement}' ...", flush=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", requirement],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if pip.returncode != 0:
        hint = (f"check DPTRAIN_SOURCE = {source!r} at the top of this cell" if source else
                "dptrain is not on the package index: set DPTRAIN_SOURCE at the top of this cell "
                "to a git URL (git+https://github.com/OWNER/dptrain) or to the path of an "
                "uploaded sdist or wheel (/content/dptrain-@VERSION@.tar.gz), then run it again")
        tail = "\n".join(pip.stdout.strip().splitlines()[-12:])
        raise SystemExit(f"installing dptrain failed: pip install '{requirement}' exited with "
                         f"{pip.returncode}; {hint}.\n--- the last lines pip printed:\n{tail}")
    importlib.invalidate_caches()           # this process now sees the new site-packages entry


spec = importlib.util.find_spec("dptrain")
if spec is None or spec.origin is None:     # missing, or only a folder named dptrain (a clone?)
    install_dptrain(DPTRAIN_SOURCE.strip())
else:
    print("dptrain is importable from", Path(spec.origin).parent, "(nothing installed)")""".replace(
    "@VERSION@", VERSION
)

SETUP = """import os
QUICK = os.environ.get("DPTRAIN_NOTEBOOK_QUICK") == "1"   # small settings (the test suite)
import numpy as np
from IPython.display import display
%matplotlib inline
import dptrain
from dptrain.measure import plots
print("dptrain", dptrain.__version__, dptrain.build_info()["simd"], "cores:", os.cpu_count())"""


def nb(cells):
    book = new_notebook()
    book.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    # ids by position, so that regenerating an unchanged notebook changes nothing
    book.cells = [
        new_markdown_cell(c[3:], id=f"cell-{i}")
        if c.startswith("md:")
        else new_code_cell(c, id=f"cell-{i}")
        for i, c in enumerate(cells)
    ]
    return book


QUICKSTART = [
    "md:# dptrain quickstart: train, look at accuracy and at where the time went\n\n"
    "dptrain trains the same model on 1..N workers (threads, processes sharing memory, or MPI "
    "ranks) and records every step's phases on every rank. Without MNIST on disk it uses a "
    "clearly announced synthetic stand-in (nothing is downloaded in the test suite).",
    INSTALL,
    SETUP,
    "md:## Train an MLP (784-256-128-10) on 2 workers",
    """result = dptrain.train(model="mlp", dataset="mnist", epochs=1 if QUICK else 3,
                       limit=6000 if QUICK else None, batch_size=128, lr=0.1,
                       workers=2, backend="thread")
print(f"test accuracy {100 * result['final_test_accuracy']:.2f} %, "
      f"training loop {result['train_seconds']:.2f} s")""",
    "md:## Accuracy per epoch",
    """import pandas as pd
pd.DataFrame(result["epochs"])""",
    "md:## Where the time went\n\nPhases per rank (seconds): data, compute (forward + backward), "
    "communication (the transfer), sync_wait (waiting for the slowest worker), update, other. "
    "They add up to each rank's training time.",
    """st = result["step_times"]
b = result["breakdown"]
print(f"step time p50 {1e3 * b['step_seconds']['p50']:.2f} ms, p99 {1e3 * b['step_seconds']['p99']:.2f} ms; "
      f"compute/communication {b['compute_to_communication']:.1f}; "
      f"{b['collective_calls_per_epoch']:.0f} collectives and {b['bytes_sent_per_epoch'] / 1e6:.1f} MB per epoch; "
      f"timers cost {100 * b['timer_fraction']:.2f} % of a step")
pd.DataFrame(b["rank_phase_seconds"]).rename_axis("rank")""",
    """st.to_pandas().head()""",
    "md:## A few steps on every rank",
    """plots.plot_timeline(st.chrome_trace(), steps=4)""",
    "md:## Your own model on your own arrays\n\nA model is a list of layers (`dptrain.nn`); "
    "`dptrain.fit` trains it on NumPy arrays on N workers. Here the arrays are MNIST's (or its "
    "announced stand-in); put yours in their place.",
    """from dptrain import nn
ds = dptrain.data.load_dataset("mnist", limit=3000 if QUICK else 20000)
X, y = ds.x_train, ds.y_train                 # your arrays: X (n, 784) or (n, 1, 28, 28), y (n,)
model = nn.Sequential([nn.Conv2d(8, 5, padding=2), nn.ReLU(), nn.MaxPool2(),
                       nn.Flatten(), nn.Dense(64), nn.GELU(), nn.Dense(10)],
                      input_shape=(1, 28, 28), seed=0)
print(model.summary())
fitted = dptrain.fit(model, X, y, X_test=ds.x_test[:2000], y_test=ds.y_test[:2000],
                     epochs=1 if QUICK else 3, lr=0.05, workers=2)
print(f"test accuracy {100 * fitted.history[-1]['test_accuracy']:.2f} %")""",
]

SCALING = [
    "md:# A scaling study: sweep, speedup and efficiency, a fitted model and its projection\n\n"
    "Every (data-set size, worker count) is trained `repeat` times; the baseline is our own "
    "1-worker run in the same sweep, and p uncoupled workers started together give the "
    "contention ceiling (what the machine allows without any communication).",
    INSTALL,
    SETUP,
    """from dptrain.measure.sweep import sweep, format_summary
sizes = (2000, 4000) if QUICK else (5000, 10000, 20000, 40000)
workers = (1, 2) if QUICK else (1, 2, 4)
res = sweep("mlp", "mnist", sizes=sizes, workers=workers, backend="process",
            repeat=2 if QUICK else 3, out="results", quiet=True)
print(format_summary(res["summary"]))""",
    "md:## Speedup against the ideal, efficiency and time against data-set size",
    """plots.plot_speedup(res)""",
    """display(plots.plot_efficiency_vs_size(res))
display(plots.plot_time_vs_size(res))""",
    "md:## Where the time goes per configuration, and 1 worker against p",
    """display(plots.plot_breakdown(res))
display(plots.plot_baseline_vs_distributed(res))""",
    "md:## The performance model\n\nT_p = steps x (t_sample b / p + t_serial + T_comm(p, M) + "
    "T_sync(p)), fitted by non-negative least squares on the sweep's phases. With only 2 "
    "cores the sweep has one worker count above 1, so the latency alpha of shared memory is "
    "taken from its preset and only the bandwidth is fitted. Validation: fit without the "
    "largest size, predict it.",
    """from dptrain.measure import perfmodel as pm
alpha = pm.NETWORKS["shared memory"].alpha
model = pm.fit(res["runs"], alpha=alpha)
analysis = pm.analyze(res["runs"], alpha=alpha)
print(f"serial fraction (Amdahl) at batch 128: {model.serial_fraction_at(128):.4f}; "
      f"fit error (rms) {analysis['fit']['fit_rms_error_pct']:.1f} %")
for p in model.parameters():
    print(f"  {p['name']:24s} {p['value']:.3g} {p['unit']:10s} {p['meaning']}")
pd_rows = analysis["validation"]["rows"]
for r in pd_rows:
    print(f"{r['workers']} worker(s), {r['n_samples']} samples: measured {r['measured']:.3f} s, "
          f"predicted {r['predicted']:.3f} s ({r['error_pct']:+.1f} %)")""",
    """display(plots.plot_model_validation(analysis["validation"]))
display(plots.plot_projection(analysis["projection"], validation=analysis["validation"]))""",
    "md:## Below which data size does adding workers not pay?",
    """import pandas as pd
be = pd.DataFrame(analysis["break_even"])
be[be.workers.isin([2, 16, 256])].pivot_table(index=["network", "algorithm"], columns="workers",
                                               values="samples_per_step")""",
]

COMMUNICATION = [
    "md:# Communication: all-reduce algorithms, buckets and overlap, the timeline, a straggler",
    INSTALL,
    SETUP,
    """common = dict(model="mlp", dataset="mnist", limit=4000 if QUICK else 20000, epochs=1,
              batch_size=128, workers=2, backend="process", quiet=True)
rows = []
for alg in ("native", "ring", "tree", "ps"):
    r = dptrain.train(allreduce=alg, **common)
    ph = r["breakdown"]["phase_seconds"]
    rows.append({"allreduce": alg, "train s": r["train_seconds"],
                 "communication s": ph["communication"], "sync_wait s": ph["sync_wait"],
                 "MB sent / epoch": r["breakdown"]["bytes_sent_per_epoch"] / 1e6,
                 "test acc": r["final_test_accuracy"]})
import pandas as pd
pd.DataFrame(rows)""",
    "md:Every algorithm trains the same model (the accuracy column); they differ in messages "
    "and bytes. `ps` (parameter server) sends the most from rank 0.",
    "md:## Buckets and overlap\n\nThe gradient can be exchanged in buckets, last layer first; "
    "with overlap each bucket's all-reduce starts while backward continues. On a 2-core machine "
    "the communication thread competes with the workers for the cores.",
    """rows = []
for bucket_kb, overlap in ((0, False), (256, False), (256, True)):
    r = dptrain.train(bucket_kb=bucket_kb, overlap=overlap, **common)
    rows.append({"bucket KiB": bucket_kb, "overlap": overlap, "train s": r["train_seconds"],
                 "collectives / epoch": r["breakdown"]["collective_calls_per_epoch"]})
pd.DataFrame(rows)""",
    "md:## A straggler\n\nRank 1's compute is made 3 ms slower per step: rank 0 now waits "
    "for it at every all-reduce. The wait shows up as sync_wait, not as communication.",
    """r = dptrain.train(straggle=(1, 3.0), **common)
pd.DataFrame(r["rank_phase_seconds"]).rename_axis("rank")""",
    """plots.plot_timeline(r["step_times"].chrome_trace(), steps=3)""",
    "md:## Communicate less, wait less: local SGD\n\nWith `sync_every=H` each worker's "
    "replica takes H steps on its own shard of every global batch, then the replicas average "
    "their parameters and momentum (also at each epoch's end, where the run evaluates). Every "
    "worker's compute is stretched by a random 0-3 ms here (`straggle_random_ms`), like the "
    "jitter of a 16-core machine: synchronous SGD waits for the slowest worker at every step, "
    "local SGD only at an average, and that wait grows as sqrt(H) while the averages fall as "
    "1/H. The weights depend on H and the replicas, not on the number of workers.",
    """jitter = dict(common, limit=4000 if QUICK else None, epochs=2 if QUICK else 3,
              straggle_random_ms=3.0, progress=False)
runs = {"synchronous": dptrain.train(**jitter)}
for h in (4,) if QUICK else (2, 8, 32):
    runs[f"H={h}"] = dptrain.train(sync_every=h, **jitter)
runs["H=8 after 1 epoch"] = dptrain.train(sync_every=8, local_after=1, **jitter)
runs["auto"] = dptrain.train(sync_every="auto", **jitter)
rows = []
for name, r in runs.items():
    ph = r["breakdown"]["phase_seconds"]
    rows.append({"run": name, "test acc": r["final_test_accuracy"], "train s": r["train_seconds"],
                 "sync_wait s": ph["sync_wait"], "average s": ph["average"],
                 "averages": (r["local_sgd"] or {}).get("averages")})
pd.DataFrame(rows)""",
    """display(plots.plot_accuracy_vs_time(runs, target=0.975, quick=QUICK))
plots.plot_run_phases(runs, quick=QUICK)""",
    "md:The performance model prices a period H from the synchronous run alone (no gradient "
    "exchange; an average every H steps; the wait at an average sqrt(H) times a step's): its "
    "prediction against what each run took.",
    """from dptrain.measure import perfmodel as pm
pd.DataFrame([
    {"run": name, "measured s": r["train_seconds"],
     "predicted s": pm.predict_local_run(runs["synchronous"], r["config"]["sync_every"],
                                         r["config"]["local_after"])["seconds"]}
    for name, r in runs.items() if name.startswith("H=")
])""",
    "md:`python -m dptrain study local-sgd` runs the whole comparison (H from 2 to 32, the MLP "
    "and the CNN) and writes its report, tables and figures.",
]


def main():
    for name, cells in (
        ("01_quickstart", QUICKSTART),
        ("02_scaling_study", SCALING),
        ("03_communication", COMMUNICATION),
    ):
        nbformat.write(nb(cells), HERE / f"{name}.ipynb")
        print("wrote", HERE / f"{name}.ipynb")


if __name__ == "__main__":
    main()
