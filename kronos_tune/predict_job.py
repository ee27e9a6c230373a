"""The work behind `kronos-tune predict`: load series, build a predictor, predict, score, write.

No terminal output here: notes go to a callback, results come back as a
`PredictResult`; `kronos_tune.commands.predict` renders them.

Future timestamps come from `kronos_tune.future_times`.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil
import torch

from kronos_core.data import FEATURE_COLUMNS, TIME_COLUMN, find_data_files, read_kline
from kronos_core.errors import KronosError
from kronos_core.model import Kronos
from kronos_core.predictor import KronosPredictor, default_device
from kronos_core.sizes import build_model, build_tokenizer, size_spec
from kronos_core.synthetic import synthetic_series
from kronos_core.tokenizer import KronosTokenizer
from kronos_tune.errors import KronosTuneError
from kronos_tune.future_times import future_timestamps

OUTPUT_FORMATS = {".csv": "csv", ".parquet": "parquet"}
DEVICES = ("auto", "cpu", "cuda")
AMP_CHOICES = ("none", "bf16", "fp16")
DEFAULT_MAX_CONTEXT = 512
DEFAULT_SYNTHETIC_SERIES = 4
RANDOM_WEIGHTS_NOTE = "random weights: predictions are meaningless, for timing only"
OUTPUT_COLUMNS = ("series", TIME_COLUMN, *FEATURE_COLUMNS)

# Called as on_note(level, message) with level "note" or "warning", as soon as a note is known.
NoteCallback = Callable[[str, str], None]


@dataclass(frozen=True)
class PredictConfig:
    """Everything `kronos-tune predict` was asked to do; see the command's --help for each field."""

    lookback: int
    pred_len: int
    size: str | None = None
    checkpoint: Path | None = None
    tokenizer: Path | None = None
    data: tuple[Path, ...] = ()
    synthetic: int | None = None
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
    progress: bool = True


@dataclass
class SeriesInput:
    """One series ready for the predictor: its history, future stamps and (holdout) actual closes."""

    name: str
    history: pd.DataFrame            # TIME_COLUMN + FEATURE_COLUMNS, `lookback` rows
    future: pd.DatetimeIndex         # pred_len stamps
    actual_close: np.ndarray | None  # holdout only


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
        return report


# Checks before any work ----------------------------------------------------------------------


def output_format(path: Path) -> str:
    """'csv' or 'parquet' from the suffix; anything else is a user error."""
    fmt = OUTPUT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise KronosTuneError(f"--out {path}: unknown suffix '{path.suffix}'; use a .csv or .parquet file name")
    return fmt


def check_output_path(path: Path) -> str:
    """Suffix, folder and write permission of --out, checked by creating (and removing) a temp file there."""
    fmt = output_format(path)
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise KronosTuneError(f"--out {path}: writing Parquet needs pyarrow; pip install pyarrow "
                                  "or use a .csv name") from None
    if path.is_dir():
        raise KronosTuneError(f"--out {path} is a folder; give a file name ending in .csv or .parquet")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise KronosTuneError(f"--out {path}: {folder} {what}; create the folder or choose another path")
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".probe")
    except OSError as error:
        raise KronosTuneError(f"--out {path}: cannot write in {folder} ({error.strerror or error}); "
                              "choose a writable folder") from None
    os.close(handle)
    os.unlink(probe)
    return fmt


def check_config(config: PredictConfig) -> None:
    """Every flag that can be judged without reading data or weights."""
    if (config.size is None) == (config.checkpoint is None):
        raise KronosTuneError("give exactly one of --checkpoint DIR (with --tokenizer DIR) or --size NAME")
    if config.checkpoint is not None and config.tokenizer is None:
        raise KronosTuneError(f"--checkpoint {config.checkpoint} needs --tokenizer DIR too: the tokenizer is a "
                              "separate checkpoint folder")
    if config.size is not None:
        try:
            size_spec(config.size)
        except KronosError as error:
            raise KronosTuneError(f"--size: {error}") from None
    if config.data and config.synthetic is not None:
        raise KronosTuneError("give either --data or --synthetic N, not both")
    if config.synthetic is not None and config.synthetic < 1:
        raise KronosTuneError(f"--synthetic {config.synthetic}: ask for at least 1 series")
    for flag, value in (("--lookback", config.lookback), ("--pred-len", config.pred_len),
                        ("--sample-count", config.sample_count)):
        if value < 1:
            raise KronosTuneError(f"{flag} {value}: must be at least 1")
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
    if config.out is not None:
        check_output_path(config.out)


def resolve_device(device: str) -> str:
    if device == "auto":
        return default_device()
    return "cuda:0" if device == "cuda" else device


def resolve_max_context(config: PredictConfig) -> int:
    if config.max_context is not None:
        return config.max_context
    return size_spec(config.size).context if config.size is not None else DEFAULT_MAX_CONTEXT


# Loading -------------------------------------------------------------------------------------


def _unique_names(paths: list[Path]) -> list[str]:
    """File stems, or the path (without suffix) where two files share a stem."""
    stems = [p.stem for p in paths]
    return [stem if stems.count(stem) == 1 else str(p.with_suffix("")) for stem, p in zip(stems, paths)]


def _series_input(name: str, frame: pd.DataFrame, config: PredictConfig, where: str) -> SeriesInput:
    rows = len(frame)
    if config.holdout:
        need = config.lookback + config.pred_len
        if rows < need:
            raise KronosTuneError(f"{where} has {rows} rows; --holdout needs --lookback {config.lookback} + "
                                  f"--pred-len {config.pred_len} = {need}; use a shorter lookback or more data")
        history = frame.iloc[rows - need:rows - config.pred_len].reset_index(drop=True)
        tail = frame.iloc[rows - config.pred_len:]
        future = pd.DatetimeIndex(tail[TIME_COLUMN], name=TIME_COLUMN)
        return SeriesInput(name, history, future, tail["close"].to_numpy(dtype=np.float64))
    if rows < config.lookback:
        raise KronosTuneError(f"{where} has {rows} rows, fewer than --lookback {config.lookback}; "
                              "use a shorter lookback or more data")
    history = frame.iloc[rows - config.lookback:].reset_index(drop=True)
    # The whole file defines the bar grid; the history alone may be too short to show it.
    future = future_timestamps(frame[TIME_COLUMN], config.pred_len, where)
    return SeriesInput(name, history, future, None)


def load_series(config: PredictConfig, on_note: NoteCallback) -> list[SeriesInput]:
    """Read every --data file (or make --synthetic series) into predictor inputs; errors name the file."""
    if config.data:
        paths = find_data_files(list(config.data))
        names = _unique_names(paths)
        inputs = []
        for name, path in zip(names, paths):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                frame = read_kline(path)
            for warning in caught:
                on_note("warning", str(warning.message))
            inputs.append(_series_input(name, frame, config, str(path)))
        return inputs
    count = config.synthetic
    if count is None:
        count = DEFAULT_SYNTHETIC_SERIES
        on_note("note", f"no --data given: predicting {count} synthetic series (--synthetic N to change)")
    rows = config.lookback + config.pred_len if config.holdout else config.lookback
    frames = synthetic_series(count, n_rows=max(rows, 2), seed=config.seed)
    return [_series_input(f"synthetic_{i}", frame, config, f"synthetic_{i}") for i, frame in enumerate(frames)]


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
                           max_batch_size=config.max_batch_size)


# Scoring and output --------------------------------------------------------------------------


def score(name: str, predicted_close: np.ndarray, actual_close: np.ndarray) -> SeriesScore:
    """MAE and MAPE (percent) of the predicted close against the actual close (prices are > 0)."""
    error = np.abs(np.asarray(predicted_close, dtype=np.float64) - actual_close)
    return SeriesScore(name, float(error.mean()), float((error / np.abs(actual_close)).mean() * 100.0))


def long_frame(names: list[str], frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per (series, timestamp): series, timestamps, open ... amount."""
    parts = []
    for name, frame in zip(names, frames):
        part = frame.reset_index(names=TIME_COLUMN)[[TIME_COLUMN, *FEATURE_COLUMNS]]
        part.insert(0, "series", name)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)[list(OUTPUT_COLUMNS)]


def write_table(table: pd.DataFrame, path: Path) -> None:
    """CSV or Parquet by suffix, atomically: a temp file in the same folder, then os.replace."""
    fmt = output_format(path)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        if fmt == "csv":
            table.to_csv(temp, index=False)
        else:
            table.to_parquet(temp, index=False)
        os.replace(temp, path)
    except (OSError, ValueError, ImportError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise KronosTuneError(f"--out {path}: writing failed ({reason}); check the folder and free space") from None
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def peak_rss_bytes() -> int:
    """This process's peak resident memory: psutil's peak where the OS reports one, else getrusage's maximum."""
    info = psutil.Process().memory_info()
    peak = int(getattr(info, "peak_wset", 0) or 0)  # Windows
    try:
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = max(peak, int(maxrss) * (1 if sys.platform == "darwin" else 1024))
    except (ImportError, OSError):
        pass
    return max(peak, int(info.rss))


# The job -------------------------------------------------------------------------------------


def run_predict(config: PredictConfig, on_note: NoteCallback | None = None) -> PredictResult:
    """Check the flags, read the data, load the predictor, predict, score (--holdout) and write --out."""
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
        note("note", f"--lookback {config.lookback} + --pred-len {config.pred_len} > max_context {max_context}: "
                     f"the window slides after {max_context - config.lookback} steps and re-fills its cache "
                     "each step after that (slower per step)")

    inputs = load_series(config, note)
    predictor = load_predictor(config, note)
    device = str(predictor.device)
    if predictor.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(predictor.device)

    torch.manual_seed(config.seed)
    predict_started = time.perf_counter()
    with warnings.catch_warnings():
        # The long-history warning is already a note above.
        warnings.filterwarnings("ignore", message=r"a history of \d+ rows is longer than max_context")
        frames = predictor.predict_batch(
            [item.history[list(FEATURE_COLUMNS)] for item in inputs],
            [item.history[TIME_COLUMN] for item in inputs],
            [item.future for item in inputs],
            config.pred_len, T=config.temperature, top_k=config.top_k, top_p=config.top_p,
            sample_count=config.sample_count, verbose=config.progress,
        )
    predict_seconds = time.perf_counter() - predict_started
    peak_gpu = int(torch.cuda.max_memory_allocated(predictor.device)) if predictor.device.type == "cuda" else None

    names = [item.name for item in inputs]
    scores = None
    if config.holdout:
        scores = [score(item.name, frame["close"].to_numpy(), item.actual_close)
                  for item, frame in zip(inputs, frames)]
    if config.out is not None:
        write_table(long_frame(names, frames), config.out)
    return PredictResult(
        series_names=names, frames=frames, device=device, max_context=max_context,
        random_weights=config.checkpoint is None, seconds=time.perf_counter() - started,
        predict_seconds=predict_seconds, peak_rss_bytes=peak_rss_bytes(), out=config.out, scores=scores,
        notes=notes, peak_gpu_bytes=peak_gpu,
    )


__all__ = [
    "PredictConfig", "PredictResult", "SeriesInput", "SeriesScore", "check_config",
    "check_output_path", "future_timestamps", "infer_interval", "load_predictor", "load_series", "long_frame",
    "output_format", "peak_rss_bytes", "run_predict", "score", "session_grid", "write_table",
]
