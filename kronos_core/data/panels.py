"""Panel files: one long table of many symbols (a symbol column, a time column, OHLCV), read and checked once.

    panel = read_panel("sp500_daily.csv", "Symbol")   # symbol, timestamps, open ... (what the file has)
    series = load_series(["sp500_daily.csv"], symbol_column="Symbol").all()   # kronos_core.data.series

`read_panel` handles what real files come with as `read_kline` does for one series (kronos_core.data.tables:
names in any case, the time column named or a written index, YYYYMMDD integers, mixed UTC offsets
converted to UTC, columns it does not use ignored and named), with every check done on arrays over the whole
file: values numeric, finite and prices > 0 (errors name the file line), each symbol's rows in time order
(a symbol newest first is read backwards, exact repeats are dropped, any other repeat or step back is one
error naming the symbol and line). Rows come back grouped by symbol (in order of first appearance) and in
time order within each, so `kronos_core.predict.panel.panel_inputs` takes them without sorting.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kronos_core.data.kline import FEATURE_COLUMNS, PRICE_COLUMNS, check_values
from kronos_core.data.tables import (TIME_COLUMN, absolute_ns, file_name, first_data_line, found_columns,
                                     ignored_columns_note, lower_columns, order_rows, parse_timestamps, read_table,
                                     row_label, time_values)
from kronos_core.deferred import deferred
from kronos_core.errors import KronosError

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)

SYMBOL = "symbol"  # the symbol column's name in what read_panel returns


def read_panel(path: str | Path, symbol_col: str = SYMBOL, date_format: str | None = None) -> pd.DataFrame:
    """Read a panel file (.csv or .parquet): columns ``symbol``, ``timestamps`` and the feature columns the file
    has (float64), rows grouped by symbol and in time order (see the module doc). ``attrs``: ``source``,
    ``notes`` (one line per thing done to the file), ``warnings`` (suspicious but usable values, one line
    each over the whole file), ``symbol_column`` (as the file spells it). ``date_format``: as for read_kline."""
    path = Path(path)
    if not path.is_file():
        raise KronosError(f"{path}: file not found; check the path")
    return panel_from_table(read_table(path), path, symbol_col, date_format)


def panel_from_table(raw: pd.DataFrame, path: Path, symbol_col: str = SYMBOL,
                     date_format: str | None = None) -> pd.DataFrame:
    """`read_panel` on a table already read from `path` (all of it, or whole symbols of it)."""
    names = lower_columns(raw, path)
    key = symbol_col.strip().lower()
    if key not in names:
        raise KronosError(f"{path}: no symbol column '{symbol_col}' (found: {found_columns(raw, names)}); "
                          f"pass the column that names each series with --symbol-column")
    notes: list[str] = []
    stamps, column, used = time_values(raw, names, path, notes, date_format)
    for name in PRICE_COLUMNS:
        if name not in names:
            raise KronosError(f"{path}: missing price column '{name}' (found: {found_columns(raw, names)}); add or "
                              f"rename it")
    present = [c for c in FEATURE_COLUMNS if c in names]
    ignored = ignored_columns_note(names, {key, *used, *present}, path)
    if ignored is not None:
        notes.insert(0, ignored)
    source = str(path)
    first_line = first_data_line(path)
    symbols = raw[key]
    missing = symbols.isna().to_numpy()
    if missing.any():
        row = int(np.argmax(missing))
        raise KronosError(f"{source}: empty {file_name(raw, key)} at {row_label(row, first_line)}; "
                          "fill or drop that row")
    ts = parse_timestamps(stamps, source, first_line, column=column, notes=notes,
                          date_format=date_format).reset_index(drop=True)
    frame = pd.DataFrame({TIME_COLUMN: ts, **{c: raw[c].to_numpy() for c in present}})
    values, found_warnings = check_values(frame, source, first_line)
    codes, uniques = pd.factorize(symbols, sort=False)
    matrix = np.stack([values[c] for c in present], axis=1)
    keep = order_rows(codes, absolute_ns(ts), matrix, ts, source, first_line,
                      symbols=[str(u) for u in uniques], notes=notes)
    out = pd.DataFrame({SYMBOL: symbols.to_numpy()[keep], TIME_COLUMN: ts.take(keep).reset_index(drop=True),
                        **{c: values[c][keep] for c in present}})
    out.attrs.update(source=source, notes=notes, warnings=found_warnings, symbol_column=file_name(raw, key))
    return out


__all__ = ["SYMBOL", "panel_from_table", "read_panel"]
