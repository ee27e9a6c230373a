"""What a running benchmark tells its views (the terminal, the dashboard, the run log), in order: what it will
measure, then per trial: started, its steps (a training StepRecord or a prediction run), finished and the time the
rest takes; then the benchmark finished; and the run log's view of them, the per-trial curves (`TrialCurves`, on
kronos_tune.run_logs' RunLog)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_tune.benchmark.results import BenchmarkReport, TrialResult, TrialSpec
from kronos_tune.run_logs import CURVES_DIR, TENSORBOARD_DIR, RunLog


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
    measuring_s: float  # 0: the trials measure counts of runs, not times
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


def safe_name(name: str) -> str:
    """A trial name as a file name (letters, digits, - _ . kept)."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip(".")
    return cleaned or "trial"


class TrialCurves:
    """Per-trial curves of a benchmark run, fed with the benchmark's events (TrialStarted/Step/Finished):
    OUT/curves/<trial>.jsonl and, with `tensorboard`, OUT/tensorboard/<trial>/. A trial run again (after a
    cancel and --resume) starts its curve over, as its result replaces the cancelled one."""

    def __init__(self, out_dir: Path, tensorboard: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.tensorboard = tensorboard
        self.logs: dict[str, RunLog] = {}

    def on_event(self, event: Any) -> None:
        if isinstance(event, TrialStarted):
            self._close(event.spec.name)
            name = safe_name(event.spec.name)
            board = self.out_dir / TENSORBOARD_DIR / name if self.tensorboard else None
            self.logs[event.spec.name] = RunLog(self.out_dir / CURVES_DIR / f"{name}.jsonl", board, mode="w")
        elif isinstance(event, TrialStep):
            log = self.logs.get(event.trial_name)
            if log is not None:
                record = event.record
                if hasattr(record, "to_dict"):  # a training StepRecord
                    values = record.to_dict()
                else:  # a predict trial's PredictStep: no loss, time and tokens per run
                    values = dataclasses.asdict(record)
                    values["tokens_per_s"] = values["tokens"] / values["step_time_s"] if values["step_time_s"] else 0.0
                log.step(values)
        elif isinstance(event, TrialFinished):
            result = event.result
            log = self.logs.get(result.name)
            if log is not None and result.val_loss is not None and result.val_loss_step is not None:
                log.eval({"step": result.val_loss_step, "val_loss": result.val_loss})
            self._close(result.name)

    def _close(self, name: str) -> None:
        log = self.logs.pop(name, None)
        if log is not None:
            log.close()

    def close(self) -> None:
        for name in list(self.logs):
            self._close(name)
