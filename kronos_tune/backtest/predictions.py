"""The backtest's predictions through the prediction pipeline: (symbol, origin) windows as chunks.

For each setting (slot "a", and "b" with --compare) every window of the schedule, origin by origin in the
schedule's member order, is cut into chunks of a fixed size. Each chunk is predicted by `predict_chunk` (the
function `kronos-tune predict` runs), in this process or by torchrun ranks that claim chunks
(`kronos_tune.predict.shards.run_ranks`), and kept as a part (every sample path's close at the end of the
horizon) in the slot's work folder, `predictions/<slot>.work/`, with a `done/` record: that is what
`--resume` continues from, after Ctrl-C, SIGTERM or kill -9. Only one chunk's windows are held at a time.
When every chunk is in, the per-origin files `predictions/<slot>/origin-NNNN.csv` are written from the parts
(scoring reads those) and the work folder is removed.

Each window samples from its own stream keyed by the run's seed, its symbol and its last history bar, so a
window's forecast does not depend on its chunk, the chunk size, the rank or a restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kronos_core.data.kline import calendar_features_ns
from kronos_core.launch import LaunchSpec
from kronos_core.predict.spec import PredictorSpec
from kronos_tune.backtest.forecast import Forecaster, Window, origin_windows
from kronos_tune.backtest.origins import OriginSchedule, Universe
from kronos_tune.backtest.store import origin_frame, origin_path, read_origin, write_origin
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.chunk_run import FINAL_CLOSES, ChunkSettings, predict_chunk
from kronos_tune.predict.chunk_size import choose_chunk_series, describe_chunks
from kronos_tune.predict.job_state import JobProgress, JobProgressCallback, rank_summary
from kronos_tune.predict.output import Precision
from kronos_tune.predict.parts import write_part
from kronos_tune.predict.series import LoadedSeries
from kronos_tune.predict.shards import rank_job, run_ranks, world_size
from kronos_tune.predict.workdir import WorkFolder, open_work

NAME_COLUMN = "symbol"
NoteCallback = Callable[[str, str], None]


@dataclass(frozen=True)
class SlotJob:
    """One setting's predictions: the windows, how they are predicted, where the parts go."""

    slot: str
    label: str
    lookback: int
    pred_len: int
    settings: ChunkSettings
    spec: PredictorSpec | None          # Kronos (None: `forecaster` predicts, in this process)
    launch: LaunchSpec
    chunk_series: int | None            # None: chosen from the job (chunk_size.choose_chunk_series)
    identity: dict[str, Any]            # what a resumed slot must match


@dataclass
class SlotOutcome:
    predicted: int = 0        # windows predicted by this invocation
    resumed: int = 0          # windows whose chunk was finished before it
    seconds: float = 0.0      # predicting them (this invocation)
    chunks: int = 0
    chunk_series: int = 0
    ranks: dict[str, dict[str, float]] | None = None  # with --nproc: per rank, chunks, series and seconds
    elsewhere: bool = False   # --nnodes: this node's ranks are done; the node that ran rank 0 writes the origins


def window_series(windows: list[Window]) -> LoadedSeries:
    """The windows as the pipeline's compact arrays (named by symbol; stream keys from the last history bar)."""
    history_ns = np.stack([w.history_stamps for w in windows]).view(np.int64)
    future_ns = np.stack([w.future_stamps for w in windows]).view(np.int64)
    count = len(windows)
    return LoadedSeries(names=np.array([w.symbol for w in windows], dtype=object),
                        x=np.stack([w.history for w in windows]).astype(np.float32),
                        x_stamp=calendar_features_ns(history_ns), y_stamp=calendar_features_ns(future_ns),
                        future_ns=future_ns, tz=None, last_ns=history_ns[:, -1].copy(), actual_close=None,
                        no_volume=np.zeros(count, dtype=bool), precision=Precision(), name_column=NAME_COLUMN)


def window_chunks(universe: Universe, schedule: OriginSchedule, lookback: int, pred_len: int,
                  futures: dict[int, np.ndarray] | None, size: int) -> Iterator[tuple[int, list[Window]]]:
    """(index, windows) chunks of `size` windows, origin by origin; only one chunk's windows are built."""
    pending: list[Window] = []
    index = 0
    for origin in schedule.origins:
        pending.extend(origin_windows(universe, origin, lookback, pred_len,
                                      None if futures is None else futures[origin.index]))
        while len(pending) >= size:
            yield index, pending[:size]
            pending = pending[size:]
            index += 1
    if pending:
        yield index, pending


def slot_complete(run_path: Path, slot: str, schedule: OriginSchedule) -> bool:
    """Every origin's file of the slot is written and complete (a finished slot of a resumed run)."""
    return all(read_origin(origin_path(run_path, slot, o.index), len(o.members)) is not None
               for o in schedule.origins)


def forecaster_table(forecaster: Forecaster, windows: list[Window], pred_len: int) -> pd.DataFrame:
    """A part from a custom forecaster (`run_backtest(forecaster_factory=...)`): its closes as close_k."""
    output = np.asarray(forecaster(windows, pred_len), dtype=np.float64)
    closes = output.reshape(len(windows), -1)
    table = pd.DataFrame(closes, columns=[f"close_{k}" for k in range(closes.shape[1])])
    table.insert(0, NAME_COLUMN, [w.symbol for w in windows])
    return table


def predict_slot(job: SlotJob, universe: Universe, schedule: OriginSchedule, run_path: Path,
                 futures: dict[int, np.ndarray] | None, note: NoteCallback,
                 make_predictor: Callable[[], Any] | None, forecaster: Callable[[], Forecaster] | None,
                 on_progress: JobProgressCallback | None) -> SlotOutcome:
    """Predict every window of the slot that no finished chunk holds, then write the origin files."""
    outcome = SlotOutcome()
    if slot_complete(run_path, job.slot, schedule):
        leftover = WorkFolder.existing(run_path / "predictions" / job.slot)
        if leftover is not None:  # stopped after the origin files were written, before the folder went
            leftover.remove()
        outcome.resumed = schedule.predictions
        return outcome
    total = schedule.predictions
    work = _open_slot_work(job, run_path, total)
    size = outcome.chunk_series = work.chunk_series
    outcome.chunks = -(-total // size)
    note("note", f"[{job.label}] " + describe_chunks(size, total, _processes(job), job.chunk_series is None)
         .replace(" series", " symbol-origins", 1))
    finished = work.finished()
    outcome.resumed = sum(d.series for d in finished.values())
    if outcome.resumed:
        note("note", f"[{job.label}] resumed: {len(finished)} of {outcome.chunks} chunks ({outcome.resumed} of "
                     f"{total} symbol-origins) were finished before; predicting the other "
                     f"{outcome.chunks - len(finished)}")
    chunks = window_chunks(universe, schedule, job.lookback, job.pred_len, futures, size)
    started = time.perf_counter()
    if job.launch.launched and job.spec is not None:
        ran = run_ranks(job.launch, rank_job(job.spec, job.settings),
                        work, ((index, window_series(windows)) for index, windows in chunks), finished, note,
                        on_progress, command_name="backtest")
        if ran is None:  # another node ran rank 0: it writes this setting's origin files
            outcome.elsewhere = True
            outcome.seconds = time.perf_counter() - started
            return outcome
    else:
        _run_here(job, work, chunks, finished, total, outcome.resumed, make_predictor, forecaster, on_progress)
    outcome.seconds = time.perf_counter() - started
    outcome.predicted = total - outcome.resumed
    if job.launch.launched:
        outcome.ranks = rank_summary(work.finished())
    write_origin_files(work, schedule, universe, job, run_path, futures, outcome.chunks)
    work.remove()
    return outcome


def _open_slot_work(job: SlotJob, run_path: Path, total: int) -> WorkFolder:
    """The slot's work folder: reopened when it exists (its identity must match, and its chunk size holds),
    else created with the chunk size chosen now."""
    base = run_path / "predictions" / job.slot
    size = job.chunk_series or choose_chunk_series(total, _processes(job), _device(job),
                                                   job.settings.sample_count)
    existing = WorkFolder.existing(base)
    if existing is not None and job.chunk_series is None:
        size = existing.chunk_series  # the size it started with, whatever the process count is now
    return open_work(base, {**job.identity, "chunk_series": size}, resume=True, join=True)


def _processes(job: SlotJob) -> int:
    """Ranks over every node (this node's count when the node count is a MIN:MAX range)."""
    return world_size(job.launch) or job.launch.nproc


def _device(job: SlotJob) -> str:
    return "cpu" if job.spec is None else job.spec.device.split(":")[0]


def _run_here(job: SlotJob, work: WorkFolder, chunks: Iterator[tuple[int, list[Window]]], finished: dict,
              total: int, resumed: int, make_predictor: Callable[[], Any] | None,
              forecaster: Callable[[], Forecaster] | None, on_progress: JobProgressCallback | None) -> None:
    predict: Callable[[list[Window], LoadedSeries], pd.DataFrame] | None = None
    done = resumed
    started = time.perf_counter()
    for index, windows in chunks:
        if index in finished:
            continue
        if predict is None:  # the model is loaded only when something is left to predict
            if forecaster is not None:
                custom = forecaster()
                predict = lambda w, s: forecaster_table(custom, w, job.pred_len)  # noqa: E731
            else:
                predictor = make_predictor()
                predict = lambda w, s: predict_chunk(predictor, s, job.settings)[0]  # noqa: E731
            started = time.perf_counter()  # the rate is the chunks', the build is a one-time cost
        series = window_series(windows)
        chunk_started = time.perf_counter()
        table = predict(windows, series)
        write_part(work, index, table, series, 0, time.perf_counter() - chunk_started)
        done += len(windows)
        if on_progress is not None:
            seconds = time.perf_counter() - started
            on_progress(JobProgress(done, total, resumed, seconds, {0: (done - resumed, seconds)}))


def write_origin_files(work: WorkFolder, schedule: OriginSchedule, universe: Universe, job: SlotJob,
                       run_path: Path, futures: dict[int, np.ndarray] | None, chunks: int) -> None:
    """Each origin's file from the parts, in order: the point forecast is the mean of the sampled closes; with
    two or more paths the band's columns too."""
    closes = np.concatenate([_part_closes(work, k) for k in range(chunks)]) if chunks else np.zeros((0, 1))
    if len(closes) != schedule.predictions:
        raise KronosTuneError(f"backtest: the parts in {work.path} hold {len(closes)} forecasts but the schedule has "
                              f"{schedule.predictions}; remove that folder and run again")
    offset = 0
    for origin in schedule.origins:
        windows = origin_windows(universe, origin, job.lookback, job.pred_len,
                                 None if futures is None else futures[origin.index])
        rows = closes[offset:offset + len(windows)]
        offset += len(windows)
        samples = rows if rows.shape[1] >= 2 else None
        write_origin(origin_path(run_path, job.slot, origin.index),
                     origin_frame(windows, origin.timestamp, rows.mean(axis=1), samples))


def _part_closes(work: WorkFolder, chunk: int) -> np.ndarray:
    table = work.read(chunk)
    return table[[c for c in table.columns if c.startswith("close_")]].to_numpy(dtype=np.float64)


def settings_for(setting, seed: int) -> ChunkSettings:
    """The chunk settings of a backtest setting (`config.PredictionSetting`)."""
    return ChunkSettings(temperature=setting.temperature, top_k=setting.sample_top_k, top_p=setting.top_p,
                         sample_count=setting.sample_count, seed=seed, name_column=NAME_COLUMN, output=FINAL_CLOSES)


__all__ = ["SlotJob", "SlotOutcome", "predict_slot", "settings_for", "window_chunks",
           "window_series", "write_origin_files"]
