"""SIGTERM and SIGHUP (kill, a scheduler's stop or time limit, timeout(1), a closed terminal)
raised as ``Terminated``, a KeyboardInterrupt, where Ctrl-C's comes: whatever stops a run on
Ctrl-C (the workers aborted and joined, a checkpoint's temporary removed, an MPI job passed
the signal) runs for them too, and the exit status is 128 + the signal's number. By default
the process died at once and left those behind."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """A stop signal, raised in the main thread: ``signum`` and its ``name``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.name = signum, signal.Signals(signum).name


def _raise_terminated(signum, frame):
    # once: a second signal while the workers are being stopped would break that off
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    raise Terminated(signum)


@contextmanager
def stop_signals_raise():
    """Within it, the stop signals raise Terminated in the main thread; only where a signal
    would kill the process (SIG_DFL): not under nohup (SIGHUP ignored), nor over a handler of
    a program that runs us in-process, nor over an enclosing one of ours. Restored after."""
    held = {}
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            if signal.getsignal(s) is signal.SIG_DFL:
                held[s] = signal.signal(s, _raise_terminated)
    try:
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)
