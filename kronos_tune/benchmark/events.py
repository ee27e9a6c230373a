"""What a running benchmark tells its views (the terminal, the dashboard, the run log), in order: a trial
started, one of its steps (a training StepRecord or a prediction run), a trial finished, the benchmark finished."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kronos_tune.benchmark.results import BenchmarkReport, TrialResult, TrialSpec


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
