"""The work behind `kronos-tune predict`: load series, build a predictor, predict, score, write.

No terminal output here: notes go to a callback, results come back as a
`PredictResult`; `kronos_tune.commands.predict` renders them.

Future timestamps come from `kronos_tune.predict.times`; `--checkpoint`/`--tokenizer` hub ids are resolved by
`kronos_core.hub` (one note line each, and `weights` in the JSON report); `--quantiles` come from the sample
paths (`kronos_tune.predict.quantiles`).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from kronos_core.data.kline import TIME_COLUMN
from kronos_core.hostmem import peak_rss_bytes
from kronos_core.hub import PretrainedSource, resolve_sources
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.predict.spec import build_predictor, load_weights
from kronos_tune.workloads import emulated_bf16_note
from kronos_tune.predict.config import (RANDOM_WEIGHTS_NOTE, InputSpec, PredictConfig, bf16_flag, check_config,
                                        predictor_spec, resolve_device, resolve_max_context)
from kronos_tune.predict.inputs import NoteCallback
from kronos_tune.predict.job_state import JobProgressCallback
from kronos_tune.predict.large import SMALL_RUN_SERIES, run_job
from kronos_tune.predict.output import Precision, long_frame, output_format, predictions_json
from kronos_tune.predict.shards import check_shards


@dataclass(frozen=True)
class SeriesScore:
    series: str
    mae: float
    mape: float  # percent
    persistence_mae: float = math.nan  # of a no-change forecast (the last history close) over the same bars


@dataclass
class PredictResult:
    series_names: list[str]
    frames: list[pd.DataFrame]  # per series: index = future stamps, columns = FEATURE_COLUMNS (+ quantiles)
    device: str
    max_context: int
    random_weights: bool
    seconds: float          # whole job: reading data, loading the model, predicting, writing
    predict_seconds: float  # the predict_batch call alone
    peak_rss_bytes: int
    out: Path | None
    scores: list[SeriesScore] | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)
    peak_gpu_bytes: int | None = None
    precision: Precision = field(default_factory=Precision)
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> PretrainedSource.to_dict()
    series_count: int | None = None   # a job's series (its frames are kept for small runs only)
    job: dict[str, Any] | None = None  # a --out job: chunks, resumed chunks, rows written, work folder
    resumed_series: int = 0  # series a resumed job had finished before: not predicted (or timed) now

    @property
    def series(self) -> int:
        return len(self.frames) if self.series_count is None else self.series_count

    @property
    def series_predicted(self) -> int:
        """Series predicted by this invocation (a resumed job's finished chunks are not)."""
        return self.series - self.resumed_series

    @property
    def series_per_s(self) -> float:
        return self.series_predicted / self.predict_seconds if self.predict_seconds > 0 else math.inf

    @property
    def mean_mae(self) -> float | None:
        return float(np.mean([s.mae for s in self.scores])) if self.scores else None

    @property
    def mean_mape(self) -> float | None:
        return float(np.mean([s.mape for s in self.scores])) if self.scores else None

    @property
    def mean_persistence_mae(self) -> float | None:
        return float(np.mean([s.persistence_mae for s in self.scores])) if self.scores else None

    def long_frame(self) -> pd.DataFrame:
        return long_frame(self.series_names, self.frames)

    def to_json_dict(self) -> dict[str, Any]:
        report: dict[str, Any] = {
            "series": self.series,
            "series_predicted": self.series_predicted,
            "seconds": round(self.seconds, 6),
            "predict_seconds": round(self.predict_seconds, 6),
            "series_per_s": self.series_per_s,
            "out": None if self.out is None else str(self.out),
            "device": self.device,
            "peak_rss_bytes": self.peak_rss_bytes,
            "max_context": self.max_context,
            "random_weights": self.random_weights,
        }
        if self.peak_gpu_bytes is not None:
            report["peak_gpu_bytes"] = self.peak_gpu_bytes
        if self.weights:
            report["weights"] = self.weights
        if self.scores is not None:
            report["mae"] = self.mean_mae
            report["mape"] = self.mean_mape
            report["persistence_mae"] = self.mean_persistence_mae
            report["per_series"] = [{"series": s.series, "mae": s.mae, "mape": s.mape,
                                     "persistence_mae": s.persistence_mae} for s in self.scores]
        if self.job is not None:
            report["job"] = self.job
        report["notes"] = [f"{level}: {message}" for level, message in self.notes]
        embedded = len(self.frames) == self.series
        report["predictions_embedded"] = embedded
        if embedded:
            report["predictions"] = predictions_json(self.series_names, self.frames, self.precision)
        else:
            report["predictions_note"] = (f"{self.series} series: the forecasts are in --out only (--json embeds "
                                          f"them for runs of up to {SMALL_RUN_SERIES} series)")
        return report


# Loading -------------------------------------------------------------------------------------


def resolve_weights(config: InputSpec, on_note: NoteCallback) -> dict[str, PretrainedSource]:
    """The folders of --checkpoint/--tokenizer (hub ids: from the cache, or downloaded unless offline); a note
    line for each hub id says which commit and snapshot folder it resolved to."""
    sources = resolve_sources({"checkpoint": config.checkpoint, "tokenizer": config.tokenizer},
                              offline=True if config.offline else None)
    for label, source in sources.items():
        if source.from_hub:
            on_note("note", source.describe(label))
    return sources


def load_predictor(config: PredictConfig, on_note: NoteCallback,
                   weights: dict[str, PretrainedSource] | None = None) -> KronosPredictor:
    """Random-init weights for --size, or the --checkpoint/--tokenizer folders or hub ids (errors name file and
    key); `weights`: those already resolved (`resolve_weights`)."""
    if weights is None:
        weights = resolve_weights(config, on_note)
    spec = predictor_spec(config, weights)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_weights(spec)
    for warning in caught:
        on_note("warning", str(warning.message))
    return build_predictor(spec, loaded)


# Scoring and output --------------------------------------------------------------------------


def persistence_mae(last_close: float | np.ndarray, actual_close: np.ndarray) -> np.ndarray | float:
    """MAE of the close of a no-change forecast over a horizon: mean |actual - last close| per series.

    `last_close` [N] (or a number) and `actual_close` [N, P] (or [P]); the shape of predict --holdout's scores."""
    actual = np.asarray(actual_close, dtype=np.float64)
    last = np.asarray(last_close, dtype=np.float64)
    error = np.abs(actual - last[..., None])
    mean = error.mean(axis=-1)
    return float(mean) if mean.ndim == 0 else mean


def score(name: str, predicted_close: np.ndarray, actual_close: np.ndarray,
          last_close: float = math.nan) -> SeriesScore:
    """MAE and MAPE (percent) of the predicted close against the actual close (prices are > 0), and the MAE of
    persistence (no change from `last_close`, the history's last close) over the same bars."""
    error = np.abs(np.asarray(predicted_close, dtype=np.float64) - actual_close)
    return SeriesScore(name, float(error.mean()), float((error / np.abs(actual_close)).mean() * 100.0),
                       persistence_mae(last_close, actual_close))


# The job -------------------------------------------------------------------------------------


def run_predict(config: PredictConfig, on_note: NoteCallback | None = None,
                on_job_progress: JobProgressCallback | None = None) -> PredictResult:
    """Check the flags, read the data, load the predictor, predict the chunks, score (--holdout) and write
    --out. `on_job_progress` follows the chunks (job_state.JobProgress)."""
    started = time.perf_counter()
    notes: list[tuple[str, str]] = []

    def note(level: str, message: str) -> None:
        notes.append((level, message))
        if on_note is not None:
            on_note(level, message)

    check_config(config)
    max_context = resolve_max_context(config)
    if config.size is not None and config.checkpoint is None:
        note("warning", RANDOM_WEIGHTS_NOTE)
    emulated = emulated_bf16_note(bf16_flag(config), resolve_device(config.device))
    if emulated:
        note("note", emulated)
    if config.lookback > max_context:
        note("warning", f"--lookback {config.lookback} is longer than max_context {max_context}: every row sets "
                        f"the normalization, but the predictor only sees the last {max_context} tokens")
    elif config.lookback + config.pred_len > max_context:
        after = ("re-runs the whole window for each step after that (one job went from 4 s to 23 s past that "
                 "point: docs/predict.md; --window-mode shift keeps the cache, approximately)"
                 if config.window_mode == "refill"
                 else "shifts its cache (approximate)")
        note("note", f"--lookback {config.lookback} + --pred-len {config.pred_len} > max_context {max_context}: "
                     f"the window slides after {max_context - config.lookback} steps and {after}")

    weights = resolve_weights(config, note)  # before the data: a hub id that is not there fails at once
    return _run_job(config, weights, note, on_job_progress, started, notes, max_context)


def _run_job(config: PredictConfig, weights: dict[str, PretrainedSource], note: NoteCallback,
             on_progress: JobProgressCallback | None, started: float, notes: list[tuple[str, str]],
             max_context: int) -> PredictResult:
    """Every run is a job of chunks (large.py): kept as they finish in the work folder beside --out
    (resumable), in a temporary one for ranks, or in memory for a run in this process without --out."""
    device = resolve_device(config.device)
    sharded = config.launch.launched
    if sharded:
        check_shards(config.launch, "cuda" if device.startswith("cuda") else "cpu")
    if config.elsewhere:
        # Loaded here too, on the CPU, so a bad checkpoint fails in one line before any rank or actor starts.
        load_predictor(replace(config, device="cpu", amp="none", cuda_graphs=None), note, weights)
    holder: list[KronosPredictor] = []

    def load() -> KronosPredictor:
        holder.append(load_predictor(config, note, weights))
        if holder[0].device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(holder[0].device)
        return holder[0]

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"a history of \d+ rows is longer than max_context")
        outcome = run_job(config, weights, note, load, on_progress)
    predictor = holder[0] if holder else None
    peak_gpu = (int(torch.cuda.max_memory_allocated(predictor.device))
                if predictor is not None and predictor.device.type == "cuda" else None)
    common = dict(max_context=max_context, random_weights=config.checkpoint is None, notes=notes,
                  peak_gpu_bytes=peak_gpu, weights={label: source.to_dict() for label, source in weights.items()},
                  device=(f"{device.split(':')[0]} x {config.launch.nproc} processes per node" if sharded
                          else f"{device.split(':')[0]}, Ray actors" if config.runner == "ray"
                          else str(predictor.device if predictor is not None else device)))
    if outcome is None:  # another node writes the output
        return PredictResult(series_names=[], frames=[], seconds=time.perf_counter() - started,
                             predict_seconds=0.0, peak_rss_bytes=peak_rss_bytes(), out=None, **common)
    names: list[str] = []
    frames: list[pd.DataFrame] = []
    for table in outcome.tables or ():
        chunk_names, chunk_frames = table_frames(table, config.pred_len)
        names += chunk_names
        frames += chunk_frames
    scores = [score(str(name), predicted, actual, last) for name, predicted, actual, last in outcome.scores] \
        if config.holdout else None
    if config.out is not None and output_format(config.out) == "csv":
        note("note", f"{config.out} rounds {outcome.precision.describe()} (the input's precision)")
    job = {"chunks": outcome.chunks, "chunk_series": outcome.chunk_series, "resumed_chunks": outcome.resumed_chunks,
           "rows": outcome.rows, "work": str(outcome.work), "ranks": outcome.ranks}
    return PredictResult(series_names=names, frames=frames, seconds=time.perf_counter() - started,
                         predict_seconds=outcome.predict_seconds, peak_rss_bytes=peak_rss_bytes(), out=config.out,
                         scores=scores, precision=outcome.precision, series_count=outcome.series, job=job,
                         resumed_series=outcome.resumed_series, **common)


def table_frames(table: pd.DataFrame, pred_len: int) -> tuple[list[str], list[pd.DataFrame]]:
    """Per series of a chunk's rows (parts.chunk_table): its name and a frame indexed by its future stamps."""
    name_column = table.columns[0]
    names = [str(name) for name in table[name_column].to_numpy()[::pred_len]]
    body = table.drop(columns=[name_column]).set_index(TIME_COLUMN)
    return names, [body.iloc[k * pred_len:(k + 1) * pred_len] for k in range(len(names))]


__all__ = [
    "RANDOM_WEIGHTS_NOTE", "PredictConfig", "PredictResult", "SeriesScore",
    "check_config", "load_predictor", "peak_rss_bytes", "resolve_device", "resolve_max_context", "resolve_weights",
    "run_predict", "score",
]
