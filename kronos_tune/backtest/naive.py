"""Naive forecasts on the same (symbol, origin) pairs as the model: what "doing nothing" scores.

Each one is a function of the symbol's own closes up to the origin (the lookback the model sees):

- persistence: no change, the last close; a predicted return of exactly 0;
- drift: the symbol's mean one-bar log return over its lookback (lookback - 1 returns), times the horizon,
  as a simple return: exp(pred_len * mean) - 1;
- random-walk band: the symbol's empirical pred_len-bar returns over its lookback (lookback - pred_len
  overlapping windows) as a forecast distribution of the return; it gives the band's quantiles, coverage
  and CRPS (kronos_tune.backtest.calibration) that the model's sample band is held against.

They are computed when scoring, from the universe, so runs saved before they existed score them too.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kronos_tune.backtest.calibration import (CALIBRATION_COLUMNS, CRPS_COLUMN, QUANTILE_COLUMNS, crps_from_samples,
                                              sample_quantiles)
from kronos_tune.backtest.metrics import PREDICTED, REALIZED
from kronos_tune.backtest.origins import Origin, Universe

PERSISTENCE, DRIFT, RANDOM_WALK = "persistence", "drift", "random_walk_band"
MIN_BAND_RETURNS = 2  # a distribution needs two returns


def band_unavailable(lookback: int, pred_len: int) -> str | None:
    """Why the random-walk band cannot be built from a lookback, or None when it can."""
    count = lookback - pred_len
    if count >= MIN_BAND_RETURNS:
        return None
    return (f"--lookback {lookback} holds {max(count, 0)} returns of --pred-len {pred_len} bars; the random-walk "
            f"band needs {MIN_BAND_RETURNS} (--lookback {pred_len + MIN_BAND_RETURNS} or more)")


def _history_closes(universe: Universe, origin: Origin, lookback: int) -> np.ndarray:
    """[members, lookback] closes up to the origin, in the order of its members (the saved rows' order)."""
    return np.stack([universe.symbols[s].close[row + 1 - lookback:row + 1] for s, row in origin.members])


def naive_frames(universe: Universe, origin: Origin, predictions: pd.DataFrame, lookback: int,
                 pred_len: int) -> dict[str, pd.DataFrame]:
    """The naive forecasts of one origin's saved predictions (same symbols, same realized returns).

    Returns {persistence, drift} frames with the columns of a saved origin that scoring reads (symbol,
    last_close, realized_close, predicted and realized return), and when the lookback allows, the random-walk
    band's frame with the calibration columns in price units as a sample band's (quantiles of the close, CRPS)."""
    history = _history_closes(universe, origin, lookback)
    base = predictions[["origin", "timestamp", "symbol", "last_close", "realized_close", REALIZED]].copy()
    last = base["last_close"].to_numpy(dtype=np.float64)
    out = {}
    persistence = base.assign(predicted_close=last, **{PREDICTED: 0.0})
    out[PERSISTENCE] = persistence
    one_bar = np.diff(np.log(history), axis=1)
    drift_return = np.expm1(pred_len * one_bar.mean(axis=1)) if one_bar.shape[1] else np.zeros(len(base))
    out[DRIFT] = base.assign(predicted_close=last * (1 + drift_return), **{PREDICTED: drift_return})
    if band_unavailable(lookback, pred_len) is None:
        samples = history[:, pred_len:] / history[:, :-pred_len] * last[:, None]  # closes: last x (1 + r)
        band = base.assign(predicted_close=samples.mean(axis=1))
        band[PREDICTED] = band["predicted_close"] / last - 1.0
        quantiles = sample_quantiles(samples)
        for k, name in enumerate(QUANTILE_COLUMNS):
            band[name] = quantiles[:, k]
        band[CRPS_COLUMN] = crps_from_samples(samples, base["realized_close"].to_numpy(dtype=np.float64))
        out[RANDOM_WALK] = band[[*band.columns.difference(CALIBRATION_COLUMNS, sort=False), *CALIBRATION_COLUMNS]]
    return out
