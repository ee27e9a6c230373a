"""Inputs of `kronos-tune predict`: files, synthetic series or panels, read once and turned into arrays.

Per-series files (or --synthetic) become `SeriesInput`s (`load_series`), whose
future timestamps continue each series' own bar grid (or follow --calendar);
panels (--symbol-column) are cut with `kronos_core.predict.panel`, with future timestamps computed once per
distinct history grid. Either way `load_inputs` returns one `LoadedSeries` of
arrays that the predictor (or the ranks of a sharded run) consume directly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS, TIME_COLUMN, find_data_files, read_kline, wall_clock_ns
from kronos_core.errors import KronosError
from kronos_core.predict.panel import panel_inputs, read_panel
from kronos_core.predict.arrays import prepare_lists
from kronos_core.data.synthetic import synthetic_series
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.times import future_timestamps
from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.output import input_precision
from kronos_tune.predict.series import LoadedSeries


DEFAULT_SYNTHETIC_SERIES = 4

# Called as on_note(level, message) with level "note" or "warning", as soon as a note is known.
NoteCallback = Callable[[str, str], None]


@dataclass
class SeriesInput:
    """One series ready for the predictor: its history, future stamps and (holdout) actual closes."""

    name: str
    history: pd.DataFrame            # TIME_COLUMN + FEATURE_COLUMNS, `lookback` rows
    future: pd.DatetimeIndex         # pred_len stamps
    actual_close: np.ndarray | None  # holdout only
    filled: tuple[str, ...] = ()     # volume/amount the file lacked


def read_series_file(path: Path, on_note: NoteCallback, date_format: str | None = None) -> pd.DataFrame:
    """One per-series file, what reading did to it (notes) and its warnings each said as one line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = read_kline(path, date_format)
    for message in frame.attrs.get("notes", ()):
        on_note("note", message)
    for warning in caught:
        on_note("warning", str(warning.message))
    return frame


def unique_names(paths: list[Path]) -> list[str]:
    """Each file's stem, or its path without the suffix where two files share a stem."""
    """File stems, or the path (without suffix) where two files share a stem."""
    stems = [p.stem for p in paths]
    return [stem if stems.count(stem) == 1 else str(p.with_suffix("")) for stem, p in zip(stems, paths)]


def say_skipped(skipped: list[tuple[str, str]], what: str, on_note: NoteCallback) -> None:
    """The short-series rule (the backtest's and training's too): a series too short for the window is left out,
    and one warning line says how many, the first one's rows and which."""
    if not skipped:
        return
    listed = ", ".join(name for name, _ in skipped[:5])
    more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    on_note("warning", f"skipped {len(skipped)} {what} with too few rows ({skipped[0][1]} for {skipped[0][0]}): "
                       f"{listed}{more}")


def _too_short(rows: int, config: PredictConfig) -> str | None:
    need = config.lookback + (config.pred_len if config.holdout else 0)
    if rows >= need:
        return None
    wanted = f"lookback {config.lookback}" + (f" + holdout {config.pred_len}" if config.holdout else "")
    return f"{rows} rows, fewer than {wanted}"


def _series_input(name: str, frame: pd.DataFrame, config: PredictConfig, where: str) -> SeriesInput:
    rows = len(frame)
    if config.holdout:
        need = config.lookback + config.pred_len
        history = frame.iloc[rows - need:rows - config.pred_len].reset_index(drop=True)
        tail = frame.iloc[rows - config.pred_len:]
        future = pd.DatetimeIndex(tail[TIME_COLUMN], name=TIME_COLUMN)
        return SeriesInput(name, history, future, tail["close"].to_numpy(dtype=np.float64),
                           tuple(frame.attrs.get("filled_columns", ())))
    history = frame.iloc[rows - config.lookback:].reset_index(drop=True)
    # The whole file defines the bar grid; the history alone may be too short to show it.
    future = future_timestamps(frame[TIME_COLUMN], config.pred_len, where, config.calendar)
    return SeriesInput(name, history, future, None, tuple(frame.attrs.get("filled_columns", ())))


def load_series(config: PredictConfig, on_note: NoteCallback) -> list[SeriesInput]:
    """Read every --data file (or make --synthetic series) into predictor inputs; errors name the file."""
    if config.data:
        paths = find_data_files(list(config.data))
        items, skipped, longest = [], [], 0
        for name, path in zip(unique_names(paths), paths):
            frame = read_series_file(path, on_note, config.date_format)
            longest, short = max(longest, len(frame)), _too_short(len(frame), config)
            if short is None:
                items.append(_series_input(name, frame, config, str(path)))
            else:
                skipped.append((name, short))
        if not items:
            need = (f"--lookback {config.lookback} + --pred-len {config.pred_len} = "
                    f"{config.lookback + config.pred_len}" if config.holdout else f"--lookback {config.lookback}")
            found = (f"{paths[0]} has {longest} rows, fewer than {need}" if len(paths) == 1 else
                     f"every --data file has fewer rows than {need} (the longest has {longest})")
            raise KronosTuneError(f"{found}; {shorter_window(config)} or more data")
        say_skipped(skipped, "files", on_note)
        return items
    count = config.synthetic
    if count is None:
        count = DEFAULT_SYNTHETIC_SERIES
        on_note("note", f"no --data given: predicting {count} synthetic series (--synthetic N to change)")
    rows = config.lookback + config.pred_len if config.holdout else config.lookback
    frames = synthetic_series(count, n_rows=max(rows, 2), seed=config.seed)
    return [_series_input(f"synthetic_{i}", frame, config, f"synthetic_{i}") for i, frame in enumerate(frames)]


def _from_series(items: list[SeriesInput], pred_len: int, on_note: NoteCallback) -> LoadedSeries:
    prepared = prepare_lists([item.history[list(FEATURE_COLUMNS)] for item in items],
                             [item.history[TIME_COLUMN] for item in items], [item.future for item in items], pred_len)
    (group,) = prepared.groups  # every history has --lookback rows
    actual = None if items[0].actual_close is None else np.stack([item.actual_close for item in items])
    raw = np.stack([item.history[list(FEATURE_COLUMNS)].to_numpy(dtype=np.float64) for item in items])
    zones = {str(pd.DatetimeIndex(item.future).tz) for item in items}
    tz = pd.DatetimeIndex(items[0].future).tz
    if len(zones) > 1:
        on_note("note", f"the files use {len(zones)} time zones ({', '.join(sorted(zones))}); every output "
                        f"stamp keeps its wall-clock time and is labelled {tz}")
    future_ns = np.stack([wall_clock_ns(pd.DatetimeIndex(item.future)) for item in items])
    last_ns = np.array([wall_clock_ns(item.history[TIME_COLUMN])[-1] for item in items], dtype=np.int64)
    lacked = set().union(*(item.filled for item in items))
    return LoadedSeries(np.array([item.name for item in items], dtype=object), group.x, group.x_stamp,
                        group.y_stamp, future_ns, tz, last_ns, actual,
                        np.array(["volume" in item.filled for item in items]), input_precision(raw),
                        tuple(c for c in ("volume", "amount") if c in lacked))


def shorter_window(config: PredictConfig) -> str:
    """How a user fits the windows into shorter series, in the command's own flags."""
    return "use a shorter --lookback" + (" (or --pred-len: --holdout holds out the last --pred-len rows)"
                                         if config.holdout else "")


def panel_series(panel: pd.DataFrame, config: PredictConfig, source: str, on_note: NoteCallback) -> LoadedSeries:
    """The series of a panel (as `read_panel` returns it) as arrays, in the panel's symbol order."""
    inputs = panel_inputs(panel, config.lookback,
                          lambda stamps, count: future_timestamps(stamps, count, source, config.calendar),
                          pred_len=config.pred_len, source=source, on_short="skip",
                          holdout=config.pred_len if config.holdout else 0, none_fix=shorter_window(config))
    for message in inputs.notes:
        on_note("note", message)
    say_skipped(inputs.skipped, "symbols", on_note)
    actual = None if inputs.actual is None else inputs.actual[..., FEATURE_COLUMNS.index("close")].astype(np.float64)
    no_volume = np.full(len(inputs.symbols), "volume" in inputs.filled_columns)
    group = inputs.group
    present = [c for c in FEATURE_COLUMNS if c in panel.columns]
    raw = np.zeros((len(panel), len(FEATURE_COLUMNS)))
    raw[:, [FEATURE_COLUMNS.index(c) for c in present]] = panel[present].to_numpy(dtype=np.float64)
    return LoadedSeries(np.array(inputs.symbols, dtype=object), group.x, group.x_stamp, group.y_stamp,
                        inputs.future_ns, inputs.tz, inputs.last_ns, actual, no_volume, input_precision(raw),
                        inputs.filled_columns, panel.attrs.get("symbol_column") or str(config.symbol_column))


def say_read_notes(panel: pd.DataFrame, on_note: NoteCallback) -> None:
    """What `read_panel` did to a file and what it found suspicious, each as one line."""
    for message in panel.attrs.get("notes", ()):
        on_note("note", message)
    for message in panel.attrs.get("warnings", ()):
        on_note("warning", message)


def _from_panels(config: PredictConfig, on_note: NoteCallback) -> LoadedSeries:
    paths = find_data_files(list(config.data))
    panels = [read_panel(path, config.symbol_column, config.date_format) for path in paths]
    for read in panels:
        say_read_notes(read, on_note)
    panel = panels[0] if len(panels) == 1 else pd.concat(panels, ignore_index=True)
    panel.attrs = {"symbol_column": panels[0].attrs.get("symbol_column")}  # the notes are said above
    source = str(paths[0]) if len(paths) == 1 else f"{len(paths)} panel files"
    return panel_series(panel, config, source, on_note)


def load_inputs(config: PredictConfig, on_note: NoteCallback) -> LoadedSeries:
    """Per-series files or synthetic series (`load_series`), or panels (--symbol-column), as arrays."""
    try:
        if config.symbol_column is not None:
            inputs = _from_panels(config, on_note)
        else:
            inputs = _from_series(load_series(config, on_note), config.pred_len, on_note)
    except KronosError as error:
        raise KronosTuneError(str(error)) from None
    say_filled(inputs.no_volume, inputs.lacked, on_note)
    return inputs


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
