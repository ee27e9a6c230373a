"""The series of a large job in chunks of a fixed size, in a fixed order: by series name.

Chunk k holds the series k * size ... (k + 1) * size - 1 of the usable series sorted by name, whatever
the order of the files or the rows, the number of ranks or a restart: so a chunk's composition (and
with per-series random streams its forecast) is the same in every run of the same data and settings.
Sorted Parquet panels stream in symbol batches (`kronos_core.data.panel_stream`); anything else is read once into arrays
(`inputs.load_inputs`) and sorted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kronos_core.data.kline import find_data_files
from kronos_core.errors import KronosError
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.inputs import NoteCallback, load_inputs, panel_series, say_filled, say_read_notes
from kronos_core.data.panel_stream import SortedPanels, sorted_panels, symbol_batches
from kronos_tune.predict.series import LoadedSeries, concat


@dataclass
class ChunkSource:
    """Where the chunks come from: `expected` series (symbols before the short ones are left out, when
    streaming), `streamed` whether memory stays flat in the number of series."""

    expected: int
    streamed: bool
    batches: Iterator[LoadedSeries]


def open_source(config: PredictConfig, note: NoteCallback) -> ChunkSource:
    """The job's series in name order: streamed from sorted Parquet panels, else read whole and sorted."""
    if config.symbol_column is not None:
        paths = find_data_files(list(config.data))
        panels, why = sorted_panels(paths, config.symbol_column)
        if panels is not None:
            return ChunkSource(panels.symbols, True, _streamed(panels, config, note))
        note("note", f"{why}: the panel is read whole, so memory grows with it; a Parquet panel sorted by "
                     f"{config.symbol_column} is read in symbol batches (e.g. df.sort_values(['{config.symbol_column}'"
                     f", time]).to_parquet(...))")
    inputs = load_inputs(config, note).sorted_by_name()
    return ChunkSource(len(inputs), False, iter([inputs]))


def _streamed(panels: SortedPanels, config: PredictConfig, note: NoteCallback) -> Iterator[LoadedSeries]:
    said: set[tuple[str, str]] = set()
    lacked: tuple[str, ...] = ()
    no_volume = 0
    count = 0

    def once(level: str, message: str) -> None:  # each batch would repeat the file's notes
        if (level, message) not in said:
            said.add((level, message))
            note(level, message)

    try:
        for frame in symbol_batches(panels, config.symbol_column, date_format=config.date_format):
            say_read_notes(frame, once)
            frame.attrs = {"symbol_column": frame.attrs.get("symbol_column")}  # the notes are said above
            try:
                series = panel_series(frame, config, str(frame_source(panels)), once)
            except KronosError as error:
                if "no symbol has" not in str(error):
                    raise
                continue  # every symbol of this batch is short; others may not be (skipped as the rule says)
            lacked, no_volume, count = series.lacked, no_volume + int(series.no_volume.sum()), count + len(series)
            yield series
    except KronosError as error:
        raise KronosTuneError(str(error)) from None
    if count == 0:
        raise KronosTuneError(f"{frame_source(panels)}: no symbol has {config.lookback} rows; use a shorter "
                              f"--lookback")
    say_filled(np.arange(count) < no_volume, lacked, note)


def frame_source(panels: SortedPanels) -> str:
    return str(panels.paths[0]) if len(panels.paths) == 1 else f"{len(panels.paths)} panel files"


def chunked(batches: Iterator[LoadedSeries], size: int) -> Iterator[tuple[int, LoadedSeries]]:
    """(index, series) chunks of `size` series from batches that come in name order."""
    pending: list[LoadedSeries] = []
    held = 0
    index = 0
    for batch in batches:
        batch = batch.sorted_by_name()
        pending.append(batch)
        held += len(batch)
        while held >= size:
            joined = concat(pending)
            yield index, joined.take(slice(0, size))
            index += 1
            rest = joined.take(slice(size, None))
            pending, held = ([rest], len(rest)) if len(rest) else ([], 0)
    if held:
        yield index, concat(pending)
