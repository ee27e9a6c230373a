"""Forecasters: turn the windows of an origin into predicted closes at the end of the horizon.

A forecaster is any callable ``forecaster(windows, pred_len) -> np.ndarray``:
one predicted close per window, or ``[windows, N]`` sampled closes (N >= 2: the
point forecast is their mean, and the backtest scores the band's calibration). Kronos itself predicts
through the prediction pipeline (`kronos_tune.backtest.predictions`); a forecaster given to `run_backtest`
replaces it in this process, e.g. `OracleForecaster`, which returns the realized close (a perfect
predictor, to check the scoring).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_tune.backtest.origins import Origin, Universe

CLOSE = FEATURE_COLUMNS.index("close")


@dataclass
class Window:
    """One symbol at one origin: the history the model sees and the realized future it is scored on."""

    origin: int
    symbol: str
    history: np.ndarray        # [lookback, 6]
    history_stamps: np.ndarray
    future_stamps: np.ndarray  # the symbol's own next pred_len bar times
    last_close: float
    realized_close: float      # close pred_len bars after the origin


def origin_windows(universe: Universe, origin: Origin, lookback: int, pred_len: int,
                   future: np.ndarray | None = None) -> list[Window]:
    """Every member's window; `future` (pred_len stamps, e.g. from an exchange calendar) replaces the stamps of
    each symbol's own next bars as what the model is told about the horizon."""
    windows = []
    for s, row in origin.members:
        series = universe.symbols[s]
        start = row + 1 - lookback
        windows.append(Window(
            origin=origin.index, symbol=series.name, history=series.features[start:row + 1],
            history_stamps=series.stamps[start:row + 1],
            future_stamps=series.stamps[row + 1:row + 1 + pred_len] if future is None else future,
            last_close=float(series.close[row]), realized_close=float(series.close[row + pred_len])))
    return windows


Forecaster = Callable[[list[Window], int], np.ndarray]


class OracleForecaster:
    """Predicts exactly what happened: RankIC 1, the portfolio of the realized top-k."""

    def __call__(self, windows: list[Window], pred_len: int) -> np.ndarray:
        return np.asarray([w.realized_close for w in windows], dtype=np.float64)
