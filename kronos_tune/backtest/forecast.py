"""Forecasters: turn the windows of an origin into predicted closes at the end of the horizon.

A forecaster is any callable ``forecaster(windows, pred_len) -> np.ndarray``:
one predicted close per window, or ``[windows, N]`` sampled closes (N >= 2: the
point forecast is their mean, and the backtest scores the band's calibration). `KronosForecaster` runs the model through
`KronosPredictor.predict_arrays` (the array path: no DataFrame per series) in
calls of ``batch_size`` series, each window sampling from its own stream keyed by
the run's seed, its symbol and its last history bar (so each origin draws its
own numbers, the same however the windows are batched);
`OracleForecaster` returns the realized close (a perfect predictor, to check
the scoring).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kronos_core.data.kline import FEATURE_COLUMNS, calendar_features_ns
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.predict.streams import series_key
from kronos_tune.backtest.config import PredictionSetting
from kronos_tune.backtest.origins import Origin
from kronos_tune.backtest.universe import Universe

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
ChunkCallback = Callable[[int], None]  # called with the number of series just predicted


class KronosForecaster:
    """Kronos through the predictor's batch path; `on_chunk` hears after each predict call."""

    def __init__(self, predictor: KronosPredictor, setting: PredictionSetting, batch_size: int,
                 on_chunk: ChunkCallback | None = None, seed: int = 0):
        self.predictor = predictor
        self.setting = setting
        self.batch_size = batch_size
        self.on_chunk = on_chunk
        self.seed = seed

    def __call__(self, windows: list[Window], pred_len: int) -> np.ndarray:
        closes = []
        for start in range(0, len(windows), self.batch_size):
            chunk = windows[start:start + self.batch_size]
            x = np.stack([w.history for w in chunk]).astype(np.float32)
            history_ns = np.stack([w.history_stamps for w in chunk]).view(np.int64)
            x_stamp = calendar_features_ns(history_ns)
            keys = [series_key(w.symbol, int(last)) for w, last in zip(chunk, history_ns[:, -1])]
            y_stamp = calendar_features_ns(np.stack([w.future_stamps for w in chunk]).view(np.int64))
            with warnings.catch_warnings():
                # A lookback longer than max_context is reported once by the runner.
                warnings.filterwarnings("ignore", message=r"a history of \d+ rows is longer than max_context")
                samples = self.predictor.predict_arrays(
                    x, x_stamp, y_stamp, T=self.setting.temperature, top_k=self.setting.sample_top_k,
                    top_p=self.setting.top_p, sample_count=self.setting.sample_count, verbose=False,
                    keys=keys, seed=self.seed)
            # [series, samples, pred_len, 6]: every sample's close at the end of the horizon.
            closes.append(samples[:, :, -1, CLOSE].astype(np.float64))
            if self.on_chunk is not None:
                self.on_chunk(len(chunk))
        final = np.concatenate(closes) if closes else np.zeros((0, self.setting.sample_count))
        return final if self.setting.sample_count >= 2 else final.mean(axis=1)


class OracleForecaster:
    """Predicts exactly what happened: RankIC 1, the portfolio of the realized top-k."""

    def __call__(self, windows: list[Window], pred_len: int) -> np.ndarray:
        return np.asarray([w.realized_close for w in windows], dtype=np.float64)
