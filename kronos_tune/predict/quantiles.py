"""Probabilistic forecasts: per-bar quantiles of the sample paths (`predict --quantiles 0.1,0.5,0.9`).

Pure functions, no torch: `parse_quantiles` reads the flag, `sample_quantiles` takes the quantiles of
sample paths, `quantile_column` names the output columns (`close_q10`, `close_q50`, `close_q90`; a level
that is not a whole percent keeps its decimals: `close_q2.5`). A quantile is numpy's default estimate,
linear interpolation between the sorted samples (type 7 of Hyndman & Fan, also R's and pandas' default):
with S samples, level q sits at position q * (S - 1) of the sorted values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kronos_tune.errors import KronosTuneError

SEPARATOR = "_q"
EXAMPLE = "e.g. --quantiles 0.1,0.5,0.9"


def parse_quantiles(text: str, flag: str = "--quantiles") -> tuple[float, ...]:
    """Comma-separated levels, each in (0, 1), strictly increasing; a one-line error otherwise."""
    parts = [part.strip() for part in str(text).split(",")]
    if not any(parts):
        raise KronosTuneError(f"{flag} '{text}': no level given; {EXAMPLE}")
    levels: list[float] = []
    for part in parts:
        try:
            level = float(part)
        except ValueError:
            raise KronosTuneError(f"{flag} {text}: '{part}' is not a number; give levels in (0, 1), "
                                  f"{EXAMPLE}") from None
        if not math.isfinite(level) or not 0 < level < 1:
            raise KronosTuneError(f"{flag} {text}: {part} is outside (0, 1); a quantile level is a probability "
                                  f"strictly between 0 and 1, {EXAMPLE}")
        if levels and level == levels[-1]:
            raise KronosTuneError(f"{flag} {text}: {part} is given twice; give each level once")
        if levels and level < levels[-1]:
            raise KronosTuneError(f"{flag} {text}: the levels are not in increasing order ({part} after "
                                  f"{parts[len(levels) - 1]}); write them sorted, {EXAMPLE}")
        levels.append(level)
    names = [quantile_suffix(level) for level in levels]
    if len(set(names)) != len(names):
        raise KronosTuneError(f"{flag} {text}: two levels give the same column name; keep levels at least "
                              f"1e-8 apart")
    return tuple(levels)


def quantile_suffix(level: float) -> str:
    """0.1 -> 'q10', 0.05 -> 'q05', 0.025 -> 'q2.5', 0.999 -> 'q99.9'."""
    percent = round(level * 100, 6)
    if percent == int(percent):
        return f"q{int(percent):02d}"
    return f"q{percent:g}"


def quantile_column(column: str, level: float) -> str:
    return f"{column}{SEPARATOR}{quantile_suffix(level)[1:]}"


def quantile_columns(columns: Sequence[str], levels: Sequence[float]) -> list[str]:
    """Every column's quantiles, grouped by column: open_q10, open_q90, high_q10, ..."""
    return [quantile_column(column, level) for column in columns for level in levels]


def base_column(name: str) -> str:
    """The column a quantile column belongs to ('close_q10' -> 'close'); other names unchanged."""
    head, separator, tail = name.rpartition(SEPARATOR)
    if separator and head and tail.replace(".", "", 1).isdigit():
        return head
    return name


def sample_quantiles(samples: np.ndarray, levels: Sequence[float], axis: int = 1) -> np.ndarray:
    """The quantiles of `samples` over `axis` (the sample axis), which becomes the level axis.

    samples [N, S, P, C] (series, samples, bars, columns) gives [N, Q, P, C]. Computed in float64 and
    returned in the input's floating dtype; NaN samples give NaN.
    """
    values = np.asarray(samples)
    if values.shape[axis] < 2:
        raise ValueError(f"quantiles need at least 2 samples along axis {axis}, got {values.shape[axis]}")
    result = np.quantile(values.astype(np.float64, copy=False), np.asarray(levels, dtype=np.float64), axis=axis)
    result = np.moveaxis(result, 0, axis)
    dtype = values.dtype if np.issubdtype(values.dtype, np.floating) else np.float64
    return result.astype(dtype, copy=False)
