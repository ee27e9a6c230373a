"""What a running benchmark tells its views (the terminal, the dashboard, the run log), in order: what it will
measure, then per trial: started, its steps (a training StepRecord or a prediction run), finished and the time the
rest takes; then the benchmark finished."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kronos_tune.benchmark.results import BenchmarkReport, TrialResult, TrialSpec


@dataclass(frozen=True)
class BenchmarkStarting:
    """Before the first trial: the trials likely to run (`planned` in all, `resumed` finished before), on which
    device, and the seconds of measuring their budgets add up to (start-up and warm-up come on top).
    `device_note`: the preset's device is not on this machine; `time_cap_s`: the run starts no trial after it."""

    preset: str
    task: str
    trials: tuple[str, ...]
    planned: int
    resumed: int
    device_line: str
    device_note: str | None
    budget_bytes: int
    measuring_s: float
    time_cap_s: float | None
    out_dir: str
    plan_command: str  # kronos-tune plan for the preset: what fits on its own device


@dataclass(frozen=True)
class TimeEstimate:
    """After a trial: the trials likely still to run and the seconds they take at the mean wall time of the
    trials this invocation measured (None: none measured yet); `cap_left_s`: what is left of the time cap."""

    trials_left: int
    seconds: float | None
    cap_left_s: float | None


@dataclass(frozen=True)
class TrialStarted:
    spec: TrialSpec
    index: int
    total: int


@dataclass(frozen=True)
class TrialStep:
    trial_name: str
    record: Any  # kronos_core.train.StepRecord (train) or PredictStep (predict)


@dataclass(frozen=True)
class TrialFinished:
    result: TrialResult


@dataclass(frozen=True)
class BenchmarkFinished:
    report: BenchmarkReport


@dataclass(frozen=True)
class PredictStep:
    """Progress of a predict trial: one prediction run (``step`` of ``total``, counting the metered
    warm-up run first, as the trial's warmup_steps + measured_steps do), shaped like a StepRecord.

    ``tokens`` are generated tokens (series x sample paths x pred_len); ``loss`` is NaN (no loss here).
    """

    step: int
    total: int
    series: int
    tokens: int
    step_time_s: float
    timed: bool = True  # False for the metered warm-up run
    loss: float = float("nan")

    @property
    def series_per_s(self) -> float:
        return self.series / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0
