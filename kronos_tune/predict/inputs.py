"""Inputs of `kronos-tune predict`: the series the one loader reads (kronos_core.data.series), as windows.

`read_series` reads --data (per-series files, or panels with --symbol-column; sorted Parquet panels stream a
batch of symbols at a time) or makes --synthetic series. `windows` turns a batch of them into one `LoadedSeries`
of arrays that the predictor (or the ranks of a sharded run) consume directly: each series' last `lookback`
rows (--holdout: the `lookback` rows before its last `pred_len`) and its future stamps, which continue its own
bar grid (or follow --calendar) and are computed once per distinct grid. `load_inputs` does it all at once.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from kronos_core.data.kline import FEATURE_COLUMNS, calendar_features_ns, wall_clock_ns
from kronos_core.data.series import KlineSeries, NoteCallback, SeriesSource, load_series
from kronos_core.errors import KronosError
from kronos_core.predict.panel import check_steps
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.output import input_precision
from kronos_tune.predict.series import LoadedSeries, concat
from kronos_tune.predict.times import future_timestamps

DEFAULT_SYNTHETIC_SERIES = 4


def read_series(config: PredictConfig, on_note: NoteCallback) -> SeriesSource:
    """--data or --synthetic series (read whole unless a sorted Parquet panel streams); errors name the file."""
    try:
        if config.data:
            return load_series(config.data, on_note, symbol_column=config.symbol_column,
                               date_format=config.date_format)
        count = config.synthetic
        if count is None:
            count = DEFAULT_SYNTHETIC_SERIES
            on_note("note", f"no --data given: predicting {count} synthetic series (--synthetic N to change)")
        rows = config.lookback + config.pred_len if config.holdout else config.lookback
        return load_series(synthetic=count, rows=max(rows, 2), seed=config.seed)
    except KronosError as error:
        raise KronosTuneError(str(error)) from None


def load_inputs(config: PredictConfig, on_note: NoteCallback) -> LoadedSeries:
    """Every series of --data or --synthetic as one LoadedSeries, in reading order."""
    return concat(list(input_batches(read_series(config, on_note), config, on_note)))


def input_batches(source: SeriesSource, config: PredictConfig, on_note: NoteCallback) -> Iterator[LoadedSeries]:
    """`windows` of each batch of `source`; after the last, the notes on the columns the input lacked."""
    lacked: set[str] = set()
    no_volume = count = 0
    try:
        for batch in source.batches:
            series = windows(batch, config, source, on_note)
            if series is None:
                continue
            lacked.update(series.lacked)
            no_volume, count = no_volume + int(series.no_volume.sum()), count + len(series)
            yield series
    except KronosError as error:
        raise KronosTuneError(str(error)) from None
    if count == 0:
        raise KronosTuneError(f"{source.source}: no symbol has {config.lookback} rows; use a shorter --lookback")
    say_filled(np.arange(count) < no_volume, tuple(c for c in ("volume", "amount") if c in lacked), on_note)


def say_skipped(skipped: list[tuple[str, str]], what: str, on_note: NoteCallback) -> None:
    """The short-series rule (the backtest's and training's too): a series too short for the window is left out,
    and one warning line says how many, the first one's rows and which."""
    if not skipped:
        return
    listed = ", ".join(name for name, _ in skipped[:5])
    more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    on_note("warning", f"skipped {len(skipped)} {what} with too few rows ({skipped[0][1]} for {skipped[0][0]}): "
                       f"{listed}{more}")


def shorter_window(config: PredictConfig) -> str:
    """How a user fits the windows into shorter series, in the command's own flags."""
    return "use a shorter --lookback" + (" (or --pred-len: --holdout holds out the last --pred-len rows)"
                                         if config.holdout else "")


def _none_long_enough(batch: list[KlineSeries], config: PredictConfig, source: SeriesSource, need: int) -> str:
    longest = max((len(series) for series in batch), default=0)
    if source.name_column is not None:
        return f"{source.source}: no symbol has {need} rows (the longest has {longest}); {shorter_window(config)}"
    wanted = (f"--lookback {config.lookback} + --pred-len {config.pred_len} = {need}" if config.holdout
              else f"--lookback {config.lookback}")
    found = (f"{source.paths[0]} has {longest} rows, fewer than {wanted}" if len(source.paths) == 1 else
             f"every --data file has fewer rows than {wanted} (the longest has {longest})")
    return f"{found}; {shorter_window(config)} or more data"


def windows(batch: list[KlineSeries], config: PredictConfig, source: SeriesSource,
            on_note: NoteCallback) -> LoadedSeries | None:
    """The series of `batch` long enough for the window, as arrays in the batch's order; the others are left out
    with one warning. None when there are none in a batch of a streamed panel (a later batch may have some)."""
    panel = source.name_column is not None
    walls = [series.wall_clock_ns() for series in batch]
    if panel and batch:  # a panel's symbols keep one bar interval each
        lengths = [len(series) for series in batch]
        check_steps(np.repeat(np.arange(len(batch)), lengths), np.concatenate(walls),
                    [series.name for series in batch], source.source)
    lookback, pred_len = config.lookback, config.pred_len
    need = lookback + (pred_len if config.holdout else 0)
    if all(len(series) < need for series in batch):
        if source.streamed:
            return None
        raise KronosTuneError(_none_long_enough(batch, config, source, need))
    wanted = f"lookback {lookback}" + (f" + holdout {pred_len}" if config.holdout else "")
    say_skipped([(series.name, f"{len(series)} rows, fewer than {wanted}") for series in batch if len(series) < need],
                "symbols" if panel else "files", on_note)
    kept = [k for k, series in enumerate(batch) if len(series) >= need]
    starts = [len(batch[k]) - need for k in kept]
    history_ns = np.stack([walls[k][start:start + lookback] for k, start in zip(kept, starts)])
    raw = np.stack([batch[k].features[start:start + lookback] for k, start in zip(kept, starts)])
    actual = None
    if config.holdout:
        future_ns = np.stack([walls[k][-pred_len:] for k in kept])
        actual = np.stack([batch[k].close[-pred_len:] for k in kept])
        if panel:  # a panel's held-out closes have always been scored as the float32 the predictor holds
            actual = actual.astype(np.float32).astype(np.float64)
    else:
        future_ns = _futures([batch[k] for k in kept], [walls[k] for k in kept], config, source)
    calendar = calendar_features_ns(np.concatenate([history_ns, future_ns], axis=1))
    if panel:  # the decimals of every value the panel holds, its missing columns as zeros
        every = [series.features.copy() for series in batch]
        for values, series in zip(every, batch):
            values[:, [FEATURE_COLUMNS.index(c) for c in series.lacked]] = 0.0
        precision = input_precision(np.concatenate(every))
    else:
        precision = input_precision(raw)
    zones = {str(batch[k].tz) for k in kept}
    tz = batch[kept[0]].tz
    if len(zones) > 1:
        on_note("note", f"the files use {len(zones)} time zones ({', '.join(sorted(zones))}); every output "
                        f"stamp keeps its wall-clock time and is labelled {tz}")
    lacked = {c for k in kept for c in batch[k].lacked}
    return LoadedSeries(np.array([batch[k].name for k in kept], dtype=object), raw.astype(np.float32),
                        calendar[:, :lookback], calendar[:, lookback:], future_ns, tz, history_ns[:, -1], actual,
                        np.array(["volume" in batch[k].lacked for k in kept]), precision,
                        tuple(c for c in ("volume", "amount") if c in lacked), source.name_column or "series")


def _futures(kept: list[KlineSeries], walls: list[np.ndarray], config: PredictConfig,
             source: SeriesSource) -> np.ndarray:
    """[n, pred_len] wall-clock nanoseconds of each series' next bars, computed once per distinct bar grid."""
    by_grid: dict[tuple[str, bytes], np.ndarray] = {}
    rows = []
    for series, wall in zip(kept, walls):
        key = (str(series.tz), wall.tobytes())
        if key not in by_grid:
            where = source.source if source.name_column is not None else series.source
            by_grid[key] = wall_clock_ns(future_timestamps(series.index(), config.pred_len, where, config.calendar))
        rows.append(by_grid[key])
    return np.stack(rows)


def say_filled(no_volume: np.ndarray, lacked: tuple[str, ...], on_note: NoteCallback) -> None:
    """Notes for the columns the output has and the input lacked (issue 35: say so, never silently)."""
    missing = int(no_volume.sum())
    if missing:
        on_note("note", f"{missing} of {len(no_volume)} series have no volume/amount column: the model sees "
                        f"zeros there and their predicted volume and amount are written as 0")
    elif "amount" in lacked:
        on_note("note", "the input has no amount column: the model sees volume x the mean of open, high, low and "
                        "close there, and the output's amount column is predicted on that basis (not a traded "
                        "amount from the data)")
