"""Backtests of Kronos forecasts over a universe of symbols: IC / RankIC, a cost-aware portfolio, and how much
a prediction speed-up changes the ranking (`ranking_agreement`). The CLI is `kronos-tune backtest`."""

from __future__ import annotations

from kronos_core.deferred import lazy_exports

# Loaded on first use (as kronos_core's names): importing one backtest module does not import the others.
_EXPORTS = {
    **{name: "kronos_tune.backtest.agreement" for name in ("RankingAgreement", "ranking_agreement",
                                                           "returns_from_frames")},
    **{name: "kronos_tune.backtest.config" for name in ("BacktestConfig", "PredictionSetting", "parse_setting")},
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
