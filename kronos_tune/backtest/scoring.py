"""Scores of a backtest, computed from the saved per-origin predictions of each setting."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kronos_tune.backtest.agreement import RankingAgreement, ranking_agreement
from kronos_tune.backtest.calibration import summarize_calibration
from kronos_tune.backtest.config import BacktestConfig, PredictionSetting
from kronos_tune.backtest.leakage import OverlapCheck
from kronos_tune.backtest.metrics import PREDICTED, REALIZED, OriginQuality, SeriesSummary, origin_quality, summarize
from kronos_tune.backtest.origins import EVERY_DAY, OriginSchedule, Universe
from kronos_tune.backtest.portfolio import CurveStats, Period, curve_stats, equity_curve, run_portfolio
from kronos_tune.backtest.significance import hac_lag
from kronos_tune.backtest.skill import (DRIFT, PERSISTENCE, RANDOM_WALK, SettingComparison, SettingSkill,
                                        absolute_errors, band_unavailable, compare, naive_frames, setting_skill)
from kronos_tune.backtest.store import has_band, origin_path, read_origin
from kronos_tune.errors import KronosTuneError

RANDOM_WEIGHTS_CAVEAT = "random weights: not a finding"
SYNTHETIC_NOTE = ("synthetic data: sector trends (AR(1), half-life 2 trading days) are planted in it, so a forecast "
                  "that follows recent returns (drift) can score on it: the generator's structure, not a finding "
                  "(docs/skill.md)")


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


@dataclass(kw_only=True)
class ForecastScores:
    """Everything scored for one forecast of the (symbol, origin) pairs: the model's or a naive one's."""

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


@dataclass(kw_only=True)
class SettingScores(ForecastScores):
    """Everything scored for one prediction setting, and its skill against the naive forecasts."""

    slot: str
    setting: PredictionSetting
    skill: SettingSkill | None = None


@dataclass
class NaiveScores:
    """The naive forecasts on the model's pairs (kronos_tune.backtest.skill) and the overlap lag of the tests."""

    lag: int
    persistence: list[pd.DataFrame]
    drift: ForecastScores
    drift_skill: SettingSkill
    band: BandCalibration | None  # the random-walk band's calibration, None when the lookback holds none
    band_reason: str | None

    @property
    def persistence_mae(self) -> list[float]:
        return [float(absolute_errors(frame).mean()) for frame in self.persistence]


@dataclass
class BacktestResult:
    config: BacktestConfig
    run_path: Path
    universe_source: str
    synthetic: bool
    universe_symbols: int
    schedule: OriginSchedule
    scores: list[SettingScores]
    agreement: RankingAgreement | None = None
    naive: NaiveScores | None = None
    comparison: SettingComparison | None = None
    horizon_end: pd.Timestamp | None = None  # the last bar of the last origin's horizon
    overlap: OverlapCheck = field(default_factory=OverlapCheck)
    notes: list[tuple[str, str]] = field(default_factory=list)
    session_predicted: int = 0
    session_predict_seconds: float = 0.0
    session_per_setting: list[tuple[int, float]] = field(default_factory=list)  # (predicted, seconds), in order
    plot: Path | None = None

    @property
    def symbol_origins_per_s(self) -> float | None:
        if self.session_predict_seconds <= 0:
            return None
        return self.session_predicted / self.session_predict_seconds

    def precision_verdict(self) -> str | None:
        """With --compare changing only the autocast (e.g. bf16): one line, the agreement (the RankIC difference
        with its 95 % interval) and both settings' speed as this run measured them; None for other comparisons."""
        if self.comparison is None or len(self.scores) != 2:
            return None
        a, b = (scores.setting for scores in self.scores)
        if a.amp == b.amp or replace(a, amp=b.amp) != b:
            return None
        title_a, title_b = self.config.titles([a, b])
        rank_ic = self.comparison.rank_ic
        if rank_ic.low is None:
            agreement = f"RankIC diff {rank_ic.mean:+.4f} (interval not available: {rank_ic.reason})"
        else:
            judged = (f"{title_b} {'higher' if rank_ic.mean > 0 else 'lower'} (p < 0.05)" if rank_ic.significant
                      else "no difference shown at 5 %")
            agreement = (f"RankIC diff {rank_ic.mean:+.4f} (95% CI {rank_ic.low:+.4f} to {rank_ic.high:+.4f}, "
                         f"{rank_ic.n} origins): {judged}")
        rates = [predicted / seconds if predicted and seconds > 0 else None
                 for predicted, seconds in self.session_per_setting]
        if len(rates) == 2 and None not in rates:
            speed = (f"speed {title_b} {rates[1]:,.2f} vs {title_a} {rates[0]:,.2f} symbol-origins/s "
                     f"({rates[1] / rates[0]:.2f}x), both predicted in this run, {title_a} first (its time "
                     f"holds the process's first calls)")
        else:
            speed = "speed not compared: a setting was read back from saved origins, not predicted in this run"
        return f"{title_b} vs {title_a}: {agreement}; {speed}"

    def random_weights(self, setting: PredictionSetting) -> bool:
        """Whether `setting` predicted with random weights (no checkpoint of its own or of the run)."""
        return setting.checkpoint is None and self.config.checkpoint is None

    def caveat(self, setting: PredictionSetting) -> str | None:
        """What every portfolio and significance line of `setting` must carry: its random weights, or None."""
        return RANDOM_WEIGHTS_CAVEAT if self.random_weights(setting) else None

    def comparison_caveat(self) -> str | None:
        """The --compare verdict's caveat: both settings with random weights (a trained model against random
        weights is a comparison that means something)."""
        if self.scores and all(self.random_weights(s.setting) for s in self.scores):
            return RANDOM_WEIGHTS_CAVEAT
        return None

    def counted(self) -> str:
        """'3,789 symbol-origins predicted (479 symbols, 8 origins)': what was predicted, not symbols x origins
        (a symbol too short for an origin is not predicted there)."""
        symbols, origins = len(self.schedule.used_symbols), len(self.schedule.origins)
        gaps = "; not every symbol at every origin" if self.schedule.predictions < symbols * origins else ""
        return (f"{self.schedule.predictions:,} symbol-origins predicted ({symbols:,} symbols, {origins:,} "
                f"origins{gaps})")


def with_caveat(line: str, caveat: str | None) -> str:
    """`line` led by its caveat ('random weights: not a finding: ...'), or as it is."""
    return line if caveat is None else f"{caveat}: {line}"


def _forecast_fields(predictions: list[pd.DataFrame], config: BacktestConfig,
                     periods_per_year: float) -> dict[str, Any]:
    quality = [origin_quality(frame) for frame in predictions]
    periods = run_portfolio(predictions, config.top_k, config.long_only, config.cost_bps)
    pooled = pd.concat(predictions, ignore_index=True)
    hits = np.sign(pooled[PREDICTED].to_numpy()) == np.sign(pooled[REALIZED].to_numpy())
    return dict(
        predictions=predictions, quality=quality, periods=periods,
        ic=summarize([q.ic for q in quality]), rank_ic=summarize([q.rank_ic for q in quality]),
        hit_rate=float(hits.mean()), mae_return=float((pooled[PREDICTED] - pooled[REALIZED]).abs().mean()),
        curve=curve_stats([p.net_return for p in periods], [p.turnover for p in periods], periods_per_year),
        benchmark=curve_stats([p.benchmark_return for p in periods], [0.0] * len(periods), periods_per_year))


def score_setting(slot: str, setting: PredictionSetting, predictions: list[pd.DataFrame], config: BacktestConfig,
                  periods_per_year: float) -> SettingScores:
    return SettingScores(slot=slot, setting=setting, **_forecast_fields(predictions, config, periods_per_year),
                         calibration=band_calibration(predictions, setting.sample_count))


def every_in_bars(config: BacktestConfig, schedule: OriginSchedule) -> float:
    """--every in bars; 'day' is the timeline's median bars per day."""
    return schedule.bars_per_day if config.every_bars == EVERY_DAY else float(config.every_bars)


def score_naive(config: BacktestConfig, universe: Universe, schedule: OriginSchedule,
                predictions: list[pd.DataFrame], periods_per_year: float) -> NaiveScores:
    """Persistence, drift and the random-walk band on the pairs of `predictions` (one frame per origin)."""
    lag = hac_lag(config.pred_len, every_in_bars(config, schedule))
    made = [naive_frames(universe, origin, frame, config.lookback, config.pred_len)
            for origin, frame in zip(schedule.origins, predictions)]
    persistence = [m[PERSISTENCE] for m in made]
    drift = ForecastScores(**_forecast_fields([m[DRIFT] for m in made], config, periods_per_year))
    reason = band_unavailable(config.lookback, config.pred_len)
    band = None if reason is not None else band_calibration([m[RANDOM_WALK] for m in made],
                                                                 samples=config.lookback - config.pred_len)
    drift_skill = setting_skill(drift.predictions, drift.quality, persistence, lag, None, None, None)
    return NaiveScores(lag, persistence, drift, drift_skill, band, reason)


def attach_skill(scores: SettingScores, naive: NaiveScores) -> None:
    crps = None if scores.calibration is None else scores.calibration.overall["crps"]
    band_crps = None if naive.band is None else naive.band.overall["crps"]
    scores.skill = setting_skill(scores.predictions, scores.quality, naive.persistence, naive.lag, crps, band_crps,
                                 naive.band_reason)


def _pivot(predictions: list[pd.DataFrame], column: str) -> pd.DataFrame:
    """One row per origin, one column per symbol."""
    return pd.concat(predictions, ignore_index=True).pivot(index="origin", columns="symbol", values=column)


def score_run(config: BacktestConfig, universe: Universe, schedule: OriginSchedule, run_path: Path,
              settings: list[PredictionSetting]) -> BacktestResult:
    """Read every saved origin of every setting back and score them (and their agreement with --compare)."""
    periods_per_year = config.periods_per_year or schedule.periods_per_year
    scores = []
    for slot, setting in zip(("a", "b"), settings):
        frames = []
        for origin in schedule.origins:
            frame = read_origin(origin_path(run_path, slot, origin.index), len(origin.members))
            if frame is None:
                raise KronosTuneError(f"{run_path}: origin {origin.index} of setting '{setting.label()}' is missing "
                                      f"or damaged; run again with --resume {run_path}")
            frames.append(frame)
        scores.append(score_setting(slot, setting, frames, config, periods_per_year))
    naive = score_naive(config, universe, schedule, scores[0].predictions, periods_per_year)
    for setting_scores in scores:
        attach_skill(setting_scores, naive)
    agreement = comparison = None
    if len(scores) == 2:
        a, b = scores
        agreement = ranking_agreement(_pivot(a.predictions, PREDICTED), _pivot(b.predictions, PREDICTED),
                                      _pivot(a.predictions, REALIZED))
        title_a, title_b = config.titles(settings)
        comparison = compare(title_a, a.predictions, a.quality, title_b, b.predictions, b.quality, naive.lag)
    last = schedule.origins[-1]
    end = max(universe.symbols[s].stamps[row + config.pred_len] for s, row in last.members)
    return BacktestResult(config, run_path, universe.source, universe.synthetic, len(universe.symbols), schedule,
                          scores, agreement, naive, comparison, pd.Timestamp(end))


def curve_difference(a: SettingScores, b: SettingScores) -> dict[str, float]:
    """How far B's portfolio curve is from A's: final cumulative return, Sharpe, and the largest gap on the way."""
    gap = (b.net_equity - a.net_equity).abs()
    return {
        "cumulative_return_diff": b.curve.cumulative_return - a.curve.cumulative_return,
        "sharpe_diff": b.curve.sharpe - a.curve.sharpe,
        "curve_max_abs_diff": float(gap.max()) if len(gap) else math.nan,
    }
