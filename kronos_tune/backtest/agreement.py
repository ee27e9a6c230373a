"""Ranking agreement between two prediction settings: does an approximation change which stocks come out on top?

``ranking_agreement(pred_a, pred_b, realized=None)`` takes predicted returns of
setting A (the reference, e.g. float32) and setting B (e.g. the shift window
or bf16) either as one cross-section (1-D, aligned by position or by a Series
index) or as a DataFrame with one row per origin and one column per symbol.
Per origin it gives the Spearman correlation of A's and B's predicted returns;
with the realized returns also each setting's IC and RankIC and their
difference (B - A). Random weights are fine: then it measures how closely B
keeps A's ranking, not forecasting skill.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kronos_tune.backtest.metrics import SeriesSummary, correlation, summarize


@dataclass(frozen=True)
class RankingAgreement:
    """Spearman agreement of two settings' predicted returns per origin, and (with realized returns) the IC gap."""

    per_origin: list[float]
    spearman: SeriesSummary
    spearman_min: float
    spearman_max: float
    ic_diff: SeriesSummary | None = None       # IC(B) - IC(A) per origin
    rank_ic_diff: SeriesSummary | None = None  # RankIC(B) - RankIC(A) per origin

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "spearman_mean": self.spearman.mean, "spearman_std": self.spearman.std,
            "spearman_min": self.spearman_min, "spearman_max": self.spearman_max, "origins": self.spearman.n,
        }
        for name, summary in (("ic_diff", self.ic_diff), ("rank_ic_diff", self.rank_ic_diff)):
            if summary is not None:
                out[f"{name}_mean"], out[f"{name}_std"] = summary.mean, summary.std
        return out


def _as_frame(values: pd.DataFrame | pd.Series | Sequence[float] | np.ndarray) -> pd.DataFrame:
    if isinstance(values, pd.DataFrame):
        return values.astype(np.float64)
    if isinstance(values, pd.Series):
        return values.astype(np.float64).to_frame().T.reset_index(drop=True)
    array = np.asarray(values, dtype=np.float64)
    return pd.DataFrame(array.reshape(1, -1) if array.ndim == 1 else array)


def ranking_agreement(pred_a: pd.DataFrame | pd.Series | Sequence[float] | np.ndarray,
                      pred_b: pd.DataFrame | pd.Series | Sequence[float] | np.ndarray,
                      realized: pd.DataFrame | pd.Series | Sequence[float] | np.ndarray | None = None,
                      ) -> RankingAgreement:
    """Per-origin Spearman(pred_a, pred_b) and, given realized returns, the IC and RankIC differences."""
    a, b = _as_frame(pred_a), _as_frame(pred_b)
    if a.shape != b.shape and not (isinstance(pred_a, pd.DataFrame) and isinstance(pred_b, pd.DataFrame)):
        raise ValueError(f"pred_a has shape {a.shape}, pred_b {b.shape}; give the same origins and symbols")
    b = b.reindex(index=a.index, columns=a.columns)
    per_origin = [correlation(a.loc[o], b.loc[o], "spearman") for o in a.index]
    finite = [v for v in per_origin if not math.isnan(v)]
    ic_diff = rank_ic_diff = None
    if realized is not None:
        r = _as_frame(realized).reindex(index=a.index, columns=a.columns) if isinstance(realized, pd.DataFrame) \
            else _as_frame(realized).set_axis(a.columns, axis=1).set_axis(a.index, axis=0)
        ic_diff = summarize([correlation(b.loc[o], r.loc[o], "pearson") - correlation(a.loc[o], r.loc[o], "pearson")
                             for o in a.index])
        rank_ic_diff = summarize([correlation(b.loc[o], r.loc[o], "spearman")
                                  - correlation(a.loc[o], r.loc[o], "spearman") for o in a.index])
    return RankingAgreement(per_origin, summarize(per_origin), min(finite, default=math.nan),
                            max(finite, default=math.nan), ic_diff, rank_ic_diff)


def returns_from_frames(predicted: list[pd.DataFrame], histories: list[pd.DataFrame]) -> np.ndarray:
    """Predicted return over the horizon of each series: last predicted close / last history close - 1.

    For callers holding `predict_batch` outputs (one frame per series) and the histories they came from."""
    return np.array([float(frame["close"].iloc[-1]) / float(history["close"].iloc[-1]) - 1.0
                     for frame, history in zip(predicted, histories)])
