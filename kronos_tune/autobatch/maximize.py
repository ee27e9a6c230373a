"""Use the whole card: the largest micro-batch that fits, and the learning rate for the bigger batch.

A bigger effective batch changes the optimization, so it never comes alone:

- ``sqrt`` (default, for AdamW): lr x sqrt(k) for a batch k times larger, the
  rule that keeps the update's noise scale for adaptive optimizers (Malladi et
  al., 2022, "On the SDEs and Scaling Rules for Adaptive Gradient
  Algorithms"). The one-cycle warm-up keeps its fraction of the run, i.e. the
  same number of samples.
- ``linear``: lr x k (Goyal et al., 2017, for SGD); the larger jump gets a
  longer warm-up: ``pct_start`` x sqrt(k), at most 0.3 of the run.
- ``none``: the learning rate is left as it is.

The batch is capped by the data: at least ``MIN_STEPS_PER_EPOCH`` optimizer
steps per epoch must remain.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kronos_core.train import TrainConfig
from kronos_tune.errors import KronosTuneError

LR_RULES = ("sqrt", "linear", "none")
MIN_STEPS_PER_EPOCH = 4
MAX_PCT_START = 0.3


@dataclass(frozen=True)
class BiggerBatch:
    """How the optimization changes with the batch: from/to effective batch, lr and warm-up fraction."""

    rule: str
    batch_from: int
    batch_to: int
    lr_from: float
    lr_to: float
    pct_start_from: float
    pct_start_to: float
    notes: tuple[str, ...] = ()

    @property
    def factor(self) -> float:
        return self.batch_to / self.batch_from

    def describe(self) -> str:
        return (f"effective batch {self.batch_from} -> {self.batch_to} (x{self.factor:.3g}), lr {self.lr_from:.3g} -> "
                f"{self.lr_to:.3g} ({self.rule} rule), warm-up {100 * self.pct_start_from:.3g}% -> "
                f"{100 * self.pct_start_to:.3g}% of the run")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        out["factor"] = self.factor
        return out


def check_rule(rule: str) -> str:
    if rule not in LR_RULES:
        raise KronosTuneError(f"--lr-rule {rule}: unknown rule; use one of {', '.join(LR_RULES)}")
    return rule


def data_cap(config: TrainConfig, processes: int = 1) -> int:
    """The largest effective batch per process that still gives MIN_STEPS_PER_EPOCH steps per epoch."""
    return max(1, config.samples_per_epoch // (MIN_STEPS_PER_EPOCH * processes))


def scale_for_batch(config: TrainConfig, micro_batch: int, rule: str = "sqrt", processes: int = 1
                    ) -> tuple[TrainConfig, BiggerBatch]:
    """`config` at micro-batch `micro_batch` with accumulation 1 (capped by the data), lr and warm-up by `rule`."""
    check_rule(rule)
    notes = []
    cap = data_cap(config, processes)
    batch = micro_batch
    if batch > cap:
        notes.append(f"capped at {cap} by the data: {config.samples_per_epoch} samples per epoch must give at "
                     f"least {MIN_STEPS_PER_EPOCH} optimizer steps (the memory would allow {micro_batch})")
        batch = cap
    before = config.batch_size * config.accumulation_steps
    factor = batch / before
    lr = config.effective_lr
    pct = config.pct_start
    if rule == "sqrt":
        new_lr, new_pct = lr * math.sqrt(factor), pct
    elif rule == "linear":
        new_lr, new_pct = lr * factor, min(MAX_PCT_START, pct * math.sqrt(max(factor, 1.0)))
    else:
        new_lr, new_pct = lr, pct
    scaled = config.replace(batch_size=batch, accumulation_steps=1, lr=new_lr, pct_start=new_pct)
    return scaled, BiggerBatch(rule, before, batch, lr, new_lr, pct, new_pct, tuple(notes))

