"""Backtests of Kronos forecasts over a universe of symbols: IC / RankIC, a cost-aware portfolio, and how much
a prediction speed-up changes the ranking (`ranking_agreement`). The CLI is `kronos-tune backtest`."""

from kronos_tune.backtest.agreement import RankingAgreement, ranking_agreement, returns_from_frames
from kronos_tune.backtest.config import BacktestConfig, PredictionSetting, parse_setting

__all__ = ["BacktestConfig", "PredictionSetting", "RankingAgreement", "parse_setting", "ranking_agreement",
           "returns_from_frames"]
