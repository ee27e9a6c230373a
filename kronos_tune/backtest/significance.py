"""Is a per-origin mean more than noise? Newey-West (HAC) tests over origins, from statsmodels.

Every test here is the mean of one number per origin (an IC, a hit rate, a loss differential): the ordinary
least squares fit of that series on a constant, with statsmodels' HAC covariance (Bartlett kernel,
``maxlags`` = the lag below, no small-sample scaling of the covariance: ``cov_type="HAC"`` and its other
defaults), so anyone can recompute the t-statistic. The lag is the overlap of neighbouring horizons:
``ceil(pred_len / every) - 1`` with ``every`` in bars; the realized returns of origins closer than that share
bars, and so do their scores.

The p-value and the 95 % interval take a small-sample correction: the Student t distribution with
``floor(n / (2 lag + 1)) - 1`` degrees of freedom (the number of disjoint Bartlett windows of 2 lag + 1 origins
among the n, less one; n - 1 when nothing overlaps). At 40 origins with pred-len 5 every 2 (lag 2), a pure-noise
forecaster whose horizons overlap as the realized returns do was found significant at 5 % in 11.5 % of 200 runs
with the normal distribution and 11.0 % with t at n - 1 degrees of freedom (the Bartlett weights
1 - j / (lag + 1) undercount the overlap's covariance), 5.0 % with this correction (benchmarks/skill.py).
The origins a non-significant mean would need are the smallest n at which the same mean and long-run spread
(HAC standard error x sqrt(n)) reach p = 0.05.

statsmodels is the optional ``[stats]`` extra (SciPy a dependency), imported here only, when a test runs;
without it every test is "not available" with that reason, the backtest warns once with the install command,
and the rest of it is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kronos_core.optional import missing

LEVEL = 0.05
MAX_ORIGINS_NEEDED = 1_000_000


def hac_lag(pred_len: int, every_bars: float) -> int:
    """Origins whose horizons overlap a given one's, on one side: ceil(pred_len / every) - 1, at least 0."""
    return max(0, math.ceil(pred_len / every_bars - 1e-9) - 1)


MIN_DEGREES_OF_FREEDOM = 3  # below, the critical t (4.3 at 2, 12.7 at 1) makes every interval meaningless


def min_origins(lag: int) -> int:
    """The fewest origins a test at `lag` is given on: four disjoint Bartlett windows of 2 lag + 1 origins
    (three degrees of freedom)."""
    return (MIN_DEGREES_OF_FREEDOM + 1) * (2 * lag + 1)


def degrees_of_freedom(n: int, lag: int) -> int:
    """The small-sample correction's degrees of freedom (see the module doc)."""
    return max(1, n // (2 * lag + 1) - 1)


def missing_stats() -> str | None:
    """Why the tests are not available when statsmodels cannot be imported, else None."""
    return missing("stats", "statsmodels.regression.linear_model")


@dataclass(frozen=True)
class MeanTest:
    """The mean of a per-origin series against `null`, with its HAC standard error, t, p and 95 % interval.

    `reason` says why the test is not available (too few origins, no variation, no statsmodels); then
    se, t, p and the interval are None."""

    mean: float
    n: int
    lag: int
    null: float = 0.0
    se: float | None = None
    t: float | None = None
    p: float | None = None
    low: float | None = None
    high: float | None = None
    origins_needed: int | None = None  # when not significant: origins for p = 0.05 at this mean and spread
    reason: str | None = None

    @property
    def significant(self) -> bool:
        return self.p is not None and self.p < LEVEL

    def to_dict(self) -> dict[str, Any]:
        out = {"mean": self.mean, "n": self.n, "lag": self.lag, "se": self.se, "t": self.t, "p": self.p,
               "ci95": None if self.low is None else [self.low, self.high], "significant": self.significant}
        if self.null:
            out["null"] = self.null
        if self.origins_needed is not None:
            out["origins_needed"] = self.origins_needed
        if self.reason is not None:
            out["not_available"] = self.reason
        return out

    def brief(self) -> str:
        """'t = 1.20, p = 0.23; about 70 origins would be needed', or why it is not available."""
        if self.reason is not None:
            return f"not available: {self.reason}"
        text = f"t = {self.t:.2f}, {p_text(self.p)}"
        if self.origins_needed is not None:
            text += f"; {needed_text(self.origins_needed)}"
        return text


def format_p(p: float | None) -> str:
    if p is None:
        return "n/a"
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.01 else f"{p:.2f}"


def p_text(p: float | None) -> str:
    """'p = 0.23', 'p = 0.004' or 'p < 0.001'."""
    shown = format_p(p)
    return f"p {shown}" if shown.startswith("<") else f"p = {shown}"


def needed_text(origins: int) -> str:
    if origins >= MAX_ORIGINS_NEEDED:
        return f"more than {MAX_ORIGINS_NEEDED:,} origins would be needed"
    return f"about {origins:,} origins would be needed"


def critical_t(n: int, lag: int) -> float:
    """The two-sided 5 % critical value of the corrected t distribution."""
    from scipy import stats

    return float(stats.t.ppf(1 - LEVEL / 2, degrees_of_freedom(n, lag)))


def origins_needed(mean: float, long_run_sd: float, n: int, lag: int) -> int:
    """The fewest origins (> n) at which |mean| / (long_run_sd / sqrt(N)) reaches the 5 % critical t; the
    statistic grows and the critical value falls with N, so a doubling then a bisection finds it."""
    if mean == 0 or not math.isfinite(mean) or not long_run_sd > 0:
        return MAX_ORIGINS_NEEDED

    def enough(count: int) -> bool:
        return abs(mean) * math.sqrt(count) / long_run_sd >= critical_t(count, lag)

    low, high = n, max(n + 1, 2 * n)
    while not enough(high):
        if high >= MAX_ORIGINS_NEEDED:
            return MAX_ORIGINS_NEEDED
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def hac_mean_test(values: Any, lag: int, null: float = 0.0, bounds: tuple[float, float] | None = None,
                  what: str = "origins") -> MeanTest:
    """Test the mean of `values` (one per origin, in time order; NaNs left out) against `null`; `bounds` clip
    the interval to the values the mean can take (a rate's [0, 1])."""
    series = np.asarray(values, dtype=np.float64)
    series = series[np.isfinite(series)]
    n = len(series)
    mean = float(series.mean()) if n else math.nan
    base = dict(mean=mean, n=n, lag=lag, null=null)
    needed = min_origins(lag)
    if n < needed:
        return MeanTest(**base, reason=f"{n} {what} with a finite value; a HAC estimate at lag {lag} needs at "
                                       f"least {needed} (more --origins, or a larger --every)")
    if float(np.ptp(series)) == 0.0:
        return MeanTest(**base, reason=f"the series does not vary (every one of the {n} {what} is {mean:.6g})")
    unavailable = missing_stats()
    if unavailable is not None:
        return MeanTest(**base, reason=unavailable)
    from statsmodels.regression.linear_model import OLS

    from scipy import stats

    fit = OLS(series - null, np.ones(n)).fit(cov_type="HAC", cov_kwds={"maxlags": lag})
    se, t = float(fit.bse[0]), float(fit.tvalues[0])
    p = float(2 * stats.t.sf(abs(t), degrees_of_freedom(n, lag)))
    half = critical_t(n, lag) * se
    needed = origins_needed(mean - null, se * math.sqrt(n), n, lag) if p >= LEVEL else None
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return MeanTest(**base, se=se, t=t, p=p, low=low, high=high, origins_needed=needed)


def conventions(lag: int, pred_len: int, every_bars: float) -> dict[str, Any]:
    """How the tests are defined, for backtest.json."""
    return {
        "test": "mean of a per-origin series: statsmodels OLS of the series on a constant, cov_type='HAC', "
                f"cov_kwds={{'maxlags': {lag}}} (Bartlett kernel, no covariance correction); t = mean / HAC se",
        "lag": f"ceil(pred_len / every) - 1 = ceil({pred_len} / {every_bars:g}) - 1 = {lag} (every in bars): "
               "origins whose horizons overlap",
        "p_value": "two-sided, Student t with floor(n / (2 lag + 1)) - 1 degrees of freedom (a small-sample "
                   "correction: Newey-West with the normal distribution, or t with n - 1, over-rejects a true null "
                   "at a few dozen overlapping origins)",
        "ci95": "mean +- t(0.975, floor(n / (2 lag + 1)) - 1) x HAC se",
        "origins_needed": "for p >= 0.05: the smallest n at which the same mean and long-run spread "
                          "(HAC se x sqrt(origins)) reach p = 0.05",
        "min_origins": f"a test needs at least 4 x (2 lag + 1) = {min_origins(lag)} origins with a value (3 "
                       "degrees of freedom); with fewer it is reported as not available, with the reason",
        "bounds": "an interval of a hit rate is clipped to [0, 1]",
        "ic_t": "ic_t / rank_ic_t stay the plain mean / (std / sqrt(origins)) that ignores overlap; "
                "skill.ic / skill.rank_ic hold the HAC test",
    }
