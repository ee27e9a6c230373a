"""The one training job behind `kronos-tune train` and the dashboard's `t`: schedule, claim, train, log, mark.

    result = run_training(TrainRequest(config, source="preset cpu", steps=3), listener, cancel)

`run_training` schedules the start (kronos_tune.train.schedule), claims the
run's folder (kronos_tune.train.run_folder), then runs each stage (the
tokenizer and/or the predictor) in this process or under torchrun
(`TrainRequest.launch`, through kronos_core.launch).
Every stage's folder gets metrics.jsonl and, with `tensorboard`, TensorBoard
event files (kronos_tune.run_logs); run.json records how the run ended. A stage
trained in this process ends by saying how far its model moved from its start
(kronos_tune.train.moved).
Ctrl-C / SIGTERM (in the main thread) or `cancel` stops at a step boundary
after a checkpoint: exit code 130, the run marked cancelled and resumable.

No terminal output here: what happens goes to a `TrainListener` (the CLI draws
it with Rich, the dashboard posts Textual messages) and the outcome comes back
as a `TrainResult`. The job takes a finished TrainConfig: a new run option is a
TrainConfig key (or a TrainRequest field) that the command maps its flag to.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_core.errors import one_line
from kronos_core.launch import LaunchSpec, run_launch, torchrun_command
from kronos_core.train.config import WHAT, TrainConfig
from kronos_core.signals import StopForwarder, stop_on_signals
from kronos_tune.run_logs import METRICS_FILE, TENSORBOARD_DIR, RunLog, check_log_paths, stage_log
from kronos_tune.errors import KronosTuneError
from kronos_tune.runs import RunDir, read_run_file
from kronos_tune.train.moved import measure, record_start
from kronos_tune.train.run_folder import (
    Start, checkpoint_step, choose_folder, claim_train_dir, finish_status, run_step,
)
from kronos_tune.train.schedule import TrainSchedule, schedule_training, world_size

if TYPE_CHECKING:  # torch, the Trainer and the worker's exit codes (kronos_core.train.__main__) load when a stage
    # runs: a command's --help and its bad-flag errors start without torch
    from kronos_core.train import StepRecord, Trainer
    from kronos_core.train.records import PhaseMeter

STAGES = (*WHAT, "both")
STOP_GRACE_S = 60.0  # after Ctrl-C, the ranks' time to finish the step and save before they are killed
WORKER_MODULE = "kronos_core.train"


@dataclass
class TrainRequest:
    """One start of a training run: the TrainConfig to train and how to run it."""

    config: TrainConfig  # its output_dir is replaced by the folder the start chooses
    source: str  # where the config came from ("preset NAME", a file), recorded in run.json
    label: str = "run"  # a new folder is runs/train/<label>-<time>/
    both: bool = False  # the tokenizer (OUT/tokenizer), then the predictor on its best weights (OUT/predictor)
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)  # with `both`: each phase's own keys
    steps: int | None = None  # stop at this global optimizer step
    resume: Path | None = None  # the folder of a run to continue
    out: Path | None = None  # write here instead of a new folder
    overwrite: bool = False  # replace the kronos-tune run in `out`
    new_run: bool = False  # never continue the newest cancelled run of the same config
    keep_batch: bool = False  # split the effective batch over the processes instead of multiplying it
    launch: LaunchSpec = field(default_factory=LaunchSpec)  # more than one process: torchrun
    tensorboard: bool = False
    weights: dict[str, Any] = field(default_factory=dict)  # resolved hub snapshots, for run.json
    checks: list[str] = field(default_factory=list)  # the job checked against its data (train.checks), in the plan


@dataclass(frozen=True)
class StageStart:
    """A stage's trainer is ready (in process, or rank 0's `start` event)."""

    config: TrainConfig
    step: int  # where it starts (a resumed run's step)
    total_steps: int  # the schedule
    target: int | None  # where this start stops: --steps or the end of the schedule
    world_size: int

    @property
    def global_batch(self) -> int:
        return self.config.batch_size * self.config.accumulation_steps * self.world_size

    @property
    def steps_per_epoch(self) -> int:
        return self.total_steps // self.config.epochs


@dataclass
class StageResult:
    """How one stage ended. `status`: complete, partial, cancelled or failed (None: a node without rank 0,
    which another node reports); `summary`: the trainer's (TrainSummary.to_dict(), or rank 0's event), None
    when the stage ended before it; `error`: the one line that says why it failed."""

    config: TrainConfig
    status: str | None
    exit_code: int  # 0, 130 stopped and saved, 1 out of memory or a failed launch, 2 a rank's usage error
    summary: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class TrainResult:
    """What a training job did: its folder, the schedule it announced, each stage's end, the run's status."""

    folder: Path
    why: str  # the line announcing the folder (new, continued, resumed, replaced)
    schedule: TrainSchedule
    stages: list[StageResult]
    status: str | None  # run.json's status at the end (None: another node reports)
    exit_code: int


class TrainListener:
    """What a training job reports while it runs. Each method does nothing here; a view overrides what it
    shows. Called from the job's thread."""

    def announce(self, why: str, schedule: TrainSchedule) -> None:
        """The folder and the schedule, once the folder is claimed and before the first step."""

    def stage_launching(self, config: TrainConfig, target: int | None) -> None:
        """torchrun is about to start a stage's ranks (their output lines may follow)."""

    def stage_ready(self, start: StageStart) -> None:
        """A stage's trainer is built: the first step follows."""

    def step(self, record: StepRecord) -> None:
        """One optimizer step (rank 0's on a torchrun run)."""

    def evaluated(self, values: dict[str, Any]) -> None:
        """One evaluation: step, epoch, val_loss and the other metrics."""

    def worker_line(self, line: str) -> None:
        """A line torchrun or a rank printed that is not an event (warnings, tracebacks)."""

    def stage_finished(self, result: StageResult) -> None:
        """A stage ended (not called when it raised: the job re-raises the error)."""


def stages(base: TrainConfig, both: bool, phases: dict[str, dict[str, Any]] | None = None) -> list[TrainConfig]:
    """`both`: the tokenizer first (OUT/tokenizer), then the predictor on its best weights (OUT/predictor);
    `phases`: each phase's own keys (a training file's [tokenizer] / [predictor] tables) over `base`."""
    if not both:
        return [base]
    root, own = Path(base.output_dir), phases or {}
    tokenizer = base.replace(**{**own.get("tokenizer", {}), "what": "tokenizer",
                                "output_dir": str(root / "tokenizer")})
    predictor = base.replace(**{**own.get("predictor", {}), "what": "predictor", "output_dir": str(root / "predictor"),
                                "tokenizer_dir": str(root / "tokenizer" / "best")})
    return [tokenizer, predictor]


def phase_done(folder: Path) -> bool:
    """A phase folder whose run finished its schedule: a resume of the run goes on with the next phase."""
    return (read_run_file(folder) or {}).get("status") == "complete"


def phase_resume(folder: Path) -> Path | None:
    """Where an unfinished phase continues: its folder when it has a checkpoint, else None (it starts over)."""
    from kronos_core.train.train_state import checkpoint_path

    return folder if checkpoint_path(folder).is_file() else None


def check_logs(configs: list[TrainConfig], tensorboard: bool) -> None:
    """Before anything is written: every stage folder can take metrics.jsonl (and tensorboard/)."""
    for stage in configs:
        folder = Path(stage.output_dir)
        check_log_paths(folder / METRICS_FILE, folder / TENSORBOARD_DIR if tensorboard else None)


def worker_args(config_file: Path, steps: int | None, resume: Path | None) -> list[str]:
    """The arguments of `python -m kronos_core.train` on every rank."""
    args = ["--config", str(config_file), "--events"]
    if steps is not None:
        args += ["--steps", str(steps)]
    if resume is not None:
        args += ["--resume", str(resume)]
    return args


def _finish(run: RunDir | None, status: str, **extra: Any) -> None:
    if run is not None:
        run.mark(status, **extra)


def _saved_step(config: TrainConfig) -> int:
    """The step of the stage's last checkpoint (0 without one): where a resume would continue."""
    try:
        return checkpoint_step(Path(config.output_dir))
    except Exception:  # noqa: BLE001 - an unreadable checkpoint only loses this number
        return 0


def _ended(config: TrainConfig, summary: dict[str, Any], run: RunDir | None) -> StageResult:
    from kronos_core.train.__main__ import EXIT_INTERRUPTED

    status = finish_status(summary["interrupted"], summary["steps"], summary["total_steps"])
    _finish(run, status, step=summary["steps"], total_steps=summary["total_steps"])
    return StageResult(config, status, EXIT_INTERRUPTED if status == "cancelled" else 0, summary)


def train_here(config: TrainConfig, steps: int | None, resume: Path | None, listener: TrainListener, *,
               meter: PhaseMeter | None = None, run: RunDir | None = None, tensorboard: bool = False,
               cancel: threading.Event | None = None) -> StageResult:
    """One stage in this process. `run`: the claimed folder, whose run.json records how the stage ended.
    A second Ctrl-C interrupts at once (the last checkpoint stays as it was); any other error is recorded
    as the run's failure and raised."""
    import torch

    from kronos_core.train import Trainer
    from kronos_core.train.__main__ import EXIT_INTERRUPTED, EXIT_OOM, oom_message

    if meter is None:
        from kronos_tune.memory.meters import make_meter

        meter = make_meter(config.resolved_device(), exact_on_cpu=False)
    if cancel is not None and cancel.is_set():
        _finish(run, "cancelled", step=_saved_step(config))
        return _told(listener, StageResult(config, "cancelled", EXIT_INTERRUPTED))
    stopper = StopForwarder()
    trainer: Trainer | None = None
    log: RunLog | None = None
    try:
        with stop_on_signals(stopper, second_interrupts=True):
            trainer = Trainer(config, meter=meter, resume=resume)
            stopper.attach(trainer)
            target = trainer.total_steps if steps is None else min(steps, trainer.total_steps)
            log = stage_log(Path(config.output_dir), tensorboard, resumed_at=trainer.step)
            listener.stage_ready(StageStart(config, trainer.step, trainer.total_steps, target,
                                            trainer.dist.world_size))

            def on_step(record: StepRecord) -> None:
                listener.step(record)
                log.step(record.to_dict())
                if cancel is not None and cancel.is_set():
                    trainer.request_stop()

            def on_eval(record: Any) -> None:
                values = record.to_dict()
                listener.evaluated(values)
                log.eval(values)

            trainer.callback, trainer.eval_callback = on_step, on_eval
            record_start(trainer, Path(config.output_dir))
            summary = trainer.fit(steps).to_dict()
            moved = None if summary["interrupted"] else measure(trainer, Path(config.output_dir))
            summary["moved"] = None if moved is None else moved.to_dict()
    except torch.OutOfMemoryError:
        step = trainer.step if trainer is not None else 0
        peak = trainer.peak_bytes_seen() if trainer is not None else None
        message = oom_message(step, peak, str(trainer.device) if trainer is not None else config.device)
        _finish(run, "failed", reason="out of memory", step=_saved_step(config))
        return _told(listener, StageResult(config, "failed", EXIT_OOM, error=message))
    except KeyboardInterrupt:  # the second Ctrl-C: no checkpoint of this step
        _finish(run, "cancelled", step=_saved_step(config))
        return _told(listener, StageResult(config, "cancelled", EXIT_INTERRUPTED))
    except BaseException as error:
        _finish(run, "failed", reason=one_line(error, typed=False), step=_saved_step(config))
        raise
    finally:
        if log is not None:
            log.close()
        if trainer is not None:
            trainer.close()
    return _told(listener, _ended(config, summary, run))


def _told(listener: TrainListener, result: StageResult) -> StageResult:
    listener.stage_finished(result)
    return result


class _RankZero:
    """Rank 0's events of a torchrun stage: to the listener and the stage's logs, the summary, the errors.
    The log opens on rank 0's first event, so on a multi-node run only the node hosting rank 0 writes it."""

    def __init__(self, config: TrainConfig, listener: TrainListener, tensorboard: bool, target: int | None) -> None:
        self.config, self.listener, self.tensorboard, self.target = config, listener, tensorboard, target
        self.log: RunLog | None = None
        self.summary: dict[str, Any] | None = None
        self.errors: list[dict[str, Any]] = []

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "error":
            self.errors.append(event)
            return
        if self.log is None and kind in ("start", "step", "eval"):
            resumed_at = int(event.get("step", 0)) if kind == "start" else 0
            self.log = stage_log(Path(self.config.output_dir), self.tensorboard, resumed_at=resumed_at)
        if kind == "start":
            total = int(event["total_steps"])
            self.listener.stage_ready(StageStart(self.config, int(event["step"]), total,
                                                 self.target if self.target is not None else total,
                                                 int(event.get("world_size", 1))))
        elif kind == "step":
            from kronos_core.train.records import StepRecord

            self.listener.step(StepRecord.from_dict(event))
            self.log.step(event)
        elif kind == "eval":
            self.listener.evaluated(event)
            self.log.eval(event)
        elif kind == "summary":
            self.summary = event

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def train_launched(config: TrainConfig, command: list[str], target: int | None, listener: TrainListener, *,
                   run: RunDir | None = None, tensorboard: bool = False,
                   cancel: threading.Event | None = None) -> StageResult:
    """One stage under torchrun through the shared launcher: Ctrl-C or SIGTERM here (main thread) or `cancel`
    makes every rank stop after its step and save; they are killed after a grace period."""
    from kronos_core.train.__main__ import EXIT_INTERRUPTED, EXIT_OOM, EXIT_USAGE

    listener.stage_launching(config, target)
    watcher = _RankZero(config, listener, tensorboard, target)
    try:
        result = run_launch(command, on_event=watcher.on_event, on_line=listener.worker_line, grace_s=STOP_GRACE_S,
                            should_stop=None if cancel is None else cancel.is_set)
    finally:
        watcher.close()
    summary, code = watcher.summary, result.returncode
    if summary is not None:
        ended = _ended(config, summary, run)
        if ended.status == "cancelled" or code == 0:
            return _told(listener, ended)
    if watcher.errors:
        first = watcher.errors[0]
        _finish(run, "failed", reason=str(first.get("message")), step=_saved_step(config))
        code = {"oom": EXIT_OOM, "usage": EXIT_USAGE}.get(str(first.get("kind")), 1)
        return _told(listener, StageResult(config, "failed", code, summary,
                                           error=f"rank {first.get('rank')}: {first.get('message')}"))
    if code != 0 or result.stopped:
        status = "cancelled" if result.stopped else "failed"
        _finish(run, status, step=_saved_step(config))
        exit_code = EXIT_INTERRUPTED if result.stopped else (code if 0 < code < 128 else 1)
        return _told(listener, StageResult(config, status, exit_code, summary,
                                           error=f"torchrun exited with code {code}; see the worker messages above"))
    return _told(listener, StageResult(config, None, 0))  # a node without rank 0: that node reports


def run_training(request: TrainRequest, listener: TrainListener | None = None,
                 cancel: threading.Event | None = None) -> TrainResult:
    """Schedule, claim the folder, train every stage, record the end; see the module doc. Bad input raises a
    KronosTuneError / KronosError (one line) before anything is written."""
    listener = listener or TrainListener()
    spec, steps, resume = request.launch, request.steps, request.resume
    if spec.launched:
        torchrun_command(spec, WORKER_MODULE, [])  # a missing rendezvous flag: one line, before any folder
    processes = world_size(spec.nproc, spec.nnodes) if spec.launched else 1
    both = request.both
    start_step = run_step(resume) if resume is not None and not both else 0
    # two phases: each is scheduled on its own below (its epochs, its --steps, its resumed step)
    base, schedule = schedule_training(request.config, processes, None if both else steps, start_step,
                                       None if both else resume, request.keep_batch)
    if spec.multi_node:  # every node must write to the same shared folder: no per-node fresh names
        folder = request.out or Path(base.output_dir)
        begin = Start(folder, resume, "--out", request.overwrite, f"output: {folder} (shared by all nodes)")
    else:
        begin = choose_folder(request.label, base, processes, steps, resume, request.out, request.overwrite,
                              request.new_run)
        if begin.resume is not None and resume is None and not both:  # a cancelled run found: from its step
            start_step = run_step(begin.resume)
            base, schedule = schedule_training(base, processes, steps, start_step, begin.resume, False)
    base = base.replace(output_dir=str(begin.folder))
    configs = stages(base, both, request.phases)
    plans: list[tuple[TrainConfig, TrainSchedule, Path | None]] = []
    kept: list[str] = []
    for stage in configs:
        if not both:
            plans.append((stage, schedule, begin.resume))
            continue
        folder = Path(stage.output_dir)
        if begin.resume is not None and phase_done(folder):
            kept.append(f"{stage.what}: complete in {folder}, kept")
            continue
        stage_resume = phase_resume(folder) if begin.resume is not None else None
        stage_start = run_step(stage_resume) if stage_resume is not None else 0
        stage, stage_schedule = schedule_training(stage, processes, steps, stage_start, stage_resume, False)
        plans.append((stage, stage_schedule, stage_resume))
    if both and not plans:
        raise KronosTuneError(f"--resume {begin.folder}: both phases are complete; there is nothing to continue, "
                              f"start a new run instead")
    if begin.resume is not None:  # the only folder kept as it is: its logs must take more lines
        check_logs([stage for stage, _, stage_resume in plans if stage_resume is not None or not both],
                   request.tensorboard)
    run: RunDir | None = None
    if not spec.multi_node:
        run = claim_train_dir(begin.folder, base, request.source, resume=begin.resume is not None,
                              overwrite=begin.overwrite, flag=begin.flag, processes=processes,
                              what="both" if both else None)
        if request.weights:
            run.mark("running", weights=request.weights)
        if both:
            write_phases(begin.folder, base, request.phases)
    if both:
        schedule = plans[0][1]
        announced = TrainSchedule(**{**schedule.__dict__, "notes": [
            *schedule.notes, *kept, *(line for _, later, _ in plans[1:] for line in later.lines()), *request.checks]})
    else:
        announced = TrainSchedule(**{**schedule.__dict__, "notes": [*schedule.notes, *request.checks]})
    listener.announce(begin.why, announced)
    ended: list[StageResult] = []
    for stage, stage_schedule, stage_resume in plans:
        stage_run = run if not both else claim_train_dir(
            Path(stage.output_dir), stage, request.source, resume=stage_resume is not None, overwrite=False,
            processes=processes)
        if spec.launched:
            config_file = Path(stage.output_dir) / "config.toml"
            stage.to_toml(config_file)
            command = torchrun_command(spec, WORKER_MODULE, worker_args(config_file, steps, stage_resume))
            outcome = train_launched(stage, command, stage_schedule.end_step, listener, run=stage_run,
                                     tensorboard=request.tensorboard, cancel=cancel)
        else:
            outcome = train_here(stage, steps, stage_resume, listener, run=stage_run,
                                 tensorboard=request.tensorboard, cancel=cancel)
        ended.append(outcome)
        if outcome.exit_code != 0:
            from kronos_core.train.__main__ import EXIT_INTERRUPTED

            status = "cancelled" if outcome.exit_code == EXIT_INTERRUPTED else "failed"
            if both and run is not None:
                run.mark(status, stage=stage.what)
            return TrainResult(begin.folder, begin.why, announced, ended, status if both else outcome.status,
                               outcome.exit_code)
    status = ended[-1].status
    if both:
        status = "complete" if all(result.status == "complete" for result in ended) else "partial"
        if run is not None:
            run.mark(status, stages=[stage.what for stage, _, _ in plans])
    return TrainResult(begin.folder, begin.why, announced, ended, status, 0)


PHASES_FILE = "phases.toml"  # a two-phase run's shared keys and per-phase tables: what --resume rebuilds it from


def write_phases(root: Path, base: TrainConfig, phases: dict[str, dict[str, Any]]) -> None:
    from kronos_core.files import write_toml

    tables = {phase: dict(phases.get(phase, {})) for phase in WHAT[::-1]}  # tokenizer, then predictor
    own = {key for table in tables.values() for key in table}
    shared = {key: value for key, value in base.to_dict().items() if key not in ("what", "output_dir", *own)}
    write_toml(root / PHASES_FILE, {**shared, **tables}, header="kronos-tune: the two phases of this run "
               "(kronos-tune train --resume continues the unfinished one)")


__all__ = ["PHASES_FILE", "STAGES", "STOP_GRACE_S", "StageResult", "StageStart", "TrainListener", "TrainRequest",
           "TrainResult", "check_logs", "phase_done", "phase_resume", "run_training", "stages", "train_here",
           "train_launched", "worker_args", "write_phases"]
