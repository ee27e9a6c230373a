"""The bodies of the dashboard's background jobs: the same public calls the CLI makes, reported as messages.

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
from kronos_tune.tui.messages import JobFinished, JobNote, LogLine, ProtocolEvent, TrainingStep

if TYPE_CHECKING:  # torch-heavy; imported inside the jobs, in their thread
    from kronos_core.train import StepRecord
    from kronos_tune.autobatch import Probe
    from kronos_tune.protocol import ProtocolOptions

Post = Callable[[Message], object]


def _finish(post: Post, job: str, cancel: threading.Event, outcome: str, result: Any = None) -> None:
    phase = "cancelled" if cancel.is_set() else "done"
    post(JobFinished(job, phase, outcome, result))


def benchmark(post: Post, preset: Preset, task: str, options: ProtocolOptions | None, out_dir: Path,
              cancel: threading.Event) -> None:
    """run_protocol for `task` ("train" or "predict") into `out_dir` (results.jsonl, reports, recommended.toml);
    every protocol event is forwarded as a ProtocolEvent."""
    job = f"benchmark {task}"
    try:
        from kronos_tune.protocol import ProtocolOptions, run_protocol

        report = run_protocol(preset, task=task, options=options or ProtocolOptions(), out_dir=out_dir,
                              resume=False, on_event=lambda event: post(ProtocolEvent(event)), cancel=cancel)
    except Exception as error:  # the app stays up and shows the reason
        post(JobFinished(job, "failed", one_line(error)))
        return
    counts: dict[str, int] = {}
    for trial in report.trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    summary = ", ".join(f"{count} {status}" for status, count in counts.items()) or "no trials"
    _finish(post, job, cancel, f"{summary}; reports in {out_dir}", report)


def autobatch(post: Post, preset: Preset, cancel: threading.Event) -> None:
    """The largest training batch that fits the preset's per-device budget, probed with real training steps
    (as `kronos-tune autobatch --preset NAME` does); each probe is a log line."""
    job = "autobatch"
    try:
        import torch

        from kronos_core.units import format_bytes
        from kronos_tune.autobatch import render
        from kronos_tune.autobatch.records import SearchCancelled
        from kronos_tune.autobatch.train_task import TrainTask
        from kronos_tune.workloads import train_config_from_preset

        config, notes = train_config_from_preset(preset)
        for note in notes:
            post(LogLine(f"autobatch: {note}", "warning"))
        wants_cuda = preset.hardware.device == "cuda"
        device = "cuda" if wants_cuda and torch.cuda.is_available() else "cpu"
        round_bytes = 512 if wants_cuda and device == "cpu" else 1  # a simulated CUDA allocator's blocks
        effective = preset.workload.batch_size * preset.workload.accumulation_steps

        def on_probe(probe: Probe) -> None:
            line = render.probe_line(probe)
            post(LogLine(f"autobatch: {line}"))
            post(JobNote(f"{line}; next probe or the fit follows"))
            if cancel.is_set():
                raise SearchCancelled

        post(JobNote(f"probing training batch sizes on {device} against {format_bytes(preset.budget_bytes)} "
                     f"(real steps, exact memory)"))

        with TrainTask(config, device=device) as task:
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
    _finish(post, job, cancel, outcome, result)


def train(post: Post, config_path: Path, folder: Path, resume: bool, cancel: threading.Event) -> None:
    """kronos_core's Trainer on a TrainConfig TOML (recommended.toml) in `folder`, a new run or (resume) the
    cancelled one it holds; the folder is claimed through kronos_tune.runs and records how the run ended.
    Cancel stops at a step boundary after a checkpoint: the next `t` continues it."""
    job = "training"
    run = None
    try:
        from kronos_core.train import TrainConfig, Trainer
        from kronos_tune.train.runs import claim_train_dir, finish_status, partial_config_note

        partial = partial_config_note(config_path)
        if partial:
            post(LogLine(f"training: {config_path} comes from a partial benchmark ({partial.lstrip('# ')}); "
                         f"training with it anyway", "warning"))
        config = TrainConfig.from_toml(config_path).replace(output_dir=str(folder))
        run = claim_train_dir(folder, config, str(config_path), resume=resume, overwrite=False)
        post(LogLine(f"training: {config.model_size} {config.what}, batch {config.batch_size} x "
                     f"{config.accumulation_steps}, " + (f"resuming {folder}" if resume else f"output {folder}")))
        if cancel.is_set():
            run.mark("cancelled", step=0)
            post(JobFinished(job, "cancelled", "cancelled before the first step"))
            return
        from kronos_tune.run_logs import stage_log, tensorboard_available

        with Trainer(config, resume=folder if resume else None) as trainer, \
                stage_log(folder, tensorboard_available(), resumed_at=trainer.step) as log:  # as `train` writes
            target = trainer.total_steps
            post(JobNote(f"{trainer.total_steps} optimizer steps = {config.epochs} epoch(s) x "
                         f"{trainer.steps_per_epoch}, effective batch {trainer.global_batch_size}; from step "
                         f"{trainer.step}"))

            def on_step(record: StepRecord) -> None:
                log.step(record.to_dict())
                post(TrainingStep(record, target))
                if cancel.is_set():
                    trainer.request_stop()

            trainer.callback = on_step
            trainer.eval_callback = lambda record: log.eval(record.to_dict())
            summary = trainer.fit()
    except Exception as error:
        if run is not None:
            run.mark("failed", reason=one_line(error))
        post(JobFinished(job, "failed", one_line(error)))
        return
    status = finish_status(summary.interrupted, summary.steps, summary.total_steps)
    run.mark(status, step=summary.steps, total_steps=summary.total_steps)
    state = "stopped early (t continues it)" if summary.interrupted else "done"
    loss = "n/a" if summary.best_val_loss is None else f"{summary.best_val_loss:.4f}"
    _finish(post, job, cancel, f"{summary.steps}/{summary.total_steps} steps, {state}, best val loss {loss}; "
                               f"in {folder}", summary)
