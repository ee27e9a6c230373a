"""One training trial, measured: warm-up, a metered step, timed steps, padding, evaluation.

The memory meter is switched on for the last warm-up step only (on the CPU its
dispatch mode adds Python work to every op, which would distort the timed
steps); that step runs with every parameter, the optimizer state and the
tokenizer already counted, so from the second step on (AdamW creates its
state in the first) it sees the steady-state peak and enforces the simulated
budget. On CUDA the allocator meter costs nothing and stays on for
every step. The timed steps run without it; their times come from the trainer's
own StepRecords (CUDA synchronized at the phase boundaries).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ContextManager

import torch

from kronos_core.train import StepRecord, TrainConfig, Trainer
from kronos_tune.flops import train_flops_per_token

StepCallback = Callable[[StepRecord], None]


class MeterSwitch:
    """A PhaseMeter for the Trainer that forwards to `meter` only while `enabled`."""

    def __init__(self, meter: Any | None, always: bool = False) -> None:
        self.meter = meter
        self.always = always
        self.enabled = always

    def phase(self, name: str) -> ContextManager[None]:
        if self.enabled and self.meter is not None:
            return self.meter.phase(name)
        return contextlib.nullcontext()

    def peaks(self) -> dict[str, int]:
        return dict(self.meter.peaks()) if self.meter is not None else {}

    def peak_bytes(self) -> int:
        return int(self.meter.peak_bytes()) if self.meter is not None else 0

    def reset(self) -> None:
        if self.meter is not None:
            self.meter.reset()

    def start(self, trainer: Trainer) -> None:
        """Count what exists (weights, optimizer state, tokenizer) and meter from now on."""
        if self.meter is None:
            return
        if hasattr(self.meter, "track_existing"):
            self.meter.track_existing(trainer.model, trainer.tokenizer, trainer.optimizer)
        self.enabled = True

    def stop(self) -> None:
        self.enabled = self.always


@dataclass
class TrainMeasurement:
    """What one trial's steps produced. status: ok | oom | cancelled."""

    status: str
    reason: str | None = None
    timed: list[dict[str, Any]] = field(default_factory=list)  # StepRecord.to_dict() of the measured steps
    warmup_time_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_bytes_by_phase: dict[str, int] = field(default_factory=dict)
    val_loss: float | None = None
    val_loss_step: int | None = None
    tokens_per_step: int | None = None
    samples_per_step: int | None = None
    losses: list[float] = field(default_factory=list)  # every step's training loss
    flops_per_token: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainMeasurement:
        return cls(**data)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def measure_training(config: TrainConfig, meter: Any | None, warmup: int, steps: int, pad: int = 0,
                     on_record: StepCallback | None = None, should_stop: Callable[[], bool] = lambda: False,
                     meter_always: bool = False, agree_across_ranks: bool = False) -> TrainMeasurement:
    """Run one trial of `config`; out-of-memory (real or simulated) is a result, other errors propagate.

    The last of the `warmup` steps (at least one; give two or more for the steady-state peak) is metered.
    `should_stop` is polled after every step (with `agree_across_ranks`, all DDP ranks stop together).
    """
    switch = MeterSwitch(meter, always=meter_always)
    result = TrainMeasurement(status="ok")
    trainer: Trainer | None = None

    def record(step: StepRecord) -> None:
        result.losses.append(step.loss)
        if on_record is not None:
            on_record(step)

    def stop_now() -> bool:
        flag = bool(should_stop())
        if agree_across_ranks and trainer is not None:
            tensor = torch.tensor([1.0 if flag else 0.0], device=trainer.device)
            flag = bool(trainer.dist.all_reduce_max(tensor).item() > 0)
        if flag:
            result.status, result.reason = "cancelled", f"cancelled after {len(result.losses)} steps"
        return flag

    try:
        trainer = Trainer(config, meter=switch, callback=record)
        result.tokens_per_step = trainer.tokens_per_step
        result.samples_per_step = trainer.global_batch_size
        if config.what == "predictor":
            result.flops_per_token = train_flops_per_token(trainer.model, config.window_length - 1)
        started = time.perf_counter()
        for index in range(max(warmup, 1)):
            if index == max(warmup, 1) - 1:
                switch.start(trainer)
            trainer.train_step()
            if stop_now():
                return result
        result.warmup_time_s = time.perf_counter() - started
        switch.stop()
        result.peak_memory_bytes, result.peak_bytes_by_phase = switch.peak_bytes(), switch.peaks()
        for _ in range(steps):
            result.timed.append(trainer.train_step().to_dict())
            if stop_now():
                return result
        if meter_always:
            result.peak_memory_bytes, result.peak_bytes_by_phase = switch.peak_bytes(), switch.peaks()
        for _ in range(pad):
            trainer.train_step()
            if stop_now():
                return result
        result.val_loss = float(trainer.evaluate()["val_loss"])
        result.val_loss_step = trainer.step
        return result
    except torch.OutOfMemoryError as error:
        result.status, result.reason = "oom", first_line(error)
        result.peak_memory_bytes = switch.peak_bytes() or None
        result.peak_bytes_by_phase = switch.peaks()
        return result
    finally:
        switch.stop()
        if trainer is not None:
            trainer.close()
