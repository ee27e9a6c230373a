"""What the training loop reports: per-step records, the run summary, the meter interface."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ContextManager, Protocol, runtime_checkable

import torch

PHASES = ("data", "forward", "backward", "optimizer", "eval")


@runtime_checkable
class PhaseMeter(Protocol):
    """A memory meter the trainer reports its phases to (kronos_tune.memory implements it).

    The trainer wraps each phase in ``with meter.phase(name):`` with name one of
    PHASES, and copies ``peaks()`` into every StepRecord.
    """

    def phase(self, name: str) -> ContextManager[None]: ...

    def peaks(self) -> dict[str, int]: ...

    def peak_bytes(self) -> int: ...

    def reset(self) -> None: ...


@dataclass
class StepRecord:
    """One optimizer step. Samples and tokens are global (all processes); times are this process's."""

    step: int
    epoch: int
    micro_steps: int
    samples: int
    tokens: int
    loss: float
    lr: float
    grad_norm: float
    data_time_s: float
    forward_time_s: float
    backward_time_s: float
    optimizer_time_s: float
    step_time_s: float
    peak_bytes_by_phase: dict[str, int] = field(default_factory=dict)
    peak_memory_bytes: int | None = None  # see Trainer.peak_bytes_seen
    skipped: bool = False  # fp16: the scaler found inf/nan gradients and skipped the update

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.step_time_s if self.step_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tokens_per_s"] = self.tokens_per_s
        out["samples_per_s"] = self.samples_per_s
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> StepRecord:
        """Back from `to_dict` (or an event carrying its fields): derived and unknown keys are dropped."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


@dataclass
class EvalRecord:
    """One evaluation: after optimizer step `step`, metrics reduced over every rank (val_loss first)."""

    step: int
    epoch: int
    metrics: dict[str, float]
    best: bool  # the lowest val_loss so far (best/ was rewritten)
    scheduled: bool  # on the eval_every / epoch schedule (False: the closing evaluation of fit)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, **self.metrics, "best": self.best,
                "scheduled": self.scheduled}


@dataclass
class TrainSummary:
    """What `Trainer.fit` did."""

    what: str
    steps: int
    total_steps: int
    epochs_completed: float
    samples: int
    tokens: int
    train_time_s: float
    last_loss: float | None
    best_val_loss: float | None
    last_eval: dict[str, float] | None
    interrupted: bool
    checkpoint_path: str | None
    best_dir: str | None
    peak_bytes_by_phase: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_time_s if self.train_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tokens_per_s"] = self.tokens_per_s
        return out


class PhaseClock:
    """Times named phases (synchronizing CUDA at both ends) and forwards them to a meter."""

    def __init__(self, device: torch.device, meter: PhaseMeter | None) -> None:
        self.device = device
        self.meter = meter
        self.seconds: dict[str, float] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def clear(self) -> None:
        self.seconds = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._sync()
        inner = self.meter.phase(name) if self.meter is not None else contextlib.nullcontext()
        start = time.perf_counter()
        with inner:
            yield
            self._sync()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def peaks(self) -> dict[str, int]:
        return dict(self.meter.peaks()) if self.meter is not None else {}
