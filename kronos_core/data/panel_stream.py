"""Panels read a batch of whole symbols at a time, so a large job's memory does not grow with the file.

A Parquet panel (or several, each a part of one universe) whose rows are sorted by symbol is read in
record batches (pyarrow); each batch is cut after its last complete symbol, the rest carried into the
next, and the whole symbols go through the same reading and checks as a whole file
(`kronos_core.data.panels.panel_from_table`, `panel_inputs`). A first pass over the symbol column alone
(cheap, flat memory) checks the order before any prediction and counts the symbols. CSV panels, and
Parquet ones not sorted by symbol, are read whole (the caller says so in a note).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kronos_core.data.panels import panel_from_table
from kronos_core.deferred import deferred
from kronos_core.errors import KronosError

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)

BATCH_ROWS = 65_536  # rows per Parquet record batch: a few MiB, whatever the size of the file


def open_parquet(path: Path):
    """A ParquetFile that reads its row groups one after the other without keeping them.

    pyarrow's default `pre_buffer=True` makes `iter_batches` keep the buffered column chunks of every row
    group it has read until the iteration ends, so memory grows to about the file's compressed size
    (pyarrow 26, a 100,000-symbol panel of 235 MB: 68 MiB of Arrow memory after its first batch, 254 MiB
    near its end; a million symbols, 2.35 GB). Without pre-buffering each column chunk is read when its row
    group is, and freed after it: the Arrow memory stays at about 60 MiB whatever the file's size.
    """
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, pre_buffer=False)


@dataclass(frozen=True)
class SortedPanels:
    """Parquet panel files whose symbols are sorted within each file and across them, in reading order."""

    paths: list[Path]
    column: str       # the symbol column as the files spell it
    symbols: int      # distinct symbols over all files


def _symbol_column(schema_names: list[str], wanted: str) -> str | None:
    key = wanted.strip().lower()
    return next((name for name in schema_names if str(name).strip().lower() == key), None)


def sorted_panels(paths: list[Path], symbol_col: str) -> tuple[SortedPanels | None, str]:
    """The files as one sorted stream, or None and the reason it cannot be read in symbol batches."""
    if any(p.suffix.lower() != ".parquet" for p in paths):
        return None, "a CSV panel cannot be read in symbol batches"
    import pyarrow.compute as pc

    spans = []
    for path in paths:
        handle = open_parquet(path)
        column = _symbol_column(handle.schema_arrow.names, symbol_col)
        if column is None:
            return None, f"{path} has no column '{symbol_col}'"  # read whole: read_panel says it in one line
        first = last = None
        count = 0
        for batch in handle.iter_batches(batch_size=BATCH_ROWS, columns=[column]):
            values = pc.cast(batch.column(0), "string")
            if len(values) == 0:
                continue
            if values.null_count:
                return None, f"{path} has empty symbols"
            head = values[0].as_py()
            if last is not None and head < last:
                return None, f"{path} is not sorted by {column} ({head} after {last})"
            if len(values) > 1:
                if not pc.all(pc.greater_equal(values[1:], values[:-1])).as_py():
                    return None, f"{path} is not sorted by {column}"
                changes = pc.sum(pc.cast(pc.not_equal(values[1:], values[:-1]), "int64")).as_py() or 0
            else:
                changes = 0
            count += changes + (0 if head == last else 1)
            first = head if first is None else first
            last = values[-1].as_py()
        if first is not None:
            spans.append((first, last, count, path, column))
    spans.sort(key=lambda span: span[0])
    for (_, end, _, before, _), (start, _, _, after, _) in zip(spans, spans[1:]):
        if start <= end:
            return None, f"{before} and {after} share symbols or overlap in symbol order"
    if not spans:
        return None, "the files hold no rows"
    return SortedPanels([s[3] for s in spans], spans[0][4], sum(s[2] for s in spans)), ""


def symbol_batches(panels: SortedPanels, symbol_col: str, batch_rows: int = BATCH_ROWS,
                   date_format: str | None = None) -> Iterator[pd.DataFrame]:
    """`read_panel` results of whole symbols, in symbol order, about `batch_rows` rows each."""
    for path in panels.paths:
        carry: pd.DataFrame | None = None
        offset = 0  # file row of the carried rows' first
        for batch in open_parquet(path).iter_batches(batch_size=batch_rows):
            frame = batch.to_pandas()
            if carry is not None:
                frame = pd.concat([carry, frame], ignore_index=True)
            symbols = frame[panels.column].astype(str).to_numpy()
            cut = int(np.searchsorted(symbols, symbols[-1], side="left"))  # the last symbol may go on
            if cut > 0:
                yield _checked(frame.iloc[:cut].reset_index(drop=True), path, symbol_col, offset, date_format)
                offset += cut
            carry = frame.iloc[cut:].reset_index(drop=True)
        if carry is not None and len(carry):
            yield _checked(carry, path, symbol_col, offset, date_format)
    import pyarrow

    pyarrow.default_memory_pool().release_unused()  # what the batches held goes back before the prediction


def _checked(rows: pd.DataFrame, path: Path, symbol_col: str, offset: int,
             date_format: str | None = None) -> pd.DataFrame:
    try:
        return panel_from_table(rows, path, symbol_col, date_format)
    except KronosError as error:
        where = f" (rows counted from row {offset} of the file)" if offset else ""
        raise KronosError(f"{error}{where}") from None
