"""`kronos-tune predict --out FILE` as a job: chunks predicted and kept as they finish, resumable, any size.

    open the work folder beside --out (a fresh job, or --resume: the same data, model and settings)
    for each chunk of the series in name order (chunks.py): skip it when finished, else predict it and
    write its part (parts.py); sharded runs hand the chunks to ranks that claim them (shards.py)
    build --out from the parts, atomically; remove the work folder

Memory is one chunk's inputs and outputs (plus one symbol batch of a sorted Parquet panel), whatever the
number of series. Progress reports series done, series/s and the time left (per rank when sharded).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd

from kronos_core.data.kline import find_data_files
from kronos_core.hub import PretrainedSource
from kronos_core.signals import interrupt_on_signals
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.chunk_run import predict_chunk
from kronos_tune.predict.chunks import chunked, open_source
from kronos_tune.predict.config import PredictConfig, predictor_spec, resolve_device
from kronos_tune.predict.inputs import NoteCallback
from kronos_tune.predict.output import Precision, output_format, widest
from kronos_tune.predict.parts import assemble, read_part_close, write_part
from kronos_tune.predict.job_state import (JobOutcome, JobProgress, JobProgressCallback, chunk_settings,
                                           rank_summary,
                                           holdout_actuals)
from kronos_tune.predict.ray_runner import run_ray
from kronos_tune.predict.shards import rank_job, run_ranks, world_size
from kronos_tune.predict.chunk_size import choose_chunk_series, describe_chunks
from kronos_tune.predict.workdir import MemoryWork, WorkFolder, open_work, temporary_work

SMALL_RUN_SERIES = 100  # --json embeds the forecasts of runs up to this many series


def job_identity(config: PredictConfig, weights: dict[str, PretrainedSource],
                 chunk_series: int | None = None) -> dict[str, Any]:
    """What a resume must match: the data (each file's size and time), the model, every setting that changes
    a value. Not the process count: a job may resume on more or fewer ranks."""
    files = []
    for file in find_data_files(list(config.data)) if config.data else ():
        stat = file.stat()
        files.append([str(file.resolve()), stat.st_size, stat.st_mtime_ns])
    return {
        "data": files, "synthetic": config.synthetic, "size": config.size,
        "weights": {label: str(source.path) for label, source in sorted(weights.items())},
        "lookback": config.lookback, "pred_len": config.pred_len, "sample_count": config.sample_count,
        "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p, "seed": config.seed,
        "holdout": config.holdout, "symbol_column": config.symbol_column,
        "window_mode": config.window_mode, "max_context": config.max_context, "amp": config.amp,
        "device": resolve_device(config.device).split(":")[0], "kv_cache": config.kv_cache,
        "max_batch_size": config.max_batch_size, "calendar": config.calendar, "quantiles": list(config.quantiles),
        "chunk_series": chunk_series or config.chunk_series,
        "format": None if config.out is None else output_format(config.out), "date_format": config.date_format,
    }


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal) stop the loop like Ctrl-C (between chunks nothing is half written
    either way)."""
    with interrupt_on_signals():
        yield


def job_chunk_series(config: PredictConfig, expected: int) -> tuple[int, bool]:
    """Series per chunk and whether it was chosen here: --chunk-series, else the size a resumed job began with
    (whatever the process count is now), else chosen from the job (chunk_size.choose_chunk_series)."""
    if config.chunk_series is not None:
        return config.chunk_series, False
    if config.resume and config.out is not None:
        existing = WorkFolder.existing(config.out)
        if existing is not None and "chunk_series" in existing.identity:
            return existing.chunk_series, False
    return choose_chunk_series(expected, job_processes(config), resolve_device(config.device),
                               config.sample_count, config.max_batch_size), True


def job_processes(config: PredictConfig) -> int:
    """Processes that share the chunks: torchrun's world, or --ray-actors (a pool sized by the cluster is
    not known before Ray starts: counted as one, so chunks stay at least as many as one process needs)."""
    if config.runner == "ray":
        return config.ray_actors or 1
    return world_size(config.launch) or config.launch.nproc


def open_job(config: PredictConfig, weights: dict[str, PretrainedSource], chunk_series: int | None = None
             ) -> WorkFolder | MemoryWork:
    """Where the finished chunks go: the work folder beside --out, a temporary one for a sharded run without
    --out (the ranks write files), or memory for a run in this process without --out."""
    identity = job_identity(config, weights, chunk_series)
    if config.out is None and not config.elsewhere:
        return MemoryWork(int(identity["chunk_series"]))
    if config.out is None:
        return temporary_work(identity)
    return open_work(config.out, identity, config.resume, join=config.launch.multi_node)


def run_job(config: PredictConfig, weights: dict[str, PretrainedSource], note: NoteCallback,
            load: Callable[[], Any], on_progress: JobProgressCallback | None = None) -> JobOutcome | None:
    """Predict every missing chunk, then write --out; None on a node whose ranks finished while another node
    (the one running rank 0) writes the output. `load` builds the predictor (in-process runs only)."""
    if config.out is not None and not config.launch.multi_node and (WorkFolder.existing(config.out) is None) == config.resume:
        open_job(config, weights)  # refuses in one line before any data is read: --resume with nothing to
        # continue, or an unfinished job's folder without --resume
    source = open_source(config, note)
    chunk_series, chosen = job_chunk_series(config, source.expected)
    work = open_job(config, weights, chunk_series)
    if config.out is not None:
        note("note", f"work folder: {work.path} (finished chunks are kept there until --out is written"
                     + ("; it must be on storage every node shares" if config.launch.multi_node else "") + ")")
    if config.out is not None or config.elsewhere:  # the unit kept and shared: said
        note("note", describe_chunks(chunk_series, source.expected, job_processes(config), chosen))
    finished = work.finished()
    try:
        # the predictor is built before the clock starts: series/s is the prediction's, as the benchmark's
        predictor = None if config.elsewhere or len(finished) == _chunk_count(source.expected, chunk_series) \
            else load()
        started = time.perf_counter()
        if config.elsewhere:
            actuals: list = []
            job = rank_job(predictor_spec(config, weights), chunk_settings(config))
            on_series = (lambda series: actuals.append(holdout_actuals(series))) if config.holdout else None
            if config.runner == "ray":
                outcome = run_ray(job, work, chunked(source.batches, work.chunk_series), finished, note, on_progress,
                                  on_series, address=config.ray_address, actors=config.ray_actors)
            else:
                outcome = run_ranks(config.launch, job, work, chunked(source.batches, work.chunk_series), finished,
                                    note, on_progress, on_series=on_series)
            if outcome is not None:
                outcome.scores = actuals
        else:
            outcome = _run_here(config, work, source, finished, predictor, on_progress)
    except BaseException:
        if work.left_empty:
            work.remove()  # nothing finished: leave no trace of a job that never started
        raise
    if outcome is None:
        return None
    outcome.predict_seconds = time.perf_counter() - started
    if outcome.negative:
        note("note", f"{outcome.negative} predicted volume/amount values were below 0 and are written as 0")
    if outcome.resumed_chunks:
        note("note", f"resumed: kept {outcome.resumed_chunks} of {outcome.chunks} chunks ({outcome.resumed_series} "
                     f"of {outcome.series} series) finished before; predicted the other "
                     f"{outcome.chunks - outcome.resumed_chunks} ({outcome.series - outcome.resumed_series} series) "
                     f"now")
    if config.out is not None:
        outcome.rows = assemble(work, config.out, outcome.chunks)
    finished = work.finished()
    outcome.chunk_series = work.chunk_series
    outcome.precision = widest([Precision(*finished[k].precision) for k in range(outcome.chunks)] or [Precision()])
    if not outcome.ranks:
        outcome.ranks = rank_summary(finished)
    # --json embeds small runs; without --out the frames are the result
    if outcome.tables is None and (outcome.series <= SMALL_RUN_SERIES or config.out is None):
        outcome.tables = [work.read(k) for k in range(outcome.chunks)]
    if config.holdout:
        outcome.scores = holdout_pairs(work, outcome.scores, config.pred_len)
    work.remove()
    return outcome


def holdout_pairs(work: WorkFolder, actuals: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                  pred_len: int) -> list[tuple[str, np.ndarray, np.ndarray, float]]:
    """(name, predicted close, actual close, last close) of every series, chunk by chunk from the parts."""
    pairs = []
    for chunk, (names, actual, last) in enumerate(actuals):
        pairs.extend(zip(names, read_part_close(work, chunk, pred_len), actual, last))
    return pairs


def _chunk_count(series: int, chunk_series: int) -> int:
    return -(-series // chunk_series)


def _run_here(config: PredictConfig, work: WorkFolder, source, finished: dict, predictor,
              on_progress: JobProgressCallback | None) -> JobOutcome:
    series_total = source.expected
    done_series = resumed_series = negative = chunks = resumed = 0
    tables: list[pd.DataFrame] | None = [] if series_total <= SMALL_RUN_SERIES else None
    actuals: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # --holdout, per chunk
    started = time.perf_counter()
    index = -1
    try:
        with _sigterm_as_interrupt():
            for index, series in chunked(source.batches, work.chunk_series):
                settings = chunk_settings(config, series.name_column)
                if index in finished:
                    table = work.read(index) if tables is not None else None
                    resumed += 1
                    resumed_series += len(series)
                else:
                    chunk_started = time.perf_counter()
                    table, clipped = predict_chunk(predictor, series, settings)
                    write_part(work, index, table, series, 0, time.perf_counter() - chunk_started)
                    negative += clipped
                if tables is not None:
                    tables.append(table)
                if config.holdout:
                    actuals.append(holdout_actuals(series))
                done_series += len(series)
                series_total = max(series_total, done_series)
                if on_progress is not None:
                    on_progress(JobProgress(done_series, series_total, resumed_series,
                                            time.perf_counter() - started, {0: (done_series - resumed_series,
                                                                                time.perf_counter() - started)}))
    except KeyboardInterrupt:
        kept = len(work.finished())
        from kronos_tune.resume_command import resume_line

        line = resume_line("predict", work.path) if config.out is not None and kept else None
        raise KronosTuneError(f"predict: interrupted after {kept} of about {-(-series_total // work.chunk_series)} "
                              f"chunks; {work.kept_note(resumable=config.out is not None and line is None)}"
                              + (f"; resume with: {line}" if line else "")) from None
    chunks = index + 1
    return JobOutcome(done_series, chunks, resumed, 0, 0.0, negative, work.path, tables, scores=actuals,
                      resumed_series=resumed_series)
