"""Which bars a training run read: the `train_until` cut and the data span written next to its checkpoints.

`train_until` is a date (``2010-05-14``, ``20100514`` or a timestamp; day and month first, ``05/06/2010``, is
refused as ambiguous) or a fraction in (0, 1). A date keeps
every bar at or before it (a date without a time keeps that whole day); a fraction is a date too: the bar at
that fraction of the data's timeline (every distinct timestamp of every series), so one cut holds for the
whole panel and a backtest can start after it. Training and validation windows both come from the bars
before the cut; each window is still normalized on its own lookback rows.

`data_span.json` (written by rank 0 into the run folder and into ``best/`` with every new best) records the
data files, the whole data's first and last bar, the cut, and the first and last bar read. Times are
wall-clock times (a time zone is dropped, not converted, as the calendar features see them).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kronos_core.data.day_month import DAY_MONTH, readings
from kronos_core.data.kline import TIME_COLUMN, wall_clock_ns
from kronos_core.deferred import deferred
from kronos_core.errors import KronosError
from kronos_core.files import write_text_atomic

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)

SPAN_FILE = "data_span.json"
SPAN_FORMAT = 1
_DATE_ONLY = re.compile(r"^\s*(\d{8}|\d{4}[-/.]\d{1,2}[-/.]\d{1,2})\s*$")
_NUMBER = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


@dataclass(frozen=True)
class DataSpan:
    """What a training run read (see the module doc); times as ISO strings, None where nothing was read."""

    data: list[dict[str, Any]]          # {"path", "bytes"} per file, or [] for synthetic series
    synthetic: bool
    symbol_column: str | None
    series: int                         # series in the data
    series_used: int                    # series with at least one bar at or before the cut
    data_first_bar: str
    data_last_bar: str
    train_until: str | None             # as given
    cut: str | None                     # the last bar kept (None: no cut, the whole data)
    first_bar: str                      # first and last bar read (training and validation)
    last_bar: str
    val_fraction: float
    tz: list[str] = field(default_factory=list)  # time zones dropped from the stamps, if any

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SPAN_FORMAT, "data": self.data, "synthetic": self.synthetic,
            "symbol_column": self.symbol_column, "series": self.series, "series_used": self.series_used,
            "data_first_bar": self.data_first_bar, "data_last_bar": self.data_last_bar,
            "train_until": self.train_until, "cut": self.cut, "first_bar": self.first_bar, "last_bar": self.last_bar,
            "validation": f"the last {self.val_fraction:g} of each series' rows read",
            "normalization": "each window z-scored on its own lookback rows",
            "times": "wall-clock" + (f" (time zone {', '.join(self.tz)} dropped)" if self.tz else ""),
        }


def _iso(ns: int) -> str:
    return pd.Timestamp(int(ns)).isoformat(sep=" ")


def _describe_files(paths: list[Path]) -> list[dict[str, Any]]:
    return [{"path": str(Path(p).resolve()), "bytes": os.path.getsize(p)} for p in paths]


def _where(paths: list[Path], synthetic: bool) -> str:
    if synthetic:
        return "synthetic series"
    names = [Path(p).name for p in paths]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def refuse_ambiguous_date(text: str, where: str) -> None:
    """Raise KronosError for a date written day and month first (05/06/2010: 5 June or 6 May?), saying how to
    write it; `where` names the setting ("train_until '05/06/2010' (--train-until)")."""
    match = DAY_MONTH.match(text)
    if match is None:
        return
    said = " or ".join(readings(int(match["a"]), int(match["b"]), match["year"]))
    raise KronosError(f"{where}: day and month first (DD/MM or MM/DD) is ambiguous; write the year first: "
                      f"{said} (YYYY-MM-DD, or YYYYMMDD)")


def parse_train_until(value: str) -> tuple[str, float | pd.Timestamp]:
    """('fraction', f) or ('date', timestamp); a date without a time becomes the end of that day (exclusive
    limit handled by the caller via `limit_ns`)."""
    text = str(value).strip()
    if _NUMBER.match(text) and not re.fullmatch(r"\d{8}", text):
        fraction = float(text)
        if not 0.0 < fraction < 1.0 or not math.isfinite(fraction):
            raise KronosError(f"train_until {text!r} (--train-until): a fraction must be between 0 and 1 "
                              f"(e.g. 0.75), or give a date such as 2010-05-14")
        return "fraction", fraction
    refuse_ambiguous_date(text, f"train_until {text!r} (--train-until)")
    try:
        stamp = pd.Timestamp(pd.to_datetime(text, format="%Y%m%d") if re.fullmatch(r"\d{8}", text) else text)
    except (ValueError, TypeError, OverflowError):
        raise KronosError(f"train_until {text!r} (--train-until) is neither a date (e.g. 2010-05-14 or "
                          f"2010-05-14 15:00) nor a fraction in (0, 1) such as 0.75") from None
    if stamp.tzinfo is not None:
        stamp = stamp.tz_localize(None)
    return "date", stamp


def limit_ns(value: str, timeline_ns: np.ndarray) -> int:
    """The last kept wall-clock instant (int64 ns, inclusive) for `value` over a sorted timeline."""
    kind, parsed = parse_train_until(value)
    if kind == "fraction":
        index = max(1, math.ceil(float(parsed) * len(timeline_ns))) - 1
        return int(timeline_ns[index])
    stamp = pd.Timestamp(parsed)
    if _DATE_ONLY.match(str(value)):
        return int((stamp.normalize() + pd.Timedelta(days=1)).value) - 1  # the whole day
    return int(stamp.value)


def _zones(frames: list[pd.DataFrame]) -> list[str]:
    zones = {str(f[TIME_COLUMN].dt.tz) for f in frames
             if len(f) and isinstance(f[TIME_COLUMN].dtype, pd.DatetimeTZDtype)}
    return sorted(zones)


def cut_frames(frames: list[pd.DataFrame], train_until: str | None, paths: list[Path], synthetic: bool,
               symbol_column: str | None, val_fraction: float) -> tuple[list[pd.DataFrame], DataSpan]:
    """Each series' rows at or before the cut (all rows without `train_until`) and the span they cover.

    Raises KronosError naming the data's span when the cut keeps no bar or leaves no bar after it."""
    stamps = [wall_clock_ns(f[TIME_COLUMN]) for f in frames]
    nonempty = [s for s in stamps if len(s)]
    if not nonempty:
        raise KronosError(f"{_where(paths, synthetic)}: the data holds no bars; give files with rows")
    first = min(int(s.min()) for s in nonempty)
    last = max(int(s.max()) for s in nonempty)
    cut_ns: int | None = None
    kept = frames
    if train_until is not None:
        timeline = np.unique(np.concatenate(nonempty))
        limit = limit_ns(train_until, timeline)
        if limit < first or limit >= last:
            raise KronosError(
                f"train_until {str(train_until).strip()!r} (--train-until) is outside the data "
                f"({_where(paths, synthetic)}: {_iso(first)} to {_iso(last)}); give a date inside that span or a "
                f"fraction in (0, 1) such as 0.75, leaving bars after it to test on")
        kept = []
        for frame, ns in zip(frames, stamps):
            part = frame[ns <= limit].reset_index(drop=True)
            part.attrs.update(frame.attrs)
            kept.append(part)
        cut_ns = int(timeline[np.searchsorted(timeline, limit, side="right") - 1])
    used = [wall_clock_ns(f[TIME_COLUMN]) for f in kept if len(f)]
    span = DataSpan(
        data=[] if synthetic else _describe_files(paths), synthetic=synthetic, symbol_column=symbol_column,
        series=len(frames), series_used=len(used), data_first_bar=_iso(first), data_last_bar=_iso(last),
        train_until=None if train_until is None else str(train_until).strip(),
        cut=None if cut_ns is None else _iso(cut_ns), first_bar=_iso(min(int(s.min()) for s in used)),
        last_bar=_iso(max(int(s.max()) for s in used)), val_fraction=val_fraction, tz=_zones(frames))
    return kept, span


def write_data_span(folder: str | os.PathLike, span: DataSpan | dict[str, Any]) -> Path:
    """Write data_span.json into `folder` (atomically); returns its path."""
    path = Path(folder) / SPAN_FILE
    values = span.to_dict() if isinstance(span, DataSpan) else span
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(values, indent=2) + "\n")
    return path


def read_data_span(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The data_span.json of a run or checkpoint folder, None when it has none; a damaged one is an error."""
    path = Path(folder) / SPAN_FILE
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise KronosError(f"{path}: not a readable data span ({error}); train again or remove the file") from None
    if not isinstance(values, dict) or values.get("format") != SPAN_FORMAT or "last_bar" not in values:
        raise KronosError(f"{path}: not a data span written by kronos_core.train (format "
                          f"{values.get('format') if isinstance(values, dict) else '?'}); train again")
    return values


def check_same_span(earlier: dict[str, Any] | None, now: DataSpan, where: str | os.PathLike) -> None:
    """A resumed run must read the bars it started on: the same cut, the same data, the same first/last bar."""
    if earlier is None:
        return  # a run from before spans were recorded
    current = now.to_dict()
    for key in ("train_until", "cut", "first_bar", "last_bar", "symbol_column"):
        if earlier.get(key) != current[key]:
            raise KronosError(f"{where}: this run trained with {key} {earlier.get(key)!r}, the config now gives "
                              f"{current[key]!r} ({SPAN_FILE}); resume with the data and train_until it started "
                              f"with, or start a new run")
