"""The bodies of the dashboard's background jobs: the same public calls the CLI makes, reported as messages, and
those Messages, which carry work results into the app (posted from the sampler and worker threads).

Each function runs in a worker thread, takes `post` (the app's thread-safe
`post_message`) and a `cancel` event, and ends by posting exactly one
JobFinished. Nothing here touches a widget.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.message import Message

from kronos_core.errors import one_line
from kronos_tune.presets import Preset
from kronos_tune.telemetry.sampler import Snapshot

if TYPE_CHECKING:  # torch-heavy; imported inside the jobs, in their thread
    from kronos_core.train import StepRecord
    from kronos_tune.autobatch import Probe
    from kronos_tune.benchmark import BenchmarkOptions
    from kronos_tune.train.job import StageStart, TrainListener
    from kronos_tune.train.schedule import TrainSchedule

Post = Callable[[Message], object]


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


def _finish(post: Post, job: str, stopped_early: bool, outcome: str, result: Any = None) -> None:
    """The phase follows what the job's result says, not the cancel event: a cancel pressed after the last step
    (or trial) was saved leaves a complete run, and the dashboard must call it done, as the folder does."""
    post(JobFinished(job, "cancelled" if stopped_early else "done", outcome, result))


def benchmark(post: Post, preset: Preset, task: str, options: BenchmarkOptions | None, out_dir: Path,
              cancel: threading.Event) -> None:
    """run_benchmark for `task` ("train" or "predict") into `out_dir` (results.jsonl, reports, recommended.toml);
    every benchmark event is forwarded as a BenchmarkEvent."""
    job = f"benchmark {task}"
    try:
        from kronos_tune.benchmark import BenchmarkOptions, run_benchmark

        report = run_benchmark(preset, task=task, options=options or BenchmarkOptions(), out_dir=out_dir,
                              resume=False, on_event=lambda event: post(BenchmarkEvent(event)), cancel=cancel)
    except Exception as error:  # the app stays up and shows the reason
        post(JobFinished(job, "failed", one_line(error)))
        return
    counts: dict[str, int] = {}
    for trial in report.trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    summary = ", ".join(f"{count} {status}" for status, count in counts.items()) or "no trials"
    _finish(post, job, report.cancelled, f"{summary}; reports in {out_dir}", report)


def autobatch(post: Post, preset: Preset, cancel: threading.Event) -> None:
    """The largest training batch that fits the preset's per-device budget, probed with real training steps
    (as `kronos-tune autobatch --preset NAME` does); each probe is a log line."""
    job = "autobatch"
    try:
        import torch

        from kronos_core.units import format_bytes
        from kronos_tune.autobatch.probes import SearchCancelled
        from kronos_tune.autobatch.probes import probe_line
        from kronos_tune.autobatch.train_probes import TrainProbes
        from kronos_tune.workloads import train_config_from_preset

        config, notes = train_config_from_preset(preset)
        for note in notes:
            post(LogLine(f"autobatch: {note}", "warning"))
        wants_cuda = preset.hardware.device == "cuda"
        device = "cuda" if wants_cuda and torch.cuda.is_available() else "cpu"
        round_bytes = 512 if wants_cuda and device == "cpu" else 1  # a simulated CUDA allocator's blocks
        effective = preset.workload.batch_size * preset.workload.accumulation_steps

        def on_probe(probe: Probe) -> None:
            line = probe_line(probe)
            post(LogLine(f"autobatch: {line}"))
            post(JobNote(f"{line}; next probe or the fit follows"))
            if cancel.is_set():
                raise SearchCancelled

        post(JobNote(f"probing training batch sizes on {device} against {format_bytes(preset.budget_bytes)} "
                     f"(real steps, exact memory)"))

        with TrainProbes(config, device=device) as task:
            result = task.run(preset.budget_bytes, effective_batch=effective, round_bytes=round_bytes,
                              on_probe=on_probe)
    except SearchCancelled:
        post(JobFinished(job, "cancelled", "stopped after a probe"))
        return
    except Exception as error:
        post(JobFinished(job, "failed", one_line(error)))
        return
    for note in result.notes:
        post(LogLine(f"autobatch: {note}"))
    outcome = (f"batch_size {result.batch_size} x accumulation {result.accumulation_steps} on {device}, "
               f"predicted peak {format_bytes(result.predicted_peak_bytes)}, "
               f"measured {format_bytes(result.measured_peak_bytes)} of {format_bytes(preset.budget_bytes)}")
    _finish(post, job, False, outcome, result)


def _training_messages(post: Post, folder: Path, resume: bool) -> TrainListener:
    """The training job's reports as the dashboard's messages (the job's module loads torch, so the class is
    made here, in the job's thread)."""
    from kronos_tune.train.job import TrainListener

    class TrainingMessages(TrainListener):
        target: int | None = None

        def announce(self, why: str, schedule: TrainSchedule) -> None:
            post(LogLine(f"training: {schedule.model_size} {schedule.what}, batch {schedule.batch_size} x "
                         f"{schedule.accumulation_steps}, " + (f"resuming {folder}" if resume else f"output {folder}")))

        def stage_ready(self, start: StageStart) -> None:
            self.target = start.target
            post(JobNote(f"{start.total_steps} optimizer steps = {start.config.epochs} epoch(s) x "
                         f"{start.steps_per_epoch}, effective batch {start.global_batch}; from step {start.step}"))

        def step(self, record: StepRecord) -> None:
            post(TrainingStep(record, self.target))

    return TrainingMessages()


def train(post: Post, config_path: Path, folder: Path, resume: bool, cancel: threading.Event) -> None:
    """The training job (kronos_tune.train.job.run_training, as `kronos-tune train` runs it) on a TrainConfig
    TOML (recommended.toml) in `folder`, a new run or (resume) the cancelled one it holds; the folder records
    how the run ended. Cancel stops at a step boundary after a checkpoint: the next `t` continues it."""
    job = "training"
    try:
        from kronos_core.train import TrainConfig
        from kronos_tune.run_logs import tensorboard_available
        from kronos_tune.train.job import TrainRequest, run_training
        from kronos_tune.train.run_folder import partial_config_note

        partial = partial_config_note(config_path)
        if partial:
            post(LogLine(f"training: {config_path} comes from a partial benchmark ({partial.lstrip('# ')}); "
                         f"training with it anyway", "warning"))
        request = TrainRequest(TrainConfig.from_toml(config_path), str(config_path),
                               resume=folder if resume else None, out=None if resume else folder,
                               tensorboard=tensorboard_available())
        result = run_training(request, _training_messages(post, folder, resume), cancel)
    except Exception as error:  # the app stays up and shows the reason
        post(JobFinished(job, "failed", one_line(error)))
        return
    stage = result.stages[-1]
    if stage.error is not None:
        post(JobFinished(job, "failed", stage.error, result))
        return
    if stage.summary is None:
        post(JobFinished(job, "cancelled", "cancelled before the first step", result))
        return
    summary = stage.summary
    state = "stopped early (t continues it)" if summary["interrupted"] else "done"
    loss = "n/a" if summary["best_val_loss"] is None else f"{summary['best_val_loss']:.4f}"
    outcome = f"{summary['steps']}/{summary['total_steps']} steps, {state}, best val loss {loss}; in {folder}"
    if summary.get("moved"):
        from kronos_tune.train.moved import Movement

        outcome += f"; from its start: {Movement.from_dict(summary['moved']).line()}"
    _finish(post, job, bool(summary["interrupted"]), outcome, result)
