"""One training trial, measured: warm-up until settled, a metered step, measured steps until the median is
known well enough, and the validation loss at a fixed optimizer step.

Warm-up covers lazy initialization (allocator growth, cuBLAS handles,
autotuning, compilation): it runs until a step's time is within a tolerance
of the one before, and its times are kept as evidence. The memory meter is
then switched on for one step (on the CPU its dispatch mode adds Python work
to every op, which would distort timing); that step runs with every
parameter, the optimizer state and the tokenizer already counted, so it sees
the steady-state peak and enforces the simulated budget. On CUDA the
allocator meter costs nothing and stays on for every step. The measured steps
run without it; their times come from the trainer's own StepRecords (CUDA
synchronized at the phase boundaries).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from kronos_core.errors import one_line
from kronos_core.train import StepRecord, TrainConfig, Trainer
from kronos_tune.profiling.flops import train_flops_per_token
from kronos_tune.memory.meters import MeterSwitch
from kronos_tune.protocol.stats import relative_halfwidth

StepCallback = Callable[[StepRecord], None]


@dataclass(frozen=True)
class StepPlan:
    """How many steps one trial runs: warm-up until settled, one metered step, measured steps until the median's
    interval is tight (or the budget is spent), and the validation loss at ``eval_step`` (None: no evaluation)."""

    min_warmup: int = 2
    max_warmup: int = 6
    settle_tolerance: float = 0.10
    min_steps: int = 8
    max_steps: int = 40
    target_ci: float = 0.02
    budget_s: float = 20.0
    eval_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepPlan:
        return cls(**data)


@dataclass
class TrainMeasurement:
    """What one trial's steps produced. status: ok | oom | cancelled."""

    status: str
    reason: str | None = None
    timed: list[dict[str, Any]] = field(default_factory=list)  # StepRecord.to_dict() of the measured steps
    warmup_time_s: float | None = None
    warmup_times_s: list[float] = field(default_factory=list)
    timing: dict[str, Any] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    peak_bytes_by_phase: dict[str, int] = field(default_factory=dict)
    val_loss: float | None = None
    val_loss_step: int | None = None
    tokens_per_step: int | None = None
    samples_per_step: int | None = None
    losses: list[float] = field(default_factory=list)  # every step's training loss, step 1 first
    flops_per_token: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainMeasurement:
        return cls(**data)


STOP_REASONS = ("", "interval", "budget", "max-steps")  # why measuring stopped; agreed as an index (the largest)


class _Stopped(Exception):
    pass


def measure_training(config: TrainConfig, meter: Any | None, plan: StepPlan,
                     on_record: StepCallback | None = None, should_stop: Callable[[], bool] = lambda: False,
                     meter_always: bool = False, agree_across_ranks: bool = False) -> TrainMeasurement:
    """Run one trial of `config` by `plan`; out-of-memory (real or simulated) is a result, other errors propagate.

    Warm-up steps run until a step's time is within ``plan.settle_tolerance`` of the one before (between
    ``min_warmup`` and ``max_warmup`` steps); then one metered step (memory; on the CPU its dispatch mode is
    slow, so it is never timed); then measured steps until the median's 95 % interval is within
    ``target_ci`` of the median, ``budget_s`` of measuring is spent or ``max_steps`` ran, and at least
    ``min_steps`` ran and the evaluation step was reached. The step right after the evaluation is not timed.
    `should_stop` is polled after every step. With `agree_across_ranks` (DDP) every decision is agreed by an
    all-reduce: the ranks time their steps on their own clocks, and one rank leaving the warm-up or the
    measurement a step before the others would leave them waiting in a collective forever.
    """
    switch = MeterSwitch(meter, always=meter_always)
    result = TrainMeasurement(status="ok")
    trainer: Trainer | None = None

    def record(step: StepRecord) -> None:
        result.losses.append(step.loss)
        if on_record is not None:
            on_record(step)

    def agreed(choice: int) -> int:
        """`choice` (0: go on, > 0: a reason to stop) as every rank sees it: the largest any rank made."""
        if not agree_across_ranks:
            return choice
        assert trainer is not None
        tensor = torch.tensor([float(choice)], device=trainer.device)
        return int(trainer.dist.all_reduce_max(tensor).item())

    def step() -> StepRecord:
        assert trainer is not None
        done = trainer.train_step()
        if agreed(int(bool(should_stop()))):
            result.status, result.reason = "cancelled", f"cancelled after {len(result.losses)} steps"
            raise _Stopped
        if plan.eval_step is not None and trainer.step == plan.eval_step:
            result.val_loss = float(trainer.evaluate()["val_loss"])
            result.val_loss_step = trainer.step
        return done

    try:
        trainer = Trainer(config, meter=switch, callback=record)
        result.tokens_per_step = trainer.tokens_per_step
        result.samples_per_step = trainer.global_batch_size
        if config.what == "predictor":
            result.flops_per_token = train_flops_per_token(trainer.model, config.window_length - 1)
        started = time.perf_counter()
        settled = False
        while len(result.warmup_times_s) < max(plan.max_warmup, 1):
            result.warmup_times_s.append(step().step_time_s)
            times = result.warmup_times_s
            if agreed(int(len(times) >= max(plan.min_warmup, 1) and len(times) >= 2
                          and abs(times[-1] / times[-2] - 1) <= plan.settle_tolerance)):
                settled = True
                break
        result.warmup_time_s = time.perf_counter() - started
        switch.start(trainer)
        step()  # the metered step
        switch.stop()
        result.peak_memory_bytes, result.peak_bytes_by_phase = switch.peak_bytes(), switch.peaks()
        measuring, stop_reason, halfwidth = time.perf_counter(), "", float("inf")
        after_eval = False
        while True:
            times = [r["step_time_s"] for r in result.timed]
            evaluated = plan.eval_step is None or trainer.step >= plan.eval_step
            reason = 0
            if len(times) >= plan.min_steps and evaluated:
                halfwidth = relative_halfwidth(times)
                if halfwidth <= plan.target_ci:
                    reason = STOP_REASONS.index("interval")
                elif time.perf_counter() - measuring >= plan.budget_s:
                    reason = STOP_REASONS.index("budget")
                elif len(times) >= plan.max_steps:
                    reason = STOP_REASONS.index("max-steps")
            reason = agreed(reason)
            if reason:
                stop_reason = STOP_REASONS[reason]
                break
            was_eval_step = result.val_loss_step is not None and result.val_loss_step == trainer.step
            done = step()
            if was_eval_step and not after_eval:
                after_eval = True  # the first step after the evaluation pays for its cache effects: untimed
                continue
            result.timed.append(done.to_dict())
        if meter_always:
            result.peak_memory_bytes, result.peak_bytes_by_phase = switch.peak_bytes(), switch.peaks()
        result.timing = {"warmup_steps": len(result.warmup_times_s), "settled": settled,
                         "settle_tolerance": plan.settle_tolerance, "measured_steps": len(result.timed),
                         "stop": stop_reason, "ci_halfwidth": halfwidth, "target_ci": plan.target_ci,
                         "budget_s": plan.budget_s, "measure_time_s": time.perf_counter() - measuring}
        return result
    except _Stopped:
        return result
    except torch.OutOfMemoryError as error:
        result.status, result.reason = "oom", one_line(error, typed=False)
        result.peak_memory_bytes = switch.peak_bytes() or None
        result.peak_bytes_by_phase = switch.peaks()
        return result
    finally:
        switch.stop()
        if trainer is not None:
            trainer.close()
