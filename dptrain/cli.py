"""The command line: ``python -m dptrain train ...`` (every option of ``dptrain.train``,
built from ``dptrain.config.TrainConfig``), ``sweep``, ``study``, ``plot``, ``info``,
``--version``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings

from ._signals import Terminated, stop_signals_raise
from .config import (
    add_train_arguments,
    check_paths,
    cli_message,
    config_from_args,
    fraction,
    positive_int,
)
from .config import given as given_options
from .measure.sweep import SWEEP_BACKENDS
from .studies import STUDIES

# the train options a sweep takes too (each run of a sweep is one dptrain.train)
SWEEP_OPTIONS = (
    "model",
    "hidden",
    "dataset",
    "data_dir",
    "epochs",
    "batch_size",
    "lr",
    "momentum",
    "upscale",
    "threads",
    "allreduce",
)


class _HelpWithDefaults(argparse.HelpFormatter):
    """argparse's help with each option's default after its text, in the form the option
    takes on the command line (--hidden 256,128; --sizes 5000 10000). Not shown: None (the
    help says what happens then) and switches (a --flag is off, a --no-flag on, by
    default)."""

    def _get_help_string(self, action):
        text = default_text(action)
        help = action.help or ""
        if text is None:
            return help
        return f"{help} (default: {text.replace('%', '%%')})"


def default_text(action) -> str | None:
    """An option's default as the command line writes it (values after a flag that takes
    several, a tuple's text form such as 256,128 after one that takes one), or None where
    it is not shown."""
    default = action.default
    if (
        default is None
        or default is argparse.SUPPRESS
        or isinstance(default, bool)
        or action.nargs == 0
    ):
        return None
    if isinstance(default, (tuple, list)):
        several = action.nargs not in (None, argparse.OPTIONAL)
        return (" " if several else ",").join(str(v) for v in default)
    return str(default)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m dptrain`` (subcommands train, sweep, study, elastic, info,
    plot)."""
    p = argparse.ArgumentParser(
        prog="python -m dptrain",
        description="Synchronous data-parallel training on CPUs, with a C core.",
        formatter_class=_HelpWithDefaults,
    )
    from ._version import __version__

    p.add_argument("--version", action="version", version=f"dptrain {__version__}")
    sub = p.add_subparsers(
        dest="command", metavar="COMMAND", help="what to do (COMMAND --help: its options)"
    )

    t = sub.add_parser(
        "train",
        formatter_class=_HelpWithDefaults,
        help="train a model and report where the time went",
        description="Train a model on 1..N workers. With no data present, "
        "MNIST and CIFAR-10 fall back to a clearly announced "
        "synthetic data set. Your own data: --data file.npz or --data file.csv, or "
        "--train-x X.npy --train-y y.npy (memory-mapped; or CSV files).",
    )
    add_train_arguments(t)
    d = t.add_argument_group("your own data")
    d.add_argument(
        "--data",
        default=None,
        metavar="FILE",
        help="train on this file: an .npz of x_train, y_train and optionally "
        "x_test, y_test (or X, y), or a CSV of features and labels (--label-column); "
        "read by what it holds, not by its name",
    )
    d.add_argument(
        "--train-x",
        default=None,
        metavar="X",
        help="training features: .npy (memory-mapped: may be larger than RAM) or CSV "
        "(every column a feature)",
    )
    d.add_argument(
        "--train-y",
        default=None,
        metavar="Y",
        help="training labels: .npy or CSV (one column, or --label-column)",
    )
    d.add_argument("--test-x", default=None, metavar="X", help="held-out features (as --train-x)")
    d.add_argument("--test-y", default=None, metavar="Y", help="held-out labels (as --train-y)")
    d.add_argument(
        "--label-column",
        default=None,
        metavar="NAME|INDEX",
        help="CSV data: the column of the labels, by its header name or its index "
        "(negative from the end; default: the last column)",
    )
    d.add_argument(
        "--csv-header",
        choices=("auto", "yes", "no"),
        default="auto",
        help="CSV data: whether the first line names the columns (default auto: it does "
        "when none of its fields is a number)",
    )
    d.add_argument(
        "--validation",
        type=fraction,
        default=None,
        metavar="FRACTION",
        help="hold out this fraction of your training data (--data, --train-x) as the test "
        "set; a named --dataset has its own test set",
    )

    w = sub.add_parser(
        "sweep",
        formatter_class=_HelpWithDefaults,
        help="time every (data-set size, worker count) and tabulate "
        "speedup, efficiency and where the time went",
        description="A scaling sweep: each size with each worker count, "
        "repeated; writes sweep.json, runs.csv, summary.csv and "
        "traces/ into --out.",
    )
    add_train_arguments(w, only=SWEEP_OPTIONS, defaults={"epochs": 1})
    s = w.add_argument_group("the sweep")
    s.add_argument(
        "--sizes",
        type=positive_int,
        nargs="+",
        default=[5000, 10000, 20000, 40000],
        help="training-set sizes (first N samples of MNIST, or N synthetic ones)",
    )
    s.add_argument(
        "--workers",
        type=positive_int,
        nargs="+",
        default=[1, 2, 4],
        help="worker counts (1, the baseline, is always run)",
    )
    s.add_argument(
        "--backend",
        choices=SWEEP_BACKENDS,
        default="process",
        help="how the workers run (under MPI: one mpiexec per worker count)",
    )
    s.add_argument(
        "--repeat", type=positive_int, default=3, help="runs of each configuration, interleaved"
    )
    s.add_argument(
        "--no-ceiling",
        action="store_true",
        help="skip the uncoupled runs that measure the contention ceiling",
    )
    s.add_argument("--out", default="results", help="directory for the results")
    s.add_argument("--quiet", action="store_true", help="no progress bar or table")

    st = sub.add_parser(
        "study",
        formatter_class=_HelpWithDefaults,
        help="run one of the four studies dptrain reproduces, or local SGD's "
        "(help(dptrain.studies)), and write its report (Markdown, PNG, CSV)",
        description="Run one of the four original studies and write its report. The "
        "original studies are four earlier measurements of data-parallel training on "
        "CPUs that dptrain set out to reproduce and explain (their code is not part of "
        "dptrain): an MLP on MNIST subsets, a CIFAR-10 CNN, a logistic regression on 1M "
        "synthetic samples, a softmax regression on enlarged MNIST. Each report's "
        "'Against the original' section puts their published figures beside ours and "
        "says what explains the difference (help(dptrain.studies)). local-sgd sets "
        "synchronous SGD against local SGD (--sync-every) on the MNIST MLP and CNN, against "
        "the published results local SGD's design rests on.",
    )
    st.add_argument(
        "name",
        choices=STUDIES,
        metavar="NAME",
        help="the study: " + ", ".join(STUDIES),
    )
    st.add_argument("--out", default=None, help="report directory (default: study-NAME)")
    st.add_argument(
        "--quick",
        action="store_true",
        help="a reduced run that checks the pipeline (not the study's result)",
    )

    e = sub.add_parser(
        "elastic",
        formatter_class=_HelpWithDefaults,
        help="run an MPI training job that goes on after a lost rank",
        description="Run `mpiexec -n N python -m dptrain train ...` (given after --) and, "
        "when it fails (a rank raised, was killed or missed --timeout), run it again on "
        "fewer ranks from its last checkpoint (written every --every steps), until it ends "
        "well. With --deterministic the result is the same bits as a job that lost no one. "
        "(The thread and process backends go on in place: train --elastic.)",
    )
    e.add_argument(
        "--min-workers", type=int, default=1, help="the fewest ranks the job goes on with"
    )
    e.add_argument(
        "--every",
        type=int,
        default=50,
        help="steps between the checkpoints a restart resumes (unless the train command "
        "gives --checkpoint-every)",
    )
    e.add_argument(
        "job",
        nargs=argparse.REMAINDER,
        metavar="-- mpiexec -n N python -m dptrain train ...",
        help="the MPI job",
    )

    sub.add_parser(
        "info",
        formatter_class=_HelpWithDefaults,
        help="print how the C core was built (SIMD, dtypes, compiler, MPI)",
    )

    f = sub.add_parser(
        "plot",
        formatter_class=_HelpWithDefaults,
        help="draw the figures of a sweep (needs matplotlib)",
        description="Draw every figure that a sweep's data allows (speedup, "
        "efficiency, time, breakdown, baseline vs distributed, "
        "timeline, performance model) as PNG and SVG.",
    )
    f.add_argument("sweep", help="the sweep directory (holding sweep.json) or the file itself")
    f.add_argument("--out", default="figures", help="directory for the figures")
    f.add_argument(
        "--formats",
        nargs="+",
        choices=("png", "svg", "pdf"),
        default=["png", "svg"],
        help="the file formats to write each figure in",
    )
    f.add_argument(
        "--trace",
        default=None,
        metavar="PATH",
        help="Chrome trace JSON for the timeline (default: the trace with the most "
        "ranks in the sweep's traces/)",
    )
    f.add_argument(
        "--validation",
        default=None,
        metavar="PATH",
        help="performance model: JSON list of {workers, n_samples, measured, predicted} rows",
    )
    f.add_argument(
        "--projection",
        default=None,
        metavar="PATH",
        help="performance model: JSON list of {network, algorithm, workers, "
        "speedup, efficiency} rows (default: fitted to the sweep here)",
    )
    f.add_argument(
        "--no-model",
        action="store_true",
        help="do not fit the performance model (dptrain.measure.perfmodel) to the sweep",
    )
    f.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return p


def main(argv=None) -> int:
    """Runs the command line on argv (default sys.argv[1:]); returns the exit code (130
    after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP, with one line on stderr: the workers
    are stopped by then; 141, quietly, when the reader of stdout went away, as in
    ``python -m dptrain info | head -3``)."""
    from .comm.mpi import mpi_world_size

    # not under MPI: there the launcher ends the ranks, and a rank blocked in a collective
    # runs no Python handler
    with stop_signals_raise() if (mpi_world_size() or 1) == 1 else contextlib.nullcontext():
        try:
            with warnings.catch_warnings():  # _main's one-line warnings end with it
                return _main(argv)
        except KeyboardInterrupt as exc:
            return _interrupted(exc)
        except BrokenPipeError:
            # what is left in stdout's buffer cannot be written either: point stdout at
            # /dev/null so that the interpreter's final flush does not fail again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 141


def _interrupted(exc: KeyboardInterrupt) -> int:
    """Ctrl-C: one line, exit status 130. Under MPI the launcher forwards it to every rank:
    the first rank of the node to handle it says it, and each leaves at once with 130
    (MPI's finalization would wait for ranks that are leaving too, and a second SIGINT
    there would kill it by the signal)."""
    from .comm.mpi import INTERRUPTED_LINE, first_on_node, mpi_world_size, tell_watcher

    if (mpi_world_size() or 1) > 1:
        if first_on_node("interrupted"):  # the same election as comm.mpi.abort_job's
            print(INTERRUPTED_LINE, file=sys.stderr, flush=True)
        tell_watcher("said")
        sys.stdout.flush()
        os._exit(130)
    if isinstance(exc, Terminated):
        print(
            f"dptrain: stopped by {exc.name}: every worker was stopped", file=sys.stderr, flush=True
        )
        return 128 + exc.signum
    print("dptrain: interrupted: every worker was stopped", file=sys.stderr, flush=True)
    return 130


def _main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _warnings_as_lines(quiet=getattr(args, "quiet", False))
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
        from ._files import check_out_dir
        from .studies import study

        try:
            check_out_dir(args.out or f"study-{args.name}", "--out")
            study(args.name, args.out or f"study-{args.name}", quick=args.quick)
        except (
            ValueError,
            TypeError,
            FloatingPointError,
            OSError,
            RuntimeError,
            ImportError,
        ) as exc:
            print(f"dptrain: error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "sweep":
        from ._files import check_out_dir
        from .measure.sweep import sweep

        try:
            if args.out:
                check_out_dir(args.out, "--out")
            sweep(
                args.model,
                args.dataset,
                sizes=args.sizes,
                workers=args.workers,
                backend=args.backend,
                repeat=args.repeat,
                epochs=args.epochs,
                batch_size=args.batch_size,
                allreduce=args.allreduce,
                ceiling=not args.no_ceiling,
                out=args.out,
                quiet=args.quiet,
                lr=args.lr,
                threads=args.threads,
                data_dir=args.data_dir,
                momentum=args.momentum,
                upscale=args.upscale,
                **({"hidden": args.hidden} if args.model == "mlp" else {}),
            )
        except (ValueError, TypeError, FloatingPointError, OSError, RuntimeError) as exc:
            print(f"dptrain: error: {cli_message(exc)}", file=sys.stderr)
            return 1
        return 0
    if args.command == "plot":
        from .measure.plot_command import main_plot

        return main_plot(args)
    if args.command == "elastic":
        from .engine.restart import supervise

        job = args.job[1:] if args.job[:1] == ["--"] else args.job
        try:
            return supervise(
                job,
                min_workers=args.min_workers,
                every=args.every,
                log=lambda line: print(line, file=sys.stderr, flush=True),
            )
        except (ValueError, OSError) as exc:
            print(f"dptrain: error: {exc}", file=sys.stderr)
            return 1
    return _train(args)


def _warnings_as_lines(quiet: bool) -> None:
    """A warning is one line on stderr, 'dptrain: warning: ...', as errors are: not the file,
    line number and source line of the library code that raised it, which tell a user of
    the command line nothing. None under --quiet (nothing but errors)."""
    if quiet:
        warnings.simplefilter("ignore")
        return

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"dptrain: warning: {message}", file=file or sys.stderr, flush=True)

    warnings.showwarning = show


def _train(args) -> int:
    from .engine.run import run

    try:
        cfg = config_from_args(args)
        run(cfg, data=_own_data(args, cfg))
    except (ValueError, TypeError, FloatingPointError, OSError, RuntimeError) as exc:
        line = f"dptrain: error: {cli_message(exc)}"
        if _first_to_say(line):
            print(line, file=sys.stderr)
        return 1
    return 0


def _first_to_say(line: str) -> bool:
    """False in an MPI rank whose node has had this line said already: every rank refuses a
    bad option alike, and said it once per rank. A rank with another error says its own."""
    import hashlib

    from .comm.mpi import first_on_node, mpi_world_size

    if (mpi_world_size() or 1) == 1:
        return True
    return first_on_node("error-" + hashlib.sha1(line.encode()).hexdigest()[:16])


def _own_data(args, cfg):
    """The Dataset of --data or --train-x/--train-y (read in the model's dtype), or None: the
    config's named data set."""
    from . import data
    from .models import storage_dtype

    given = {k: getattr(args, k) for k in ("data", "train_x", "train_y", "test_x", "test_y")}
    files = [f"--{k.replace('_', '-')}" for k, v in given.items() if v]
    if not (given["data"] or given["train_x"] or given["train_y"]):
        # what applies to the user's files only would be silently ignored: refused
        for option, value in (
            ("--label-column", args.label_column),
            ("--csv-header", None if args.csv_header == "auto" else args.csv_header),
            ("--validation", args.validation),
            *((name, True) for name in files),  # --test-x without --train-x
        ):
            if value is not None:
                raise ValueError(
                    f"{option} applies to your own data (--data, or --train-x and "
                    f"--train-y) only, but the run trains on the named data set --dataset "
                    f"{cfg.dataset}"
                    + (", which has its own test set" if option == "--validation" else "")
                )
        return None
    if "dataset" in given_options(args):
        raise ValueError(
            f"--dataset {cfg.dataset} and {files[0]} both name the training data: give one"
        )
    if given["data"] and (given["train_x"] or given["train_y"]):
        raise ValueError("give either --data or --train-x/--train-y, not both")
    # no output may overwrite a data file (checked before anything is read or written)
    check_paths(cfg, {"--" + k.replace("_", "-"): v for k, v in given.items() if v})
    csv = dict(
        label_column=args.label_column,
        header={"auto": None, "yes": True, "no": False}[args.csv_header],
        dtype=storage_dtype(cfg.dtype),
        validation=args.validation,
    )
    if given["data"]:
        if given["test_x"] or given["test_y"]:
            raise ValueError("--test-x/--test-y go with --train-x/--train-y, not with --data")
        return data.from_files(given["data"], **csv)
    if not (given["train_x"] and given["train_y"]):
        raise ValueError("--train-x and --train-y go together")
    if bool(given["test_x"]) != bool(given["test_y"]):
        raise ValueError("--test-x and --test-y go together")
    return data.from_files(
        given["train_x"],
        given["train_y"],
        x_test_path=given["test_x"],
        y_test_path=given["test_y"],
        **csv,
    )
