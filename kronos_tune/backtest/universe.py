"""The universe of a backtest: one `KlineSeries` per symbol, read by the one loader (kronos_core.data.series).

Per-symbol files (the symbol is the file name) keep their order; panel files (``--symbol-column NAME``, or one
file with a column ``symbol``, ``ticker``, ``code``, ``instrument`` or ``stock``) and the synthetic universe are
sorted by symbol. A sorted Parquet panel streams a batch of whole symbols at a time, so the universe holds only
each symbol's arrays, never the file's table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kronos_core.data.kline import find_data_files
from kronos_core.data.series import KlineSeries, NoteCallback, load_series
from kronos_core.errors import KronosError
from kronos_tune.errors import KronosTuneError


@dataclass
class Universe:
    symbols: list[KlineSeries]
    source: str  # what it was read from, for reports
    synthetic: bool = False


def load_universe(data: tuple[Path, ...], synthetic: int | None, synthetic_rows: int, seed: int,
                  on_note: NoteCallback, symbol_column: str | None = None,
                  date_format: str | None = None) -> Universe:
    """Read --data (per-symbol files, panel files with `symbol_column`, or one file with a symbol column of
    SYMBOL_COLUMN_NAMES) or make --synthetic N symbols; `date_format`: how the files write their dates."""
    try:
        if data:
            find_data_files(list(data))
    except KronosError as error:
        raise KronosTuneError(f"--data: {error}") from None
    try:
        loaded = load_series(data, on_note, symbol_column=symbol_column, date_format=date_format,
                             synthetic=synthetic, rows=synthetic_rows, seed=seed, universe=True)
        symbols = loaded.all()
    except KronosError as error:
        raise KronosTuneError(str(error)) from None
    if loaded.name_column is not None or loaded.synthetic:
        symbols.sort(key=lambda series: series.name)
    return Universe(symbols, loaded.source, loaded.synthetic)
