"""The four studies dptrain grew from (and local SGD's), each one command away, each writing
its report.

The "original studies" are four earlier measurements of data-parallel training on CPUs that
dptrain set out to reproduce and explain: an MLP on MNIST subsets whose speedup stayed near 1
(pickling and process start-up inside the timing), a CIFAR-10 CNN that exchanged one
all-reduce call per parameter tensor, a logistic regression on 1M synthetic samples through a
pickled ``multiprocessing`` Pool, and a softmax regression on enlarged MNIST images on threads
of one node and on 4 MPI nodes. Their code is not part of dptrain; each report quotes their
published figures (the "Original: " line of its template, ``ORIGINAL``) under "Against the
original", beside ours, and says what explains the difference.

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

A fifth preset is not an earlier study but the comparison behind local SGD
(``engine.local``), set against the published results its design rests on:

- ``local-sgd``: MNIST MLP (3 epochs) and CNN (2 epochs) on 2 worker processes with
  ``--straggle-random 3``: synchronous SGD, local SGD at H = 2..32, post-local SGD and
  ``--sync-every auto``; final and per-epoch test accuracy against training time, time to the
  target accuracy (97.5 / 98.5 %), the phases, and the performance model's prediction of each
  period from the synchronous run (``perfmodel.predict_local_run``).

Each report's prose (what the original study found, what explains the difference) is its
template in ``templates/NAME.md``, filled with the run's figures (``report``); the runs are
``runs``, the PNG files ``figures``. What is left out on purpose:
the original studies' code (we compare against their published figures, quoted in the
templates), and runs that need more cores than the machine has, which are
run but flagged (oversubscribed) in the report.
"""

from __future__ import annotations

from pathlib import Path

from .report import ORIGINAL, QUICK_BANNER, STUDIES, SUPERLINEAR_NOTE, TEMPLATES, template  # noqa: F401
from .runs import _RUNNERS


def study(name: str, out="study", *, quick: bool = False, log=print) -> dict:
    """Runs one study (see the module docstring) and writes its report into `out`."""
    if name not in _RUNNERS:
        raise ValueError(f"study is {name!r}, expected one of {STUDIES}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = _RUNNERS[name](out, quick, log)
    log(f"wrote {out / 'report.md'}")
    return res
