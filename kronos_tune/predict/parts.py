"""A large job's output, a chunk at a time: each chunk's rows as a part file, then --out built from the parts.

`chunk_table` lays a chunk's predictions out as the output's rows (name, timestamps, open ... amount, then
the quantile columns) without a DataFrame per series; `write_part` stores it in the work folder and
records the chunk finished; `assemble` streams the parts into --out in chunk order (Parquet: one row group
per chunk; CSV: appended, rounded to the decimals every chunk's input needs), atomically, holding one part
at a time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS, TIME_COLUMN
from kronos_core.errors import one_line
from kronos_core.files import atomic_path
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.output import Precision, output_format, rounded, widest
from kronos_tune.predict.quantiles import quantile_columns
from kronos_tune.predict.series import LoadedSeries
from kronos_tune.predict.workdir import DoneChunk, WorkFolder


def chunk_table(series: LoadedSeries, values: np.ndarray, quantiles: np.ndarray | None,
                levels: tuple[float, ...], name_column: str) -> pd.DataFrame:
    """Rows of one chunk: values [n, P, 6], quantiles [n, Q, P, 6] or None, in the series' order."""
    count, pred_len = series.future_ns.shape
    stamps = pd.DatetimeIndex(series.future_ns.reshape(-1).view("datetime64[ns]"))
    if series.tz is not None:
        stamps = stamps.tz_localize(series.tz, ambiguous="NaT", nonexistent="shift_forward")
    columns: dict[str, object] = {name_column: np.repeat(series.names.astype(object), pred_len),
                                  TIME_COLUMN: stamps}
    flat = values.reshape(count * pred_len, len(FEATURE_COLUMNS))
    columns.update({name: flat[:, k] for k, name in enumerate(FEATURE_COLUMNS)})
    if quantiles is not None:
        # [n, Q, P, C] -> [n, P, C, Q]: per bar, each column's levels side by side, in quantile_columns' order
        banded = np.moveaxis(quantiles, 1, 3).reshape(count * pred_len, -1)
        columns.update({name: banded[:, k] for k, name in enumerate(quantile_columns(FEATURE_COLUMNS, levels))})
    return pd.DataFrame(columns)


def write_part(work: WorkFolder, chunk: int, table: pd.DataFrame, series: LoadedSeries, rank: int,
               seconds: float) -> DoneChunk:
    work.store(chunk, table)
    precision = series.precision
    done = DoneChunk(chunk, rank, len(series), len(table), (precision.price, precision.volume, precision.amount),
                     seconds)
    work.record(done)
    return done


def assemble(work: WorkFolder, out: Path, chunks: int) -> int:
    """Write --out from parts 0 .. chunks-1 (every one finished); returns the rows written."""
    import pyarrow.parquet as pq

    finished = work.finished()
    missing = [k for k in range(chunks) if k not in finished]
    if missing:
        raise KronosTuneError(f"--out {out}: chunks {missing[:5]} of {chunks} are not finished; run the same "
                              f"command with --resume")
    precision = widest([Precision(*finished[k].precision) for k in range(chunks)])
    rows = 0
    try:
        with atomic_path(out) as temp:
            if output_format(out) == "parquet":
                writer = None
                for k in range(chunks):
                    table = pq.read_table(work.part(k))
                    if writer is None:
                        writer = pq.ParquetWriter(temp, table.schema)
                    writer.write_table(table.cast(writer.schema))
                    rows += table.num_rows
                if writer is not None:
                    writer.close()
            else:
                with open(temp, "w", encoding="utf-8", newline="") as handle:
                    for k in range(chunks):
                        part = pd.read_parquet(work.part(k))
                        rounded(part, precision).to_csv(handle, index=False, header=k == 0)
                        rows += len(part)
    except (OSError, ValueError) as error:
        raise KronosTuneError(f"--out {out}: writing failed ({one_line(error, typed=False)}); the finished chunks "
                              f"are kept in {work.path}: free space, then run the same command with --resume") from None
    return rows


def read_part_close(work: WorkFolder, chunk: int, pred_len: int) -> np.ndarray:
    """The predicted close [n, P] of a finished chunk (scores of a resumed --holdout job)."""
    close = work.read(chunk, columns=["close"])["close"].to_numpy()
    return close.reshape(-1, pred_len)
