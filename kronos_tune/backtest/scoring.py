"""Scores of a backtest, computed from the saved per-origin predictions of each setting."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_tune.backtest.agreement import RankingAgreement, ranking_agreement
from kronos_tune.backtest.calibration import summarize_calibration
from kronos_tune.backtest.config import BacktestConfig, PredictionSetting
from kronos_tune.backtest.leakage import OverlapCheck
from kronos_tune.backtest.metrics import PREDICTED, REALIZED, OriginQuality, SeriesSummary, origin_quality, summarize
from kronos_tune.backtest.origins import OriginPlan
from kronos_tune.backtest.portfolio import CurveStats, Period, curve_stats, equity_curve, run_portfolio
from kronos_tune.backtest.store import has_band, origin_path, read_origin
from kronos_tune.backtest.universe import Universe
from kronos_tune.errors import KronosTuneError


@dataclass(frozen=True)
class BandCalibration:
    """Coverage, pinball loss and CRPS of the sample band (kronos_tune.backtest.calibration), per origin and
    over every (symbol, origin)."""

    samples: int
    per_origin: list[dict[str, float]]
    overall: dict[str, float]


def band_calibration(predictions: list[pd.DataFrame], samples: int) -> BandCalibration | None:
    """None unless every origin holds the band's columns."""
    if not predictions or not all(has_band(frame) for frame in predictions):
        return None
    return BandCalibration(samples, [summarize_calibration(frame) for frame in predictions],
                           summarize_calibration(pd.concat(predictions, ignore_index=True)))


@dataclass
class SettingScores:
    """Everything scored for one prediction setting."""

    slot: str
    setting: PredictionSetting
    predictions: list[pd.DataFrame]  # per origin, as saved
    quality: list[OriginQuality]
    periods: list[Period]
    ic: SeriesSummary
    rank_ic: SeriesSummary
    hit_rate: float    # over every (symbol, origin)
    mae_return: float  # over every (symbol, origin)
    curve: CurveStats
    benchmark: CurveStats  # the equal-weight universe, no costs
    calibration: BandCalibration | None = None  # with sample paths (--sample-count >= 2)

    @property
    def net_equity(self) -> pd.Series:
        return equity_curve([p.net_return for p in self.periods])


@dataclass
class BacktestResult:
    config: BacktestConfig
    run_path: Path
    universe_source: str
    synthetic: bool
    universe_symbols: int
    plan: OriginPlan
    scores: list[SettingScores]
    agreement: RankingAgreement | None = None
    overlap: OverlapCheck = field(default_factory=OverlapCheck)
    notes: list[tuple[str, str]] = field(default_factory=list)
    session_predicted: int = 0
    session_predict_seconds: float = 0.0
    plot: Path | None = None

    @property
    def symbol_origins_per_s(self) -> float | None:
        if self.session_predict_seconds <= 0:
            return None
        return self.session_predicted / self.session_predict_seconds


def score_setting(slot: str, setting: PredictionSetting, predictions: list[pd.DataFrame], config: BacktestConfig,
                  periods_per_year: float) -> SettingScores:
    quality = [origin_quality(frame) for frame in predictions]
    periods = run_portfolio(predictions, config.top_k, config.long_only, config.cost_bps)
    pooled = pd.concat(predictions, ignore_index=True)
    hits = np.sign(pooled[PREDICTED].to_numpy()) == np.sign(pooled[REALIZED].to_numpy())
    return SettingScores(
        slot=slot, setting=setting, predictions=predictions, quality=quality, periods=periods,
        ic=summarize([q.ic for q in quality]), rank_ic=summarize([q.rank_ic for q in quality]),
        hit_rate=float(hits.mean()), mae_return=float((pooled[PREDICTED] - pooled[REALIZED]).abs().mean()),
        curve=curve_stats([p.net_return for p in periods], [p.turnover for p in periods], periods_per_year),
        benchmark=curve_stats([p.benchmark_return for p in periods], [0.0] * len(periods), periods_per_year),
        calibration=band_calibration(predictions, setting.sample_count),
    )


def _pivot(predictions: list[pd.DataFrame], column: str) -> pd.DataFrame:
    """One row per origin, one column per symbol."""
    return pd.concat(predictions, ignore_index=True).pivot(index="origin", columns="symbol", values=column)


def score_run(config: BacktestConfig, universe: Universe, plan: OriginPlan, run_path: Path,
              settings: list[PredictionSetting]) -> BacktestResult:
    """Read every saved origin of every setting back and score them (and their agreement with --compare)."""
    periods_per_year = config.periods_per_year or plan.periods_per_year
    scores = []
    for slot, setting in zip(("a", "b"), settings):
        frames = []
        for origin in plan.origins:
            frame = read_origin(origin_path(run_path, slot, origin.index), len(origin.members))
            if frame is None:
                raise KronosTuneError(f"{run_path}: origin {origin.index} of setting '{setting.label()}' is missing "
                                      f"or damaged; run again with --resume {run_path}")
            frames.append(frame)
        scores.append(score_setting(slot, setting, frames, config, periods_per_year))
    agreement = None
    if len(scores) == 2:
        a, b = scores
        agreement = ranking_agreement(_pivot(a.predictions, PREDICTED), _pivot(b.predictions, PREDICTED),
                                      _pivot(a.predictions, REALIZED))
    return BacktestResult(config, run_path, universe.source, universe.synthetic, len(universe.symbols), plan,
                          scores, agreement)


def curve_difference(a: SettingScores, b: SettingScores) -> dict[str, float]:
    """How far B's portfolio curve is from A's: final cumulative return, Sharpe, and the largest gap on the way."""
    gap = (b.net_equity - a.net_equity).abs()
    return {
        "cumulative_return_diff": b.curve.cumulative_return - a.curve.cumulative_return,
        "sharpe_diff": b.curve.sharpe - a.curve.sharpe,
        "curve_max_abs_diff": float(gap.max()) if len(gap) else math.nan,
    }
