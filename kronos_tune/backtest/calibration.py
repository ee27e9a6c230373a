"""Calibration of the forecast bands from the sample paths (`--sample-count N`, N >= 2).

At each (origin, symbol) the N sampled closes at the end of the horizon are a forecast distribution of the
close the backtest scores. From them:

- quantiles P10, P25, P50, P75, P90 (``np.quantile``, linear interpolation between order statistics);
- coverage of a central interval: the share of realized closes inside [P10, P90] (expected 80 %) and
  [P25, P75] (expected 50 %), bounds included;
- pinball loss of quantile q at level t: (y - q) * (t - 1[y < q]), for t = 0.1, 0.5, 0.9;
- CRPS of the sample distribution: E|X - y| - 0.5 E|X - X'| over all N x N pairs (the CRPS of the
  empirical distribution of the samples).

Pinball and CRPS are in price units per row; `summarize_calibration` divides them by the last close, so they
are in return units (a symbol's price level does not weigh in the pooled mean).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

LEVELS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9)
INTERVALS: tuple[tuple[float, float], ...] = ((0.1, 0.9), (0.25, 0.75))
PINBALL_LEVELS: tuple[float, ...] = (0.1, 0.5, 0.9)
CRPS_COLUMN = "crps_close"


def quantile_column(level: float) -> str:
    return f"close_p{round(level * 100):d}"


QUANTILE_COLUMNS: tuple[str, ...] = tuple(quantile_column(level) for level in LEVELS)
CALIBRATION_COLUMNS: tuple[str, ...] = (*QUANTILE_COLUMNS, CRPS_COLUMN)


def interval_name(low: float, high: float) -> str:
    return f"coverage_p{round(low * 100):d}_p{round(high * 100):d}"


def pinball_name(level: float) -> str:
    return f"pinball_p{round(level * 100):d}"


def sample_quantiles(samples: np.ndarray, levels: tuple[float, ...] = LEVELS) -> np.ndarray:
    """[n, len(levels)] quantiles of each row of `samples` [n, N]."""
    return np.quantile(np.asarray(samples, dtype=np.float64), levels, axis=1).T


def inside(lower: np.ndarray, upper: np.ndarray, realized: np.ndarray) -> np.ndarray:
    """Whether each realized value lies in [lower, upper]."""
    realized = np.asarray(realized, dtype=np.float64)
    return (np.asarray(lower) <= realized) & (realized <= np.asarray(upper))


def pinball_loss(quantile: np.ndarray, realized: np.ndarray, level: float) -> np.ndarray:
    """Pinball (quantile) loss per row of the `level` quantile forecast."""
    diff = np.asarray(realized, dtype=np.float64) - np.asarray(quantile, dtype=np.float64)
    return diff * (level - (diff < 0))


def crps_from_samples(samples: np.ndarray, realized: np.ndarray) -> np.ndarray:
    """CRPS per row: mean |x_i - y| - 0.5 * mean over all pairs |x_i - x_j| (sorted samples: O(N log N))."""
    x = np.sort(np.asarray(samples, dtype=np.float64), axis=1)
    n = x.shape[1]
    y = np.asarray(realized, dtype=np.float64)[:, None]
    spread_to_truth = np.abs(x - y).mean(axis=1)
    # sum over i < j of (x_j - x_i) = sum_k x_(k) (2k - n + 1), k = 0..n-1; both orders count.
    weights = 2.0 * np.arange(n) - n + 1.0
    mean_pair_gap = 2.0 * (x * weights).sum(axis=1) / (n * n)
    return spread_to_truth - 0.5 * mean_pair_gap


def calibration_columns(samples: np.ndarray, realized: np.ndarray) -> dict[str, np.ndarray]:
    """The per-row columns a prediction file keeps: the close quantiles and the CRPS (price units)."""
    quantiles = sample_quantiles(samples)
    columns = {name: quantiles[:, k] for k, name in enumerate(QUANTILE_COLUMNS)}
    columns[CRPS_COLUMN] = crps_from_samples(samples, realized)
    return columns


def summarize_calibration(frame: pd.DataFrame) -> dict[str, float]:
    """Coverage of each interval, pinball loss per level and CRPS (both / last close) over the frame's rows."""
    realized = frame["realized_close"].to_numpy(dtype=np.float64)
    scale = frame["last_close"].to_numpy(dtype=np.float64)
    out: dict[str, float] = {"rows": len(frame)}
    if not len(frame):
        return {**out, **{interval_name(*i): math.nan for i in INTERVALS},
                **{pinball_name(t): math.nan for t in PINBALL_LEVELS}, "crps": math.nan}
    for low, high in INTERVALS:
        hits = inside(frame[quantile_column(low)].to_numpy(), frame[quantile_column(high)].to_numpy(), realized)
        out[interval_name(low, high)] = float(hits.mean())
    for level in PINBALL_LEVELS:
        out[pinball_name(level)] = float((pinball_loss(frame[quantile_column(level)].to_numpy(), realized, level)
                                          / scale).mean())
    out["crps"] = float((frame[CRPS_COLUMN].to_numpy(dtype=np.float64) / scale).mean())
    return out


def expected_coverage() -> dict[str, float]:
    return {interval_name(low, high): round(high - low, 6) for low, high in INTERVALS}


def conventions() -> dict[str, Any]:
    """How the calibration figures are defined, for backtest.json."""
    return {
        "of": "the close at the end of the horizon, from the sample paths' closes there",
        "quantiles": "np.quantile of the samples, linear interpolation",
        "coverage": "share of realized closes inside the central interval, bounds included",
        "expected": expected_coverage(),
        "pinball": "(y - q) * (t - 1[y < q]) divided by the last close, mean over rows",
        "crps": "E|X - y| - 0.5 E|X - X'| over the samples (all pairs), divided by the last close, mean over rows",
    }
