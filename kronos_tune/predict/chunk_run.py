"""One chunk of a large job predicted, in this process or in a rank: the same code, the same rows.

Every call passes the series' stream keys (`kronos_core.predict.streams.series_key` of the name the
output writes and the last history bar) with the run's seed, so a series' sampled forecast does not depend
on the chunk, the rank or a restart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.predict.streams import series_key
from kronos_tune.predict.output import fix_volumes
from kronos_tune.predict.parts import chunk_table
from kronos_tune.predict.quantiles import sample_quantiles
from kronos_tune.predict.series import LoadedSeries


ROWS = "rows"
FINAL_CLOSES = "final-closes"


@dataclass(frozen=True)
class ChunkSettings:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.9
    sample_count: int = 1
    levels: tuple[float, ...] = ()
    seed: int = 0
    name_column: str = "series"
    output: str = ROWS  # what a chunk's part holds: ROWS (predict's table) or FINAL_CLOSES (the backtest's)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "levels": list(self.levels)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ChunkSettings:
        return cls(**{**values, "levels": tuple(values["levels"])})


def close_columns(sample_count: int) -> list[str]:
    """The columns of a FINAL_CLOSES part: each sample path's close at the end of the horizon."""
    return [f"close_{k}" for k in range(sample_count)]


def stream_arguments(names: np.ndarray, last_ns: np.ndarray, seed: int) -> dict[str, Any]:
    """keys= and seed= for the predictor: each series' own random stream."""
    keys = np.array([series_key(str(name), int(last)) for name, last in zip(names, last_ns)], dtype=np.int64)
    return {"keys": keys, "seed": seed}


def predict_chunk(predictor: KronosPredictor, series: LoadedSeries,
                  settings: ChunkSettings) -> tuple[pd.DataFrame, int]:
    """The chunk's output rows and how many negative volume/amount values were clipped to 0."""
    if settings.output == FINAL_CLOSES:
        return final_closes(predictor, series, settings), 0
    common = dict(T=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                  sample_count=settings.sample_count, **stream_arguments(series.names, series.last_ns, settings.seed))
    quantiles = None
    if settings.levels:
        values, samples = predictor.predict_arrays(series.x, series.x_stamp, series.y_stamp, mean_and_samples=True,
                                                   **common)
        quantiles = sample_quantiles(samples, settings.levels)  # per chunk: [n, Q, P, 6]
        del samples
    else:
        values = predictor.predict_arrays(series.x, series.x_stamp, series.y_stamp, mean_only=True, **common)
    negative = fix_volumes(values, series.no_volume)
    if quantiles is not None:
        negative += fix_volumes(quantiles, series.no_volume)
    return chunk_table(series, values, quantiles, settings.levels, settings.name_column), negative


def final_closes(predictor: KronosPredictor, series: LoadedSeries, settings: ChunkSettings) -> pd.DataFrame:
    """A backtest chunk's part: per window (in order) its name and every sample path's close at the end of
    the horizon (what the backtest scores)."""
    samples = predictor.predict_arrays(series.x, series.x_stamp, series.y_stamp, T=settings.temperature,
                                       top_k=settings.top_k, top_p=settings.top_p, sample_count=settings.sample_count,
                                       **stream_arguments(series.names, series.last_ns, settings.seed))
    closes = samples[:, :, -1, FEATURE_COLUMNS.index("close")].astype(np.float64)
    table = pd.DataFrame(closes, columns=close_columns(settings.sample_count))
    table.insert(0, settings.name_column, series.names.astype(str))
    return table
