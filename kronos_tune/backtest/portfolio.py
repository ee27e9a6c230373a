"""A cost-aware portfolio rebalanced at each origin from the predicted returns.

Long-short: +1/k on the k symbols with the highest predicted return, -1/k on
the k lowest (gross exposure 2). Long-only: +1/k on the top k, measured
against the equal-weight universe of that origin. Positions are held over the
prediction horizon, so a period's return is sum(weight x realized return).

Turnover of a rebalance is sum |w_new - w_old| over symbols (the first one
builds the book from cash: its turnover is the gross exposure); weights do
not drift between rebalances. Cost of a period = turnover x cost_bps / 10,000,
subtracted from its return. Annualizing uses the rebalances per year; below
FEW_PERIODS periods an annualized figure is an extrapolation, so the Sharpe
ratio comes with its 95 % interval (Lo 2002: the per-period ratio's standard
error sqrt((1 + SR^2 / 2) / n) for independent returns) and every view says
how few periods it rests on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kronos_tune.backtest.metrics import PREDICTED, REALIZED

LONG_SHORT = "long-short"
LONG_ONLY = "long-only"
FEW_PERIODS = 30  # fewer rebalances than this: annualized figures are extrapolations


def target_weights(predictions: pd.DataFrame, top_k: int, long_only: bool) -> pd.Series:
    """Weights by symbol; ties in the predicted return are broken by symbol name (stable)."""
    ranked = predictions.sort_values([PREDICTED, "symbol"], ascending=[False, True], kind="mergesort")
    weights = pd.Series(0.0, index=ranked["symbol"].to_numpy())
    weights.iloc[:top_k] = 1.0 / top_k
    if not long_only:
        weights.iloc[len(weights) - top_k:] = -1.0 / top_k
    return weights


@dataclass(frozen=True)
class Period:
    """One rebalance and its holding period (returns are fractions, not percent)."""

    gross_return: float
    turnover: float
    cost: float
    net_return: float
    long_return: float       # mean realized return of the long leg
    short_return: float      # mean realized return of the short leg (NaN when long-only)
    benchmark_return: float  # equal-weight universe of the origin


def run_portfolio(origins: list[pd.DataFrame], top_k: int, long_only: bool, cost_bps: float) -> list[Period]:
    """Periods of the portfolio over the origins' predictions, in order."""
    periods, previous = [], pd.Series(dtype=np.float64)
    for predictions in origins:
        weights = target_weights(predictions, top_k, long_only)
        realized = predictions.set_index("symbol")[REALIZED].reindex(weights.index)
        symbols = weights.index.union(previous.index)
        turnover = float((weights.reindex(symbols, fill_value=0.0) - previous.reindex(symbols, fill_value=0.0))
                         .abs().sum())
        gross = float((weights * realized).sum())
        cost = turnover * cost_bps / 10_000.0
        periods.append(Period(
            gross_return=gross, turnover=turnover, cost=cost, net_return=gross - cost,
            long_return=float(realized[weights > 0].mean()),
            short_return=math.nan if long_only else float(realized[weights < 0].mean()),
            benchmark_return=float(realized.mean())))
        previous = weights
    return periods


@dataclass(frozen=True)
class CurveStats:
    cumulative_return: float
    annualized_return: float
    annualized_volatility: float
    sharpe: float        # mean / std of period returns x sqrt(periods per year), zero risk-free rate
    max_drawdown: float  # largest fall from a running peak of the equity curve, as a positive fraction
    turnover: float      # mean turnover per rebalance
    periods: int = 0     # rebalances the figures rest on
    sharpe_low: float = math.nan   # the Sharpe ratio's 95 % interval (sharpe_interval)
    sharpe_high: float = math.nan


def sharpe_interval(sharpe: float, periods: int, periods_per_year: float) -> tuple[float, float]:
    """The 95 % interval of an annualized Sharpe ratio from `periods` returns: the per-period ratio plus or minus
    1.96 x sqrt((1 + SR^2 / 2) / n) (Lo 2002, independent returns), annualized like the ratio itself."""
    from scipy.stats import norm

    if periods < 2 or not math.isfinite(sharpe) or periods_per_year <= 0:
        return math.nan, math.nan
    scale = math.sqrt(periods_per_year)
    per_period = sharpe / scale
    error = math.sqrt((1.0 + per_period**2 / 2.0) / periods)
    z = float(norm.ppf(0.975))  # two-sided 95%
    return (per_period - z * error) * scale, (per_period + z * error) * scale


def equity_curve(returns: pd.Series | list[float]) -> pd.Series:
    """Growth of 1 through the period returns (one value per period, after that period)."""
    return (1.0 + pd.Series(returns, dtype=np.float64)).cumprod()


def curve_stats(returns: list[float], turnovers: list[float], periods_per_year: float) -> CurveStats:
    series = pd.Series(returns, dtype=np.float64)
    n = len(series)
    if n == 0:
        return CurveStats(*(math.nan,) * 6)
    equity = equity_curve(series)
    cumulative = float(equity.iloc[-1] - 1.0)
    final = float(equity.iloc[-1])
    annualized = final ** (periods_per_year / n) - 1.0 if final > 0 else -1.0
    std = float(series.std(ddof=1)) if n > 1 else math.nan
    volatility = std * math.sqrt(periods_per_year) if n > 1 else math.nan
    sharpe = float(series.mean()) / std * math.sqrt(periods_per_year) if n > 1 and std > 0 else math.nan
    peaks = pd.concat([pd.Series([1.0]), equity], ignore_index=True).cummax().iloc[1:].to_numpy()
    drawdown = float(np.max(1.0 - equity.to_numpy() / peaks))
    low, high = sharpe_interval(sharpe, n, periods_per_year)
    return CurveStats(cumulative, annualized, volatility, sharpe, max(drawdown, 0.0),
                      float(pd.Series(turnovers, dtype=np.float64).mean()), n, low, high)
