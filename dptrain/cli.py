"""The command line: ``python -m dptrain train ...``, ``python -m dptrain info`` and
``python -m dptrain plot results/ --out figures/``."""
from __future__ import annotations

import argparse
import json
import sys


def _hidden(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hidden is {text!r}, expected comma-separated "
                                         f"widths such as 256,128") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--hidden is {text!r}, expected positive widths")
    return sizes


def _pos_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (v >= 0) or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return v


def _fault(text: str | None):
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 3 or parts[2] not in ("raise", "kill") or not all(
            p.isdigit() for p in parts[:2]):
        raise ValueError(f"--inject-fault is {text!r}, expected RANK:STEP:raise or "
                         f"RANK:STEP:kill, e.g. 1:10:raise")
    return int(parts[0]), int(parts[1]), parts[2]


def _straggle(text: str | None):
    if text is None:
        return None
    parts = text.split(":")
    try:
        rank, ms = int(parts[0]), float(parts[1])
        if len(parts) != 2 or rank < 0 or not ms >= 0:
            raise ValueError
    except (ValueError, IndexError):
        raise ValueError(f"--straggle is {text!r}, expected RANK:MS with MS >= 0, "
                         f"e.g. 1:5") from None
    return rank, ms


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m dptrain`` (subcommands train, sweep, study, info,
    plot)."""
    p = argparse.ArgumentParser(
        prog="python -m dptrain",
        description="Synchronous data-parallel training on CPUs, with a C core.")
    from ._version import __version__
    p.add_argument("--version", action="version", version=f"dptrain {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("train", help="train a model and report where the time went",
                       description="Train a model. With no data present, MNIST and CIFAR-10 "
                                   "fall back to a clearly announced synthetic data set.")
    t.add_argument("--model", choices=("logreg", "softmax", "mlp", "cnn"), default="mlp",
                   help="mlp: dense layers (--hidden); cnn: two conv blocks and fc 128, "
                        "reading each row as a 1x28x28 (MNIST) or 3xSxS image")
    t.add_argument("--hidden", type=_hidden, default=(256, 128),
                   help="MLP hidden widths, comma-separated (default 256,128)")
    t.add_argument("--dataset", choices=("mnist", "cifar10", "synthetic"), default="mnist")
    t.add_argument("--data-dir", default=None,
                   help="directory with the MNIST IDX files (gzip or raw) or the CIFAR-10 "
                        "batches (either format, or its .tar.gz); default: $DPTRAIN_DATA, "
                        "then ~/.cache/dptrain/DATASET")
    t.add_argument("--no-download", action="store_true",
                   help="never try to download MNIST when it is not found")
    t.add_argument("--n-samples", type=_pos_int, default=None,
                   help="synthetic data set: training samples (default 100000)")
    t.add_argument("--n-features", type=_pos_int, default=None,
                   help="synthetic data set: features (default 20)")
    t.add_argument("--upscale", type=int, choices=(1, 2, 4), default=1,
                   help="MNIST up-scaling factor: 2 -> 56x56, 4 -> 112x112 inputs")
    t.add_argument("--epochs", type=_pos_int, default=2)
    t.add_argument("--batch-size", type=_pos_int, default=128)
    t.add_argument("--lr", type=_nonneg_float, default=0.1)
    t.add_argument("--momentum", type=_nonneg_float, default=0.9)
    t.add_argument("--lr-schedule", choices=("constant", "cosine"), default="cosine",
                   help="learning-rate schedule over the whole run (default cosine decay)")
    t.add_argument("--nesterov", action="store_true")
    t.add_argument("--weight-decay", type=_nonneg_float, default=0.0)
    t.add_argument("--dampening", type=_nonneg_float, default=0.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-shuffle", action="store_true", help="fixed batch order")
    t.add_argument("--limit", type=_pos_int, default=None,
                   help="use only the first N training samples")
    t.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    t.add_argument("--workers", type=_pos_int, default=1,
                   help="data-parallel workers (default 1; under mpiexec: the MPI world size)")
    t.add_argument("--backend", choices=("thread", "process", "mpi"), default=None,
                   help="how workers run: threads of this process, processes sharing memory, "
                        "or MPI ranks (launch with mpiexec -n N). Default: mpi when started by "
                        "an MPI launcher with several ranks, else thread")
    t.add_argument("--start-method", choices=("spawn", "fork", "forkserver"), default=None,
                   help="process backend: how worker processes start (default: Python's)")
    t.add_argument("--timeout", type=_nonneg_float, default=0.0,
                   help="fail a collective that waits longer than this many seconds (0: never)")
    t.add_argument("--allreduce", choices=("native", "ring", "tree", "ps"), default="native",
                   help="gradient exchange: the transport's own (native), the ring or tree "
                        "point-to-point schedule, or a parameter server (ps)")
    t.add_argument("--bucket-kb", type=_nonneg_float, default=0.0,
                   help="exchange the gradient in buckets of this many KiB, last layer first "
                        "(default 0: one all-reduce of the whole flat gradient)")
    t.add_argument("--overlap", action="store_true",
                   help="start each bucket's all-reduce while backward is still running")
    t.add_argument("--batch-per-worker", type=_pos_int, default=None, metavar="B",
                   help="weak scaling: each worker's batch (the global batch is B x workers)")
    t.add_argument("--scale-lr", action="store_true",
                   help="multiply --lr by the number of workers (linear scaling rule)")
    t.add_argument("--warmup-epochs", type=_nonneg_float, default=0.0,
                   help="ramp the learning rate up linearly over this many epochs first")
    t.add_argument("--deterministic", action="store_true",
                   help="bitwise-identical weights for any number of workers up to 8")
    t.add_argument("--checkpoint", default=None, help="checkpoint file to write (.npz)")
    t.add_argument("--checkpoint-every", type=_pos_int, default=0, metavar="K",
                   help="write the checkpoint every K steps")
    t.add_argument("--resume", default=None, metavar="PATH",
                   help="continue the run saved in this checkpoint")
    t.add_argument("--inject-fault", default=None, metavar="RANK:STEP:raise|kill",
                   help="make one worker fail at one step (to see how a failure is handled)")
    t.add_argument("--straggle", default=None, metavar="RANK:MS",
                   help="make one rank's compute MS milliseconds slower every step")
    t.add_argument("--straggle-random", type=_nonneg_float, default=0.0, metavar="MS",
                   help="add a random U(0, MS) ms delay to every rank's compute every step")
    t.add_argument("--trace", default=None, metavar="FILE",
                   help="write a Chrome trace of every step on every rank (open in Perfetto)")
    t.add_argument("--steps-csv", default=None, metavar="FILE",
                   help="write the per-step, per-rank phase table as CSV")
    t.add_argument("--threads", type=_pos_int, default=1,
                   help="threads the C kernels split each worker's batch over (default 1)")
    t.add_argument("--out", default=None, help="write the JSON result here")
    t.add_argument("--save-weights", default=None, help="save the trained model (.npz)")
    t.add_argument("--quiet", action="store_true", help="print nothing but errors")

    w = sub.add_parser("sweep", help="time every (data-set size, worker count) and tabulate "
                                     "speedup, efficiency and where the time went",
                       description="A scaling sweep: each size with each worker count, "
                                   "repeated; writes sweep.json, runs.csv, summary.csv and "
                                   "traces/ into --out.")
    w.add_argument("--model", choices=("logreg", "softmax", "mlp", "cnn"), default="mlp")
    w.add_argument("--hidden", type=_hidden, default=(256, 128))
    w.add_argument("--dataset", choices=("mnist", "cifar10", "synthetic"), default="mnist")
    w.add_argument("--data-dir", default=None)
    w.add_argument("--sizes", type=_pos_int, nargs="+", default=[5000, 10000, 20000, 40000],
                   help="training-set sizes (first N samples of MNIST, or N synthetic ones)")
    w.add_argument("--workers", type=_pos_int, nargs="+", default=[1, 2, 4])
    w.add_argument("--backend", choices=("thread", "process"), default="process")
    w.add_argument("--allreduce", choices=("native", "ring", "tree", "ps"), default="native")
    w.add_argument("--repeat", type=_pos_int, default=3)
    w.add_argument("--epochs", type=_pos_int, default=1)
    w.add_argument("--batch-size", type=_pos_int, default=128)
    w.add_argument("--lr", type=float, default=0.1)
    w.add_argument("--momentum", type=float, default=0.9)
    w.add_argument("--upscale", type=_pos_int, default=1,
                   help="enlarge MNIST images by this factor per side (more compute per sample)")
    w.add_argument("--threads", type=_pos_int, default=1)
    w.add_argument("--no-ceiling", action="store_true",
                   help="skip the uncoupled runs that measure the contention ceiling")
    w.add_argument("--out", default="results", help="directory for the results")
    w.add_argument("--quiet", action="store_true", help="no progress bar or table")

    st = sub.add_parser("study", help="run one of the four original studies and write its "
                                      "report (Markdown, PNG, CSV)")
    st.add_argument("name", choices=("mnist-mlp", "cifar10-cnn", "logreg-1m",
                                     "mnist-softmax-scaled"))
    st.add_argument("--out", default=None, help="report directory (default: study-NAME)")
    st.add_argument("--quick", action="store_true",
                    help="a reduced run that checks the pipeline (not the study's result)")

    sub.add_parser("info", help="print how the C core was built (SIMD, dtypes, compiler, MPI)")

    f = sub.add_parser("plot", help="draw the figures of a sweep (needs matplotlib)",
                       description="Draw every figure that a sweep's data allows (speedup, "
                                   "efficiency, time, breakdown, baseline vs distributed, "
                                   "timeline, performance model) as PNG and SVG.")
    f.add_argument("sweep", help="the sweep directory (holding sweep.json) or the file itself")
    f.add_argument("--out", default="figures", help="directory for the figures (default figures)")
    f.add_argument("--formats", nargs="+", choices=("png", "svg", "pdf"), default=["png", "svg"])
    f.add_argument("--trace", default=None, metavar="PATH",
                   help="Chrome trace JSON for the timeline (default: the trace with the most "
                        "ranks in the sweep's traces/)")
    f.add_argument("--validation", default=None, metavar="PATH",
                   help="performance model: JSON list of {workers, n_samples, measured, "
                        "predicted} rows")
    f.add_argument("--projection", default=None, metavar="PATH",
                   help="performance model: JSON list of {network, algorithm, workers, "
                        "speedup, efficiency} rows (default: fitted to the sweep here)")
    f.add_argument("--no-model", action="store_true",
                   help="do not fit the performance model (dptrain.perfmodel) to the sweep")
    f.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return p


def main(argv=None) -> int:
    """Runs the command line on argv (default sys.argv[1:]); returns the exit code (130
    after Ctrl-C, with one line on stderr: the workers are stopped by then)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("dptrain: interrupted: every worker was stopped", file=sys.stderr, flush=True)
        return 130


def _main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "info":
        from . import __version__, build_info
        info = build_info()
        print(f"dptrain {__version__}")
        for k, v in info.items():
            print(f"  {k:30s} {json.dumps(v) if not isinstance(v, str) else v}")
        return 0
    if args.command == "study":
        from .studies import study
        try:
            study(args.name, args.out or f"study-{args.name}", quick=args.quick)
        except (ValueError, TypeError, FloatingPointError, OSError, RuntimeError,
                ImportError) as exc:
            print(f"dptrain: error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "sweep":
        from .sweep import sweep
        try:
            sweep(args.model, args.dataset, sizes=args.sizes, workers=args.workers,
                  backend=args.backend, repeat=args.repeat, epochs=args.epochs,
                  batch_size=args.batch_size, allreduce=args.allreduce,
                  ceiling=not args.no_ceiling, out=args.out, quiet=args.quiet, lr=args.lr,
                  threads=args.threads, data_dir=args.data_dir, momentum=args.momentum,
                  upscale=args.upscale,
                  **({"hidden": args.hidden} if args.model == "mlp" else {}))
        except (ValueError, TypeError, FloatingPointError, OSError, RuntimeError) as exc:
            print(f"dptrain: error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "plot":
        from .plots import main_plot
        return main_plot(args)
    from .training import train
    try:
        train(model=args.model, dataset=args.dataset, data_dir=args.data_dir,
              epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
              momentum=args.momentum, nesterov=args.nesterov, lr_schedule=args.lr_schedule,
              weight_decay=args.weight_decay, dampening=args.dampening, seed=args.seed,
              shuffle=not args.no_shuffle, limit=args.limit, dtype=args.dtype,
              hidden=args.hidden, workers=args.workers, backend=args.backend,
              start_method=args.start_method, timeout=args.timeout,
              threads=args.threads, n_samples=args.n_samples,
              n_features=args.n_features, upscale=args.upscale, out=args.out,
              save_weights=args.save_weights, quiet=args.quiet,
              allow_download=not args.no_download, deterministic=args.deterministic,
              checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every,
              resume=args.resume, batch_per_worker=args.batch_per_worker,
              scale_lr=args.scale_lr, warmup_epochs=args.warmup_epochs,
              allreduce=args.allreduce, bucket_kb=args.bucket_kb, overlap=args.overlap,
              fault=_fault(args.inject_fault), trace=args.trace,
              straggle=_straggle(args.straggle), straggle_random_ms=args.straggle_random,
              steps_csv=args.steps_csv)
    except (ValueError, TypeError, FloatingPointError, OSError, RuntimeError) as exc:
        print(f"dptrain: error: {exc}", file=sys.stderr)
        return 1
    return 0
