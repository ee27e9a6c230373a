"""The series of a large job in chunks of a fixed size, in a fixed order: by series name.

Chunk k holds the series k * size ... (k + 1) * size - 1 of the usable series sorted by name, whatever
the order of the files or the rows, the number of ranks or a restart: so a chunk's composition (and
with per-series random streams its forecast) is the same in every run of the same data and settings.
Sorted Parquet panels stream in symbol batches (`kronos_core.data.series`, over `kronos_core.data.panel_stream`);
anything else is read once into arrays (`inputs.input_batches`) and sorted.

Every runner of chunks in other processes (torchrun's ranks, `shards.run_ranks`, and Ray's actors,
`ray_runner.run_ray`) starts from `write_chunk_inputs`: each unfinished chunk's inputs written into the work
folder (`series.save_series`; a resumed job keeps the ones it wrote), so those processes see the same chunks,
with the same composition, as a run in this process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.inputs import NoteCallback, input_batches, read_series
from kronos_tune.predict.series import LoadedSeries, concat, save_series
from kronos_tune.predict.workdir import DoneChunk, WorkFolder


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


@dataclass(frozen=True)
class ChunkJob:
    """The chunks of a job whose inputs are on disk, and the job the other processes read: the predictor
    spec, the device, the chunk settings (`shards.rank_job`) with the work folder and the chunk count."""

    job: dict
    chunks: int
    series_total: int
    resumed_series: int
    todo: list[int]  # the chunks without a done record, in order


def write_chunk_inputs(job: dict, work: WorkFolder, source: Iterable[tuple[int, LoadedSeries]],
                       finished: dict[int, DoneChunk],
                       on_series: Callable[[LoadedSeries], None] | None = None) -> ChunkJob:
    """Every chunk of `source` ((index, series) in order) counted, and the inputs of each unfinished one
    written (unless a resumed job wrote them already); `on_series` sees each chunk's series."""
    chunks = series_total = resumed_series = 0
    name_column = "series"
    for index, series in source:
        chunks, series_total, name_column = index + 1, series_total + len(series), series.name_column
        if index in finished:
            resumed_series += len(series)
        elif not work.inputs(index).is_file():
            save_series(work.inputs(index), series)
        if on_series is not None:
            on_series(series)
    full = {**job, "work": str(work.path), "chunks": chunks,
            "settings": {**job["settings"], "name_column": name_column}}
    return ChunkJob(full, chunks, series_total, resumed_series, [k for k in range(chunks) if k not in finished])
