"""The work behind `kronos-tune predict`: load series, build a predictor, predict, score, write.

No terminal output here: notes go to a callback, results come back as a
`PredictResult`; `kronos_tune.commands.predict` renders them.

Future timestamps come from `kronos_tune.future_times`.
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

from kronos_core.data import FEATURE_COLUMNS
from kronos_core.hostmem import peak_rss_bytes
from kronos_core.launch import LaunchSpec
from kronos_core.model import Kronos
from kronos_core.predict_sharded import ShardJob
from kronos_core.predictor import KronosPredictor, ProgressCallback, default_device
from kronos_core.sizes import build_model, build_tokenizer, size_spec
from kronos_core.tokenizer import KronosTokenizer
from kronos_tune.calendars import exchange_calendar
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict_inputs import NoteCallback, load_inputs
from kronos_tune.predict_output import (
    Precision,
    check_output_path,
    fix_volumes,
    long_frame,
    output_format,
    predictions_json,
    write_table,
)
from kronos_tune.job_inputs import JobInputs, check_job_inputs
from kronos_tune.predict_shards import check_shards, run_sharded

DEVICES = ("auto", "cpu", "cuda")
AMP_CHOICES = ("none", "bf16", "fp16")
DEFAULT_MAX_CONTEXT = 512
RANDOM_WEIGHTS_NOTE = "random weights: predictions are meaningless, for timing only"


@dataclass(frozen=True)
class PredictConfig(JobInputs):
    """Everything `kronos-tune predict` was asked to do; see the command's --help for each field."""

    sample_count: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.9
    out: Path | None = None
    device: str = "auto"
    amp: str = "none"
    max_batch_size: int | None = None
    max_context: int | None = None
    seed: int = 0
    holdout: bool = False
    symbol_column: str | None = None  # --data files are panels: one long table, this column names each series
    skip_short: bool = False          # panels: leave out symbols with too few rows instead of stopping
    window_mode: str = "refill"
    nproc: int = 1
    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_backend: str | None = None
    calendar: str | None = None  # exchange calendar for future stamps (e.g. XSHG); None: the series' own grid

    @property
    def launch(self) -> LaunchSpec:
        return LaunchSpec(self.nproc, self.nnodes, self.node_rank, self.rdzv_endpoint, self.rdzv_id,
                          self.rdzv_backend)


@dataclass(frozen=True)
class SeriesScore:
    series: str
    mae: float
    mape: float  # percent


@dataclass
class PredictResult:
    series_names: list[str]
    frames: list[pd.DataFrame]  # per series: index = future stamps, columns = FEATURE_COLUMNS
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

    @property
    def series_per_s(self) -> float:
        return len(self.frames) / self.predict_seconds if self.predict_seconds > 0 else math.inf

    @property
    def mean_mae(self) -> float | None:
        return float(np.mean([s.mae for s in self.scores])) if self.scores else None

    @property
    def mean_mape(self) -> float | None:
        return float(np.mean([s.mape for s in self.scores])) if self.scores else None

    def long_frame(self) -> pd.DataFrame:
        return long_frame(self.series_names, self.frames)

    def to_json_dict(self) -> dict[str, Any]:
        report: dict[str, Any] = {
            "series": len(self.frames),
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
        if self.scores is not None:
            report["mae"] = self.mean_mae
            report["mape"] = self.mean_mape
            report["per_series"] = [{"series": s.series, "mae": s.mae, "mape": s.mape} for s in self.scores]
        report["notes"] = [f"{level}: {message}" for level, message in self.notes]
        report["predictions"] = predictions_json(self.series_names, self.frames, self.precision)
        return report


# Checks before any work ----------------------------------------------------------------------


def check_config(config: PredictConfig) -> None:
    """Every flag that can be judged without reading data or weights."""
    check_job_inputs(config)
    if config.synthetic is not None and config.synthetic < 1:
        raise KronosTuneError(f"--synthetic {config.synthetic}: ask for at least 1 series")
    if config.sample_count < 1:
        raise KronosTuneError(f"--sample-count {config.sample_count}: must be at least 1")
    if config.max_batch_size is not None and config.max_batch_size < 1:
        raise KronosTuneError(f"--max-batch-size {config.max_batch_size}: must be at least 1")
    if config.max_context is not None and config.max_context < 1:
        raise KronosTuneError(f"--max-context {config.max_context}: must be at least 1")
    if not config.temperature > 0 or not math.isfinite(config.temperature):
        raise KronosTuneError(f"--T {config.temperature}: the temperature must be a number > 0")
    if config.top_k < 0:
        raise KronosTuneError(f"--top-k {config.top_k}: must be >= 0 (0 = off, 1 = greedy)")
    if not 0 < config.top_p <= 1:
        raise KronosTuneError(f"--top-p {config.top_p}: must be in (0, 1]")
    if config.device not in DEVICES:
        raise KronosTuneError(f"--device {config.device}: choose one of {', '.join(DEVICES)}")
    if config.amp not in AMP_CHOICES:
        raise KronosTuneError(f"--amp {config.amp}: choose one of {', '.join(AMP_CHOICES)}")
    if config.device == "cuda" and not torch.cuda.is_available():
        raise KronosTuneError("--device cuda: no CUDA device is visible to torch; use --device cpu or auto")
    if config.amp == "fp16" and resolve_device(config.device) == "cpu":
        raise KronosTuneError("--amp fp16 needs a CUDA device; use --amp bf16 or none on CPU")
    if config.window_mode not in ("refill", "shift"):
        raise KronosTuneError(f"--window-mode {config.window_mode}: choose refill (exact) or shift (approximate)")
    if config.nproc < 1:
        raise KronosTuneError(f"--nproc {config.nproc}: must be at least 1")
    if config.symbol_column is not None and not config.data:
        raise KronosTuneError("--symbol-column reads panel files; give them with --data")
    if config.skip_short and config.symbol_column is None:
        raise KronosTuneError("--skip-short applies to panels; add --symbol-column NAME")
    if config.out is not None:
        check_output_path(config.out)
    if config.calendar is not None:
        exchange_calendar(config.calendar)  # a missing package or an unknown name fails before any data is read


def resolve_device(device: str) -> str:
    if device == "auto":
        return default_device()
    return "cuda:0" if device == "cuda" else device


def resolve_max_context(config: PredictConfig) -> int:
    if config.max_context is not None:
        return config.max_context
    return size_spec(config.size).context if config.size is not None else DEFAULT_MAX_CONTEXT


# Loading -------------------------------------------------------------------------------------


def load_predictor(config: PredictConfig, on_note: NoteCallback) -> KronosPredictor:
    """Random-init weights for --size, or the --checkpoint/--tokenizer folders (errors name file and key)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if config.checkpoint is not None:
            model = Kronos.from_pretrained(config.checkpoint)
        else:
            model = build_model(config.size, seed=config.seed)
        if config.tokenizer is not None:
            tokenizer = KronosTokenizer.from_pretrained(config.tokenizer)
        else:
            tokenizer = build_tokenizer(config.size, seed=config.seed)
    for warning in caught:
        on_note("warning", str(warning.message))
    amp = None if config.amp == "none" else config.amp
    return KronosPredictor(model, tokenizer, device=resolve_device(config.device),
                           max_context=resolve_max_context(config), amp=amp,
                           max_batch_size=config.max_batch_size, window_mode=config.window_mode)


# Scoring and output --------------------------------------------------------------------------


def score(name: str, predicted_close: np.ndarray, actual_close: np.ndarray) -> SeriesScore:
    """MAE and MAPE (percent) of the predicted close against the actual close (prices are > 0)."""
    error = np.abs(np.asarray(predicted_close, dtype=np.float64) - actual_close)
    return SeriesScore(name, float(error.mean()), float((error / np.abs(actual_close)).mean() * 100.0))


# The job -------------------------------------------------------------------------------------


def _shard_job(config: PredictConfig, device: str) -> ShardJob:
    return ShardJob(size=config.size, checkpoint=None if config.checkpoint is None else str(config.checkpoint),
                    tokenizer=None if config.tokenizer is None else str(config.tokenizer), seed=config.seed,
                    device="cuda" if device.startswith("cuda") else "cpu",
                    amp=None if config.amp == "none" else config.amp, max_context=resolve_max_context(config),
                    window_mode=config.window_mode, max_batch_size=config.max_batch_size,
                    temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                    sample_count=config.sample_count)


def run_predict(config: PredictConfig, on_note: NoteCallback | None = None,
                on_progress: ProgressCallback | None = None) -> PredictResult:
    """Check the flags, read the data, load the predictor, predict, score (--holdout) and write --out.
    `on_progress` follows the in-process prediction (kronos_core.predictor.PredictProgress)."""
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
    if config.lookback > max_context:
        note("warning", f"--lookback {config.lookback} is longer than max_context {max_context}: every row sets "
                        f"the normalization, but the predictor only sees the last {max_context} tokens")
    elif config.lookback + config.pred_len > max_context:
        after = ("re-fills its cache each step after that (slower per step)" if config.window_mode == "refill"
                 else "shifts its cache (approximate)")
        note("note", f"--lookback {config.lookback} + --pred-len {config.pred_len} > max_context {max_context}: "
                     f"the window slides after {max_context - config.lookback} steps and {after}")

    inputs = load_inputs(config, note)
    device = resolve_device(config.device)
    sharded = config.launch.launched
    if sharded:
        check_shards(config.launch, len(inputs.names), "cuda" if device.startswith("cuda") else "cpu")
    # Sharded runs load the weights here too, on the CPU, so a bad checkpoint fails in one line before any rank.
    predictor = load_predictor(replace(config, device="cpu", amp="none") if sharded else config, note)
    if predictor.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(predictor.device)

    torch.manual_seed(config.seed)
    predict_started = time.perf_counter()
    with warnings.catch_warnings():
        # The long-history warning is already a note above.
        warnings.filterwarnings("ignore", message=r"a history of \d+ rows is longer than max_context")
        if sharded:
            values = run_sharded(config.launch, _shard_job(config, device), inputs.x, inputs.x_stamp,
                                 inputs.y_stamp, note)
        else:
            values = predictor.predict_arrays(inputs.x, inputs.x_stamp, inputs.y_stamp, T=config.temperature,
                                              top_k=config.top_k, top_p=config.top_p,
                                              sample_count=config.sample_count, on_progress=on_progress,
                                              mean_only=True)
    predict_seconds = time.perf_counter() - predict_started
    peak_gpu = int(torch.cuda.max_memory_allocated(predictor.device)) if predictor.device.type == "cuda" else None
    precision = inputs.precision
    frames: list[pd.DataFrame] = []
    names = inputs.names if values is not None else []
    if values is not None:
        negative = fix_volumes(values, inputs.no_volume)
        if negative:
            note("note", f"{negative} predicted volume/amount values were below 0 and are written as 0")
        columns = pd.Index(FEATURE_COLUMNS)
        frames = [pd.DataFrame(v, columns=columns, index=index) for v, index in zip(values, inputs.futures)]

    scores = None
    if config.holdout and frames:
        scores = [score(name, frame["close"].to_numpy(), actual)
                  for name, frame, actual in zip(names, frames, inputs.actual_close)]
    if config.out is not None and frames:
        write_table(long_frame(names, frames), config.out, precision)
        if output_format(config.out) == "csv":
            note("note", f"{config.out} rounds {precision.describe()} (the input's precision)")
    return PredictResult(
        series_names=names, frames=frames, max_context=max_context,
        device=(f"{device.split(':')[0]} x {config.launch.nproc} processes per node" if sharded
                else str(predictor.device)),
        random_weights=config.checkpoint is None, seconds=time.perf_counter() - started,
        predict_seconds=predict_seconds, peak_rss_bytes=peak_rss_bytes(), out=config.out if frames else None,
        scores=scores, notes=notes, peak_gpu_bytes=peak_gpu, precision=precision,
    )


__all__ = [
    "RANDOM_WEIGHTS_NOTE", "PredictConfig", "PredictResult", "SeriesScore",
    "check_config", "load_predictor", "peak_rss_bytes", "resolve_device", "resolve_max_context", "run_predict", "score",
]
