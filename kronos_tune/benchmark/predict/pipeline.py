"""What a predict trial runs: `kronos-tune predict` itself, on the series `predict --synthetic N` makes.

A trial's settings are turned into the `PredictConfig` that `kronos-tune predict --config RUN/recommended.toml`
would run (`predict_config`, from the same keys `summary.recommended_settings` writes there), so the predictor
comes from predict's own `predictor_spec` and `build_predictor`, the series from predict's own loader
(`inputs.load_inputs`: the synthetic series of the trial's seed and shape, named synthetic_0 ...), and every
pass goes through predict's chunk pipeline (`chunk_run.predict_chunk` over chunks of the trial's chunk size).
The chunks are cut in the series' generation order (predict cuts them in name order; the chunk sizes are the
same), so the first series of a larger set are the same series and give the same outputs.

Timed passes decode as predict does by default (temperature 1, top-p 0.9, each series' own random stream);
the quality check's greedy outputs come from a pass with top-k 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_tune.benchmark.events import PredictStep
from kronos_tune.benchmark.results import PredictSettings
from kronos_tune.benchmark.predict.summary import recommended_settings
from kronos_tune.predict.chunk_run import ChunkSettings
from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.config_file import PATH_KEYS
from kronos_tune.predict.series import LoadedSeries


@dataclass
class PredictMeasurement:
    status: str  # ok | oom | cancelled | failed
    reason: str | None = None
    seconds: list[float] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    metered_time_s: float | None = None
    outputs: list[pd.DataFrame] = field(default_factory=list)  # the greedy pass's (quality set)
    sampled_outputs: list[pd.DataFrame] = field(default_factory=list)  # predict's decoding (quality set)
    reference_seconds: list[float] = field(default_factory=list)  # paired: the reference's run in each round
    order: list[str] = field(default_factory=list)  # paired: which side ran first in each round
    greedy_tokens: np.ndarray | None = None  # the greedy pass's (s1, s2) ids [rows, pred_len, 2]
    other_seed_outputs: list[pd.DataFrame] = field(default_factory=list)  # sampled again on another seed


def quality_step(settings: PredictSettings, repeats: int, seconds: float) -> PredictStep:
    tokens = settings.quality_series * settings.sample_count * settings.pred_len
    return PredictStep(repeats + 2, repeats + 2, settings.quality_series, tokens, seconds, timed=False)


def predict_config(settings: PredictSettings, device: str, count: int | None = None) -> PredictConfig:
    """The `kronos-tune predict` job of a trial: its recommended keys, over `count` (default: the measured)
    synthetic series."""
    keys = {k: v for k, v in recommended_settings(asdict(settings), device).items() if v is not None}
    keys["synthetic"] = count or settings.measured_series
    if settings.inputs:  # the user's files and model (`benchmark --config`): the first `count` series of them
        keys.pop("synthetic")
        if settings.inputs.get("checkpoint"):
            keys.pop("size", None)
        keys.update({key: tuple(map(Path, value)) if key == "data" else Path(value) if key in PATH_KEYS else value
                     for key, value in settings.inputs.items() if key != "saved"})
    return PredictConfig(**keys)


def benchmark_series(settings: PredictSettings, device: str, count: int | None = None) -> LoadedSeries:
    """The first `count` (default: measured_series) series, as `kronos-tune predict` reads them (`--synthetic`, or
    the user's files in their order, from the copy the run saved of them: `inputs["saved"]`)."""
    from kronos_tune.predict.inputs import load_inputs
    from kronos_tune.predict.series import load_saved_series

    if settings.inputs and settings.inputs.get("saved"):
        series = load_saved_series(Path(settings.inputs["saved"]))
    else:
        series = load_inputs(predict_config(settings, device, count), lambda level, message: None)
    return series.take(slice(0, count or settings.measured_series)) if settings.inputs else series


def decoding(config: PredictConfig, greedy: bool = False) -> ChunkSettings:
    """The chunk settings of a pass: predict's (`greedy`: top-k 1, for the exactness and agreement check)."""
    chunk = ChunkSettings(config.temperature, config.top_k, config.top_p, config.sample_count, config.quantiles,
                          config.seed)
    return replace(chunk, top_k=1, top_p=1.0) if greedy else chunk


def chunks_of(series: LoadedSeries, size: int) -> list[LoadedSeries]:
    """The series in chunks of `size`, in their order."""
    return [series.take(slice(begin, begin + size)) for begin in range(0, len(series), max(1, size))]


def predict_pass(predictor, config: PredictConfig, series: LoadedSeries, greedy: bool = False,
                 seed: int | None = None) -> np.ndarray:
    """One pass of predict's pipeline over `series`: mean paths [N, P, 6] (volumes clipped at 0, as written);
    `seed`: the sampling streams' seed instead of the config's (the weights stay those of the config's)."""
    import torch

    from kronos_tune.predict.chunk_run import predict_chunk

    chunk = decoding(config, greedy)
    if seed is not None:
        chunk = replace(chunk, seed=seed)
    torch.manual_seed(config.seed)  # the streams make sampled paths independent of it; kept for the greedy pass
    tables = [predict_chunk(predictor, part, chunk)[0] for part in chunks_of(series, config.chunk_series or 1)]
    if predictor.device.type == "cuda":
        torch.cuda.synchronize(predictor.device)
    return values_of(tables, config.pred_len)


def greedy_pass_with_tokens(predictor, config: PredictConfig, series: LoadedSeries) -> tuple[np.ndarray, np.ndarray]:
    """The greedy pass, and the (s1, s2) ids it generated [rows, pred_len, 2] in series order."""
    tokens: list[np.ndarray] = []
    predictor.token_sink = lambda s1, s2: tokens.append(np.stack([s1.cpu().numpy(), s2.cpu().numpy()], axis=-1))
    try:
        values = predict_pass(predictor, config, series, greedy=True)
    finally:
        predictor.token_sink = None
    return values, np.concatenate(tokens).astype(np.int32)


def values_of(tables: list[pd.DataFrame], pred_len: int) -> np.ndarray:
    """Mean paths [N, P, 6] of chunk tables (parts.chunk_table's rows), in order."""
    values = np.concatenate([table[list(FEATURE_COLUMNS)].to_numpy() for table in tables])
    return values.reshape(-1, pred_len, len(FEATURE_COLUMNS))


def frames_of(values: np.ndarray, series: LoadedSeries) -> list[pd.DataFrame]:
    """One frame per series (index: its future stamps), as the quality check compares them."""
    columns = pd.Index(FEATURE_COLUMNS)
    return [pd.DataFrame(v, columns=columns, index=stamps) for v, stamps in zip(values, series.futures)]


def histories(series: LoadedSeries) -> list[pd.DataFrame]:
    """Each series' history as a frame of the feature columns (the quality check's scale and returns)."""
    columns = pd.Index(FEATURE_COLUMNS)
    return [pd.DataFrame(np.asarray(x, dtype=np.float64), columns=columns) for x in series.x]


def with_chunk(settings: PredictSettings, device: str) -> PredictSettings:
    """`settings` with the chunk size predict chooses for its series and processes when none is set."""
    if settings.chunk_series is not None:
        return settings
    from kronos_tune.predict.chunk_size import choose_chunk_series

    return replace(settings, chunk_series=choose_chunk_series(settings.measured_series, settings.devices, device,
                                                              settings.sample_count, settings.max_batch_size))
