"""What a large `predict --out` job reports: its progress while it runs and its outcome.

Shared by the in-process loop (large.py) and the ranks' parent (shards.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_tune.predict.chunk_run import ChunkSettings
from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.output import Precision
from kronos_tune.predict.series import LoadedSeries
from kronos_tune.predict.workdir import DoneChunk


@dataclass(frozen=True)
class JobProgress:
    """Where a job stands: series finished (this run and before it), and per rank (series, seconds)."""

    series_done: int
    series_total: int
    series_resumed: int
    seconds: float
    ranks: dict[int, tuple[int, float]] = field(default_factory=dict)

    @property
    def series_per_s(self) -> float:
        predicted = self.series_done - self.series_resumed
        return predicted / self.seconds if self.seconds > 0 and predicted else 0.0


JobProgressCallback = Callable[[JobProgress], None]


@dataclass
class JobOutcome:
    series: int
    chunks: int
    resumed_chunks: int
    rows: int
    predict_seconds: float
    negative: int
    work: Path
    tables: list[pd.DataFrame] | None  # the chunks' rows, kept for small runs only
    ranks: dict[str, dict[str, float]] = field(default_factory=dict)  # rank -> chunks, series, seconds
    chunk_series: int = 0
    resumed_series: int = 0  # series whose chunk was finished before this invocation
    precision: Precision = field(default_factory=Precision)
    # --holdout: per chunk (names, actual close) while predicting, then (name, predicted, actual close) per series
    scores: list = field(default_factory=list)


def chunk_settings(config: PredictConfig, name_column: str = "series") -> ChunkSettings:
    return ChunkSettings(config.temperature, config.top_k, config.top_p, config.sample_count, config.quantiles,
                         config.seed, name_column)


def holdout_actuals(series: LoadedSeries) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What --holdout scores of a chunk need besides its forecast: names, actual closes, last history closes."""
    return series.names, series.actual_close, series.x[:, -1, FEATURE_COLUMNS.index("close")].astype(float)


def rank_summary(finished: dict[int, DoneChunk]) -> dict[str, dict[str, float]]:
    """Per rank: the chunks and series it finished and its seconds predicting them (the manifest's record)."""
    ranks: dict[str, dict[str, float]] = {}
    for done in finished.values():
        item = ranks.setdefault(str(done.rank), {"chunks": 0, "series": 0, "seconds": 0.0})
        item["chunks"] += 1
        item["series"] += done.series
        item["seconds"] = round(item["seconds"] + done.seconds, 6)
    return dict(sorted(ranks.items(), key=lambda pair: int(pair[0])))
