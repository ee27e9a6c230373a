"""Tables we do not own, read as a user would expect: column names, the time column, its stamps, row order.

What real exports come with, and what happens to it (each handled case adds one note line; each refusal is
one KronosError line naming the file, the line and what to do):

- names in any case and with spaces: matched case-insensitively (two names differing only so: refused);
- the time column under any of TIME_COLUMN_ALIASES, or without a name at all (a written index, which
  pandas reads as ``Unnamed: 0``): read as the time column when its values are dates;
- columns we do not use (``Adj Close``, a written index next to a named time column, ...): ignored, named;
- YYYYMMDD integers: dates (other numbers are refused, their unit is unknown);
- dates with the day and month first (01/07/2024): read the one way every date allows, refused when they all
  read both ways unless a format is given (kronos_core.data.day_month, ``--date-format``);
- tz-aware stamps with several UTC offsets (exchange-local time across a daylight-saving change):
  converted to UTC; some stamps with an offset and some without: refused (the row that differs);
- rows newest first: put in time order; in a panel, each symbol's rows sorted by time (said when they were
  not); a row that repeats another exactly (time and values): dropped; a repeated stamp with other values,
  or in one series a stamp out of order: refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kronos_core.data.day_month import AmbiguousDayMonth, day_first, parse_with_format
from kronos_core.deferred import deferred
from kronos_core.errors import KronosError, one_line

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)

TIME_COLUMN = "timestamps"
# Accepted spellings of the time column, in order of preference.
TIME_COLUMN_ALIASES: tuple[str, ...] = ("timestamps", "timestamp", "date", "datetime", "time")
# Column names that say a file holds many symbols (a panel), for hints and the backtest's panel detection.
SYMBOL_COLUMN_NAMES: tuple[str, ...] = ("symbol", "ticker", "code", "instrument", "stock")
UNNAMED_PREFIX = "unnamed: "  # how pandas names a column whose header cell is empty
_OFFSET = re.compile(r"\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?\s*(Z|[+-]\d{2}:?\d{2})$")
_SHOWN_NAMES = 8


def format_stamp(ts: object) -> str:
    return "NaT" if pd.isna(ts) else str(pd.Timestamp(ts))


def row_label(row: int, first_line: int | None) -> str:
    """'row N' (0-based data row) or, for a text file whose first data row is `first_line`, 'line N'."""
    return f"row {row}" if first_line is None else f"line {row + first_line}"


def first_data_line(path: Path) -> int | None:
    """The file line of data row 0: 2 for a CSV (line 1 is the header); None (name rows) for Parquet."""
    return 2 if path.suffix.lower() == ".csv" else None


def read_table(path: Path) -> pd.DataFrame:
    """A .csv or .parquet file as read by pandas; unreadable files are one line naming them."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        try:
            return pd.read_csv(path)
        except pd.errors.EmptyDataError:
            raise KronosError(f"{path}: file is empty; give a CSV with a header row and data") from None
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise KronosError(f"{path}: could not read CSV ({one_line(exc, typed=False)}); check the file") from None
    if suffix == ".parquet":
        try:
            return pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise KronosError(f"{path}: could not read Parquet ({one_line(exc, typed=False)}); "
                              "check the file") from None
    raise KronosError(f"{path}: unsupported file type '{path.suffix}'; use .csv or .parquet")


def lower_columns(frame: pd.DataFrame, source: object) -> list[str]:
    """Strip and lower-case the frame's column names in place and return them; two names that differ only in
    case or spaces are an error naming ``source``. The names as the file spells them stay in
    ``frame.attrs["file_columns"]`` (lower-case name -> file name)."""
    originals = [str(c) for c in frame.columns]
    names = [c.strip().lower() for c in originals]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise KronosError(f"{source}: columns {dupes} appear more than once (names ignore case); keep one of each")
    frame.columns = names
    frame.attrs["file_columns"] = dict(zip(names, originals))
    return names


def symbol_column(columns: Sequence[object]) -> str | None:
    """The one rule for a panel's symbol column when none is named: the first of `columns` (in the file's
    order) whose name, in any case and without spaces around it, is one of SYMBOL_COLUMN_NAMES; returned as
    spelled. None: a single-series file."""
    return next((str(c) for c in columns if str(c).strip().lower() in SYMBOL_COLUMN_NAMES), None)


def file_name(frame: pd.DataFrame, name: str) -> str:
    """Column `name` (lower case) as the file spells it."""
    return frame.attrs.get("file_columns", {}).get(name, name)


def found_columns(frame: pd.DataFrame | None, names: Sequence[str]) -> str:
    """The columns of an error's "(found: ...)" as the file spells them (`frame` after lower_columns)."""
    shown = [name if frame is None else file_name(frame, name) for name in names]
    return ", ".join(shown) or "none"


def time_column(names: Sequence[str], source: object, frame: pd.DataFrame | None = None) -> str:
    """The first accepted spelling of the time column among ``names`` (`frame`: to name the file's columns as
    it spells them when there is none)."""
    found = next((a for a in TIME_COLUMN_ALIASES if a in names), None)
    if found is None:
        raise KronosError(f"{source}: no time column (found: {found_columns(frame, names)}); "
                          f"name it one of {', '.join(TIME_COLUMN_ALIASES)}")
    return found


def locate_time_column(frame: pd.DataFrame, names: Sequence[str], source: object, notes: list[str],
                       date_format: str | None = None) -> str:
    """`time_column`, or else a first column without a name whose values are dates (a written index)."""
    if any(alias in names for alias in TIME_COLUMN_ALIASES) or not names or not names[0].startswith(UNNAMED_PREFIX):
        return time_column(names, source, frame)
    try:
        parse_timestamps(frame[names[0]].head(50), str(source), date_format=date_format)
    except AmbiguousDayMonth:
        pass  # dates still; which reading is judged on the whole column
    except KronosError:
        return time_column(names, source, frame)
    notes.append(f"{source}: the first column has no name; read it as the time column (a written index)")
    return names[0]


def time_values(raw: pd.DataFrame, names: Sequence[str], source: object, notes: list[str],
                date_format: str | None = None) -> tuple[pd.Series, str, set[str]]:
    """The raw stamps (separate ``date`` and ``time`` columns joined, as many exports write them), the column
    as the file names it (for messages), and the names of the columns they came from."""
    time_col = locate_time_column(raw, names, source, notes, date_format)
    column = file_name(raw, time_col)
    if time_col == "date" and "time" in names:
        stamps = raw["date"].astype(str).str.strip() + " " + raw["time"].astype(str).str.strip()
        return stamps, f"{column} + {file_name(raw, 'time')}", {"date", "time"}
    return raw[time_col], column, {time_col}


def ignored_columns_note(names: Sequence[str], used: set[str], source: object) -> str | None:
    ignored = [n for n in names if n not in used]
    if not ignored:
        return None
    shown = ", ".join(ignored[:_SHOWN_NAMES]) + (f" and {len(ignored) - _SHOWN_NAMES} more"
                                                 if len(ignored) > _SHOWN_NAMES else "")
    return f"{source}: ignored columns: {shown}"


def _is_mixed_zones(error: Exception) -> bool:
    return "mixed timezone" in str(error).lower()


def _offsets(text: pd.Series) -> pd.Series:
    return text.str.extract(_OFFSET, expand=False)


def _mixed_offsets(values: pd.Series, source: str, column: str, first_line: int | None,
                   notes: list[str] | None, dayfirst: bool = False) -> pd.Series:
    """Stamps with several UTC offsets, as UTC; stamps with and without an offset in one column are refused."""
    text = values.astype(str).str.strip()
    offsets = _offsets(text)
    has = offsets.notna().to_numpy()
    # Rows that are no date at all (and missing ones) are reported as such by the caller, not here.
    plain = np.flatnonzero(values.notna().to_numpy() & ~has)
    if len(plain):
        dates = pd.to_datetime(values.iloc[plain], errors="coerce", format="mixed",
                               dayfirst=dayfirst).notna().to_numpy()
        plain = plain[dates]
    dated = np.union1d(np.flatnonzero(has), plain)
    if len(plain) and len(plain) < len(dated):
        row = int(dated[np.argmax(has[dated] != has[dated[0]])])
        kind = "has one" if has[row] else "has none"
        raise KronosError(f"{source}: column '{column}' mixes stamps with and without a UTC offset "
                          f"({row_label(row, first_line)}: {text.iloc[row][:40]!r} {kind}); give every stamp "
                          "an offset or none")
    try:
        parsed = pd.to_datetime(values, utc=True, dayfirst=dayfirst)
    except (ValueError, TypeError, OverflowError):
        parsed = pd.to_datetime(values, utc=True, errors="coerce", format="mixed", dayfirst=dayfirst)
    if notes is not None:
        seen = list(dict.fromkeys(offsets.dropna()))
        shown = ", ".join(seen[:4]) + (" ..." if len(seen) > 4 else "")
        notes.append(f"{source}: column '{column}' has mixed UTC offsets ({shown}); converted the timestamps to UTC")
    return parsed


def parse_timestamps(values: pd.Series, source: str, first_line: int | None = None, column: str = TIME_COLUMN,
                     notes: list[str] | None = None, date_format: str | None = None) -> pd.Series:
    """A time column as datetime64 (see the module doc), or KronosError naming `column` and the first bad row.
    What was done to the values (mixed offsets converted) is appended to `notes`. `date_format` (strptime
    directives, --date-format) reads text stamps; without it, dates written day and month first are read
    the only way the column allows (kronos_core.data.day_month)."""
    if pd.api.types.is_datetime64_any_dtype(values):
        parsed = values
    elif pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        # Only YYYYMMDD integers are unambiguous; epoch numbers need a unit we can't guess.
        as_int = values.dropna()
        if len(as_int) and ((as_int % 1 == 0) & (as_int >= 1900_01_01) & (as_int <= 2199_12_31)).all():
            parsed = pd.to_datetime(values.astype("Int64").astype(str), format="%Y%m%d", errors="coerce")
        else:
            raise KronosError(
                f"{source}: column '{column}' holds numbers, not dates; "
                "write dates like 2024-01-02 09:35:00 (or YYYYMMDD)"
            )
    elif date_format is not None:
        parsed = parse_with_format(values, date_format, source, column, first_line)
    else:
        error: Exception | None = None
        dayfirst = day_first(values, source, column, first_line)
        try:
            parsed = pd.to_datetime(values, dayfirst=dayfirst)
        except (ValueError, TypeError, OverflowError) as first:
            error = first
            if not _is_mixed_zones(first):
                try:
                    parsed, error = pd.to_datetime(values, errors="coerce", format="mixed", dayfirst=dayfirst), None
                except (ValueError, TypeError, OverflowError) as second:
                    error = second
        if error is not None:
            if not _is_mixed_zones(error):
                raise KronosError(
                    f"{source}: column '{column}' could not be parsed as dates ({one_line(error, typed=False)}); "
                    "use one format like 2024-01-02 09:35:00"
                ) from None
            parsed = _mixed_offsets(values, source, column, first_line, notes, dayfirst)
    parsed = pd.Series(parsed, index=values.index, name=TIME_COLUMN)
    bad = parsed.isna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        raw = values.iloc[row]
        what = "is empty" if pd.isna(raw) else f"has unparseable value {str(raw)[:40]!r}"
        raise KronosError(f"{source}: column '{column}' {what} at {row_label(row, first_line)}; "
                          "fix or drop that row")
    if not pd.api.types.is_datetime64_any_dtype(parsed):
        # e.g. mixed UTC offsets come back as objects
        raise KronosError(
            f"{source}: column '{column}' mixes time zones or formats; use one time zone and format"
        )
    return parsed


def absolute_ns(stamps: pd.Series) -> np.ndarray:
    """int64 nanoseconds of parsed stamps (UTC instants for tz-aware ones), for ordering."""
    return pd.DatetimeIndex(stamps).as_unit("ns").asi8


def order_rows(codes: np.ndarray, ns: np.ndarray, values: np.ndarray, stamps: pd.Series, source: str,
               first_line: int | None = None, symbols: Sequence[str] | None = None,
               notes: list[str] | None = None) -> np.ndarray:
    """Row positions in time order within each symbol (grouped by `codes`, in code order), exact repeats left out.

    `codes` [n] numbers the symbol of each row (all 0 for one series; `symbols` names them for a panel),
    `ns` [n] its time, `values` [n, k] its numbers, `stamps` the parsed time column (for messages). Rows
    that all run newest first are read backwards; a panel's rows are sorted by time within each symbol (a
    panel's row order carries no meaning); a row equal to another in time and values is dropped (each said
    in `notes`). A repeated stamp with other values, or in one series a stamp out of order, raises
    KronosError at the first such row of the file."""
    count = len(ns)
    panel = symbols is not None
    position = np.arange(count)
    by_symbol = np.argsort(codes, kind="stable")
    grouped_codes = codes[by_symbol]
    same = grouped_codes[1:] == grouped_codes[:-1]
    steps = np.diff(ns[by_symbol])
    owners = grouped_codes[1:]
    symbol_count = int(codes.max()) + 1 if count else 0
    down = np.bincount(owners[same & (steps < 0)], minlength=symbol_count) > 0
    up = np.bincount(owners[same & (steps > 0)], minlength=symbol_count) > 0
    newest_first = down & ~up
    unordered = down & up if panel else np.zeros(symbol_count, dtype=bool)
    if panel:
        order = np.lexsort((position, ns, codes))
    else:
        order = np.lexsort((np.where(newest_first[codes], -position, position), codes))

    ordered_ns, ordered_codes = ns[order], codes[order]
    same = ordered_codes[1:] == ordered_codes[:-1]
    steps = np.diff(ordered_ns)
    repeated = same & (steps == 0)
    exact = repeated & (values[order][1:] == values[order][:-1]).all(axis=1)
    problems = np.flatnonzero((same & (steps < 0)) | (repeated & ~exact))
    if len(problems):
        later = np.maximum(order[problems], order[problems + 1])
        k = int(problems[np.argmin(later)])
        before, after = order[k], order[k + 1]
        where = f"{source}: symbol {symbols[codes[after]]}:" if panel else f"{source}:"
        if ordered_ns[k] == ordered_ns[k + 1]:
            a, b = sorted((int(before), int(after)))
            lines = "rows" if first_line is None else "lines"
            raise KronosError(f"{where} duplicate timestamp {format_stamp(stamps.iloc[after])} at {lines} "
                              f"{a + (first_line or 0)} and {b + (first_line or 0)}; drop duplicates")
        raise KronosError(f"{where} timestamps not increasing at {row_label(int(after), first_line)} "
                          f"({format_stamp(stamps.iloc[after])} after {format_stamp(stamps.iloc[before])}); "
                          "sort the rows by time")
    if notes is not None:
        _order_notes(notes, source, first_line, symbols, newest_first, unordered, codes, ns, by_symbol)
        if exact.any():
            first = int(np.min(np.maximum(order[:-1][exact], order[1:][exact])))
            what = "symbol, time and values" if panel else "time and values"
            notes.append(f"{source}: dropped {int(exact.sum())} repeated rows (same {what} as another row, first "
                         f"at {row_label(first, first_line)})")
    keep = np.ones(count, dtype=bool)
    keep[1:] = ~exact
    return order[keep]


def _order_notes(notes: list[str], source: str, first_line: int | None, symbols: Sequence[str] | None,
                 newest_first: np.ndarray, unordered: np.ndarray, codes: np.ndarray, ns: np.ndarray,
                 by_symbol: np.ndarray) -> None:
    flipped = np.flatnonzero(newest_first)
    if len(flipped) and symbols is None:
        notes.append(f"{source}: the rows run newest first; read them in time order")
    elif len(flipped):
        notes.append(f"{source}: the rows of {len(flipped)} symbols run newest first (e.g. {symbols[flipped[0]]}); "
                     "read them in time order")
    if symbols is not None and unordered.any():
        grouped = codes[by_symbol]
        back = np.flatnonzero((grouped[1:] == grouped[:-1]) & (np.diff(ns[by_symbol]) < 0)
                              & unordered[grouped[1:]])
        row = int(np.min(by_symbol[back + 1]))
        notes.append(f"{source}: the rows of {int(unordered.sum())} symbols were out of time order (first "
                     f"{symbols[codes[row]]} at {row_label(row, first_line)}); sorted them by time")


__all__ = ["SYMBOL_COLUMN_NAMES", "TIME_COLUMN", "TIME_COLUMN_ALIASES", "absolute_ns", "file_name",
           "first_data_line", "format_stamp", "ignored_columns_note", "locate_time_column", "lower_columns",
           "order_rows", "parse_timestamps", "read_table", "row_label", "symbol_column", "time_column",
           "time_values"]


def _header(path: Path) -> list[str]:
    if path.suffix.lower() == ".csv":
        return [str(c) for c in pd.read_csv(path, nrows=0).columns]
    import pyarrow.parquet as parquet

    return list(parquet.read_schema(path).names)


def _time_names(names: Sequence[str]) -> list[str]:
    """The file's names of the columns the stamps come from (tables.time_values' choice), or none."""
    lowered = [n.strip().lower() for n in names]
    found = next((a for a in TIME_COLUMN_ALIASES if a in lowered), None)
    if found is None:
        return names[:1] if names and lowered[0].startswith(UNNAMED_PREFIX) else []
    wanted = {found, "time"} if found == "date" else {found}
    return [name for name, low in zip(names, lowered) if low in wanted]


def check_file_dates(paths: Sequence[Path], date_format: str | None = None) -> None:
    """A data file's dates checked alone, before a job claims its folder (`kronos-tune train` reads its data in
    the training process, after the run folder exists): only the time column of each file is read, and parsed as
    `read_kline` and `read_panel` parse it, so an ambiguous or unreadable date column is one line with nothing
    written. A file that cannot be read, or has no time column, is left to the full read to describe."""
    for path in paths:
        path = Path(path)
        try:
            columns = _time_names(_header(path))
            if not columns:
                continue
            if path.suffix.lower() == ".csv":
                raw = pd.read_csv(path, usecols=columns)[columns]
            else:
                raw = pd.read_parquet(path, columns=columns)
        except (ImportError, OSError, ValueError, UnicodeDecodeError):
            continue
        names = lower_columns(raw, path)
        stamps, column, _ = time_values(raw, names, path, [], date_format)
        parse_timestamps(stamps, str(path), first_data_line(path), column=column, date_format=date_format)
