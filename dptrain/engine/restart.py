"""Elastic training under MPI without fault-tolerant MPI: ``python -m dptrain elastic --
mpiexec -n N python -m dptrain train ...`` runs the job, and when it fails (a rank raised,
was killed or missed ``--timeout``: MPI ends the whole job) runs it again on fewer ranks from
its last checkpoint, until it ends well or fewer than ``--min-workers`` ranks would be left.

MPI drops a rank from a running job only where the library is fault tolerant (ULFM: Open
MPI 5 under ``mpiexec --with-ft ulfm``, where ``train --elastic`` goes on in the job itself,
see ``comm.ulfm``); elsewhere (MPICH's Hydra kills every rank with the first) the job is
restarted: every ``--every`` steps the ranks commit the run to a checkpoint (the train
command's own ``--checkpoint``, else one in a temporary directory, removed at the end), and a
restart resumes from it (``--resume``): at most ``--every`` steps are redone. With
``--deterministic`` the result is the same bits as a job that lost no one (its checkpoints
and resumes are exact, and its sums do not depend on the number of ranks: 4 ranks go on as
3). An injected fault (``--inject-fault``) happens once: the restarts leave it out.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile

from .._signals import Terminated, stop_signals_raise
from ..sampler import CHUNKS

LAUNCHERS = ("mpiexec", "mpirun", "mpiexec.hydra", "mpiexec.mpich", "mpiexec.openmpi")
SIZE_FLAGS = ("-n", "-np", "--np", "-c")


def split_command(command: list[str]) -> tuple[list[str], int, int, list[str]]:
    """(the launcher's part, the index of its rank count in it, the rank count, the train
    command after it) of ``mpiexec -n N python -m dptrain train ...``; ValueError naming
    what is missing."""
    if not command or os.path.basename(command[0]) not in LAUNCHERS:
        raise ValueError(
            f"elastic supervises an MPI job: give the command after --, starting with "
            f"mpiexec or mpirun (e.g. -- mpiexec -n 4 python -m dptrain train ...), got "
            f"{' '.join(command[:3]) or 'nothing'}"
        )
    size_at = next((i + 1 for i, a in enumerate(command) if a in SIZE_FLAGS), None)
    if size_at is None or size_at >= len(command) or not command[size_at].isdigit():
        raise ValueError(
            f"elastic needs the job's rank count as {command[0]} -n N (to restart it on fewer "
            f"ranks): not found in {' '.join(command)}"
        )
    train_at = next(
        (
            i + 1
            for i, a in enumerate(command)
            if os.path.basename(a).startswith("dptrain") and command[i + 1 : i + 2] == ["train"]
        ),
        None,
    )
    if train_at is None:
        raise ValueError(
            "elastic restarts `python -m dptrain train ...` under the MPI launcher: no "
            "dptrain train in the command"
        )
    return command[: train_at + 1], size_at, int(command[size_at]), command[train_at + 1 :]


def _option(args: list[str], name: str) -> str | None:
    """The value of --name VALUE or --name=VALUE in args (the last one given), or None."""
    value = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def _without(args: list[str], name: str, takes_value: bool = True) -> list[str]:
    """args without --name [VALUE] and --name=VALUE."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == name:
            skip = takes_value
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def next_size(size: int, deterministic: bool) -> int:
    """The rank count a job of `size` ranks goes on with after losing one: size - 1, and in
    deterministic mode no more than CHUNKS (the most ranks it runs on)."""
    return min(size - 1, CHUNKS) if deterministic else size - 1


def supervise(command: list[str], *, min_workers: int = 1, every: int = 50, log=print) -> int:
    """Runs the MPI job `command` until it ends well, restarting it on fewer ranks from its
    last checkpoint after each failure (see the module docstring); returns the exit code
    (the job's last one; 130 after Ctrl-C)."""
    launcher, size_at, size, train = split_command(command)
    if min_workers < 1:
        raise ValueError(f"min_workers must be >= 1, got {min_workers}")
    if every < 1:
        raise ValueError(f"every must be >= 1 (steps between checkpoints), got {every}")
    if min_workers > size:
        raise ValueError(f"min_workers={min_workers} is more than the job's {size} ranks")
    if _option(train, "--resume") is not None:
        raise ValueError("elastic adds --resume itself: leave it out (its checkpoint is resumed)")
    deterministic = "--deterministic" in train
    scratch = None
    checkpoint = _option(train, "--checkpoint")
    if checkpoint is None:
        scratch = tempfile.mkdtemp(prefix="dptrain-elastic-")
        checkpoint = os.path.join(scratch, "checkpoint.npz")
        train = [*train, "--checkpoint", checkpoint]
    if _option(train, "--checkpoint-every") is None:
        train = [*train, "--checkpoint-every", str(every)]
    attempt = 0
    try:
        while True:
            args = list(train)
            if attempt:  # an injected fault happens once; the restart resumes the commit
                # (under MPI the workers are the ranks: a --workers N of the first attempt
                # would refuse the smaller job)
                args = _without(_without(args, "--inject-fault"), "--workers")
                if os.path.exists(checkpoint):
                    args += ["--resume", checkpoint]
            job = list(launcher)
            job[size_at] = str(size)
            try:
                rc = _run(job + args)
            except Terminated as stop:
                log(f"dptrain elastic: {stop.name}: the job was stopped, not restarted")
                return 128 + stop.signum
            if rc in (0, 130):
                return rc
            attempt += 1
            left = next_size(size, deterministic)
            where = _position(checkpoint)
            if left < min_workers:
                log(
                    f"dptrain elastic: the job on {size} ranks failed (exit {rc}); going on "
                    f"would leave {left} ranks, fewer than --min-workers {min_workers}"
                )
                return rc
            log(
                f"dptrain elastic: the job on {size} ranks failed (exit {rc}): restarting it "
                f"on {left} ranks from {where}"
            )
            size = left
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _run(command: list[str]) -> int:
    """Runs one attempt, its output going where ours goes. Ctrl-C ends the supervision with
    130, SIGTERM and SIGHUP with Terminated: each is passed on to the job (Ctrl-C at a
    terminal reaches the job's ranks anyway, in the same process group; sent to the
    supervisor alone it did not, nor did a SIGTERM, which left the job running with no one
    to wait for it)."""
    proc = subprocess.Popen(command)
    with stop_signals_raise():  # (the command line's, where it runs us)
        try:
            rc = proc.wait()
        except Terminated as stop:
            _stop(proc, stop.signum)
            raise
        except KeyboardInterrupt:
            _stop(proc, signal.SIGINT)
            return 130
    return 130 if rc == -signal.SIGINT else rc


def _stop(proc: subprocess.Popen, signum: int) -> None:
    """The signal passed on to the job's launcher (which passes it to the ranks), 10 s for
    the job to end, then SIGKILL."""
    try:
        proc.send_signal(signum)
    except ProcessLookupError:
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _position(checkpoint: str) -> str:
    """Where a restart resumes: the checkpoint's step, or the start when there is none."""
    if not os.path.exists(checkpoint):
        return "the start (no checkpoint yet)"
    import numpy as np

    try:
        with np.load(checkpoint) as f:
            position = json.loads(str(f["position"]))
        return f"step {position['step']} (the checkpoint {checkpoint})"
    except (OSError, KeyError, ValueError) as exc:
        return f"the checkpoint {checkpoint} ({exc})"
