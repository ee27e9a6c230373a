"""The series of a large job in chunks of a fixed size, in a fixed order: by series name.

Chunk k holds the series k * size ... (k + 1) * size - 1 of the usable series sorted by name, whatever
the order of the files or the rows, the number of ranks or a restart: so a chunk's composition (and
with per-series random streams its forecast) is the same in every run of the same data and settings.
Sorted Parquet panels stream in symbol batches (`kronos_core.data.series`, over `kronos_core.data.panel_stream`);
anything else is read once into arrays (`inputs.input_batches`) and sorted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.inputs import NoteCallback, input_batches, read_series
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
    source = read_series(config, note)
    batches = input_batches(source, config, note)
    if source.streamed:
        return ChunkSource(source.count, True, batches)
    inputs = concat(list(batches)).sorted_by_name()
    return ChunkSource(len(inputs), False, iter([inputs]))


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
