"""The quality guard and the deltas vs the baseline.

Every train trial is evaluated after the same optimizer step on the same validation windows, window by window
(train/measure.py: ``val_windows``). A trial is compared with the baseline *paired per window*: the
token-weighted mean of the windows' differences is the change of the validation loss, and its 95% interval is
the normal approximation over those differences, the statistic ``kronos-tune train`` reports for how far a
model moved (kronos_tune/train/moved.py: ``paired_interval``). Relative figures are over the baseline's loss.

The A/A check: the ``noise-probe`` trains the baseline again from the same initial weights on the same windows,
only the order of the training windows changed (another sampler seed). Compared the same way, its interval
should contain 0; how far it reaches from 0 is the run's *quality resolution*: a change of the validation
loss smaller than that could not be seen (it holds both the evaluation's noise and the training order's).

Guard: a change is flagged (and left out of the combination) when the low end of its interval lies above the
tolerated worsening, ``max(floor, resolution)`` (floor 0.5% by default): worse beyond doubt, by more than the
run can resolve. Improvements never fail the guard. The A/A itself is flagged when its interval lies above
the floor alone (the two orders of one configuration differ beyond it). Results kept before per-window losses
were recorded fall back to the old repeat rule: ``val_loss(change) - val_loss(baseline) > max(noise_factor x
|val_loss(noise-probe) - val_loss(baseline)|, floor x val_loss(baseline))``.

Deltas are percent changes vs the baseline (a paired trial's time and
throughput deltas: its paired estimate, per token). A time/throughput delta is
marked noise unless the decision rule (decision.py) calls it faster or slower. A
memory delta is noise under MEMORY_NOISE_FRACTION; a val-loss delta when it
is within the guard's threshold.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kronos_tune.benchmark.results import NOISE_PROBE, Delta, TrialResult
from kronos_tune.benchmark.stats import Comparison
from kronos_tune.train.moved import paired_interval

MEMORY_NOISE_FRACTION = 0.005


def quality_rule(noise_factor: float, floor: float, paired: bool = True) -> str:
    if paired:
        return (f"val loss of each trial vs the baseline's on the same validation windows, paired per window (the "
                f"token-weighted mean change with its 95% interval); flag a change when its interval lies above the "
                f"tolerated worsening max({100 * floor:g}%, the quality resolution), the resolution being how far "
                f"the A/A comparison's interval (the noise-probe: the baseline retrained from the same weights on "
                f"the same windows in another order) reaches from 0")
    return (f"flag a change when val_loss(change) - val_loss(baseline) > max({noise_factor:g} x noise, "
            f"{100 * floor:g}% of val_loss(baseline)); noise = |val_loss(noise-probe) - val_loss(baseline)|, "
            f"the noise-probe being the baseline retrained from the same weights on the same windows in another "
            f"order")


@dataclass(frozen=True)
class WindowComparison:
    """A trial's validation loss against the baseline's on the same windows, paired per window: the change
    (token-weighted mean of the windows' differences, = the difference of the two losses) and its 95% interval,
    absolute; ``*_rel`` over the baseline's loss."""

    change: float
    low: float
    high: float
    base_loss: float
    windows: int

    def _rel(self, value: float) -> float:
        return value / abs(self.base_loss) if self.base_loss else 0.0

    @property
    def change_rel(self) -> float:
        return self._rel(self.change)

    @property
    def low_rel(self) -> float:
        return self._rel(self.low)

    @property
    def high_rel(self) -> float:
        return self._rel(self.high)

    @property
    def reach(self) -> float:
        """How far the interval reaches from 0, relative: for the A/A comparison, the quality resolution."""
        return max(abs(self.low_rel), abs(self.high_rel))

    def interval_text(self) -> str:
        return (f"{100 * self.change_rel:+.2f}% [{100 * self.low_rel:+.2f}%, {100 * self.high_rel:+.2f}%] over "
                f"{self.windows} windows")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "change_pct": 100 * self.change_rel, "low_pct": 100 * self.low_rel,
                "high_pct": 100 * self.high_rel, "reach_pct": 100 * self.reach}


def compare_windows(base: TrialResult | None, trial: TrialResult | None) -> WindowComparison | None:
    """`trial`'s validation loss against `base`'s, paired per window (None: either has no per-window losses, or
    they were not evaluated on the same windows)."""
    if base is None or trial is None or base.val_loss is None or not base.val_windows or not trial.val_windows:
        return None
    interval = paired_interval(base.val_windows, trial.val_windows)
    if interval is None:
        return None
    change, low, high = interval
    return WindowComparison(change, low, high, base.val_loss, len(trial.val_windows))


def quality_resolution(base: TrialResult | None, probe: TrialResult | None
                       ) -> tuple[float | None, WindowComparison | None]:
    """The A/A comparison (the noise-probe against the baseline, per window) and how far its interval reaches
    from 0, relative: the smallest change of the validation loss this run can see (None, None: no A/A)."""
    if probe is None or probe.status not in ("ok", "cancelled"):
        return None, None
    aa = compare_windows(base, probe)
    return (None, None) if aa is None else (aa.reach, aa)


def tolerated_worsening(floor: float, resolution: float | None) -> float:
    """The largest relative worsening of the validation loss the guard accepts: max(floor, resolution)."""
    return max(floor, resolution or 0.0)


@dataclass(frozen=True)
class QualityVerdict:
    """The guard's answer for one trial. ``method``: "windows" (paired per window; ``low_pct``/``high_pct``
    its interval, ``noise`` the resolution as an absolute loss) or "repeat" (results without per-window losses:
    one repeat's |difference| as ``noise``)."""

    passed: bool
    delta: float  # val_loss - baseline val_loss (positive = worse)
    delta_pct: float
    threshold: float  # the largest tolerated worsening, absolute
    noise: float | None
    method: str = "repeat"
    low_pct: float | None = None
    high_pct: float | None = None
    windows: int | None = None
    threshold_pct: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.method == "windows" and self.low_pct is not None and self.high_pct is not None:
            where = "above" if not self.passed else "not above"
            out["text"] = (f"val loss {self.delta_pct:+.2f}% [{self.low_pct:+.2f}%, {self.high_pct:+.2f}%] over "
                           f"{self.windows} windows, {where} the tolerated +{self.threshold_pct:.2f}%")
        return out


def noise_estimate(baseline_val_loss: float | None, probe_val_loss: float | None) -> float | None:
    """Run-to-run noise of the validation loss: baseline vs its re-ordered repeat (None if either is missing)."""
    if baseline_val_loss is None or probe_val_loss is None:
        return None
    return abs(probe_val_loss - baseline_val_loss)


def quality_threshold(baseline_val_loss: float, noise: float | None, noise_factor: float = 2.0,
                      floor: float = 0.005) -> float:
    """The repeat rule's largest worsening of the validation loss still accepted (absolute)."""
    return max(noise_factor * (noise or 0.0), floor * abs(baseline_val_loss))


def quality_guard(baseline_val_loss: float, val_loss: float, noise: float | None, noise_factor: float = 2.0,
                  floor: float = 0.005) -> QualityVerdict:
    """The repeat rule: pass unless the change's validation loss is worse than the baseline's by more than the
    threshold (results without per-window losses)."""
    threshold = quality_threshold(baseline_val_loss, noise, noise_factor, floor)
    delta = val_loss - baseline_val_loss
    pct = 100.0 * delta / abs(baseline_val_loss) if baseline_val_loss else 0.0
    return QualityVerdict(passed=delta <= threshold, delta=delta, delta_pct=pct, threshold=threshold, noise=noise)


def guard_trial(base: TrialResult | None, trial: TrialResult, probe: TrialResult | None,
                noise_factor: float = 2.0, floor: float = 0.005) -> QualityVerdict | None:
    """The guard's verdict on `trial` against `base`, the noise-probe `probe` being the A/A check (None: the
    baseline or the trial has no validation loss)."""
    if base is None or base.val_loss is None or trial.val_loss is None:
        return None
    windows = compare_windows(base, trial)
    if windows is None:
        probe_loss = probe.val_loss if probe is not None and probe.status == "ok" else None
        return quality_guard(base.val_loss, trial.val_loss, noise_estimate(base.val_loss, probe_loss),
                             noise_factor, floor)
    resolution, _ = quality_resolution(base, probe)
    return windows_verdict(windows, tolerated_worsening(floor, resolution), resolution)


def windows_verdict(windows: WindowComparison, tolerance: float, resolution: float | None) -> QualityVerdict:
    """Passed unless the interval's low end lies above `tolerance` (relative worsening)."""
    base_loss = abs(windows.base_loss)
    return QualityVerdict(passed=windows.low_rel <= tolerance, delta=windows.change,
                          delta_pct=100 * windows.change_rel, threshold=tolerance * base_loss,
                          noise=None if resolution is None else resolution * base_loss, method="windows",
                          low_pct=100 * windows.low_rel, high_pct=100 * windows.high_rel, windows=windows.windows,
                          threshold_pct=100 * tolerance)


def guard_all(trials: list[TrialResult], base: TrialResult | None, probe: TrialResult | None,
              noise_factor: float = 2.0, floor: float = 0.005) -> dict[str, Any]:
    """Set every single and combined trial's guard verdict (``quality``); return the report's quality figures:
    the rule, the resolution and the A/A comparison (``aa``, its ``flagged`` when its interval lies above the
    floor), the tolerated worsening (``threshold``, absolute, and ``threshold_pct``) and the repeat rule's
    ``noise`` where the results carry no per-window losses."""
    resolution, aa = quality_resolution(base, probe)
    paired = base is not None and bool(base.val_windows)
    noise = None
    if base is not None and probe is not None and base.status == "ok" and probe.status == "ok":
        noise = noise_estimate(base.val_loss, probe.val_loss)
    threshold = None
    if base is not None and base.val_loss is not None:
        threshold = (tolerated_worsening(floor, resolution) * abs(base.val_loss) if paired else
                     quality_threshold(base.val_loss, noise, noise_factor, floor))
        for trial in trials:
            if trial.stage in ("single", "combined") and trial.val_loss is not None:
                verdict = guard_trial(base, trial, probe, noise_factor, floor)
                trial.quality = None if verdict is None else verdict.to_dict()
    if aa is not None and probe is not None:  # the A/A check, against the floor alone
        probe.quality = windows_verdict(aa, floor, resolution).to_dict()
    return {"rule": quality_rule(noise_factor, floor, paired), "method": "windows" if paired else "repeat",
            "noise": noise, "noise_source": NOISE_PROBE if noise is not None or aa is not None else None,
            "resolution": None if resolution is None or base is None or base.val_loss is None else
            resolution * abs(base.val_loss),
            "resolution_pct": None if resolution is None else 100 * resolution,
            "aa": None if aa is None else {**aa.to_dict(), "flagged": aa.low_rel > floor},
            "threshold": threshold,
            "threshold_pct": None if threshold is None or base is None or not base.val_loss else
            100 * threshold / abs(base.val_loss),
            "noise_factor": noise_factor, "floor": floor}


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
