"""How long the rest of a job takes, from the rate measured in this invocation: one arithmetic for every
estimate a command prints (the benchmark's trials, predict's and backtest's chunks, a resumed run's note and
its bar), so that two figures of one run never disagree.

Work finished before a resume is never counted as measured: its time is not in this invocation's clock.
The first estimate is kept, so that the end of a run can say how far off it was ("first estimate 5.0 min,
actual 6.1 min")."""

from __future__ import annotations

import time
from collections.abc import Callable

from kronos_core.units import format_duration


def seconds_left(done: float, elapsed_s: float, left: float) -> float | None:
    """Seconds for `left` more units at the rate of `done` units in `elapsed_s` seconds (None: no rate yet)."""
    if done <= 0 or elapsed_s <= 0:
        return None
    return max(left, 0.0) * elapsed_s / done


def seconds_left_by_budget(done: int, elapsed_s: float, done_budget_s: float,
                           left_budgets_s: list[float]) -> float | None:
    """Seconds for units of unequal length: each unit left takes its own budget plus the overhead the `done`
    units took beyond theirs (start-up, warm-up), `(elapsed_s - done_budget_s) / done`. With no budgets
    (units measured by count) this is `seconds_left`'s mean rate."""
    if done <= 0 or elapsed_s <= 0:
        return None
    overhead = max(0.0, elapsed_s - done_budget_s) / done
    return sum(left_budgets_s) + overhead * len(left_budgets_s)


class TimeLeft:
    """A job's estimate on a clock of its own (time.monotonic by default; tests give a fake one): `start`
    when this invocation's work begins, then `update(done, left)` with the units this invocation finished and
    those still to do. `first_total_s`: the whole invocation's length as the first estimate saw it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.first_total_s: float | None = None

    def start(self) -> None:
        self.started = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def update(self, done: float, left: float) -> float | None:
        """Seconds for `left` more units at the rate of `done` units since start."""
        return self.expect(seconds_left(done, self.elapsed(), left))

    def expect(self, figure: float | None) -> float | None:
        """`figure` seconds left, from a rate measured elsewhere (a pipeline's own clock): kept as the first
        estimate when it is one."""
        if figure is not None and self.first_total_s is None:
            self.first_total_s = self.elapsed() + figure
        return figure

    def first_vs_actual(self, actual_s: float | None = None) -> str | None:
        """'first estimate X, actual Y (+Z%)' once an estimate was made; `actual_s` defaults to the time since
        start."""
        if self.first_total_s is None:
            return None
        actual = self.elapsed() if actual_s is None else actual_s
        change = f" ({100 * (actual / self.first_total_s - 1):+.0f}%)" if self.first_total_s > 0 else ""
        return f"first estimate {format_duration(self.first_total_s)}, actual {format_duration(actual)}{change}"
