"""Step time against peak memory, one point per trial: the data behind the report's picture (pareto.png/svg,
kronos_tune.benchmark.report.picture) and the dashboard's scatter. Plain Python: nothing here draws.

Lower is better on both axes. Times are the estimate every view shows (report/shown.py: the compared
ratio x the baseline's median), not raw medians. The time axis is the time per optimizer step when every trial runs the same
batch; when batches differ (bigger-batch, autobatch, DDP) it is the time per training sample, so that the
points compare equal work. Prediction trials use the time per series. Re-measurements of the baseline
(noise-probe, baseline-repeat, drift checks) are drawn but are no configuration of their own, so they never
make the Pareto front.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kronos_tune.benchmark.train.decide import DRIFT_STAGE
from kronos_tune.benchmark.report.shown import baseline_of, fastest, shown_series_rate, shown_step_time
from kronos_tune.benchmark.results import TrialResult
from kronos_tune.benchmark.tasks import get

PICTURE_STEM = "pareto"  # pareto.png and pareto.svg in the run folder
RECOMMENDED_MARK, FASTEST_MARK = "▶", "★"  # one meaning in every view: the table, the panel, both plots


@dataclass(frozen=True)
class Point:
    name: str
    memory_bytes: float
    seconds: float
    repeat: bool = False  # the baseline measured again: shows the noise, is not a configuration


@dataclass
class Scatter:
    task: str
    unit: str  # what one `seconds` value is the time of: "step", "sample" or "series"
    axis_label: str
    points: list[Point] = field(default_factory=list)
    front: list[Point] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (trial, why it has no point)
    recommended: str | None = None  # marked ▶ in every view
    budget_bytes: int = 0
    fastest: str | None = None  # marked ★ in every view: the fastest configuration by the time shown

    def point(self, name: str) -> Point | None:
        return next((p for p in self.points if p.name == name), None)

    def marks(self, name: str) -> str:
        """The marks of a point, as the results table puts them before its name: ▶ recommended, ★ fastest."""
        return (RECOMMENDED_MARK if name == self.recommended else "") + (FASTEST_MARK if name == self.fastest else "")

    def label(self, name: str) -> str:
        """A point's name with its marks before it ("▶★ combined"): drawn as one text, a mark never sits by
        another trial's name."""
        marks = self.marks(name)
        return f"{marks} {name}" if marks else name

    def caption(self) -> str:
        """One line on what is not drawn (failed, OOM, timed out, skipped trials; several of one kind
        together), or ''."""
        if not self.left_out:
            return ""
        groups: dict[str, list[str]] = {}
        for name, why in self.left_out:
            groups.setdefault(why, []).append(name)
        parts = [f"{names[0]} ({why})" if len(names) == 1 else f"{why}: {', '.join(names)}"
                 for why, names in groups.items()]
        return "not drawn: " + "; ".join(parts)


def pareto_front(points: Iterable[Point]) -> list[Point]:
    """The points no other point beats (at most as much memory and at most as much time, less of one), by
    memory, least first. Points equal on both axes do not beat each other: all of them stay."""
    front: list[Point] = []
    best = math.inf  # the least time among the points with at most this much memory
    for point in sorted(points, key=lambda p: (p.memory_bytes, p.seconds)):
        if point.seconds < best:
            front.append(point)
            best = point.seconds
        elif point.seconds == best and front and front[-1].memory_bytes == point.memory_bytes:
            front.append(point)  # an exact tie with the last point on the front
    return front


def front_staircase(front: Sequence[Point]) -> tuple[list[float], list[float]]:
    """The front as a line (memory, seconds): with more memory the best time holds until the next point
    drops it, so the line runs right, then down."""
    xs: list[float] = []
    ys: list[float] = []
    for index, point in enumerate(front):
        if index:
            xs.append(point.memory_bytes)
            ys.append(front[index - 1].seconds)
        xs.append(point.memory_bytes)
        ys.append(point.seconds)
    return xs, ys


def _is_repeat(trial: TrialResult) -> bool:
    return trial.trial_kind.kind == "baseline-repeat" or trial.stage == DRIFT_STAGE


def _median(spread: float | None) -> float | None:
    return None if spread is None or not spread > 0 else float(spread)


def _seconds(trial: TrialResult, unit: str, baseline: TrialResult | None) -> float | None:
    """The point's time from the one estimate every view shows (kronos_tune.benchmark.report.shown)."""
    if unit == "series":
        rate = _median(shown_series_rate(trial, baseline))
        return None if rate is None else 1.0 / rate
    step = _median(shown_step_time(trial, baseline))
    if unit == "step" or step is None:
        return step
    samples_per_step = (_median(trial.samples_per_s) or 0.0) * (_median(trial.step_time_s) or 0.0)
    return step / samples_per_step if samples_per_step > 0 else None


AXIS_LABELS = {
    "step": "time per optimizer step (compared estimate)",
    "sample": "time per training sample (compared estimate; the trials' batches differ)",
    "series": "time per series (1 / compared series/s)",
}


def scatter_of(trials: Sequence[TrialResult], task: str, budget_bytes: int = 0,
               recommended: str | None = None) -> Scatter:
    """The points of the trials that ran ok with a time and a peak memory; the others listed with why."""
    drawable = [t for t in trials if t.status == "ok" and t.peak_memory_bytes]
    unit = get(task).scatter_unit(drawable)
    scatter = Scatter(task, unit, AXIS_LABELS[unit], recommended=recommended, budget_bytes=int(budget_bytes or 0))
    baseline = baseline_of(trials)
    for trial in trials:
        seconds = _seconds(trial, unit, baseline) if any(t is trial for t in drawable) else None
        if seconds is None:
            why = trial.status if trial.status != "ok" else "no time or peak memory measured"
            scatter.left_out.append((trial.name, why))
            continue
        scatter.points.append(Point(trial.name, float(trial.peak_memory_bytes or 0), seconds, _is_repeat(trial)))
    scatter.front = pareto_front(p for p in scatter.points if not p.repeat)
    best = fastest(trials, task)
    scatter.fastest = best.name if best is not None and scatter.point(best.name) is not None else None
    return scatter


def time_scale(seconds: Iterable[float]) -> tuple[float, str]:
    """(factor, unit) that puts the largest time in readable numbers: ms below a second, µs below a ms."""
    largest = max(seconds, default=0.0)
    if largest >= 1:
        return 1.0, "s"
    if largest >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def memory_scale(values: Iterable[float]) -> tuple[float, str]:
    """(divisor, unit): GiB from 1 GiB up, MiB below."""
    return (2**30, "GiB") if max(values, default=0.0) >= 2**30 else (2**20, "MiB")


BUDGET_IN_VIEW = 2.5  # the budget line is drawn when it is at most this many times the largest peak


def budget_in_view(scatter: Scatter) -> bool:
    """Whether the x axis should reach the budget: when it is far past every peak, drawing it would squeeze
    every point into the left edge; the picture then states the budget in words."""
    largest = max((p.memory_bytes for p in scatter.points), default=0.0)
    return bool(scatter.budget_bytes) and scatter.budget_bytes <= BUDGET_IN_VIEW * largest
