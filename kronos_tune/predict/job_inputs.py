"""What every runner of chunks in other processes does first: each unfinished chunk's inputs written into the
work folder, and the job those processes read.

torchrun's ranks (`shards.run_ranks`) and Ray's actors (`ray_runner.run_ray`) both start from here, so they
see the same chunks, with the same composition, as a run in this process: a chunk's inputs are its series in
name order (`chunks.chunked`), saved once (`series.save_series`; a resumed job keeps the ones it wrote).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kronos_tune.predict.series import LoadedSeries, save_series
from kronos_tune.predict.workdir import DoneChunk, WorkFolder


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


__all__ = ["ChunkJob", "write_chunk_inputs"]
