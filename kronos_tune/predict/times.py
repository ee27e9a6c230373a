"""Future bar timestamps: on an exchange's calendar when one is named, else on the series' own grid.

## The series' own grid

The bar interval is the most common difference between consecutive
timestamps. Data whose bars all lie inside the A-share sessions (weekdays,
09:30-11:30 and 13:00-15:00) with an interval dividing the 120-minute sessions
continues on that session calendar (bar-close or bar-open stamps, whichever
the data uses); daily data on weekdays only continues on business days;
anything else adds multiples of the interval.

With a named exchange calendar (`--calendar`), the stamps come from that
exchange's sessions instead (below); the series' own grid is the fallback.

## Exchange calendars

On `exchange-calendars`. With a calendar, the bars after a series' last one follow the exchange's real
sessions: weekends and holidays are skipped, lunch breaks and half days are
respected. Intraday bars are laid at the data's bar interval inside each
session, stamped at bar end or bar start as the data is (a day whose last bar
is the session close means bar ends); daily bars continue on the next
sessions at the time of day of the last bar. Naive timestamps are read as the
exchange's local time and come back naive; tz-aware ones keep their zone.

Before any stamp is made, every bar of the data inside the calendar's range
must sit on that grid, so a wrong calendar (or an interval that does not
divide the sessions) fails with one line naming the first bar off the grid.
The calendar is never guessed from the data: XSHG and XSHE have the same
sessions, and a guess would silently change output that users already have.

`exchange_calendars` is imported only when a calendar is named (it is an
optional extra, and slow to import); each calendar object is built once.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kronos_core.data.kline import TIME_COLUMN
from kronos_core.data.synthetic import SESSIONS, session_bar_minutes, trading_timestamps
from kronos_core.optional import install_command, require
from kronos_tune.errors import KronosTuneError


def infer_interval(stamps: pd.Series | pd.DatetimeIndex, where: str = "<data>") -> pd.Timedelta:
    """The most common difference between consecutive stamps (the smallest on a tie)."""
    index = pd.DatetimeIndex(stamps)
    if len(index) < 2:
        raise KronosTuneError(f"{where}: {len(index)} row(s); need at least 2 to infer the bar interval")
    diffs = np.diff(index.as_unit("ns").asi8)  # asi8 counts in the index's own unit; fix it to ns
    values, counts = np.unique(diffs, return_counts=True)
    step = int(values[np.argmax(counts)])
    if step <= 0:
        raise KronosTuneError(f"{where}: timestamps do not increase; sort the rows by time")
    return pd.Timedelta(step, unit="ns")


def session_grid(stamps: pd.DatetimeIndex, interval: pd.Timedelta) -> str | None:
    """'close' or 'open' when every bar sits on the A-share session grid (stamped at bar close or bar open)."""
    minutes = interval / pd.Timedelta(minutes=1)
    if minutes != int(minutes) or not 1 <= minutes <= 120 or 120 % int(minutes):
        return None
    if (stamps.day_of_week >= 5).any() or (stamps.second != 0).any() or (stamps.nanosecond != 0).any() \
            or (stamps.microsecond != 0).any():
        return None
    minute_of_day = stamps.hour * 60 + stamps.minute
    inside = np.zeros(len(stamps), dtype=bool)
    for start, end in SESSIONS:
        inside |= (minute_of_day >= start) & (minute_of_day <= end)
    if not inside.all():
        return None
    closes = session_bar_minutes(int(minutes))
    observed = np.unique(np.asarray(minute_of_day))
    if np.isin(observed, closes).all():
        return "close"
    if np.isin(observed, closes - int(minutes)).all():
        return "open"
    return None


def future_timestamps(stamps: pd.Series | pd.DatetimeIndex, count: int, where: str = "<data>",
                      calendar: str | None = None) -> pd.DatetimeIndex:
    """`count` stamps after the last one: on exchange `calendar`'s sessions when one is named, else continuing
    the series' own bar grid (see the module doc)."""
    index = pd.DatetimeIndex(stamps)
    if calendar is not None:
        return calendar_grid(calendar, index, where).after(index[-1], count, where)
    interval = infer_interval(index, where)
    tz = index.tz
    local = index.tz_localize(None) if tz is not None else index
    last = local[-1]
    grid = session_grid(local, interval)
    if grid is not None:
        step = int(interval / pd.Timedelta(minutes=1))
        if grid == "close":  # the next bars open at or after the last close
            future = trading_timestamps(count, last, step)
        else:  # stamps are bar opens: shift to closes, continue, shift back
            future = trading_timestamps(count, last + interval, step) - interval
    elif interval == pd.Timedelta(days=1) and (local.day_of_week < 5).all():
        future = pd.DatetimeIndex([last + pd.offsets.BDay(k) for k in range(1, count + 1)])
    else:
        future = pd.DatetimeIndex([last + interval * k for k in range(1, count + 1)])
    future = pd.DatetimeIndex(future, name=TIME_COLUMN)
    if tz is not None:
        future = future.tz_localize(tz, ambiguous="NaT", nonexistent="shift_forward")
        if future.isna().any():
            raise KronosTuneError(f"{where}: a future bar falls in an ambiguous daylight-saving hour of {tz}; "
                                  "convert the timestamps to UTC")
    return future


# Exchange calendars (`--calendar NAME`)

UPGRADE = f"{install_command('calendars')} --upgrade"
SOME_CALENDARS = ("XSHG", "XSHE", "XHKG", "XNYS", "XNAS", "XLON", "XTKS")
LIST_ALL = "python -c 'import exchange_calendars; print(exchange_calendars.get_calendar_names())'"
DAY = pd.Timedelta(days=1)


@functools.cache
def exchange_calendar(name: str) -> Any:
    """The `exchange_calendars` calendar called `name` (any case), built once per name."""
    xc = require("calendars", f"--calendar {name}")
    for candidate in dict.fromkeys((name, name.upper())):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the package's own deprecation noise, nothing a user can act on
                return xc.get_calendar(candidate)
        except xc.errors.InvalidCalendarName:
            continue
    raise KronosTuneError(f"--calendar {name}: no such exchange calendar; e.g. {', '.join(SOME_CALENDARS)} "
                          f"(list them all: {LIST_ALL})")


def _minutes(interval: pd.Timedelta) -> str:
    minutes = interval / pd.Timedelta(minutes=1)
    return f"{minutes:g}-minute" if minutes >= 1 else f"{interval.total_seconds():g}-second"


def _hhmm(utc_ns: np.int64, tz: Any) -> str:
    return pd.Timestamp(int(utc_ns), tz="UTC").tz_convert(tz).strftime("%H:%M")


@dataclass(frozen=True)
class CalendarGrid:
    """A calendar bound to one series' bar interval, stamp convention and time zone."""

    name: str
    calendar: Any
    interval: pd.Timedelta
    daily: bool
    bar_end: bool          # intraday: stamps mark the end of each bar (else its start)
    tz: Any                # the data's zone; None: naive exchange-local time
    time_of_day: pd.Timedelta = pd.Timedelta(0)  # daily: the clock time the bars carry

    # Intraday ---------------------------------------------------------------------------------

    @functools.cached_property
    def _schedule_ns(self) -> dict[str, np.ndarray]:
        """The calendar's open, break and close times as UTC nanoseconds (break columns equal open when none)."""
        schedule = self.calendar.schedule
        table = {c: schedule[c].to_numpy("datetime64[ns]").view(np.int64) for c in ("open", "close")}
        has_break = "break_start" in schedule.columns
        table["break"] = schedule["break_start"].notna().to_numpy() if has_break else np.zeros(len(schedule), bool)
        for column in ("break_start", "break_end"):
            table[column] = schedule[column].to_numpy("datetime64[ns]").view(np.int64) if has_break else table["open"]
        return table

    def _segments(self, first: int, last: int, where: str) -> tuple[np.ndarray, np.ndarray]:
        """UTC nanoseconds where each trading stretch of sessions first..last (positions) starts and ends."""
        table = {key: values[first:last + 1] for key, values in self._schedule_ns.items()}
        breaks, opens, closes = table["break"], table["open"], table["close"]
        starts = np.concatenate([opens, table["break_end"][breaks]])
        ends = np.concatenate([np.where(breaks, table["break_start"], closes), closes[breaks]])
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        step = self.interval.value
        uneven = np.nonzero((ends - starts) % step)[0]
        if len(uneven):
            at = uneven[0]
            day = pd.Timestamp(int(starts[at]), tz="UTC").tz_convert(self.calendar.tz).date()
            raise KronosTuneError(
                f"{where}: the {_minutes(self.interval)} bars do not divide {self.name}'s session "
                f"{_hhmm(starts[at], self.calendar.tz)}-{_hhmm(ends[at], self.calendar.tz)} (local time) on {day}; "
                f"check --calendar, or leave it out to continue the series' own grid")
        return starts, ends

    def _bars(self, first: int, last: int, where: str, bar_end: bool | None = None) -> np.ndarray:
        """UTC nanoseconds of every bar stamp in sessions first..last, in order."""
        starts, ends = self._segments(first, last, where)
        step = self.interval.value
        counts = (ends - starts) // step
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        end = self.bar_end if bar_end is None else bar_end
        return np.repeat(starts, counts) + (within + (1 if end else 0)) * step

    def _to_utc_ns(self, stamps: pd.DatetimeIndex) -> np.ndarray:
        if stamps.tz is None:  # naive: the exchange's local time
            stamps = stamps.tz_localize(self.calendar.tz, ambiguous="NaT", nonexistent="NaT")
        return stamps.tz_convert("UTC").tz_localize(None).as_unit("ns").asi8

    def _from_utc_ns(self, values: np.ndarray) -> pd.DatetimeIndex:
        index = pd.DatetimeIndex(values.view("datetime64[ns]")).tz_localize("UTC")
        if self.tz is None:
            return index.tz_convert(self.calendar.tz).tz_localize(None)
        return index.tz_convert(self.tz)

    def _session_after(self, last_ns: int) -> int:
        """Position of the first session whose close is at or after `last_ns`."""
        return int(np.searchsorted(self._schedule_ns["close"], last_ns, side="left"))

    # Both -------------------------------------------------------------------------------------

    def _range_error(self, where: str, last: pd.Timestamp, count: int) -> KronosTuneError:
        return KronosTuneError(
            f"{where}: {count} bars after {last} run past the end of {self.name}'s calendar "
            f"({self.calendar.last_session.date()}); lower --pred-len, or update exchange-calendars "
            f"({UPGRADE})")

    def after(self, last: pd.Timestamp, count: int, where: str = "<data>") -> pd.DatetimeIndex:
        """The `count` bar stamps that follow `last` on this calendar."""
        last = pd.Timestamp(last)
        sessions = self.calendar.sessions
        if self.daily:
            day = (last.tz_localize(None) if last.tz is not None else last).normalize()
            first = int(sessions.searchsorted(day, side="right"))
            if first + count > len(sessions):
                raise self._range_error(where, last, count)
            future = pd.DatetimeIndex(sessions[first:first + count]) + self.time_of_day
            if self.tz is not None:
                future = future.tz_localize(self.tz, ambiguous="NaT", nonexistent="shift_forward")
            return pd.DatetimeIndex(future, name=TIME_COLUMN)
        last_ns = int(self._to_utc_ns(pd.DatetimeIndex([last]))[0])
        first = self._session_after(last_ns)
        per_session = max(1, len(self._bars(first, first, where))) if first < len(sessions) else 1
        span = -(-count // per_session) + 1
        while True:
            end = min(first + span, len(sessions)) - 1
            bars = self._bars(first, end, where) if first <= end else np.zeros(0, np.int64)
            bars = bars[bars > last_ns][:count]
            if len(bars) == count:
                return pd.DatetimeIndex(self._from_utc_ns(bars), name=TIME_COLUMN)
            if end >= len(sessions) - 1:
                raise self._range_error(where, last, count)
            span *= 2


def _outside_range(name: str, calendar: Any, where: str, last: pd.Timestamp, early: bool) -> KronosTuneError:
    fix = "use more recent data" if early else f"update exchange-calendars ({UPGRADE})"
    return KronosTuneError(
        f"{where}: the last bar ({last}) is {'before the start' if early else 'past the end'} of {name}'s calendar "
        f"({calendar.first_session.date()} to {calendar.last_session.date()}); {fix}")


def _daily_grid(name: str, calendar: Any, index: pd.DatetimeIndex, where: str) -> CalendarGrid:
    wall = index.tz_localize(None) if index.tz is not None else index
    days = wall.normalize()
    sessions = calendar.sessions
    last = index[-1]
    if days[-1] > sessions[-1] or days[-1] < sessions[0]:
        raise _outside_range(name, calendar, where, last, early=days[-1] < sessions[0])
    covered = days >= sessions[0]
    off = np.nonzero(covered & ~days.isin(sessions))[0]
    if len(off):
        raise KronosTuneError(f"{where}: the daily bar at {index[off[0]]} is on {days[off[0]].date()}, not a "
                              f"session of {name} (a weekend or holiday there); check --calendar, or leave it out")
    return CalendarGrid(name, calendar, DAY, daily=True, bar_end=True, tz=index.tz,
                        time_of_day=wall[-1] - days[-1])


def calendar_grid(name: str, stamps: pd.Series | pd.DatetimeIndex, where: str = "<data>") -> CalendarGrid:
    """Bind calendar `name` to a series' stamps, checking every bar the calendar covers (see the module doc)."""
    calendar = exchange_calendar(name)
    index = pd.DatetimeIndex(stamps)
    interval = infer_interval(index, where)
    if interval == DAY:
        return _daily_grid(name, calendar, index, where)
    if interval > DAY:
        raise KronosTuneError(f"{where}: bars every {interval}; --calendar continues intraday or daily bars only, "
                              "leave it out for this data")
    grid = CalendarGrid(name, calendar, interval, daily=False, bar_end=True, tz=index.tz)
    values = grid._to_utc_ns(index)
    missing = np.nonzero(pd.isna(values.view("datetime64[ns]")))[0]
    if len(missing):
        raise KronosTuneError(f"{where}: the bar at {index[missing[0]]} does not exist or is ambiguous in "
                              f"{calendar.tz} (a daylight-saving change); give the timestamps in UTC")
    schedule = calendar.schedule
    first_open = schedule["open"].iloc[0].value
    last_close = schedule["close"].iloc[-1].value
    last = index[-1]
    if values[-1] > last_close or values[-1] < first_open:
        raise _outside_range(name, calendar, where, last, early=values[-1] < first_open)
    covered = np.nonzero(values >= first_open)[0]
    values, positions = values[covered], covered
    first_session = grid._session_after(int(values[0]))
    last_session = grid._session_after(int(values[-1]))
    ends = grid._bars(first_session, last_session, where, bar_end=True)
    on_end = np.isin(values, ends)
    if on_end.all():
        return grid
    on_start = np.isin(values, grid._bars(first_session, last_session, where, bar_end=False))
    if on_start.all():
        return CalendarGrid(name, calendar, interval, daily=False, bar_end=False, tz=index.tz)
    # Name the first bar off whichever convention fits the data better.
    best = on_end if on_end.sum() >= on_start.sum() else on_start
    off = positions[np.argmin(best)]
    raise KronosTuneError(
        f"{where}: the bar at {index[off]} is not on {name}'s {_minutes(interval)} session grid (bars inside "
        f"its sessions, stamped at bar end or bar start); check --calendar, or leave it out to continue the "
        f"series' own grid")


__all__ = ["CalendarGrid", "SOME_CALENDARS", "calendar_grid", "exchange_calendar"]
