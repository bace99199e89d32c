"""The command line: ``python -m dptrain train ...`` and ``python -m dptrain info``."""
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dptrain",
        description="Synchronous data-parallel training on CPUs, with a C core.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("train", help="train a model and report where the time went",
                       description="Train a model. With no data present, MNIST falls back to a "
                                   "clearly announced synthetic data set.")
    t.add_argument("--model", choices=("logreg", "softmax", "mlp", "cnn"), default="mlp",
                   help="mlp: dense layers (--hidden); cnn: two conv blocks and fc 128, "
                        "reading each row as a 1x28x28 (MNIST) or 3xSxS image")
    t.add_argument("--hidden", type=_hidden, default=(256, 128),
                   help="MLP hidden widths, comma-separated (default 256,128)")
    t.add_argument("--dataset", choices=("mnist", "synthetic"), default="mnist")
    t.add_argument("--data-dir", default=None,
                   help="directory with the MNIST IDX files (gzip or raw); default: "
                        "$DPTRAIN_DATA, then ~/.cache/dptrain/mnist")
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
    t.add_argument("--backend", choices=("thread", "process", "mpi"), default="thread",
                   help="how workers run: threads of this process, processes sharing memory, "
                        "or MPI ranks (launch with mpiexec -n N)")
    t.add_argument("--start-method", choices=("spawn", "fork", "forkserver"), default=None,
                   help="process backend: how worker processes start (default: Python's)")
    t.add_argument("--timeout", type=_nonneg_float, default=0.0,
                   help="fail a collective that waits longer than this many seconds (0: never)")
    t.add_argument("--allreduce", choices=("native", "ring", "tree", "ps"), default="native",
                   help="gradient exchange: the transport's own (native), ring or tree over "
                        "MPI messages, or a parameter server (ps)")
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
    t.add_argument("--threads", type=_pos_int, default=1,
                   help="threads the C kernels split each worker's batch over (default 1)")
    t.add_argument("--out", default=None, help="write the JSON result here")
    t.add_argument("--save-weights", default=None, help="save the trained model (.npz)")
    t.add_argument("--quiet", action="store_true", help="print nothing but errors")

    sub.add_parser("info", help="print how the C core was built (SIMD, dtypes, compiler, MPI)")
    return p


def main(argv=None) -> int:
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
              fault=_fault(args.inject_fault))
    except (ValueError, TypeError, FloatingPointError, OSError, RuntimeError) as exc:
        print(f"dptrain: error: {exc}", file=sys.stderr)
        return 1
    return 0
