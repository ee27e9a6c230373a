"""Plain progress lines for output that is not a terminal.

A Rich bar on a console that is not a terminal (``kronos-tune backtest ... | tee log``, a batch job's log
file) draws nothing until it stops, so a long run looks hung. While a bar runs on such a console, a thread
prints one plain line on stderr every KRONOS_TUNE_PROGRESS_EVERY seconds (default 30; 0 turns them off) for
each visible task of the bar: what is done of the total, the rate and the time left (a task's own `left_s` and
`rate_per_s` fields where the command keeps them, from kronos_tune.time_left; else Rich's).

    backtest float32: 120/480 symbol-origins (25%), 3.21/s, 1.9 min left, 38.0 s elapsed
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

from rich.text import Text

from kronos_core.units import format_duration

PROGRESS_EVERY_ENV = "KRONOS_TUNE_PROGRESS_EVERY"
DEFAULT_EVERY_S = 30.0


def progress_every_s() -> float | None:
    """Seconds between lines from $KRONOS_TUNE_PROGRESS_EVERY (default 30); None: off (0, or not a number)."""
    text = os.environ.get(PROGRESS_EVERY_ENV, "").strip()
    try:
        every = float(text) if text else DEFAULT_EVERY_S
    except ValueError:
        return DEFAULT_EVERY_S
    return every if every > 0 else None


def task_line(label: str, task: Any, unit: str = "") -> str:
    """One Rich task as a plain line: done/total (share), rate, time left, elapsed."""
    description = Text.from_markup(str(task.description)).plain.strip()
    head = f"{label} {description}".strip()
    done = task.completed
    count = f"{done:,.0f}" + (f"/{task.total:,.0f}" if task.total else "") + (f" {unit}" if unit else "")
    if task.total:
        count += f" ({100 * done / task.total:.0f}%)"
    elapsed = task.elapsed or 0.0
    if "left_s" in task.fields:  # the command's own estimate (time_left.py): this invocation's work only
        rate, left = task.fields.get("rate_per_s"), task.fields["left_s"]
    else:
        rate = task.speed if task.speed else (done / elapsed if elapsed > 0 and done > 0 else None)
        left = task.time_remaining
        if left is None and rate and task.total:
            left = max(task.total - done, 0) / rate
    parts = [count, "-/s" if rate is None else f"{rate:,.2f}/s" if rate < 100 else f"{rate:,.0f}/s"]
    if left is not None:
        parts.append(f"{format_duration(left)} left")
    parts.append(f"{format_duration(elapsed)} elapsed")
    return f"{head}: " + ", ".join(parts)


class ProgressLines:
    """While started, a line per visible task of `progress` (a Rich Progress) every `every` seconds on
    `stream` (stderr by default); `label` starts each line (the command)."""

    def __init__(self, progress: Any, label: str, unit: str = "", every: float | None = None,
                 stream: TextIO | None = None) -> None:
        self.progress, self.label, self.unit = progress, label, unit
        self.every = every
        self.stream = stream
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.every is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="progress-lines", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        assert self.every is not None
        next_at = time.monotonic() + self.every
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.every
            stream = self.stream or sys.stderr
            for task in self.progress.tasks:
                if task.visible and task.started and not task.finished:
                    print(task_line(self.label, task, self.unit), file=stream, flush=True)


def lines_when_piped(progress: Any, label: str, unit: str = "") -> ProgressLines:
    """ProgressLines for `progress` when its console is not a terminal; off (never prints) when it is."""
    every = None if progress.console.is_terminal else progress_every_s()
    return ProgressLines(progress, label, unit, every)
