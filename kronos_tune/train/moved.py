"""How far a `kronos-tune train` run moved its model from where it started.

A finetune can end with weights that barely changed (a low learning rate, few steps): its loss curve looks
like training, and nothing says so. So the job evaluates the model before its first step (a fresh run only;
the per-batch sums go to ``start_eval.json`` in the stage's folder, which a resumed run reads back) and again
at the end, on the same validation windows, and reports both losses with the change and its noise.

The noise is the evaluation's own: each validation batch gives a loss at the start and at the end, the
change is their token-weighted mean (the difference of the two reported losses), and its 95% interval is
the normal approximation over the batches' paired differences (``paired_interval``). The benchmark compares
each trial with its baseline by the same statistic, over validation windows (kronos_tune/benchmark/quality.py);
it does not evaluate a trial's start (two extra evaluations would change what it times).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_core.files import write_text_atomic

if TYPE_CHECKING:
    from kronos_core.train import Trainer

START_FILE = "start_eval.json"


@dataclass(frozen=True)
class Movement:
    """The validation loss at the start and at the end, and the 95% interval of end - start (None: one batch,
    or the windows differ from the start's)."""

    start_step: int
    start_loss: float
    end_step: int
    end_loss: float
    low: float | None
    high: float | None
    batches: int

    @property
    def change(self) -> float:
        return self.end_loss - self.start_loss

    def verdict(self) -> str:
        if self.low is None or self.high is None:
            return "noise unknown"
        if self.high < 0:
            return "lower than at the start, beyond the evaluation's noise"
        if self.low > 0:
            return "higher than at the start, beyond the evaluation's noise"
        return "within the evaluation's noise: the model barely moved from its start"

    def line(self) -> str:
        where = (f"val loss {self.start_loss:.4f} at step {self.start_step}, {self.end_loss:.4f} at step "
                 f"{self.end_step}: {self.change:+.4f}")
        if self.low is None or self.high is None:
            return f"{where} ({self.verdict()}: {self.batches} evaluation batch(es))"
        return (f"{where} (95% interval {self.low:+.4f} to {self.high:+.4f} over {self.batches} evaluation "
                f"batches), {self.verdict()}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "change": self.change, "verdict": self.verdict()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Movement:
        return cls(**{spec.name: values[spec.name] for spec in fields(cls)})


def _batches(trainer: Trainer) -> list[list[float]]:
    """[loss, weight] of each validation batch (weight: its tokens, or elements for the tokenizer)."""
    found = []
    for sums in trainer.evaluate_by_batch():
        found.append([trainer.steps.eval_metrics(sums)["val_loss"], float(sums[-1])])
    return found


def record_start(trainer: Trainer, folder: Path) -> None:
    """Evaluate a fresh run's model before its first step, into `folder`/start_eval.json (kept as it is
    when there: a resumed run compares with its real start)."""
    if trainer.step != 0 or (folder / START_FILE).is_file():
        return
    write_text_atomic(folder / START_FILE, json.dumps({"step": 0, "batches": _batches(trainer)}) + "\n")


def _mean(pairs: list[list[float]]) -> float:
    weight = sum(w for _, w in pairs)
    return sum(loss * w for loss, w in pairs) / weight


def paired_interval(before: list[list[float]], after: list[list[float]]) -> tuple[float, float, float] | None:
    """The weighted mean change after - before of paired [loss, weight] parts (evaluation batches, or the
    benchmark's validation windows) and its 95% interval (low, high): the normal approximation over the parts'
    paired differences. None when the parts do not pair (other counts or weights) or there is only one."""
    from scipy.stats import norm

    paired = len(before) == len(after) and all(b[1] == a[1] for b, a in zip(before, after))
    if not paired or len(after) < 2:
        return None
    total = sum(w for _, w in after)
    diffs = [(a[0] - b[0], a[1] / total) for b, a in zip(before, after)]
    change = sum(d * share for d, share in diffs)
    n = len(diffs)
    spread = math.sqrt(n / (n - 1) * sum((share * (d - change)) ** 2 for d, share in diffs))
    z = float(norm.ppf(0.975))  # two-sided 95%
    return change, change - z * spread, change + z * spread


def measure(trainer: Trainer, folder: Path) -> Movement | None:
    """The movement from the recorded start to the model as it is now (None: no start was recorded)."""
    try:
        start = json.loads((folder / START_FILE).read_text())
    except (OSError, ValueError):
        return None
    before, after = start["batches"], _batches(trainer)
    interval = paired_interval(before, after)
    low, high = (None, None) if interval is None else interval[1:]
    return Movement(int(start["step"]), _mean(before), trainer.step, _mean(after), low, high, len(after))
