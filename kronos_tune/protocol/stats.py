"""Timing statistics that survive outliers and drift.

The protocol decides "faster / slower / the same" from the ratio of two
medians (a trial's step times over the baseline's) and a confidence interval
of that ratio, never from [min, max] overlap: one slow step (a page fault, a
garbage collection, a neighbour's burst) moves the max but barely the median.

- ``median_ci``: a distribution-free interval for one median from order
  statistics (binomial), used to decide when enough steps were measured.
- ``ratio_ci``: a percentile bootstrap of median(a) / median(b) with a fixed
  seed (the same samples always give the same interval).
- ``compare``: the verdict against a threshold ``max(floor, drift)``: faster
  only when the interval lies below 1 and the ratio itself is beyond the
  threshold; "unresolved" when the interval reaches past the threshold on
  both sides (the samples cannot tell).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 20261130
VERDICTS = ("faster", "slower", "same", "unresolved")


def quantiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3) with linear interpolation."""
    values = np.asarray(samples, dtype=float)
    q1, median, q3 = np.quantile(values, [0.25, 0.5, 0.75])
    return float(q1), float(median), float(q3)


def _binomial_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def median_ci(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free interval for the median: the order statistics x(j), x(n-j+1) with the largest j
    whose coverage 1 - 2 P(Binom(n, 1/2) <= j - 1) is still >= confidence. Below 6 samples no such j exists
    at 95 %, and the interval is [min, max]."""
    values = sorted(float(v) for v in samples)
    n = len(values)
    if n == 0:
        raise ValueError("median_ci of no samples")
    j = 0
    while j + 1 <= n // 2 and 1 - 2 * _binomial_cdf(j, n) >= confidence:
        j += 1
    if j == 0:
        return values[0], values[-1]
    return values[j - 1], values[n - j]


def relative_halfwidth(samples: Sequence[float], confidence: float = CONFIDENCE) -> float:
    """Half the width of the median's interval, as a fraction of the median (inf for a zero median)."""
    low, high = median_ci(samples, confidence)
    median = float(np.median(np.asarray(samples, dtype=float)))
    return (high - low) / 2 / median if median > 0 else math.inf


def ratio_ci(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE,
             resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """median(a) / median(b) and its percentile-bootstrap interval (each sample resampled on its own)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        raise ValueError("ratio_ci needs samples on both sides")
    ratio = float(np.median(x) / np.median(y))
    rng = np.random.default_rng(seed)
    mx = np.median(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1)
    my = np.median(y[rng.integers(0, y.size, size=(resamples, y.size))], axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(mx / my, [tail, 1 - tail])
    return ratio, float(low), float(high)


@dataclass(frozen=True)
class Comparison:
    """A trial's typical step time against the baseline's.

    ``ratio`` = median(trial) / median(baseline); ``low``/``high`` its interval (None when only medians were
    kept, as in results written before raw samples were stored); ``threshold``: the relative change that
    counts (max(floor, drift)); ``verdict``: faster | slower | same | unresolved."""

    ratio: float
    low: float | None
    high: float | None
    threshold: float
    verdict: str
    n: int
    n_reference: int
    method: str

    @property
    def pct(self) -> float:
        return 100.0 * (self.ratio - 1.0)

    def interval_text(self) -> str:
        if self.low is None or self.high is None:
            return "no interval: raw step times were not kept"
        return f"95% interval {100 * (self.low - 1):+.1f}% to {100 * (self.high - 1):+.1f}%"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Comparison | None:
        return None if data is None else cls(**data)


def verdict(ratio: float, low: float | None, high: float | None, threshold: float) -> str:
    if low is None or high is None:  # medians only
        if ratio <= 1 - threshold:
            return "faster"
        return "slower" if ratio >= 1 + threshold else "same"
    if high < 1 and ratio <= 1 - threshold:
        return "faster"
    if low > 1 and ratio >= 1 + threshold:
        return "slower"
    if low < 1 - threshold and high > 1 + threshold:
        return "unresolved"
    return "same"


def compare(samples: Sequence[float] | None, reference: Sequence[float] | None, threshold: float,
            median: float | None = None, reference_median: float | None = None,
            confidence: float = CONFIDENCE) -> Comparison | None:
    """Compare step-time samples with the reference's; with no samples on either side, the given medians
    (a verdict from the ratio alone). None when there is nothing to compare."""
    if samples and reference:
        ratio, low, high = ratio_ci(samples, reference, confidence)
        return Comparison(ratio, low, high, threshold, verdict(ratio, low, high, threshold), len(samples),
                          len(reference), f"ratio of medians, {100 * confidence:g}% bootstrap interval")
    if median is None or reference_median is None or reference_median <= 0:
        return None
    ratio = median / reference_median
    return Comparison(ratio, None, None, threshold, verdict(ratio, None, None, threshold),
                      len(samples or ()), len(reference or ()), "ratio of medians only (no raw step times)")
