"""The quality guard and the deltas vs the baseline.

Noise of the validation loss: the ``noise-probe`` trial trains the baseline
again from the same initial weights on the same data and validation windows,
with only the order of the training windows changed (another sampler seed).
``noise = |val_loss(noise-probe) - val_loss(baseline)|`` is what an innocent
change can move the validation loss by.

Guard: a change is flagged (and left out of the combination) when
``val_loss(change) - val_loss(baseline) > max(noise_factor x noise, floor x val_loss(baseline))``
(defaults 2 x noise and 0.5 %). Improvements never fail the guard.

Deltas are percent changes vs the baseline (a paired trial's time and
throughput deltas: its paired estimate, per token). A time/throughput delta is
marked noise unless the decision rule (decision.py) calls it faster or slower. A
memory delta is noise under MEMORY_NOISE_FRACTION; a val-loss delta when it
is within the guard's threshold.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kronos_tune.benchmark.results import Delta, TrialResult
from kronos_tune.benchmark.stats import Comparison

MEMORY_NOISE_FRACTION = 0.005


def quality_rule(noise_factor: float, floor: float) -> str:
    return (f"flag a change when val_loss(change) - val_loss(baseline) > max({noise_factor:g} x noise, "
            f"{100 * floor:g}% of val_loss(baseline)); noise = |val_loss(noise-probe) - val_loss(baseline)|, "
            f"the noise-probe being the baseline retrained from the same weights on the same windows in another "
            f"order")


@dataclass(frozen=True)
class QualityVerdict:
    """The guard's answer for one trial."""

    passed: bool
    delta: float  # val_loss - baseline val_loss (positive = worse)
    delta_pct: float
    threshold: float  # the largest tolerated worsening, absolute
    noise: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def noise_estimate(baseline_val_loss: float | None, probe_val_loss: float | None) -> float | None:
    """Run-to-run noise of the validation loss: baseline vs its re-ordered repeat (None if either is missing)."""
    if baseline_val_loss is None or probe_val_loss is None:
        return None
    return abs(probe_val_loss - baseline_val_loss)


def quality_threshold(baseline_val_loss: float, noise: float | None, noise_factor: float = 2.0,
                      floor: float = 0.005) -> float:
    """The largest worsening of the validation loss still accepted (absolute, same unit as the loss)."""
    return max(noise_factor * (noise or 0.0), floor * abs(baseline_val_loss))


def quality_guard(baseline_val_loss: float, val_loss: float, noise: float | None, noise_factor: float = 2.0,
                  floor: float = 0.005) -> QualityVerdict:
    """Pass unless the change's validation loss is worse than the baseline's by more than the threshold."""
    threshold = quality_threshold(baseline_val_loss, noise, noise_factor, floor)
    delta = val_loss - baseline_val_loss
    pct = 100.0 * delta / abs(baseline_val_loss) if baseline_val_loss else 0.0
    return QualityVerdict(passed=delta <= threshold, delta=delta, delta_pct=pct, threshold=threshold, noise=noise)


def _pct(value: float, reference: float) -> float | None:
    return None if not reference else 100.0 * (value - reference) / reference


def compute_deltas(result: TrialResult, baseline: TrialResult | None, val_threshold: float | None,
                   comparison: Comparison | None = None) -> dict[str, Delta]:
    """Percent deltas of `result` vs `baseline` for every figure both have (none unless both
    ran ok, and none for the baseline itself).

    A time or throughput delta is noise unless the decision rule's comparison (ratio of medians with its
    interval, against max(floor, drift): see decision.py) calls the trial faster or slower."""
    if baseline is None or result.name == baseline.name or baseline.status != "ok" \
            or result.status not in ("ok", "cancelled"):
        return {}
    timing_noise = comparison is None or comparison.verdict not in ("faster", "slower")
    deltas: dict[str, Delta] = {}
    paired = comparison is not None and comparison.design == "paired" and comparison.ratio > 0
    for key in ("step_time_s", "samples_per_s", "tokens_per_s", "series_per_s"):
        mine, theirs = getattr(result, key), getattr(baseline, key)
        pct = None if mine is None or theirs is None else _pct(mine.median, theirs.median)
        if pct is not None and paired:  # the paired estimate, not two medians measured at different times
            pct = 100.0 * ((comparison.ratio if key == "step_time_s" else 1 / comparison.ratio) - 1)
        if pct is not None:
            deltas[key] = Delta(pct, timing_noise)
    for key in ("projected_train_time_s", "projected_predict_time_s"):
        mine, theirs = getattr(result, key), getattr(baseline, key)
        pct = None if mine is None or theirs is None else _pct(mine, theirs)
        if pct is not None:
            deltas[key] = Delta(pct, timing_noise)
    if result.peak_memory_bytes is not None and baseline.peak_memory_bytes:
        pct = _pct(result.peak_memory_bytes, baseline.peak_memory_bytes)
        if pct is not None:
            deltas["peak_memory_bytes"] = Delta(pct, abs(pct) < 100 * MEMORY_NOISE_FRACTION)
    if result.val_loss is not None and baseline.val_loss is not None:
        pct = _pct(result.val_loss, baseline.val_loss)
        if pct is not None:
            within = val_threshold is not None and abs(result.val_loss - baseline.val_loss) <= val_threshold
            deltas["val_loss"] = Delta(pct, within)
    return deltas
