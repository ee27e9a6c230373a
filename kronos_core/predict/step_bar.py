"""The progress bar of the Python API's `verbose=True`: autoregressive steps done of the total, the rate and the
time left, redrawn in place on stderr (the reference draws one with tqdm; this needs no dependency).

ASCII only, so a stream whose encoding is not UTF-8 cannot fail a prediction; redrawn at most every
REDRAW_S seconds, so a captured or logged stderr stays a few lines long, and always at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO

from kronos_core.units import format_duration

REDRAW_S = 0.1
WIDTH = 24


class StepBar:
    def __init__(self, total: int, label: str = "predict", stream: IO[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(0, total)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.done = 0
        self.started = clock()
        self.drawn_at: float | None = None
        self.drawn_done = -1
        self.closed = False

    def line(self, now: float) -> str:
        filled = WIDTH * self.done // self.total if self.total else WIDTH
        elapsed = now - self.started
        rate = self.done / elapsed if self.done and elapsed > 0 else None
        speed = f"{rate:.1f} steps/s" if rate is not None else "- steps/s"
        left = format_duration((self.total - self.done) / rate) if rate is not None else "-"
        return (f"{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} steps, "
                f"{speed}, {left} left, {format_duration(elapsed)} elapsed")

    def advance(self, steps: int = 1) -> None:
        self.done = min(self.total, self.done + steps)
        now = self.clock()
        if self.done == self.total or self.drawn_at is None or now - self.drawn_at >= REDRAW_S:
            self._draw(now)

    def close(self) -> None:
        """The last state, then the line ended (also after an error, so the terminal is not left mid-line)."""
        if self.closed:
            return
        self.closed = True
        if self.drawn_done != self.done:
            self._draw(self.clock())
        self.stream.write("\n")
        self.stream.flush()

    def _draw(self, now: float) -> None:
        self.drawn_at, self.drawn_done = now, self.done
        self.stream.write(f"\r{self.line(now)}")
        self.stream.flush()


__all__ = ["REDRAW_S", "StepBar"]
