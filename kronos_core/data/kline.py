"""Reading, checking and normalizing K-line (OHLCV candlestick) data.

A K-line frame has a ``timestamps`` column (datetime64) and the six feature
columns ``open, high, low, close, volume, amount``. The calendar features and
the normalization here match the reference Kronos implementation exactly, so
the training and prediction code can share them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from kronos_core.data.tables import (TIME_COLUMN, absolute_ns, file_name, first_data_line, format_stamp,
                                     found_columns, ignored_columns_note, lower_columns, order_rows,
                                     parse_timestamps, read_table, row_label, symbol_column, time_values)
from kronos_core.deferred import deferred
from kronos_core.errors import KronosError

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)

PRICE_COLUMNS: tuple[str, ...] = ("open", "high", "low", "close")
FEATURE_COLUMNS: tuple[str, ...] = PRICE_COLUMNS + ("volume", "amount")
TIME_FEATURES: tuple[str, ...] = ("minute", "hour", "weekday", "day", "month")

DATA_SUFFIXES: tuple[str, ...] = (".csv", ".parquet")

_NORM_EPS = 1e-5


class KlineDataWarning(UserWarning):
    """A suspicious but usable K-line file (e.g. high below close)."""


def calendar_features(timestamps: pd.Series | pd.DatetimeIndex | Sequence | np.ndarray) -> np.ndarray:
    """Return float32 [n, 5]: minute, hour, weekday (Mon=0), day of month, month.

    Same values as the reference ``x.dt.minute, x.dt.hour, x.dt.weekday,
    x.dt.day, x.dt.month``; time-zone-aware stamps use their local wall time.
    """
    if isinstance(timestamps, pd.Series):
        idx = pd.DatetimeIndex(pd.to_datetime(timestamps).array)
    else:
        idx = pd.DatetimeIndex(pd.to_datetime(timestamps))
    if len(idx) == 0:
        return np.zeros((0, len(TIME_FEATURES)), dtype=np.float32)
    # day_of_week == the reference's .dt.weekday (Mon=0), which pandas 3 deprecates.
    cols = [idx.minute, idx.hour, idx.day_of_week, idx.day, idx.month]
    return np.stack([np.asarray(c) for c in cols], axis=1).astype(np.float32)


def wall_clock_ns(stamps: pd.Series | pd.Index | Sequence | np.ndarray) -> np.ndarray:
    """Timestamps as int64 nanoseconds of their wall-clock time (time zones dropped, not converted).

    NaT comes back as ``NAT_NS``; datetime64 inputs of any unit skip parsing.
    """
    if isinstance(stamps, pd.Series):
        if isinstance(stamps.dtype, pd.DatetimeTZDtype):
            stamps = stamps.dt.tz_localize(None)
        if pd.api.types.is_datetime64_dtype(stamps.dtype):
            return stamps.values.astype("datetime64[ns]").view(np.int64)
        stamps = stamps.to_numpy()
    if isinstance(stamps, pd.DatetimeIndex):
        index = stamps
    elif isinstance(stamps, np.ndarray) and np.issubdtype(stamps.dtype, np.datetime64):
        return stamps.astype("datetime64[ns]").view(np.int64)
    else:
        index = pd.DatetimeIndex(pd.to_datetime(stamps))
    if index.tz is not None:
        index = index.tz_localize(None)
    return index.as_unit("ns").asi8


NAT_NS = np.iinfo(np.int64).min


def _civil_days(days: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weekday Mon=0, day of month, month) of days since 1970-01-01 (proleptic Gregorian calendar,
    H. Hinnant's civil_from_days)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    return (days + 3) % 7, day, month  # 1970-01-01 was a Thursday


def _calendar_arithmetic(ns: np.ndarray) -> np.ndarray:
    """Calendar features of wall-clock nanoseconds by integer arithmetic; equal to the pandas accessors.
    The date parts come from a table over the days spanned, so the big array sees only a few operations."""
    minutes = ns // 60_000_000_000
    days = minutes // 1440
    first = int(days.min())
    weekday, day, month = _civil_days(np.arange(first, int(days.max()) + 1, dtype=np.int64))
    table = np.stack([weekday, day, month], axis=-1).astype(np.float32)
    out = np.empty((*ns.shape, len(TIME_FEATURES)), dtype=np.float32)
    out[..., 0] = minutes % 60
    out[..., 1] = (minutes // 60) % 24
    out[..., 2:] = table[days - first]
    return out


def calendar_features_ns(stamps_ns: np.ndarray) -> np.ndarray:
    """Calendar features (see `calendar_features`) of wall-clock nanoseconds [N, L] (or [L]) -> [..., 5].

    Computed once per distinct timestamp grid (row) and shared by the series on it: a panel of stocks on
    one calendar costs one row's work. Vectorized integer arithmetic, no per-series pandas calls.
    """
    grid = np.asarray(stamps_ns, dtype=np.int64)
    rows = grid.reshape(-1, grid.shape[-1]) if grid.ndim else grid.reshape(1, 1)
    if rows.size == 0:
        return np.zeros((*grid.shape, len(TIME_FEATURES)), dtype=np.float32)
    first_of_grid: dict[bytes, int] = {}
    owner = np.array([first_of_grid.setdefault(row.tobytes(), len(first_of_grid)) for row in rows])
    distinct = np.empty((len(first_of_grid), rows.shape[1]), dtype=np.int64)
    distinct[owner] = rows
    features = _calendar_arithmetic(distinct)
    return features[owner].reshape(*grid.shape, len(TIME_FEATURES))


def fill_volume_amount(df: pd.DataFrame) -> pd.DataFrame:
    """Return a copy with ``volume`` and ``amount`` present (reference Kronos rule).

    No ``volume`` column: volume and amount are both set to 0.0 (an existing
    amount is overwritten too, as the reference does). ``volume`` but no
    ``amount``: amount = volume * mean(open, high, low, close) of the row.
    """
    out = df.copy()
    if "volume" not in out.columns:
        out["volume"] = 0.0
        out["amount"] = 0.0
    elif "amount" not in out.columns:
        out["amount"] = out["volume"] * out[list(PRICE_COLUMNS)].mean(axis=1)
    return out


def normalize_window(
    x: np.ndarray, clip: float = 5.0, stats_rows: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-column z-score of a [rows, cols] window, clipped to [-clip, clip].

    Computes ``(x - mean) / (std + 1e-5)`` in float32 with the population std
    (ddof=0), like the reference. ``stats_rows`` takes mean/std from the first
    ``stats_rows`` rows only (the lookback part of a training window).
    Returns (x_norm, mean, std), all float32.
    """
    arr = np.asarray(x, dtype=np.float32)
    ref = arr if stats_rows is None else arr[:stats_rows]
    mean = np.mean(ref, axis=0)
    std = np.std(ref, axis=0)
    x_norm = np.clip((arr - mean) / (std + _NORM_EPS), -clip, clip)
    return x_norm.astype(np.float32, copy=False), mean, std


def _where(df: pd.DataFrame, row: int, first_line: int | None = None) -> str:
    if TIME_COLUMN in df.columns:
        return f"{row_label(row, first_line)} ({format_stamp(df[TIME_COLUMN].iloc[row])})"
    return row_label(row, first_line)


def _feature_values(df: pd.DataFrame, checked: pd.DataFrame, source: str,
                    first_line: int | None) -> dict[str, np.ndarray]:
    """Every feature column present as float64, or KronosError at its first non-numeric or non-finite value."""
    values: dict[str, np.ndarray] = {}
    for col in (c for c in FEATURE_COLUMNS if c in df.columns):
        raw = df[col]
        if pd.api.types.is_bool_dtype(raw):
            raise KronosError(
                f"{source}: column '{col}' holds true/false values, first at {_where(checked, 0)}; "
                "use plain numbers"
            )
        if pd.api.types.is_numeric_dtype(raw):
            num = raw.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            coerced = pd.to_numeric(raw, errors="coerce")
            bad = (coerced.isna() & raw.notna()).to_numpy()
            if bad.any():
                row = int(np.argmax(bad))
                raise KronosError(
                    f"{source}: column '{col}' has non-numeric value {str(raw.iloc[row])[:40]!r} at "
                    f"{_where(checked, row, first_line)}; use plain numbers"
                )
            num = coerced.to_numpy(dtype=np.float64, na_value=np.nan)
        nonfinite = ~np.isfinite(num)
        if nonfinite.any():
            row = int(np.argmax(nonfinite))
            kind = "NaN/empty" if np.isnan(num[row]) else "infinite value"
            raise KronosError(
                f"{source}: column '{col}' has {kind} at {_where(checked, row, first_line)}; "
                "fill or drop those rows"
            )
        values[col] = num
    return values


def _check_prices(values: dict[str, np.ndarray], checked: pd.DataFrame, source: str, first_line: int | None) -> None:
    for col in PRICE_COLUMNS:
        nonpos = values[col] <= 0
        if nonpos.any():
            row = int(np.argmax(nonpos))
            raise KronosError(
                f"{source}: column '{col}' has non-positive price {values[col][row]:g} at "
                f"{_where(checked, row, first_line)}; prices must be > 0"
            )


def _data_warnings(values: dict[str, np.ndarray], checked: pd.DataFrame, source: str,
                   first_line: int | None) -> list[str]:
    found: list[str] = []
    o, h, lo, c = (values[col] for col in PRICE_COLUMNS)
    # Tiny relative tolerance so float noise from conversions is not reported.
    tol = 1e-9 * np.maximum(np.abs(o), np.abs(c))
    inconsistent = (h < np.maximum(o, c) - tol) | (lo > np.minimum(o, c) + tol)
    if inconsistent.any():
        row = int(np.argmax(inconsistent))
        found.append(
            f"{source}: {int(inconsistent.sum())} rows have high below max(open, close) or low above "
            f"min(open, close), first at {_where(checked, row, first_line)}"
        )
    for col in ("volume", "amount"):
        if col in values:
            neg = values[col] < 0
            if neg.any():
                row = int(np.argmax(neg))
                found.append(
                    f"{source}: {int(neg.sum())} rows have negative {col}, "
                    f"first at {_where(checked, row, first_line)}"
                )
    return found


def check_values(df: pd.DataFrame, source: str, first_line: int | None = None) -> tuple[dict[str, np.ndarray],
                                                                                        list[str]]:
    """The feature columns of `df` (parsed TIME_COLUMN + features, rows in file order) as float64 arrays after
    the value checks of `validate_kline` (numbers, finite, prices > 0), and its warnings."""
    checked = df[[TIME_COLUMN]]
    values = _feature_values(df, checked, source, first_line)
    _check_prices(values, checked, source, first_line)
    return values, _data_warnings(values, checked, source, first_line)


def validate_kline(df: pd.DataFrame, source: str = "<data>", first_line: int | None = None) -> list[str]:
    """Check a K-line frame; raise KronosError on errors, return warnings.

    Errors (the data would train or predict on garbage):
      - no rows, no ``timestamps`` column, or a missing price column
        (open/high/low/close; the message lists the columns found);
      - unparseable or empty timestamps;
      - a non-numeric value in a feature column (column, first bad row);
      - NaN or +/-inf in a feature column (column, first row and timestamp);
      - timestamps duplicated or not strictly increasing (first offender);
      - a price <= 0 (column, first row and timestamp).
    Warnings (real data has these; usable as is):
      - high below max(open, close) or low above min(open, close)
        (count and first timestamp);
      - negative volume or amount.
    Gaps in time (nights, weekends, holidays, halts) are normal and not reported.
    ``volume``/``amount`` are optional. Rows are named "row N" from 0, or "line N" of the file
    when ``first_line`` (the file line of data row 0: 2 for a CSV with one header line) is given.
    (`read_kline` repairs what it can first: rows newest first, exact repeats; see kronos_core.data.tables.)
    """
    if not isinstance(df, pd.DataFrame):
        raise KronosError(f"{source}: expected a pandas DataFrame, got {type(df).__name__}")
    found = ", ".join(map(str, df.columns)) or "none"
    if TIME_COLUMN not in df.columns:
        raise KronosError(
            f"{source}: no '{TIME_COLUMN}' column (found: {found}); add or rename the time column"
        )
    for col in PRICE_COLUMNS:
        if col not in df.columns:
            raise KronosError(f"{source}: missing price column '{col}' (found: {found}); add or rename it")
    if len(df) == 0:
        raise KronosError(f"{source}: no data rows; give at least one K-line")

    ts = parse_timestamps(df[TIME_COLUMN], source, first_line)
    checked = pd.DataFrame({TIME_COLUMN: ts.to_numpy()})
    values = _feature_values(df, checked, source, first_line)
    ts_ns = ts.to_numpy()
    if len(ts_ns) > 1:
        step_ok = ts_ns[1:] > ts_ns[:-1]
        if not step_ok.all():
            row = int(np.argmax(~step_ok)) + 1
            if ts_ns[row] == ts_ns[row - 1]:
                raise KronosError(
                    f"{source}: duplicate timestamp {format_stamp(ts.iloc[row])} at "
                    f"{'rows' if first_line is None else 'lines'} "
                    f"{row - 1 + (first_line or 0)} and {row + (first_line or 0)}; "
                    "drop duplicates"
                )
            raise KronosError(
                f"{source}: timestamps not increasing at {row_label(row, first_line)} ({format_stamp(ts.iloc[row])} "
                f"after {format_stamp(ts.iloc[row - 1])}); sort the rows by time"
            )
    _check_prices(values, checked, source, first_line)
    return _data_warnings(values, checked, source, first_line)


def _panel_hint(names: Sequence[str], raw: pd.DataFrame) -> str:
    symbol = symbol_column(names)
    if symbol is None:
        return ""
    spelled = file_name(raw, symbol)
    return f"; or, as the file has a '{spelled}' column, read it as a panel (--symbol-column {spelled})"


def read_kline(path: str | Path, date_format: str | None = None) -> pd.DataFrame:
    """Read one K-line file (.csv or .parquet) into a validated frame.

    Column names are matched case-insensitively after stripping spaces, in any
    order; the time column may be named timestamps, timestamp, date, datetime
    or time, or have no name at all as the first column (a written index);
    separate ``date`` and ``time`` columns are joined; a Parquet
    datetime index also works; text stamps are read with ``date_format`` when given (strptime directives),
    dates written day and month first the one way they allow (kronos_core.data.day_month);
    YYYYMMDD integers are read as dates, other
    numbers are refused since their unit is unknown; mixed UTC offsets are converted to UTC.
    Other columns are ignored. Rows newest first are put in time order and rows repeating the row
    before them exactly are dropped (see kronos_core.data.tables).
    Returns ``timestamps`` + FEATURE_COLUMNS (volume/amount filled with
    :func:`fill_volume_amount`), float64 features, index 0..n-1. Warnings from
    :func:`validate_kline` are issued as KlineDataWarning and kept in
    ``df.attrs["warnings"]``; what was done to the file (columns ignored, stamps converted, rows reordered
    or dropped) is one line each in ``df.attrs["notes"]`` (not issued: the caller says them);
    ``df.attrs["source"]`` is the path; ``df.attrs["filled_columns"]`` lists
    the feature columns the file lacked (volume and/or amount), filled by the reference rule. Errors in
    a CSV name file lines (the header is line 1), in a Parquet file 0-based rows.
    """
    path = Path(path)
    if not path.exists():
        raise KronosError(f"{path}: file not found; check the path")
    if not path.is_file():
        raise KronosError(f"{path}: not a file; give a .csv or .parquet file")
    raw = read_table(path)

    if TIME_COLUMN not in {str(c).strip().lower() for c in raw.columns} and isinstance(
        raw.index, pd.DatetimeIndex
    ):
        raw = raw.reset_index(names=TIME_COLUMN)
    names = lower_columns(raw, path)
    notes: list[str] = []
    stamps, column, used = time_values(raw, names, path, notes, date_format)
    # Checked here (not only in validate_kline) so the message lists the file's own columns.
    for col in PRICE_COLUMNS:
        if col not in names:
            found = found_columns(raw, names)
            raise KronosError(f"{path}: missing price column '{col}' (found: {found}); add or rename it")
    present = [c for c in FEATURE_COLUMNS if c in names]
    used.update(present)
    ignored = ignored_columns_note(names, used, path)
    if ignored is not None:
        notes.insert(0, ignored)

    source = str(path)
    first_line = first_data_line(path)
    if len(raw) == 0:
        raise KronosError(f"{source}: no data rows; give at least one K-line")
    ts = parse_timestamps(stamps, source, first_line, column=column, notes=notes, date_format=date_format)
    frame = pd.DataFrame({TIME_COLUMN: ts.reset_index(drop=True), **{c: raw[c].to_numpy() for c in present}})
    values, found_warnings = check_values(frame, source, first_line)
    matrix = np.stack([values[c] for c in present], axis=1)
    try:
        keep = order_rows(np.zeros(len(frame), dtype=np.int64), absolute_ns(frame[TIME_COLUMN]), matrix,
                          frame[TIME_COLUMN], source, first_line, notes=notes)
    except KronosError as error:
        raise KronosError(f"{error}{_panel_hint(names, raw)}") from None
    df = pd.DataFrame({TIME_COLUMN: frame[TIME_COLUMN].take(keep).reset_index(drop=True),
                       **{c: values[c][keep] for c in present}})
    filled = [c for c in ("volume", "amount") if c not in present]
    df = fill_volume_amount(df)[[TIME_COLUMN, *FEATURE_COLUMNS]].reset_index(drop=True)
    for message in found_warnings:
        warnings.warn(message, KlineDataWarning, stacklevel=2)
    df.attrs["source"] = source
    df.attrs["warnings"] = found_warnings
    df.attrs["notes"] = notes
    df.attrs["filled_columns"] = filled
    return df


def find_data_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Expand one or more paths to data files.

    A file is kept as given (it must end in .csv or .parquet); a folder expands
    to its own ``*.csv`` and ``*.parquet`` files (not sub-folders), sorted by
    name. Duplicates are dropped, order otherwise kept. A missing path, a
    folder without data files, or no paths at all raise KronosError.
    """
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not items:
        raise KronosError("no data paths given; pass a .csv/.parquet file or a folder of them")
    out: list[Path] = []
    seen: set[Path] = set()
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(
                (f for f in p.iterdir() if f.is_file() and f.suffix.lower() in DATA_SUFFIXES),
                key=lambda f: f.name,
            )
            if not found:
                raise KronosError(f"{p}: folder has no .csv or .parquet files; put data files there")
        elif p.is_file():
            if p.suffix.lower() not in DATA_SUFFIXES:
                raise KronosError(f"{p}: unsupported file type '{p.suffix}'; use .csv or .parquet")
            found = [p]
        else:
            raise KronosError(f"{p}: no such file or folder; check the path")
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out
