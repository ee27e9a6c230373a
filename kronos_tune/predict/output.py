"""What `kronos-tune predict` writes: the --out checks, the long table, rounding for text, atomic writes.

Text outputs (CSV, the --json predictions) are rounded so they read like the
input: prices to the decimals the input's prices use (at most
MAX_PRICE_DECIMALS), volume and amount to the decimals the input's use (at
most MAX_VOLUME_DECIMALS; whole numbers for share counts). Parquet keeps the
predictor's float values. Volume and amount are never negative: the model can
predict a negative z-score that de-normalizes below zero; those are clipped
to 0 and counted in a note. Quantile columns (`close_q10`...) follow the mean
columns and are rounded and clipped like the column they belong to.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS, PRICE_COLUMNS, TIME_COLUMN
from kronos_core.errors import one_line
from kronos_core.files import atomic_path
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.quantiles import base_column

OUTPUT_FORMATS = {".csv": "csv", ".parquet": "parquet"}
OUTPUT_COLUMNS = ("series", TIME_COLUMN, *FEATURE_COLUMNS)
VOLUME_COLUMNS = ("volume", "amount")
MAX_PRICE_DECIMALS = 6
MAX_VOLUME_DECIMALS = 2


@dataclass(frozen=True)
class Precision:
    """Decimals for text output: prices, volume and amount."""

    price: int = MAX_PRICE_DECIMALS
    volume: int = MAX_VOLUME_DECIMALS
    amount: int = MAX_VOLUME_DECIMALS

    def describe(self) -> str:
        def places(decimals: int) -> str:
            return "whole numbers" if decimals == 0 else f"{decimals} decimals"

        return f"prices to {self.price} decimals, volume to {places(self.volume)}, amount to {places(self.amount)}"


def decimals_used(values: np.ndarray, limit: int) -> int:
    """The fewest decimals (<= limit) that write every value exactly; `limit` when none do.
    float32 inputs (what the predictor holds) are exact to their own rounding error only."""
    values = np.asarray(values)
    relative = 8 * np.finfo(np.float32).eps if values.dtype == np.float32 else 1e-9
    flat = values.astype(np.float64).reshape(-1)
    flat = flat[np.isfinite(flat)]
    tolerance = relative * np.maximum(1.0, np.abs(flat))
    for decimals in range(limit + 1):
        if np.all(np.abs(np.round(flat, decimals) - flat) <= tolerance):
            return decimals
    return limit


def widest(precisions: list[Precision]) -> Precision:
    """The decimals that write every part's values exactly (the most each column needs)."""
    return Precision(max(p.price for p in precisions), max(p.volume for p in precisions),
                     max(p.amount for p in precisions))


def input_precision(x: np.ndarray) -> Precision:
    """Precision of raw inputs x [..., 6] (open, high, low, close, volume, amount); pass the float64 values
    as read (float32 copies only show about 7 significant digits)."""
    volume, amount = len(PRICE_COLUMNS), len(PRICE_COLUMNS) + 1
    return Precision(decimals_used(x[..., :volume], MAX_PRICE_DECIMALS),
                     decimals_used(x[..., volume], MAX_VOLUME_DECIMALS),
                     decimals_used(x[..., amount], MAX_VOLUME_DECIMALS))


def fix_volumes(values: np.ndarray, zero_rows: np.ndarray | None) -> int:
    """In place on [N, P, 6]: volume/amount of series without them in the input become 0, negatives 0.
    Returns how many negative values were clipped."""
    volume = values[..., len(PRICE_COLUMNS):]
    if zero_rows is not None and zero_rows.any():
        volume[zero_rows] = 0.0
    negative = int((volume < 0).sum())
    np.maximum(volume, 0.0, out=volume)
    return negative


def output_format(path: Path) -> str:
    """'csv' or 'parquet' from the suffix; anything else is a user error."""
    fmt = OUTPUT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise KronosTuneError(f"--out {path}: unknown suffix '{path.suffix}'; use a .csv or .parquet file name")
    return fmt


def check_output_path(path: Path) -> str:
    """Suffix, folder and write permission of --out, checked by creating (and removing) a temp file there."""
    fmt = output_format(path)
    if path.is_dir():
        raise KronosTuneError(f"--out {path} is a folder; give a file name ending in .csv or .parquet")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise KronosTuneError(f"--out {path}: {folder} {what}; create the folder or choose another path")
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".probe")
    except OSError as error:
        raise KronosTuneError(f"--out {path}: cannot write in {folder} ({error.strerror or error}); "
                              "choose a writable folder") from None
    os.close(handle)
    os.unlink(probe)
    return fmt


def long_frame(names: list[str], frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per (series, timestamp): series, timestamps, open ... amount, then any quantile columns."""
    parts = []
    for name, frame in zip(names, frames):
        part = frame.reset_index(names=TIME_COLUMN)[[TIME_COLUMN, *frame.columns]]
        part.insert(0, "series", name)
        parts.append(part)
    extra = [column for column in frames[0].columns if column not in FEATURE_COLUMNS]
    return pd.concat(parts, ignore_index=True)[[*OUTPUT_COLUMNS, *extra]]


def rounded(table: pd.DataFrame, precision: Precision) -> pd.DataFrame:
    """Float64 columns rounded for text (float32 values would print artefacts like 9.8933935)."""
    out = table.copy()
    decimals_of = {**{column: precision.price for column in PRICE_COLUMNS},
                   **dict(zip(VOLUME_COLUMNS, (precision.volume, precision.amount)))}
    for column in out.columns:
        decimals = decimals_of.get(base_column(column))
        if decimals is None:
            continue
        values = np.round(out[column].to_numpy(dtype=np.float64), decimals)
        whole = decimals == 0 and base_column(column) in VOLUME_COLUMNS
        out[column] = values.astype(np.int64) if whole else values
    return out


def write_table(table: pd.DataFrame, path: Path, precision: Precision | None = None) -> None:
    """CSV (rounded to `precision` when given) or Parquet by suffix, atomically (kronos_core.files)."""
    fmt = output_format(path)
    try:
        with atomic_path(path) as temp:
            if fmt == "csv":
                (table if precision is None else rounded(table, precision)).to_csv(temp, index=False)
            else:
                table.to_parquet(temp, index=False)
    except (OSError, ValueError, ImportError) as error:
        raise KronosTuneError(f"--out {path}: writing failed ({one_line(error, typed=False)}); "
                              "check the folder and free space") from None


def predictions_json(names: list[str], frames: list[pd.DataFrame], precision: Precision) -> list[dict]:
    """Per series: name, ISO timestamps and each column's rounded values (for --json)."""
    out = []
    for name, frame in zip(names, frames):
        table = rounded(frame.reset_index(names=TIME_COLUMN).assign(series=name), precision)
        item = {"series": name, TIME_COLUMN: [stamp.isoformat() for stamp in table[TIME_COLUMN]]}
        item.update({column: table[column].tolist() for column in frame.columns})
        out.append(item)
    return out
