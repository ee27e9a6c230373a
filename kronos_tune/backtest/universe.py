"""The universe of a backtest: one K-line series per symbol, from files, a panel file or the synthetic generator.

Two file layouts:
- a folder of (or several) per-symbol .csv/.parquet files: the symbol is the file name;
- panel files (``--symbol-column NAME``, or one file with a column ``symbol``, ``ticker``, ``code``,
  ``instrument`` or ``stock``): rows of every symbol, read by `kronos_core.data.panels.read_panel`
  (checked on arrays over the whole file; what it did to the file and its warnings are one note each), or,
  for Parquet panels sorted by symbol, a batch of whole symbols at a time (`kronos_core.data.panel_stream`):
  the universe then holds only each symbol's arrays, never the file's table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS, TIME_COLUMN, find_data_files
from kronos_core.data.panel_stream import SortedPanels, sorted_panels, symbol_batches
from kronos_core.data.panels import read_panel, split_panel
from kronos_core.data.tables import symbol_column
from kronos_core.errors import KronosError
from kronos_core.data.synthetic import synthetic_universe_symbols
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.inputs import read_series_file, say_read_notes, unique_names

NoteCallback = Callable[[str, str], None]


@dataclass
class SymbolSeries:
    """One symbol's bars: timestamps (datetime64[ns], strictly increasing) and the six features."""

    name: str
    stamps: np.ndarray
    features: np.ndarray  # [rows, 6] float64, FEATURE_COLUMNS order

    @property
    def close(self) -> np.ndarray:
        return self.features[:, FEATURE_COLUMNS.index("close")]

    def __len__(self) -> int:
        return len(self.stamps)


@dataclass
class Universe:
    symbols: list[SymbolSeries]
    source: str  # what it was read from, for reports
    synthetic: bool = False


def _symbol_series(name: str, frame: pd.DataFrame) -> SymbolSeries:
    stamps = pd.to_datetime(frame[TIME_COLUMN]).to_numpy(dtype="datetime64[ns]")
    return SymbolSeries(name, stamps, frame[list(FEATURE_COLUMNS)].to_numpy(dtype=np.float64))


def _panel_column(path: Path) -> str | None:
    """The file's symbol column by the one rule (`tables.symbol_column`), else None (a single-symbol file)."""
    try:
        if path.suffix.lower() == ".csv":
            columns = list(pd.read_csv(path, nrows=0).columns)
        else:
            import pyarrow.parquet as parquet

            columns = list(parquet.read_schema(path).names)
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.EmptyDataError):
        return None  # read_kline gives the precise message
    return symbol_column(columns)


def universe_from_files(paths: list[Path], symbol_column: str, on_note: NoteCallback,
                        date_format: str | None = None) -> Universe:
    """Panel files: every symbol of every file (a symbol in two files is refused), sorted by name. Parquet
    panels sorted by symbol are read a batch of whole symbols at a time (`panel_stream`), so only the
    symbols' arrays grow with the universe; other panels are read whole, and a note says so."""
    source = str(paths[0]) if len(paths) == 1 else f"{len(paths)} panel files"
    panels, why = sorted_panels(paths, symbol_column)
    if panels is not None:
        return Universe(_streamed_symbols(panels, symbol_column, on_note, date_format), source)
    on_note("note", f"{why}: the panel is read whole, so memory grows with it; a Parquet panel sorted by "
                    f"{symbol_column} is read in symbol batches (e.g. df.sort_values(['{symbol_column}', time])"
                    f".to_parquet(...))")
    symbols: dict[str, SymbolSeries] = {}
    where: dict[str, Path] = {}
    for path in paths:
        panel = read_panel(path, symbol_column, date_format)
        say_read_notes(panel, on_note)
        for symbol, frame in split_panel(panel):
            if symbol in symbols:
                raise KronosTuneError(f"{path}: symbol {symbol} is also in {where[symbol]}; give each symbol's rows "
                                      "in one file")
            symbols[symbol], where[symbol] = _symbol_series(symbol, frame), path
    return Universe([symbols[name] for name in sorted(symbols)], source)


def _streamed_symbols(panels: SortedPanels, symbol_column: str, on_note: NoteCallback,
                      date_format: str | None) -> list[SymbolSeries]:
    said: set[tuple[str, str]] = set()

    def once(level: str, message: str) -> None:  # each batch would repeat the file's notes
        if (level, message) not in said:
            said.add((level, message))
            on_note(level, message)

    symbols = []
    for panel in symbol_batches(panels, symbol_column, date_format=date_format):
        say_read_notes(panel, once)
        symbols.extend(_symbol_series(symbol, frame) for symbol, frame in split_panel(panel))
    symbols.sort(key=lambda series: series.name)  # as a whole panel's are
    return symbols


def load_universe(data: tuple[Path, ...], synthetic: int | None, synthetic_rows: int, seed: int,
                  on_note: NoteCallback, symbol_column: str | None = None,
                  date_format: str | None = None) -> Universe:
    """Read --data (per-symbol files, panel files with `symbol_column`, or one file with a symbol column of
    SYMBOL_COLUMN_NAMES) or make --synthetic N symbols; `date_format`: how the files write their dates."""
    if not data:
        count = synthetic if synthetic is not None else 0
        try:
            # symbol by symbol: arrays only, never the long panel (its table would be the largest thing held)
            symbols = [SymbolSeries(name, stamps.to_numpy(dtype="datetime64[ns]"),
                                    np.stack([columns[c] for c in FEATURE_COLUMNS], axis=1).astype(np.float64))
                       for name, _sector, stamps, columns in synthetic_universe_symbols(count, synthetic_rows, seed)]
            symbols.sort(key=lambda series: series.name)  # as a panel's symbols are: by name
        except KronosError as error:
            raise KronosTuneError(str(error)) from None
        return Universe(symbols, f"synthetic universe ({count} symbols)", synthetic=True)
    try:
        paths = find_data_files(list(data))
    except KronosError as error:
        raise KronosTuneError(f"--data: {error}") from None
    if symbol_column is not None:
        return universe_from_files(paths, symbol_column, on_note, date_format)
    if len(paths) == 1:
        found = _panel_column(paths[0])
        if found is not None:
            return universe_from_files(paths, found, on_note, date_format)
    symbols = []
    for name, path in zip(unique_names(paths), paths):
        symbols.append(_symbol_series(name, read_series_file(path, on_note, date_format)))
    source = str(data[0]) if len(data) == 1 else f"{len(paths)} files"
    return Universe(symbols, source)
