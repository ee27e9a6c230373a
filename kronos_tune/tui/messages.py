"""Messages that carry work results into the app; posted from the sampler and worker threads."""

from __future__ import annotations

from typing import Any

from textual.message import Message

from kronos_tune.telemetry.sampler import Snapshot


class TelemetryUpdated(Message):
    """A new sampler snapshot."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class BenchmarkEvent(Message):
    """One event of run_benchmark: TrialStarted, TrialStep, TrialFinished or BenchmarkFinished."""

    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event


class TrainingStep(Message):
    """One optimizer step of a training run (a kronos_core StepRecord)."""

    def __init__(self, record: Any, target_steps: int | None) -> None:
        super().__init__()
        self.record = record
        self.target_steps = target_steps


class JobFinished(Message):
    """A background job ended: `phase` is done, cancelled or failed; `result` is what it returned."""

    def __init__(self, job: str, phase: str, outcome: str, result: Any = None) -> None:
        super().__init__()
        self.job = job
        self.phase = phase
        self.outcome = outcome
        self.result = result


class LogLine(Message):
    """A line for the log pane from a worker thread (level: info, warning, error)."""

    def __init__(self, text: str, level: str = "info") -> None:
        super().__init__()
        self.text = text
        self.level = level


class JobNote(Message):
    """What the running job is doing now, for the run panel (an autobatch probe, a run being prepared...)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
