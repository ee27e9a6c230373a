"""Series as compact arrays: what `kronos-tune predict` holds of its inputs, whole or a chunk at a time.

No DataFrame per series: a `LoadedSeries` is a handful of arrays over N series (histories, calendar
features, future stamps as wall-clock nanoseconds with one time zone), so a chunk of a large job costs
what its arrays cost. `take`, `concat` and `sorted_by_name` cut and join them; `futures` builds the
per-series output index only when a small job asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.data.kline import TIME_COLUMN
from kronos_core.files import atomic_writer
from kronos_tune.predict.output import Precision, widest


@dataclass
class LoadedSeries:
    """Series of one history length as arrays, with what the output and the scores need."""

    names: np.ndarray                  # [N] str (object): the name the output writes
    x: np.ndarray                      # [N, L, 6] raw features
    x_stamp: np.ndarray                # [N, L, 5]
    y_stamp: np.ndarray                # [N, P, 5]
    future_ns: np.ndarray              # [N, P] wall-clock nanoseconds of the predicted bars
    tz: object | None                  # their time zone (None: naive)
    last_ns: np.ndarray                # [N] wall-clock nanoseconds of each history's last bar (stream keys)
    actual_close: np.ndarray | None    # [N, P] (holdout)
    no_volume: np.ndarray              # [N] bool: the input had no volume column (predict zeros)
    precision: Precision               # decimals of the input's (float64) values, for text output
    lacked: tuple[str, ...] = ()       # volume/amount columns the input did not have
    name_column: str = "series"        # the output's name column: a panel's symbol column as the file spells it

    def __len__(self) -> int:
        return len(self.names)

    @property
    def futures(self) -> list[pd.DatetimeIndex]:
        """The output index of each series (built on demand: one DatetimeIndex per series)."""
        out = []
        for row in self.future_ns:
            index = pd.DatetimeIndex(row.view("datetime64[ns]"), name=TIME_COLUMN)
            if self.tz is not None:
                index = index.tz_localize(self.tz, ambiguous="NaT", nonexistent="shift_forward")
            out.append(index)
        return out

    def take(self, positions: np.ndarray | slice) -> LoadedSeries:
        """The series at `positions` (array fields cut alike; precision and time zone kept)."""
        return replace(self, **{f.name: getattr(self, f.name)[positions] for f in fields(self)
                                if isinstance(getattr(self, f.name), np.ndarray)})

    def sorted_by_name(self) -> LoadedSeries:
        order = np.argsort(self.names.astype(str), kind="stable")
        return self if np.array_equal(order, np.arange(len(order))) else self.take(order)


def concat(parts: list[LoadedSeries]) -> LoadedSeries:
    """One LoadedSeries of several (same history length, pred_len and time zone)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    arrays = {f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(first)
              if isinstance(getattr(first, f.name), np.ndarray)}
    lacked = tuple(c for c in ("volume", "amount") if any(c in p.lacked for p in parts))
    return replace(first, **arrays, precision=widest([p.precision for p in parts]), lacked=lacked)


def save_series(path: Path, series: LoadedSeries) -> None:
    """A chunk's inputs for the ranks of a sharded job (atomically; no pickled objects)."""
    precision = series.precision
    with atomic_writer(path, "wb") as stream:
        np.savez(stream, names=series.names.astype(str), x=series.x, x_stamp=series.x_stamp, y_stamp=series.y_stamp,
                 future_ns=series.future_ns, last_ns=series.last_ns, no_volume=series.no_volume,
                 precision=np.array([precision.price, precision.volume, precision.amount]),
                 tz=np.array("" if series.tz is None else str(series.tz)), name_column=np.array(series.name_column))


def load_saved_series(path: Path) -> LoadedSeries:
    with np.load(path) as saved:
        tz = str(saved["tz"])
        return LoadedSeries(saved["names"].astype(object), saved["x"], saved["x_stamp"], saved["y_stamp"],
                            saved["future_ns"], tz or None, saved["last_ns"], None, saved["no_volume"],
                            Precision(*(int(v) for v in saved["precision"])), (), str(saved["name_column"]))
