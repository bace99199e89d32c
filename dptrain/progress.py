"""A progress bar with an ETA for sweeps and long runs: a live bar in a notebook (one output
that updates in place), a single rewritten line in a terminal, a line per update in a log
(stderr not a terminal), nothing when quiet."""
from __future__ import annotations

import sys
import time


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except AttributeError:
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def format_seconds(s: float) -> str:
    """A duration for people: "42 s", "3 min 05 s", "1 h 02 min"."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


class Progress:
    """``with Progress(total, "sweep") as bar: ... bar.update("label")``: done/total, a bar,
    elapsed time and the ETA (the mean time per item so far times the items left)."""

    WIDTH = 24

    def __init__(self, total: int, title: str = "", quiet: bool = False, stream=None):
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total, self.title, self.quiet = total, title, quiet
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.perf_counter()
        self._handle = None
        self._notebook = not quiet and stream is None and _in_notebook()
        self._tty = not self._notebook and hasattr(self.stream, "isatty") and self.stream.isatty()

    def line(self, label: str = "") -> str:
        """The bar as one line of text."""
        elapsed = time.perf_counter() - self.t0
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(self.WIDTH * frac))
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        eta = (elapsed / self.done * (self.total - self.done)) if self.done else float("nan")
        eta_s = format_seconds(eta) if self.done else "?"
        head = f"{self.title}: " if self.title else ""
        return (f"{head}[{bar}] {self.done}/{self.total}  elapsed {format_seconds(elapsed)}"
                f"  eta {eta_s}" + (f"  {label}" if label else ""))

    def update(self, label: str = "", n: int = 1) -> None:
        """n more items done; redraws the bar (with label) unless quiet."""
        self.done = min(self.total, self.done + n)
        if self.quiet:
            return
        text = self.line(label)
        if self._notebook:
            from IPython.display import display
            if self._handle is None:
                self._handle = display({"text/plain": text}, raw=True, display_id=True)
            else:
                self._handle.update({"text/plain": text}, raw=True)
        elif self._tty:
            self.stream.write("\r\x1b[2K" + text)
            self.stream.flush()
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()
        return False
