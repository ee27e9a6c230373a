"""One loader for every command: data paths, or a synthetic count, become `KlineSeries`, one per series.

    source = load_series(["prices/"], on_note)                           # a file per series, named by its stem
    source = load_series(["panel.parquet"], on_note, symbol_column="code")  # a panel: a series per symbol
    for batch in source.batches: ...                                      # lists of KlineSeries

What a file may hold and how it is checked is `read_kline`'s and `read_panel`'s (kronos_core.data.kline,
kronos_core.data.panels); what reading did to a file and what it found suspicious reach `on_note(level,
message)` as one line each. Parquet panels sorted by symbol stream a batch of whole symbols at a time
(kronos_core.data.panel_stream), so only what the caller keeps of each batch grows with the file; any other
panel is read whole, and a note says so. A symbol's rows are in one panel file. Each command builds its own view
from the series: the backtest's universe, predict's windows (kronos_tune.predict.inputs), training's frames
(kronos_core.train.loading).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kronos_core.data.kline import FEATURE_COLUMNS, TIME_COLUMN, fill_volume_amount, find_data_files, read_kline
from kronos_core.data.panel_stream import SortedPanels, sorted_panels, symbol_batches
from kronos_core.data.panels import SYMBOL, read_panel
from kronos_core.data.synthetic import synthetic_series, synthetic_universe_symbols
from kronos_core.data.tables import symbol_column as named_symbol_column
from kronos_core.deferred import deferred
from kronos_core.errors import KronosError

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)

NoteCallback = Callable[[str, str], None]  # on_note(level, message), level "note" or "warning"


def _quiet(level: str, message: str) -> None:
    pass


@dataclass
class KlineSeries:
    """One series' bars: stamps strictly increasing, the six features (volume/amount filled by the reference
    rule where the file lacked them)."""

    name: str
    stamps: np.ndarray             # [rows] datetime64[ns]: UTC instants when `tz` is set
    features: np.ndarray           # [rows, 6] float64, FEATURE_COLUMNS order
    tz: object | None = None       # the time zone of the file's stamps (None: naive)
    lacked: tuple[str, ...] = ()   # volume/amount columns the file did not have
    source: str = ""               # where it was read, for messages: the file (and the symbol)

    @property
    def close(self) -> np.ndarray:
        return self.features[:, FEATURE_COLUMNS.index("close")]

    def __len__(self) -> int:
        return len(self.stamps)

    def index(self) -> pd.DatetimeIndex:
        """The stamps as the file gave them, in its time zone."""
        index = pd.DatetimeIndex(self.stamps, name=TIME_COLUMN)
        return index if self.tz is None else index.tz_localize("UTC").tz_convert(self.tz)

    def wall_clock_ns(self) -> np.ndarray:
        """int64 nanoseconds of the stamps' wall-clock time (time zone dropped, not converted)."""
        return self.stamps.view(np.int64) if self.tz is None else self.index().tz_localize(None).asi8


@dataclass
class SeriesSource:
    """What `load_series` read: its series in batches (one batch, unless a sorted Parquet panel streams)."""

    batches: Iterator[list[KlineSeries]]
    count: int                        # series (a streamed panel: its symbols, counted before any is read)
    source: str                       # what it was read from, for messages and reports
    paths: list[Path] = field(default_factory=list)
    name_column: str | None = None    # a panel's symbol column as the file spells it; None: a series per file
    streamed: bool = False
    synthetic: bool = False

    def all(self) -> list[KlineSeries]:
        return [series for batch in self.batches for series in batch]


def load_series(data: Sequence[str | Path] = (), on_note: NoteCallback = _quiet, *, symbol_column: str | None = None,
                date_format: str | None = None, synthetic: int | None = None,
                rows: int = 2000, seed: int = 0, universe: bool = False) -> SeriesSource:
    """The series of `data` (files, or folders of them), or without it `synthetic` series of `rows` bars made from
    `seed` (`universe`: the symbols SYN0000 ... of one market with sectors, else independent series synthetic_0
    ...). `symbol_column`: the files are panels; so is one file with a column of SYMBOL_COLUMN_NAMES
    (kronos_core.data.tables.symbol_column), for every command alike. `date_format`: how the files write their dates."""
    if not data:
        return _synthetic(synthetic if synthetic is not None else 0, rows, seed, universe)
    paths = find_data_files(list(data))
    if symbol_column is None and len(paths) == 1:
        symbol_column = _panel_column(paths[0])
    if symbol_column is not None:
        return _panels(paths, symbol_column, on_note, date_format)
    series = [_file_series(name, path, on_note, date_format) for name, path in zip(_unique_names(paths), paths)]
    source = str(data[0]) if len(data) == 1 else f"{len(paths)} files"
    return SeriesSource(iter([series]), len(series), source, paths)


def _unique_names(paths: list[Path]) -> list[str]:
    """Each file's stem, or its path without the suffix where two files share a stem."""
    stems = [p.stem for p in paths]
    return [stem if stems.count(stem) == 1 else str(p.with_suffix("")) for stem, p in zip(stems, paths)]


def _synthetic(count: int, rows: int, seed: int, universe: bool) -> SeriesSource:
    if universe:  # symbol by symbol: arrays only, never the long panel
        series = [KlineSeries(name, stamps.to_numpy(dtype="datetime64[ns]"),
                              np.stack([columns[c] for c in FEATURE_COLUMNS], axis=1).astype(np.float64), source=name)
                  for name, _sector, stamps, columns in synthetic_universe_symbols(count, rows, seed)]
        return SeriesSource(iter([series]), len(series), f"synthetic universe ({count} symbols)", synthetic=True)
    series = [_frame_series(f"synthetic_{i}", frame, f"synthetic_{i}")
              for i, frame in enumerate(synthetic_series(count, n_rows=rows, seed=seed))]
    return SeriesSource(iter([series]), len(series), f"{count} synthetic series", synthetic=True)


def _frame_series(name: str, frame: pd.DataFrame, source: str) -> KlineSeries:
    times = frame[TIME_COLUMN]
    return KlineSeries(name, times.to_numpy(dtype="datetime64[ns]"),
                       frame[list(FEATURE_COLUMNS)].to_numpy(dtype=np.float64), getattr(times.dtype, "tz", None),
                       tuple(frame.attrs.get("filled_columns", ())), source)


def _file_series(name: str, path: Path, on_note: NoteCallback, date_format: str | None) -> KlineSeries:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = read_kline(path, date_format)
    for message in frame.attrs.get("notes", ()):
        on_note("note", message)
    for warning in caught:
        on_note("warning", str(warning.message))
    return _frame_series(name, frame, str(path))


def _panel_column(path: Path) -> str | None:
    """The file's symbol column by the one rule (`tables.symbol_column`), else None (a single-series file)."""
    try:
        if path.suffix.lower() == ".csv":
            columns = list(pd.read_csv(path, nrows=0).columns)
        else:
            import pyarrow.parquet as parquet

            columns = list(parquet.read_schema(path).names)
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.EmptyDataError):
        return None  # read_kline gives the precise message
    return named_symbol_column(columns)


def _panels(paths: list[Path], symbol_column: str, on_note: NoteCallback, date_format: str | None) -> SeriesSource:
    source = str(paths[0]) if len(paths) == 1 else f"{len(paths)} panel files"
    panels, why = sorted_panels(paths, symbol_column)
    if panels is not None:
        return SeriesSource(_streamed(panels, symbol_column, on_note, date_format), panels.symbols, source, paths,
                            panels.column, streamed=True)
    on_note("note", f"{why}: the panel is read whole, so memory grows with it; a Parquet panel sorted by "
                    f"{symbol_column} is read in symbol batches (e.g. df.sort_values(['{symbol_column}', time])"
                    f".to_parquet(...))")
    series: list[KlineSeries] = []
    where: dict[str, Path] = {}
    spelled = None
    for path in paths:
        panel = read_panel(path, symbol_column, date_format)
        _say_read(panel, on_note)
        spelled = spelled or panel.attrs["symbol_column"]
        for one in _panel_series(panel):
            if one.name in where:
                raise KronosError(f"{path}: symbol {one.name} is also in {where[one.name]}; give each symbol's rows "
                                  "in one file")
            where[one.name] = path
            series.append(one)
    return SeriesSource(iter([series]), len(series), source, paths, spelled)


def _streamed(panels: SortedPanels, symbol_column: str, on_note: NoteCallback,
              date_format: str | None) -> Iterator[list[KlineSeries]]:
    said: set[tuple[str, str]] = set()

    def once(level: str, message: str) -> None:  # each batch would repeat the file's notes
        if (level, message) not in said:
            said.add((level, message))
            on_note(level, message)

    for panel in symbol_batches(panels, symbol_column, date_format=date_format):
        _say_read(panel, once)
        yield _panel_series(panel)


def _say_read(panel: pd.DataFrame, on_note: NoteCallback) -> None:
    for message in panel.attrs.get("notes", ()):
        on_note("note", message)
    for message in panel.attrs.get("warnings", ()):
        on_note("warning", message)


def _panel_series(panel: pd.DataFrame) -> list[KlineSeries]:
    """The symbols of a `read_panel` result (rows grouped by symbol, in time order), in its order; their arrays
    are views of one array of the whole panel."""
    if len(panel) == 0:
        return []
    lacked = tuple(c for c in ("volume", "amount") if c not in panel.columns)
    features = fill_volume_amount(panel)[list(FEATURE_COLUMNS)].to_numpy(dtype=np.float64)
    times = panel[TIME_COLUMN]
    stamps, tz = times.to_numpy(dtype="datetime64[ns]"), getattr(times.dtype, "tz", None)
    symbols = panel[SYMBOL].to_numpy()
    starts = np.flatnonzero(np.concatenate([[True], symbols[1:] != symbols[:-1]]))
    ends = np.append(starts[1:], len(symbols))
    source = panel.attrs.get("source", "panel")
    return [KlineSeries(str(symbols[a]), stamps[a:b], features[a:b], tz, lacked, f"{source} (symbol {symbols[a]})")
            for a, b in zip(starts, ends)]


__all__ = ["KlineSeries", "NoteCallback", "SeriesSource", "load_series"]
