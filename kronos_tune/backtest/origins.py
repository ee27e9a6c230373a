"""What a backtest runs over: its universe of symbols and the rolling origins, the moments it predicts from, and
which symbols take part at each.

The universe: one `KlineSeries` per symbol, read by the one loader (kronos_core.data.series). Per-symbol files
(the symbol is the file name) keep their order; panel files (``--symbol-column NAME``, or one file with a column
``symbol``, ``ticker``, ``code``, ``instrument`` or ``stock``) and the synthetic universe are sorted by symbol.
A sorted Parquet panel streams a batch of whole symbols at a time, so the universe holds only each symbol's
arrays, never the file's table.

The timeline is every timestamp of any symbol. A symbol takes part at origin t
when it has a bar exactly at t, at least ``lookback`` bars up to and including
t (the history) and ``pred_len`` bars after t (the realized future). Origins
are spaced ``every`` bars along the timeline, counted back from the latest
possible origin, or one per trading day (that day's last possible bar); the
latest ``count`` of them are kept, in time order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.data.kline import find_data_files
from kronos_core.data.series import KlineSeries, NoteCallback, load_series
from kronos_core.errors import KronosError
from kronos_tune.errors import KronosTuneError

TRADING_DAYS_PER_YEAR = 252
EVERY_DAY = "day"


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


@dataclass
class Origin:
    """One origin: its position in the schedule, time, and (symbol index, row of t in that symbol) pairs."""

    index: int
    timestamp: pd.Timestamp
    members: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class OriginSchedule:
    origins: list[Origin]
    used_symbols: list[int]     # symbols taking part in at least one origin
    skipped_symbols: list[str]  # symbols too short for every chosen origin
    bars_per_day: float         # median bars per calendar date on the timeline
    periods_per_year: float     # rebalances per year, for annualizing

    @property
    def predictions(self) -> int:
        return sum(len(o.members) for o in self.origins)


def parse_every(value: str | int | None) -> int | str | None:
    """'day', a positive number of bars, or None (= pred_len)."""
    if value is None or isinstance(value, int):
        every = value
    elif str(value).strip().lower() == EVERY_DAY:
        return EVERY_DAY
    else:
        try:
            every = int(str(value).strip())
        except ValueError:
            raise KronosTuneError(f"--every {value}: give a number of bars (e.g. 12) or 'day'") from None
    if every is not None and every < 1:
        raise KronosTuneError(f"--every {every}: must be at least 1 bar (or 'day')")
    return every


def _eligible_rows(length: int, lookback: int, pred_len: int) -> tuple[int, int]:
    """First and last row of a symbol that can be an origin (last < first when none)."""
    return lookback - 1, length - 1 - pred_len


def schedule_origins(universe: Universe, lookback: int, pred_len: int, every: int | str, count: int | None,
                     min_cross_section: int = 2) -> OriginSchedule:
    """Choose the origins and their members, or raise a one-line error saying what the data lacks."""
    if not universe.symbols:
        raise KronosTuneError(f"{universe.source}: the universe is empty (no symbols); give data with at least "
                              f"{min_cross_section} symbols")
    if count is not None and count < 1:
        raise KronosTuneError(f"--origins {count}: ask for at least 1 origin")
    timeline = np.unique(np.concatenate([s.stamps for s in universe.symbols]))
    eligible_count = np.zeros(len(timeline), dtype=np.int64)
    for series in universe.symbols:
        first, last = _eligible_rows(len(series), lookback, pred_len)
        if last >= first:
            eligible_count[np.searchsorted(timeline, series.stamps[first:last + 1])] += 1
    candidates = np.flatnonzero(eligible_count >= min_cross_section)
    if len(candidates) == 0:
        longest = max(len(s) for s in universe.symbols)
        raise KronosTuneError(
            f"{universe.source}: no origin has {min_cross_section} symbols with --lookback {lookback} bars up to it "
            f"and --pred-len {pred_len} bars after it (longest symbol: {longest} bars); use a shorter --lookback "
            f"or --pred-len, or more data")
    if every == EVERY_DAY:
        dates = pd.DatetimeIndex(timeline[candidates]).normalize()
        last_of_day = ~pd.Series(dates).duplicated(keep="last").to_numpy()
        chosen = candidates[last_of_day]
        spacing = "one per day"
    else:
        grid = np.arange(candidates[-1], -1, -int(every))[::-1]
        chosen = np.intersect1d(grid, candidates)
        spacing = f"every {every} bars"
    if count is not None:
        if count > len(chosen):
            first, last = pd.Timestamp(timeline[chosen[0]]), pd.Timestamp(timeline[chosen[-1]])
            raise KronosTuneError(
                f"--origins {count}: the data holds only {len(chosen)} origins {spacing} with --lookback {lookback} "
                f"and --pred-len {pred_len} (from {first} to {last}); ask for at most {len(chosen)}, a smaller "
                f"--every, or a shorter --lookback")
        chosen = chosen[-count:]

    origins = [Origin(i, pd.Timestamp(timeline[t])) for i, t in enumerate(chosen)]
    taking_part = np.zeros(len(universe.symbols), dtype=bool)
    for s, series in enumerate(universe.symbols):
        first, last = _eligible_rows(len(series), lookback, pred_len)
        rows = np.searchsorted(series.stamps, timeline[chosen])
        for origin, row in zip(origins, rows):
            if first <= row <= last and series.stamps[row] == timeline[chosen[origin.index]]:
                origin.members.append((s, int(row)))
                taking_part[s] = True

    bars_per_day = float(pd.Series(pd.DatetimeIndex(timeline).normalize()).value_counts().median())
    periods = TRADING_DAYS_PER_YEAR if every == EVERY_DAY else TRADING_DAYS_PER_YEAR * bars_per_day / int(every)
    return OriginSchedule(origins, list(np.flatnonzero(taking_part)),
                          [universe.symbols[s].name for s in np.flatnonzero(~taking_part)], bars_per_day, periods)
