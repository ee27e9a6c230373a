"""Future timestamps that continue a series' own bar grid (for `kronos-tune predict`).

The bar interval is the most common difference between consecutive
timestamps. Data whose bars all lie inside the A-share sessions (weekdays,
09:30-11:30 and 13:00-15:00) with an interval dividing the 120-minute sessions
continues on that session calendar (bar-close or bar-open stamps, whichever
the data uses); daily data on weekdays only continues on business days;
anything else adds multiples of the interval.

With a named exchange calendar (`--calendar`), `kronos_tune.calendars` makes
the stamps instead: real sessions and holidays; this grid is the fallback.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kronos_core.data import TIME_COLUMN
from kronos_core.synthetic import SESSIONS, session_bar_minutes, trading_timestamps
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
        from kronos_tune.calendars import calendar_grid

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
