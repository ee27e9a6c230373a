"""Timing statistics that survive outliers and drift.

The benchmark decides "faster / slower / the same" from the ratio of two
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
  both sides (the samples cannot tell). This is the *sequential* design: two
  configurations measured one after the other, so slow drift between the two
  measurements is charged to the change; the drift threshold is its guard.
- ``paired_compare``: the *paired* design. The two configurations ran in short
  alternating blocks, so each round gives one ratio (trial block / the
  baseline block next to it) in which whatever moves slowly (load, clocks,
  temperature) cancels. The estimate is the Hodges-Lehmann centre of the log
  ratios (the median of their pairwise means: a geometric mean that one block
  hit by a load burst cannot drag) with the Wilcoxon signed-rank interval,
  exact and distribution-free (it assumes only that noise is symmetric,
  which randomizing and counterbalancing the order of the blocks makes
  true); a round more than five robust standard deviations off the others
  (its two blocks straddled a change of load) is set aside first.
- ``aa_compare``: the A/A comparison (the baseline against itself), whose
  interval's reach from 1 is the run's ``resolution``: the smallest change
  such a run can tell from noise. Its interval is a trimmed one (the
  Tukey-McLaughlin interval of the 20%-trimmed mean of the log ratios, its
  spread from the winsorized variance): the rounds at each end are trimmed
  and the spread is charged for the trimming, so one outlying round (a load
  burst that the five-sigma rule did not catch, or any round at all when the
  A/A has only ten) cannot carry the interval's edge, as it does with the
  signed-rank interval whenever its cut is smaller than the number of rounds.
- ``pooled_resolution``: the resolution an A/A of the same rounds would have at the run's pooled noise: the
  winsorized variances of the A/A's and every paired trial's log ratios pooled (weights n - 1), in the A/A's
  Tukey-McLaughlin interval in place of its own. One A/A whose rounds met a burst of load is one variance
  estimate among several, not the run's only word on its noise.

The distributions (binomial, normal, Student's t), the trimmed mean, winsorizing and the median absolute
deviation are SciPy's, imported inside the functions that use them (SciPy's stats take longer to import than
the rest of `kronos-tune report`). Written here is only what SciPy lacks or draws otherwise: the exact
signed-rank cut of the Hodges-Lehmann interval (``signed_rank_cut``) and the fixed-seed ratio bootstrap
(``ratio_ci``); each says why in its docstring.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

CONFIDENCE = 0.95
# A change measured on because its first rounds left its verdict open is judged on this interval: the second
# look at the same comparison pays for itself (two looks at 95% would call a null change about 1.5x as often).
EXTENDED_CONFIDENCE = 0.99
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 20261130
VERDICTS = ("faster", "slower", "same", "unresolved")


def quantiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3) with linear interpolation."""
    values = np.asarray(samples, dtype=float)
    q1, median, q3 = np.quantile(values, [0.25, 0.5, 0.75])
    return float(q1), float(median), float(q3)


def median_ci(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free interval for the median: the order statistics x(j), x(n-j+1) with the largest j
    whose coverage 1 - 2 P(Binom(n, 1/2) <= j - 1) is still >= confidence. Below 6 samples no such j exists
    at 95 %, and the interval is [min, max]."""
    from scipy.stats import binom

    values = sorted(float(v) for v in samples)
    n = len(values)
    if n == 0:
        raise ValueError("median_ci of no samples")
    coverage = 1 - 2 * binom.cdf(np.arange(n // 2), n, 0.5)  # of x(j), x(n-j+1) for j = 1 .. n // 2
    j = int(np.count_nonzero(coverage >= confidence))
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
    """median(a) / median(b) and its percentile-bootstrap interval (each sample resampled on its own).

    Written here rather than through ``scipy.stats.bootstrap`` (which draws the same resamples from the same
    seed): that refuses a side with a single step time, which a short trial has, and its seed argument is
    ``random_state`` before SciPy 1.15 and ``rng`` from 1.15 on, both within the versions pyproject allows;
    these lines are the whole method."""
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

    design: str = "sequential"  # sequential: ratio of medians of two runs; paired: block ratios (paired_compare)
    evidence: str = ""  # what decided the verdict (train/decide.py: EVIDENCE); "" where the rule names none
    confidence: float = CONFIDENCE

    @property
    def halfwidth(self) -> float | None:
        """Half the interval's width as a fraction of the ratio (None without an interval)."""
        if self.low is None or self.high is None or self.ratio <= 0:
            return None
        return (self.high - self.low) / 2 / self.ratio

    @property
    def reach(self) -> float | None:
        """How far the interval reaches from 1 on its farther side (an A/A comparison's: the run's resolution)."""
        if self.low is None or self.high is None:
            return None
        return max(self.high - 1, 1 - self.low, 0.0)

    @property
    def pct(self) -> float:
        return 100.0 * (self.ratio - 1.0)

    def interval_text(self) -> str:
        if self.low is None or self.high is None:
            return "no interval: raw step times were not kept"
        return (f"{100 * self.confidence:g}% interval {100 * (self.low - 1):+.1f}% to "
                f"{100 * (self.high - 1):+.1f}%")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Comparison | None:
        if data is None:
            return None
        known = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        return cls(**known)


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


# The paired design ------------------------------------------------------------------------------------------

MIN_PAIRS = 6  # below 6 pairs no Wilcoxon interval reaches 95 %
OUTLIER_SIGMAS = 5.0  # a round this many robust standard deviations off the others measured a load change
MAX_OUTLIER_SHARE = 0.25  # more rounds than this off: that is the noise itself, and every round is kept


def _signed_rank_counts(n: int) -> list[int]:
    """How many of the 2**n sign patterns give each signed-rank sum W+ = 0 .. n(n+1)/2 (exact, by counting).

    SciPy has no public quantile of this distribution (``scipy.stats.wilcoxon`` gives a p-value for given
    data, not the cut of an interval), nor the Hodges-Lehmann interval built on it, so both stay here."""
    counts = [1]
    for rank in range(1, n + 1):
        grown = counts + [0] * rank
        for total, ways in enumerate(counts):
            grown[total + rank] += ways
        counts = grown
    return counts


def signed_rank_cut(n: int, confidence: float = CONFIDENCE) -> int | None:
    """The number k of Walsh averages left out at each end of the Hodges-Lehmann interval: the largest k with
    P(W+ <= k - 1) <= (1 - confidence) / 2 under the symmetric null; None when even k = 1 is not allowed
    (fewer than MIN_PAIRS pairs at 95 %)."""
    if n < 1:
        return None
    if n > 60:  # the normal approximation is within one average of the exact cut here
        from scipy.stats import norm

        mean, sd = n * (n + 1) / 4, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        z = float(norm.ppf(1 - (1 - confidence) / 2))
        return max(1, int(math.floor(mean - z * sd)))
    counts = _signed_rank_counts(n)
    total, tail, cut = 2**n, 0, 0
    for w, ways in enumerate(counts):
        tail += ways
        if tail / total > (1 - confidence) / 2:
            break
        cut = w + 1
    return cut or None


@dataclass(frozen=True)
class PairedEstimate:
    """The centre of paired log ratios and its interval, on the ratio scale (low/high None below MIN_PAIRS);
    ``n`` pairs used, ``outliers`` set aside."""

    ratio: float
    low: float | None
    high: float | None
    n: int
    outliers: int = 0

    @property
    def halfwidth(self) -> float:
        """Half the interval's width as a fraction of the ratio (inf without an interval)."""
        if self.low is None or self.high is None:
            return math.inf
        return (self.high - self.low) / 2 / self.ratio


def _log_ratios(ratios: Sequence[float]) -> np.ndarray:
    """The logs of the positive, finite ratios."""
    return np.log(np.asarray([r for r in ratios if r > 0 and math.isfinite(r)], dtype=float))


def _without_outliers(logs: np.ndarray) -> np.ndarray:
    """The log ratios less the rounds OUTLIER_SIGMAS robust standard deviations (the median absolute deviation
    scaled to a normal's standard deviation) from their median: a round whose two blocks straddled a change of
    load measures the load, and with a periodic load a few rounds do. None are set aside when the deviation is
    zero or when more than MAX_OUTLIER_SHARE of them would be (then the spread is the noise)."""
    from scipy.stats import median_abs_deviation

    centre = float(np.median(logs))
    sigma = float(median_abs_deviation(logs, scale="normal"))
    if sigma <= 0:
        return logs
    kept = logs[np.abs(logs - centre) <= OUTLIER_SIGMAS * sigma]
    return kept if kept.size >= max(MIN_PAIRS, (1 - MAX_OUTLIER_SHARE) * logs.size) else logs


def paired_estimate(ratios: Sequence[float], confidence: float = CONFIDENCE) -> PairedEstimate:
    """Hodges-Lehmann estimate of paired ratios (trial / baseline per round) with the Wilcoxon signed-rank
    interval, both computed on log ratios (outlying rounds set aside first) and returned as ratios."""
    every = _log_ratios(ratios)
    if every.size == 0:
        raise ValueError("paired_estimate needs at least one positive ratio")
    logs = _without_outliers(every)
    n, outliers = int(logs.size), int(every.size - logs.size)
    rows, cols = np.triu_indices(n)
    walsh = np.sort((logs[rows] + logs[cols]) / 2)
    centre = float(np.median(walsh))
    cut = signed_rank_cut(n, confidence)
    if cut is None:
        return PairedEstimate(math.exp(centre), None, None, n, outliers)
    return PairedEstimate(math.exp(centre), math.exp(float(walsh[cut - 1])), math.exp(float(walsh[-cut])), n,
                          outliers)


def block_ratios(blocks: Sequence[dict[str, Any]]) -> list[float]:
    """One ratio per round of a paired measurement: the median of the trial block's step times over the median
    of the baseline block's (blocks as results.jsonl keeps them: ``trial_s`` and ``baseline_s`` lists)."""
    ratios = []
    for block in blocks:
        trial, base = block.get("trial_s") or [], block.get("baseline_s") or []
        if trial and base:
            base_median = float(np.median(np.asarray(base, dtype=float)))
            if base_median > 0:
                ratios.append(float(np.median(np.asarray(trial, dtype=float))) / base_median)
    return ratios


def paired_compare(ratios: Sequence[float], threshold: float, confidence: float = CONFIDENCE,
                   what: str = "block") -> Comparison | None:
    """The paired verdict: faster when the interval of the ratios' centre lies below 1 and the centre is at least
    `threshold` below 1 (slower mirrored, unresolved when the interval reaches past the threshold on both sides,
    or with too few pairs for an interval).
    `ratios`: trial / baseline per pair (step times, or seconds per run for prediction). None without ratios."""
    if not ratios:
        return None
    found = paired_estimate(ratios, confidence)
    aside = f" ({found.outliers} outlying round(s) set aside)" if found.outliers else ""
    method = (f"paired: Hodges-Lehmann centre of {found.n} {what} ratios (trial / neighbouring baseline){aside}, "
              f"{100 * confidence:g}% Wilcoxon signed-rank interval")
    called = "unresolved" if found.low is None else verdict(found.ratio, found.low, found.high, threshold)
    return Comparison(found.ratio, found.low, found.high, threshold, called, found.n, found.n, method, "paired",
                      confidence=confidence)


def verdict_open(ratios: Sequence[float], threshold: float) -> bool:
    """Whether paired ratios leave a change's verdict open: their centre at least `threshold` from 1 (it looks
    like a change) while their 95% interval still reaches past 1 (not shown). False below MIN_PAIRS ratios."""
    if len(ratios) < MIN_PAIRS:
        return False
    found = paired_estimate(ratios)
    if found.low is None or found.high is None:
        return False
    looks_like_one = found.ratio <= 1 - threshold or found.ratio >= 1 + threshold
    return looks_like_one and found.low <= 1 <= found.high


# The A/A comparison: a trimmed interval ----------------------------------------------------------------------

AA_TRIM = 0.2  # the share of rounds trimmed at each end of the A/A's log ratios


def trimmed_estimate(ratios: Sequence[float], confidence: float = CONFIDENCE,
                     trim: float = AA_TRIM) -> PairedEstimate:
    """The trimmed mean of the log ratios (floor(trim x n) rounds left out at each end) with the
    Tukey-McLaughlin interval: standard error = the winsorized standard deviation / ((1 - 2 trim) sqrt(n)),
    Student's t with (n - 2 x trimmed - 1) degrees of freedom (``scipy.stats.mstats.trimmed_mean_ci``); on the
    ratio scale (no interval below MIN_PAIRS rounds). Every round counts: none is set aside before trimming."""
    from scipy.stats import mstats, trim_mean

    logs = _log_ratios(ratios)
    n = int(logs.size)
    if n == 0:
        raise ValueError("trimmed_estimate needs at least one positive ratio")
    centre = float(trim_mean(logs, trim))
    if n < MIN_PAIRS:
        return PairedEstimate(math.exp(centre), None, None, n)
    low, high = mstats.trimmed_mean_ci(logs, limits=(trim, trim), alpha=1 - confidence)
    return PairedEstimate(math.exp(centre), math.exp(float(low)), math.exp(float(high)), n)


def _winsorized(ratios: Sequence[float], trim: float = AA_TRIM) -> tuple[int, float, int] | None:
    """(rounds, winsorized variance of the log ratios, the trimmed interval's degrees of freedom); None below
    MIN_PAIRS rounds."""
    from scipy.stats import mstats

    logs = _log_ratios(ratios)
    n = int(logs.size)
    if n < MIN_PAIRS:
        return None
    variance = float(mstats.winsorize(logs, limits=(trim, trim)).var(ddof=1))
    return n, variance, n - 2 * int(math.floor(trim * n)) - 1


def pooled_resolution(aa: Sequence[float], others: Sequence[Sequence[float]], confidence: float = CONFIDENCE,
                      trim: float = AA_TRIM) -> float | None:
    """How far an A/A interval of `aa`'s rounds would reach from 1 at the noise of every comparison of the run:
    the winsorized variance pooled over `aa` and each of `others` (each around its own centre, weights n - 1),
    the standard error pooled variance ** 0.5 / ((1 - 2 trim) sqrt(n of aa)), Student's t with the summed
    degrees of freedom, the reach exp(t x error) - 1 (the wider side). None when `aa` has too few rounds."""
    from scipy.stats import t

    mine = _winsorized(aa, trim)
    if mine is None:
        return None
    sets = [mine, *filter(None, (_winsorized(ratios, trim) for ratios in others))]
    variance = sum((n - 1) * var for n, var, _ in sets) / sum(n - 1 for n, _, _ in sets)
    error = math.sqrt(variance) / ((1 - 2 * trim) * math.sqrt(mine[0]))
    return math.expm1(float(t.ppf(1 - (1 - confidence) / 2, sum(df for _, _, df in sets))) * error)


def aa_compare(ratios: Sequence[float], floor: float, confidence: float = CONFIDENCE,
               what: str = "block") -> Comparison | None:
    """The A/A comparison (two workers of one configuration, paired): the trimmed estimate of its ratios against
    `floor` alone, so that a bias between the workers beyond the floor shows; its ``reach`` is the run's
    resolution. None without ratios."""
    if not ratios:
        return None
    found = trimmed_estimate(ratios, confidence)
    trimmed = int(math.floor(AA_TRIM * found.n))
    method = (f"paired A/A: {100 * AA_TRIM:g}%-trimmed mean of {found.n} {what} ratios (trial / neighbouring "
              f"baseline; {trimmed} round(s) trimmed at each end), {100 * confidence:g}% Tukey-McLaughlin interval")
    called = "unresolved" if found.low is None else verdict(found.ratio, found.low, found.high, floor)
    return Comparison(found.ratio, found.low, found.high, floor, called, found.n, found.n, method, "paired",
                      confidence=confidence)


def rate_over_ratio(ratio: float | None, reference_rate: float | None, own_rate: float | None) -> float | None:
    """A rate (series/s) as every view shows it: the reference's rate over the compared time ratio where there
    is one, else the trial's own (report/shown.py, benchmark/predict/decide.py)."""
    if ratio is not None and ratio > 0 and reference_rate is not None:
        return reference_rate / ratio
    return own_rate
