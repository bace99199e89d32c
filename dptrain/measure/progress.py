"""Progress for sweeps and long runs, drawn by tqdm (``tqdm.auto``: a widget in Jupyter and
Colab, one rewritten line in a terminal): ``Progress`` over a sweep's runs, ``StepBar`` over
a run's steps; and durations for people.

Where the output is not a terminal (a log file, a pipe, Slurm's output file holding stdout
and stderr together) nothing is rewritten in place: a sweep writes one whole line per run,
and a run's step bar is not drawn at all (its epoch lines say the same), so no ``\r``
and bar ends up glued to the line after it."""

from __future__ import annotations

import sys
import threading


def format_seconds(s: float) -> str:
    """A duration for people: "42 s", "3 min 05 s", "1 h 02 min"."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def live_bar(stream) -> bool:
    """Whether a bar redrawn in place shows as one: a widget (tqdm.auto's own choice, in
    Jupyter and Colab, whose stderr is no terminal) or a terminal. Not a file or a pipe."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return False
    if any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


class _Discard:
    """A file that keeps nothing: a bar that is read as text (str(bar)), never drawn."""

    def write(self, text):
        return len(text)

    def flush(self):
        pass


class Progress:
    """``with Progress(total, "sweep") as bar: ... bar.update("label")``: done/total, the
    elapsed time, the ETA (tqdm's) and the last item's label; nothing when quiet. stream:
    where the bar goes (default stderr); where it is not a terminal, one line per update."""

    def __init__(self, total: int, title: str = "", quiet: bool = False, stream=None):
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total, self.title, self.quiet = total, title, quiet
        self._bar = None
        self._lines = None  # the stream that gets one line per update, where not live
        if not quiet:
            from tqdm.auto import tqdm

            stream = stream if stream is not None else sys.stderr
            if not live_bar(stream):
                self._lines = stream
            self._bar = tqdm(
                total=total,
                desc=title or None,
                unit="run",
                file=_Discard() if self._lines is not None else stream,
                dynamic_ncols=self._lines is None,
                mininterval=0.0,
            )

    @property
    def done(self) -> int:
        """Items done so far."""
        return self._bar.n if self._bar is not None else 0

    def update(self, label: str = "", n: int = 1) -> None:
        """n more items done; shows label beside the bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(n)
            if self._lines is not None:
                print(self._bar, file=self._lines, flush=True)

    def close(self) -> None:
        """Draws the bar a last time and lets go of its line."""
        if self._bar is not None:
            self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class StepBar:
    """A live bar over a run's steps (tqdm.auto: a terminal line, or a widget in Jupyter and
    Colab), drawn in the launching process from rank 0's progress slot (steps done, steps in
    all: ``Communicator.progress``, shared memory when the workers are processes), polled
    every 0.2 s once ``watch`` is given the slot (``launch``'s watch). Where stderr is not
    a terminal (or a notebook's widget) there is no bar: ``above`` only says the line."""

    def __init__(self):
        self.bar = None
        self.done = threading.Event()
        self.thread = None
        if not live_bar(sys.stderr):
            return
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=None,
            desc="training",
            unit="step",
            leave=False,
            dynamic_ncols=True,
            file=sys.stderr,
        )

    def above(self, say, line: str) -> None:
        """say(line) with the bar cleared first and drawn again after, so that the line
        (an epoch's, printed while the run goes on) is not written into the bar's."""
        if self.bar is None:
            say(line)
            return
        with self.bar.external_write_mode(file=sys.stderr):
            say(line)

    def watch(self, slot) -> None:
        """Draws from `slot` from now on (again: an elastic run's workers after a recovery)."""
        self.slot = slot
        if self.bar is None or self.thread is not None:
            return

        def loop():
            while not self.done.wait(0.2):
                self._draw(self.slot)
            self._draw(self.slot)

        self.thread = threading.Thread(target=loop, daemon=True, name="dptrain-progress")
        self.thread.start()

    def _draw(self, slot):
        step, total = int(slot[0]), int(slot[1])
        if total and self.bar.total != total:
            self.bar.total = total
            self.bar.refresh()
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(1.0)
        if self.bar is not None:
            self.bar.close()
