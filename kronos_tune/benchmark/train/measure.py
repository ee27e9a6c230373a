"""One training trial, measured: warm-up until settled, a metered step, measured steps until the median is
known well enough, and the validation loss at a fixed optimizer step (window by window).

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
from kronos_tune.benchmark.stats import relative_halfwidth

StepCallback = Callable[[StepRecord], None]


@dataclass(frozen=True)
class TrialSteps:
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
    def from_dict(cls, data: dict[str, Any]) -> TrialSteps:
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
    val_windows: list[list[float]] = field(default_factory=list)  # [loss, tokens] of each validation window
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


def evaluate_windows(trainer: Trainer) -> tuple[float, list[list[float]]]:
    """The validation loss and [loss, tokens] of every validation window (one batched evaluation): the baseline
    and a trial are compared window by window on the same windows (quality.py)."""
    rows = trainer.evaluate_by_window()
    loss = float(trainer.steps.eval_metrics(rows.sum(0))["val_loss"])
    return loss, [[float(trainer.steps.eval_metrics(row)["val_loss"]), float(row[-1])] for row in rows]


class TrialSession:
    """One trial's trainer, measured in parts: ``warm_up`` (warm-up until settled, then the metered step),
    then either ``measure`` (the sequential design: measured steps until the median is known well enough) or
    ``block`` calls (the paired design: a few timed steps at a time, alternating with the baseline's), then
    ``finish`` (trained on to the evaluation step if the steps so far did not reach it).

    The validation loss is taken right after the optimizer step ``steps.eval_step``, wherever that falls; the
    step after an evaluation pays for its cache effects and is never timed. With `agree_across_ranks` (DDP)
    every decision is agreed by an all-reduce: the ranks time their steps on their own clocks, and one rank
    leaving the warm-up or the measurement a step before the others would leave them waiting in a collective
    forever. Out-of-memory, cancel and every other error are the caller's (``run`` below turns the first two
    into the measurement's status)."""

    def __init__(self, config: TrainConfig, meter: Any | None, steps: TrialSteps,
                 on_record: StepCallback | None = None, should_stop: Callable[[], bool] = lambda: False,
                 meter_always: bool = False, agree_across_ranks: bool = False) -> None:
        self.config, self.steps, self.on_record, self.should_stop = config, steps, on_record, should_stop
        self.agree_across_ranks, self.meter_always = agree_across_ranks, meter_always
        self.switch = MeterSwitch(meter, always=meter_always)
        self.result = TrainMeasurement(status="ok")
        self.trainer: Trainer | None = None
        self._last: StepRecord | None = None

    # Steps -------------------------------------------------------------------------------------------------
    def open(self) -> None:
        self.trainer = Trainer(self.config, meter=self.switch, callback=self._keep)
        self.result.tokens_per_step = self.trainer.tokens_per_step
        self.result.samples_per_step = self.trainer.global_batch_size
        if self.config.what == "predictor":
            self.result.flops_per_token = train_flops_per_token(self.trainer.model, self.config.window_length - 1)

    def _keep(self, record: StepRecord) -> None:
        self._last = record

    def agreed(self, choice: int) -> int:
        """`choice` (0: go on, > 0: a reason to stop) as every rank sees it: the largest any rank made."""
        if not self.agree_across_ranks:
            return choice
        assert self.trainer is not None
        tensor = torch.tensor([float(choice)], device=self.trainer.device)
        return int(self.trainer.dist.all_reduce_max(tensor).item())

    def step(self) -> StepRecord:
        """One optimizer step (its record); evaluates at the evaluation step, then runs the next step untimed."""
        trainer = self.trainer
        assert trainer is not None
        record = self._one()
        if self.steps.eval_step is not None and trainer.step == self.steps.eval_step:
            self.result.val_loss, self.result.val_windows = evaluate_windows(trainer)
            self.result.val_loss_step = trainer.step
            self._one()  # after the evaluation: its cache effects, never timed
        return record

    def _one(self) -> StepRecord:
        trainer = self.trainer
        assert trainer is not None
        trainer.train_step()
        record = self._last
        assert record is not None
        self.result.losses.append(record.loss)
        if self.on_record is not None:
            self.on_record(record)
        if self.agreed(int(bool(self.should_stop()))):
            self.result.status, self.result.reason = "cancelled", f"cancelled after {len(self.result.losses)} steps"
            raise _Stopped
        return record

    # The parts of a trial ----------------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Warm-up steps until a step's time is within ``steps.settle_tolerance`` of the one before (between
        ``min_warmup`` and ``max_warmup`` steps), then one metered step (memory; on the CPU its dispatch mode is
        slow, so it is never timed)."""
        steps, result = self.steps, self.result
        assert self.trainer is not None
        started = time.perf_counter()
        settled = False
        while len(result.warmup_times_s) < max(steps.max_warmup, 1):
            result.warmup_times_s.append(self.step().step_time_s)
            times = result.warmup_times_s
            if self.agreed(int(len(times) >= max(steps.min_warmup, 1) and len(times) >= 2
                               and abs(times[-1] / times[-2] - 1) <= steps.settle_tolerance)):
                settled = True
                break
        result.warmup_time_s = time.perf_counter() - started
        result.timing = {"warmup_steps": len(result.warmup_times_s), "settled": settled,
                         "settle_tolerance": steps.settle_tolerance}
        self.switch.start(self.trainer)
        self.step()  # the metered step
        self.switch.stop()
        result.peak_memory_bytes, result.peak_bytes_by_phase = self.switch.peak_bytes(), self.switch.peaks()

    def measure(self) -> None:
        """The sequential design's measured steps: until the median's 95 % interval is within ``target_ci`` of
        the median, ``budget_s`` of measuring is spent or ``max_steps`` ran, and at least ``min_steps`` ran and
        the evaluation step was reached."""
        steps, result, trainer = self.steps, self.result, self.trainer
        assert trainer is not None
        measuring, stop_reason, halfwidth = time.perf_counter(), "", float("inf")
        while True:
            times = [r["step_time_s"] for r in result.timed]
            evaluated = steps.eval_step is None or trainer.step >= steps.eval_step
            reason = 0
            if len(times) >= steps.min_steps and evaluated:
                halfwidth = relative_halfwidth(times)
                if halfwidth <= steps.target_ci:
                    reason = STOP_REASONS.index("interval")
                elif time.perf_counter() - measuring >= steps.budget_s:
                    reason = STOP_REASONS.index("budget")
                elif len(times) >= steps.max_steps:
                    reason = STOP_REASONS.index("max-steps")
            reason = self.agreed(reason)
            if reason:
                stop_reason = STOP_REASONS[reason]
                break
            result.timed.append(self.step().to_dict())
        result.timing.update({"measured_steps": len(result.timed), "stop": stop_reason, "ci_halfwidth": halfwidth,
                              "target_ci": steps.target_ci, "budget_s": steps.budget_s,
                              "measure_time_s": time.perf_counter() - measuring})

    def block(self, count: int) -> list[StepRecord]:
        """`count` timed steps of the paired design (an evaluation among them adds its untimed step)."""
        return [self.step() for _ in range(max(1, count))]

    def finish(self) -> None:
        """Train on (untimed) to the evaluation step when the steps so far did not reach it."""
        trainer = self.trainer
        assert trainer is not None
        while self.steps.eval_step is not None and trainer.step < self.steps.eval_step:
            self.step()
        if self.meter_always:
            self.result.peak_memory_bytes = self.switch.peak_bytes()
            self.result.peak_bytes_by_phase = self.switch.peaks()

    def run(self, *parts: Callable[[], Any]) -> TrainMeasurement:
        """Run `parts` in order; out-of-memory (real or simulated) and a cancel end them as the result's status."""
        try:
            for part in parts:
                part()
        except _Stopped:
            pass
        except torch.OutOfMemoryError as error:
            self.result.status, self.result.reason = "oom", one_line(error, typed=False)
            self.result.peak_memory_bytes = self.switch.peak_bytes() or None
            self.result.peak_bytes_by_phase = self.switch.peaks()
        finally:
            self.switch.stop()
        return self.result

    def close(self) -> None:
        self.switch.stop()
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None

