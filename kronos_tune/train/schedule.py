"""What a training start will do, announced before its first step (`TrainSchedule`).

`schedule_training` gives the config a start runs and its schedule: optimizer steps, epochs, the effective
batch per process and in total. It raises the epochs when `--steps` goes past the schedule of a new run, and
refuses what a resumed run cannot do (a step it already passed, a schedule it cannot extend). The printed
announcement (`TrainSchedule.lines`) starts with "plan:", the word users read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from kronos_core.train import TrainConfig
from kronos_tune.errors import KronosTuneError


@dataclass
class TrainSchedule:
    """What a training run will do, in optimizer steps and windows (samples)."""

    what: str
    model_size: str
    processes: int | None  # None: elastic (torchrun --nnodes MIN:MAX)
    batch_size: int
    accumulation_steps: int
    samples_per_epoch: int
    epochs: int
    start_step: int
    stop_step: int | None  # --steps, or None for the end of the schedule
    notes: list[str] = field(default_factory=list)

    @property
    def per_process_batch(self) -> int:
        return self.batch_size * self.accumulation_steps

    @property
    def global_batch(self) -> int | None:
        return None if self.processes is None else self.per_process_batch * self.processes

    @property
    def steps_per_epoch(self) -> int | None:
        return None if self.global_batch is None else self.samples_per_epoch // self.global_batch

    @property
    def total_steps(self) -> int | None:
        """The schedule's length: epochs x steps per epoch."""
        return None if self.steps_per_epoch is None else self.steps_per_epoch * self.epochs

    @property
    def end_step(self) -> int | None:
        """Where this start stops: --steps or the end of the schedule."""
        total = self.total_steps
        if total is None:
            return self.stop_step
        return total if self.stop_step is None else min(self.stop_step, total)

    def lines(self) -> list[str]:
        """The announcement printed before the first step."""
        batch = (f"batch_size {self.batch_size} x accumulation_steps {self.accumulation_steps} = "
                 f"{self.per_process_batch} windows")
        if self.processes is None:
            return [f"plan: {self.what} (Kronos-{self.model_size}), {batch} per process and optimizer step; the "
                    f"process count is elastic, so steps per epoch are known only once torchrun starts", *self.notes]
        if self.processes == 1:
            effective = f"effective batch {self.global_batch} windows per optimizer step ({batch})"
        else:
            effective = (f"effective batch {self.global_batch} windows per optimizer step = {self.per_process_batch} "
                         f"per process ({batch}) x {self.processes} processes")
        span = (f"{self.total_steps} optimizer steps = {self.epochs} epoch{'s' if self.epochs != 1 else ''} x "
                f"{self.steps_per_epoch} steps (samples_per_epoch {self.samples_per_epoch} / {self.global_batch})")
        where = f"from step {self.start_step}" + (f", stopping at step {self.end_step}"
                                                  if self.end_step != self.total_steps else "")
        return [f"plan: {self.what} (Kronos-{self.model_size}), {span}, {where}", effective, *self.notes]


def world_size(nproc: int, nnodes: str | None) -> int | None:
    """Processes in total; None when the node count is a range (elastic)."""
    try:
        return nproc * int(nnodes or "1")
    except ValueError:
        return None


def keep_effective_batch(config: TrainConfig, processes: int) -> tuple[TrainConfig, str]:
    """Split the config's effective batch over `processes`: accumulation steps first (same memory per process),
    else the micro-batch; a one-line error when neither divides."""
    if processes == 1:
        return config, ""
    batch, accumulation = config.batch_size, config.accumulation_steps
    if accumulation % processes == 0:
        changed = config.replace(accumulation_steps=accumulation // processes)
        how = f"accumulation_steps {accumulation} -> {accumulation // processes}"
    elif batch % processes == 0:
        changed = config.replace(batch_size=batch // processes)
        how = f"batch_size {batch} -> {batch // processes}"
    else:
        raise KronosTuneError(f"--keep-effective-batch: batch_size {batch} x accumulation_steps {accumulation} "
                              f"does not split evenly over {processes} processes; use an --nproc that divides "
                              f"{batch} or {accumulation}, or leave the flag out")
    return changed, f"--keep-effective-batch: {how}, so {processes} processes keep {batch * accumulation} windows " \
                    f"per optimizer step"


def schedule_training(config: TrainConfig, processes: int | None, steps: int | None, start_step: int = 0,
                      resumed: Path | None = None, keep_batch: bool = False) -> tuple[TrainConfig, TrainSchedule]:
    """The config this start runs (epochs raised for a --steps past one schedule) and its schedule.

    A resumed run keeps its schedule (its optimizer and scheduler state are tied to it), so there --steps
    must lie between the run's step and the end of its schedule."""
    notes: list[str] = []
    if keep_batch and processes is not None:
        config, note = keep_effective_batch(config, processes)
        notes.append(note)
    elif processes is not None and processes > 1:
        notes.append(f"--nproc gives every process the config's batch, so the effective batch is {processes}x the "
                     f"config's {config.batch_size * config.accumulation_steps}; add --keep-effective-batch to "
                     f"keep it")

    def schedule_for(current: TrainConfig) -> TrainSchedule:
        return TrainSchedule(current.what, current.model_size, processes, current.batch_size,
                             current.accumulation_steps, current.samples_per_epoch, current.epochs, start_step,
                             steps, notes)

    schedule = schedule_for(config)
    per_epoch = schedule.steps_per_epoch
    if per_epoch is not None and per_epoch < 1:
        raise KronosTuneError(f"samples_per_epoch {config.samples_per_epoch} is less than one optimizer step of "
                              f"{schedule.global_batch} windows on {processes} processes; raise samples_per_epoch or "
                              f"lower the batch (--keep-effective-batch splits it over the processes)")
    total = schedule.total_steps
    if resumed is not None and total is not None:
        if start_step >= total:
            raise KronosTuneError(f"--resume {resumed}: that run is complete ({start_step}/{total} steps); there is "
                                  f"nothing to continue, start a new run instead")
        if steps is not None and steps <= start_step:
            raise KronosTuneError(f"--steps {steps}: the run in {resumed} is already at step {start_step} of "
                                  f"{total}; give --steps between {start_step + 1} and {total}, or leave it out to "
                                  f"finish the schedule")
        if steps is not None and steps > total:
            raise KronosTuneError(f"--steps {steps}: the run in {resumed} has a schedule of {total} steps "
                                  f"({config.epochs} epoch{'s' if config.epochs != 1 else ''} x {per_epoch}), which a resumed run cannot extend; "
                                  f"leave --steps out to finish it, or start a new run with --steps {steps}")
    elif steps is not None and total is not None and per_epoch and steps > total:
        epochs = math.ceil(steps / per_epoch)
        notes.append(f"--steps {steps} is past the schedule of {total} steps ({config.epochs} epoch"
                     f"{'s' if config.epochs != 1 else ''} x {per_epoch}): epochs raised to {epochs}, so the "
                     f"learning-rate schedule spans {epochs * per_epoch} steps and this start stops at step {steps} "
                     f"(resumable to the end)")
        config = config.replace(epochs=epochs)
        schedule = schedule_for(config)
    return config, schedule
