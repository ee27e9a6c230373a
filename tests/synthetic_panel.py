"""The synthetic universe as one long panel, and that panel split into the backtest's universe (tests only: the
product reads the synthetic symbols one at a time, kronos_core.data.synthetic.synthetic_universe_symbols)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS, TIME_COLUMN
from kronos_core.data.synthetic import synthetic_universe_symbols
from kronos_core.data.series import KlineSeries
from kronos_tune.backtest.origins import Universe

SYMBOL_COLUMN, SECTOR_COLUMN = "symbol", "sector"


def synthetic_universe(n_symbols: int, **settings: Any) -> pd.DataFrame:
    """Columns ``symbol, sector, timestamps, open ... amount``, rows sorted by symbol, then time."""
    parts = []
    for symbol, sector, stamps, columns in synthetic_universe_symbols(n_symbols, **settings):
        frame = pd.DataFrame({TIME_COLUMN: stamps.to_numpy(), **columns}, columns=[TIME_COLUMN, *FEATURE_COLUMNS])
        frame.insert(0, SECTOR_COLUMN, sector)
        frame.insert(0, SYMBOL_COLUMN, symbol)
        parts.append(frame)
    return pd.concat(parts, ignore_index=True)


def universe_of(panel: pd.DataFrame, source: str = "synthetic") -> Universe:
    """A panel of synthetic_universe's columns as one series per symbol."""
    symbols = [KlineSeries(str(name), pd.to_datetime(group[TIME_COLUMN]).to_numpy(dtype="datetime64[ns]"),
                            group[list(FEATURE_COLUMNS)].to_numpy(dtype=np.float64))
               for name, group in panel.groupby(SYMBOL_COLUMN, sort=True)]
    return Universe(symbols, source)
