"""Forecast quality across stocks: IC, RankIC, hit rate and MAE of returns, per origin and over origins.

Correlations come from pandas (`DataFrame.corr`, whose Spearman path ranks in
pandas' own code and needs no SciPy); nothing here re-implements them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

PREDICTED = "predicted_return"
REALIZED = "realized_return"


def correlation(a: pd.Series | np.ndarray, b: pd.Series | np.ndarray, method: str) -> float:
    """Pearson or Spearman correlation of two aligned vectors (NaN pairs dropped; NaN when undefined)."""
    frame = pd.DataFrame({"a": np.asarray(a, dtype=np.float64), "b": np.asarray(b, dtype=np.float64)}).dropna()
    if len(frame) < 2:
        return math.nan
    return float(frame.corr(method=method).iloc[0, 1])


@dataclass(frozen=True)
class OriginQuality:
    """One origin's cross-section: IC (Pearson), RankIC (Spearman), hit rate of the sign, MAE of returns."""

    symbols: int
    ic: float
    rank_ic: float
    hit_rate: float
    mae_return: float


def origin_quality(predictions: pd.DataFrame) -> OriginQuality:
    """Scores of one origin's predictions (columns predicted_return, realized_return)."""
    predicted, realized = predictions[PREDICTED], predictions[REALIZED]
    hits = np.sign(predicted.to_numpy()) == np.sign(realized.to_numpy())
    return OriginQuality(
        symbols=len(predictions),
        ic=correlation(predicted, realized, "pearson"),
        rank_ic=correlation(predicted, realized, "spearman"),
        hit_rate=float(hits.mean()) if len(hits) else math.nan,
        mae_return=float((predicted - realized).abs().mean()),
    )


@dataclass(frozen=True)
class SeriesSummary:
    """Mean, sample std (ddof 1), t-statistic mean / (std / sqrt(n)) and n of a per-origin series (NaNs left out)."""

    mean: float
    std: float
    t: float
    n: int


def summarize(values: pd.Series | list[float]) -> SeriesSummary:
    series = pd.Series(values, dtype=np.float64).dropna()
    n = len(series)
    mean = float(series.mean()) if n else math.nan
    std = float(series.std(ddof=1)) if n > 1 else math.nan
    t = mean / (std / math.sqrt(n)) if n > 1 and std > 0 else math.nan
    return SeriesSummary(mean, std, t, n)
