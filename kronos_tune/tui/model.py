"""What the dashboard shows, kept apart from how: telemetry history, the run in progress, finished trials, and
the benchmark's answer (`Answer`: what to run, why, the command and the fastest trial, built from a
BenchmarkReport's `recommended` and the finished trials).

Plain Python (no Textual): the app feeds it snapshots and events, the widgets
read it. Nothing here measures or decides anything about a run; it only
remembers what the sampler, the benchmark and the trainer reported.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kronos_tune.telemetry.sampler import Snapshot
from kronos_tune.tui.format import duration, rate, ratio

HISTORY_LENGTH = 240


def _number(value: float | int | None) -> float:
    return math.nan if value is None else float(value)


class TelemetryHistory:
    """The last `length` readings of every plotted series, keyed `ram`, `cpu`, `rss`, `gpu0.memory`..."""

    def __init__(self, length: int = HISTORY_LENGTH) -> None:
        self.length = length
        self._series: dict[str, deque[float]] = {}
        self.latest: Snapshot | None = None

    def _push(self, key: str, value: float | int | None) -> None:
        self._series.setdefault(key, deque(maxlen=self.length)).append(_number(value))

    def add(self, snapshot: Snapshot) -> None:
        host = snapshot.host
        memory = ratio(host.ram_used_bytes, host.ram_total_bytes)
        self._push("ram", None if memory is None else 100.0 * memory)
        self._push("cpu", host.cpu_percent_total)
        self._push("rss", host.process_tree_rss_bytes)
        for gpu in snapshot.gpus:
            used = ratio(gpu.memory_used_bytes, gpu.memory_total_bytes)
            self._push(f"gpu{gpu.index}.memory", None if used is None else 100.0 * used)
            self._push(f"gpu{gpu.index}.util", gpu.utilization_pct)
            self._push(f"gpu{gpu.index}.power", gpu.power_w)
        self.latest = snapshot

    def series(self, key: str) -> list[float]:
        return list(self._series.get(key, ()))


@dataclass
class RunState:
    """The job in progress (or the last one): which, how far, and its live step series."""

    job: str | None = None  # "benchmark train", "benchmark predict", "autobatch", "training"
    phase: str = "idle"  # idle, running, cancelling, done, cancelled, failed
    outcome: str = ""  # one line about how the last job ended
    trial: str | None = None
    trial_index: int = 0  # 1-based
    trial_total: int = 0
    step: int = 0
    steps_target: int | None = None
    steps_open: bool = False  # steps_target is a floor (a benchmark trial measures until its timing settles)
    note: str = ""  # what the job is doing between steps (an autobatch probe, a predict run...)
    step_label: str = "step"  # "run" for prediction trials
    speed_unit: str = "tokens/s"  # "series/s" for prediction trials
    loss: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_LENGTH))
    step_time_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_LENGTH))
    tokens_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_LENGTH))

    @property
    def busy(self) -> bool:
        return self.phase in ("running", "cancelling")

    def begin(self, job: str) -> None:
        self.job, self.phase, self.outcome, self.note = job, "running", "", ""
        self.trial, self.trial_index, self.trial_total = None, 0, 0
        predicting = job == "benchmark predict"
        self.step_label, self.speed_unit = ("run", "series/s") if predicting else ("step", "tokens/s")
        self._reset_steps(None)

    def _reset_steps(self, target: int | None, open_count: bool = False) -> None:
        self.step, self.steps_target, self.steps_open = 0, target, open_count
        self.loss.clear()
        self.step_time_s.clear()
        self.tokens_per_s.clear()

    def begin_trial(self, name: str, index: int, total: int, steps_target: int | None = None,
                    open_count: bool = False) -> None:
        """`open_count`: the trial runs at least `steps_target` steps, its real count is not known ahead."""
        self.trial, self.trial_index, self.trial_total, self.note = name, index, total, ""
        self._reset_steps(steps_target, open_count)

    def end_trial(self) -> None:
        """The trial's step line goes (its result is in the table); the next trial starts its own."""
        self._reset_steps(None)

    @property
    def count_known(self) -> bool:
        """Whether a bar can show the steps: a real total, not yet passed."""
        return bool(self.steps_target) and not self.steps_open and self.step <= (self.steps_target or 0)

    def add_step(self, step: int, loss: float, step_time_s: float, tokens_per_s: float) -> None:
        self.step = step
        self.loss.append(loss)
        self.step_time_s.append(step_time_s)
        self.tokens_per_s.append(tokens_per_s)

    def cancelling(self) -> None:
        if self.busy:
            self.phase = "cancelling"

    def end(self, phase: str, outcome: str) -> None:
        """The job's end; a benchmark's last trial and its steps no longer show (the outcome says it all)."""
        self.phase, self.outcome = phase, outcome
        if self.trial is not None:
            self.trial, self.note = None, ""
            self._reset_steps(None)


@dataclass(frozen=True)
class Column:
    """One results-table column: its key, header, and how to sort by it (None values sort last)."""

    key: str
    label: str
    sort_value: Callable[..., Any]
    by_shown_figure: bool = False  # sort_value(result, baseline): the estimate (benchmark.report.shown)


class ResultsModel:
    """Finished trials in arrival order, shown sorted by one column (arrival order when none)."""

    def __init__(self, columns: Sequence[Column]) -> None:
        self.columns = {column.key: column for column in columns}
        self.results: list[Any] = []
        self.sort_key: str | None = None
        self.reverse = False

    def add(self, result: Any) -> None:
        """A finished trial; a second result with the same name replaces the first (a resumed run)."""
        self.results = [r for r in self.results if r.name != result.name]
        self.results.append(result)

    def sort_by(self, key: str | None) -> None:
        """Sort by `key`; asking for the current key again flips the order; None restores arrival order."""
        if key is not None and key not in self.columns:
            raise KeyError(key)
        if key == self.sort_key and key is not None:
            self.reverse = not self.reverse
        else:
            self.sort_key, self.reverse = key, False

    def cycle_sort(self) -> None:
        """The next column (after the last one: arrival order)."""
        keys = list(self.columns)
        if self.sort_key is None:
            self.sort_by(keys[0])
        else:
            index = keys.index(self.sort_key) + 1
            self.sort_key, self.reverse = (keys[index] if index < len(keys) else None), False

    def rows(self) -> list[Any]:
        """The trials in display order; the ones without a value in the sort column go last."""
        if self.sort_key is None:
            return list(reversed(self.results)) if self.reverse else list(self.results)
        column = self.columns[self.sort_key]
        if column.by_shown_figure:  # the figure shown: the compared estimate, which needs the baseline
            from kronos_tune.benchmark.report.shown import baseline_of

            baseline = baseline_of(self.results)
            value: Callable[[Any], Any] = lambda r: column.sort_value(r, baseline)  # noqa: E731
        else:
            value = column.sort_value
        known = [r for r in self.results if value(r) is not None]
        unknown = [r for r in self.results if value(r) is None]
        known.sort(key=value, reverse=self.reverse)
        return known + unknown


def best_trial(results: Sequence[Any], task: str) -> Any | None:
    """The fastest trial that ran ok and kept the quality guard, by the one estimate every view shows
    (kronos_tune.benchmark.report.shown: the compared ratio x the baseline's median where there is one);
    None before any such trial."""
    from kronos_tune.benchmark.report.shown import fastest

    return fastest(list(results), task)


@dataclass
class Answer:
    preset: str
    task: str
    folder: str | None
    recommended: str | None  # the trial whose config is recommended
    changes: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    command: str | None = None
    best: str | None = None  # the fastest trial that ran ok and kept the quality guard
    best_figure: str = ""
    partial: bool = False
    missing: list[str] = field(default_factory=list)
    newer_partial: str | None = None  # a later, partial run's folder: this answer comes from an earlier one
    headroom: dict[str, Any] | None = None  # BenchmarkReport.headroom: peak vs budget, the batch that would fit
    resolution: str | None = None  # "changes under 3.8% could not be told from noise in this run (...)"
    own_evidence: str | None = None  # the verdicts called on their own interval, not on the resolution above

    def changes_text(self) -> str:
        return ", ".join(f"{key} = {value}" for key, value in self.changes.items()) or "the baseline config"


def _figure(result: Any, trials: list[Any], task: str) -> str:
    """The fastest trial's figure, as its row shows it (the compared estimate)."""
    from kronos_tune.benchmark.report.shown import baseline_of, shown_time
    from kronos_tune.benchmark.tasks import get

    if result is None:
        return ""
    chosen = get(task)
    shown = shown_time(result, baseline_of(trials), task)
    return f"{(rate if chosen.time_is_rate else duration)(shown)} {chosen.time_text}"


def answer_from(report: Any) -> Answer:
    """The answer of a finished (or cancelled) benchmark run."""
    from kronos_tune.benchmark.report.files import evidence_line, resolution_line

    rec = report.recommended
    best = best_trial(report.trials, report.task)
    missing = list((rec.missing if rec is not None else None) or getattr(report, "missing", []) or [])
    partial = rec.partial if rec is not None else bool(getattr(report, "partial", False) or report.cancelled)
    return Answer(preset=report.preset, task=report.task, folder=report.out_dir,
                  recommended=rec.source if rec is not None else None,
                  changes=dict(rec.changes) if rec is not None else {},
                  reason=rec.reason if rec is not None else "", command=rec.command if rec is not None else None,
                  best=best.name if best is not None else None, best_figure=_figure(best, report.trials, report.task),
                  partial=partial, missing=missing, headroom=getattr(report, "headroom", None),
                  resolution=resolution_line(report) if getattr(report, "timing", None) else None,
                  own_evidence=evidence_line(report, own_only=True) if getattr(report, "timing", None) else None)


def is_complete(report: Any) -> bool:
    return not (getattr(report, "partial", False) or report.cancelled)
