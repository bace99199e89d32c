"""Progress for sweeps and long runs, drawn by tqdm (``tqdm.auto``: a widget in Jupyter and
Colab, one rewritten line in a terminal, lines in a log), and durations for people."""
from __future__ import annotations

import sys


def format_seconds(s: float) -> str:
    """A duration for people: "42 s", "3 min 05 s", "1 h 02 min"."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


class Progress:
    """``with Progress(total, "sweep") as bar: ... bar.update("label")``: done/total, the
    elapsed time, the ETA (tqdm's) and the last item's label; nothing when quiet. stream:
    where a text bar goes (default stderr)."""

    def __init__(self, total: int, title: str = "", quiet: bool = False, stream=None):
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total, self.title, self.quiet = total, title, quiet
        self._bar = None
        if not quiet:
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total, desc=title or None, unit="run",
                             file=stream if stream is not None else sys.stderr,
                             dynamic_ncols=True, mininterval=0.0)

    @property
    def done(self) -> int:
        """Items done so far."""
        return self._bar.n if self._bar is not None else 0

    def update(self, label: str = "", n: int = 1) -> None:
        """n more items done; shows label beside the bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        """Draws the bar a last time and lets go of its line."""
        if self._bar is not None:
            self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
