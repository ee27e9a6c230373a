"""Panel data in and out: one long DataFrame with a symbol column, as users keep many series.

    panel = pd.read_csv("prices.csv")   # symbol, timestamps, open, high, low, close[, volume, amount]
    inputs = panel_inputs(panel, lookback=400, future=my_future_stamps)
    out = predict_panel(predictor, inputs)   # symbol, timestamps, open ... amount; pred_len rows per symbol

Everything is vectorized over the whole panel: one timestamp parse, one sort
by (symbol, time), one gather of the last `lookback` rows per symbol, checks
per symbol done on arrays, calendar features once per distinct timestamp.
Future timestamps are a shared sequence, a mapping symbol -> stamps, or a
function of one symbol's whole history, called once per distinct history grid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS, NAT_NS, TIME_COLUMN, calendar_features_ns, wall_clock_ns
from kronos_core.data.panels import read_panel
from kronos_core.data.tables import parse_timestamps
from kronos_core.errors import KronosError
from kronos_core.predict.arrays import SeriesGroup, frame_values

if TYPE_CHECKING:
    from kronos_core.predict.predictor import KronosPredictor

SHORT_POLICIES = ("error", "skip")
FutureSpec = Union[Sequence, pd.DatetimeIndex, Mapping[str, Sequence], Callable[[pd.DatetimeIndex, int], Sequence]]


@dataclass
class PanelInputs:
    """The last `lookback` rows of every usable symbol, as arrays, plus what was left out and why."""

    symbols: list[str]
    group: SeriesGroup          # x [n, L, 6] raw, x_stamp [n, L, 5], y_stamp [n, P, 5]
    future_ns: np.ndarray       # [n, P] wall-clock nanoseconds
    tz: object | None           # time zone of the input's time column (the output gets it back)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (symbol, reason)
    actual: np.ndarray | None = None  # [n, P, 6] the held-out rows (holdout > 0)
    filled_columns: tuple[str, ...] = ()  # volume/amount the panel lacked (filled by the reference rule)
    notes: list[str] = field(default_factory=list)  # what was done to the input (read_panel's and the stamps')
    last_ns: np.ndarray | None = None  # [n] wall-clock nanoseconds of each history's last bar

    @property
    def pred_len(self) -> int:
        return self.future_ns.shape[1]


def _future_for(symbols: list[str], histories: list[np.ndarray], future: FutureSpec, pred_len: int | None,
                tz: object | None) -> np.ndarray:
    """[n, P] future stamps: shared, per symbol, or computed once per distinct history grid."""
    if callable(future):
        if pred_len is None:
            raise KronosError("pass pred_len when future is a function of each symbol's history")
        by_grid: dict[bytes, np.ndarray] = {}
        rows = []
        for symbol, history in zip(symbols, histories):
            key = history.tobytes()
            if key not in by_grid:
                stamps = pd.DatetimeIndex(history.view("datetime64[ns]"))
                if tz is not None:
                    stamps = stamps.tz_localize(tz, ambiguous="NaT", nonexistent="shift_forward")
                by_grid[key] = wall_clock_ns(future(stamps, pred_len))
            rows.append(by_grid[key])
        result = np.stack(rows)
    elif isinstance(future, Mapping):
        missing = [s for s in symbols if s not in future]
        if missing:
            raise KronosError(f"future timestamps missing for symbol(s) {missing[:5]}; give stamps for every symbol")
        result = np.stack([wall_clock_ns(future[s]) for s in symbols]) if symbols else np.zeros((0, 0), np.int64)
    else:
        shared = wall_clock_ns(future)
        result = np.broadcast_to(shared, (len(symbols), len(shared)))
    if pred_len is not None and result.shape[1] != pred_len:
        raise KronosError(f"got {result.shape[1]} future timestamps per symbol but pred_len={pred_len}")
    if result.size and (result == NAT_NS).any():
        raise KronosError("the future timestamps hold a missing value (NaT); give valid stamps")
    return np.ascontiguousarray(result)


def panel_inputs(panel: pd.DataFrame, lookback: int, future: FutureSpec | None, pred_len: int | None = None,
                 symbol_col: str = "symbol", time_col: str = TIME_COLUMN, on_short: str = "error",
                 source: str = "panel", holdout: int = 0,
                 short_fix: str = "use a shorter lookback, more data, or skip short symbols",
                 none_fix: str = "use a shorter lookback") -> PanelInputs:
    """Validate a panel and cut the last `lookback` rows of each symbol (see the module doc).

    With `holdout` = P > 0 the last P rows of each symbol are held out instead: the history is the
    `lookback` rows before them, the future stamps are theirs and `actual` holds their values
    (`future` is then ignored and may be None). `short_fix` ends the too-few-rows error, `none_fix` the one
    where no symbol is long enough (a command names its own flags there).

    Errors (KronosError, one line naming the symbol): no symbol/time/price column (the message lists the
    columns found); a missing timestamp; a duplicate timestamp; a step shorter than the symbol's usual
    one (bar intervals mixed in one symbol); NaN/inf features; fewer than `lookback` rows (with
    on_short="skip" such symbols are left out and listed in `skipped` instead).
    """
    if on_short not in SHORT_POLICIES:
        raise KronosError(f"on_short must be one of {SHORT_POLICIES}, got {on_short!r}")
    if lookback < 1:
        raise KronosError(f"lookback must be >= 1, got {lookback}")
    found = ", ".join(map(str, panel.columns)) or "none"
    for column, what in ((symbol_col, "symbol"), (time_col, "time")):
        if column not in panel.columns:
            raise KronosError(f"{source}: no {what} column '{column}' (found: {found}); name the column or "
                              f"rename it")
    if len(panel) == 0:
        raise KronosError(f"{source}: no rows")
    symbols_raw = panel[symbol_col]
    if symbols_raw.isna().any():
        row = int(np.argmax(symbols_raw.isna().to_numpy()))
        raise KronosError(f"{source}: empty {symbol_col} at row {row}; fill or drop that row")
    codes, names = pd.factorize(symbols_raw, sort=False)
    names = [str(n) for n in names]
    times = panel[time_col]
    notes: list[str] = list(panel.attrs.get("notes", ()))
    if not pd.api.types.is_datetime64_any_dtype(times):
        # YYYYMMDD integers are dates, not nanoseconds; strings with mixed UTC offsets become UTC
        times = parse_timestamps(times.reset_index(drop=True), source, column=time_col, notes=notes)
    tz = getattr(times.dtype, "tz", None)
    try:
        ns = wall_clock_ns(times)
    except (TypeError, ValueError, OverflowError) as error:
        raise KronosError(f"{source}: column '{time_col}' could not be read as dates "
                          f"({' '.join(str(error).split())[:100]}); use one format like 2024-01-02 09:35:00") from None
    if (ns == NAT_NS).any():
        row = int(np.argmax(ns == NAT_NS))
        raise KronosError(f"{source}: symbol {names[codes[row]]}: empty timestamp at row {row}; fill or drop it")
    features = panel.drop(columns=[symbol_col, time_col])
    features.columns = [str(c).strip().lower() for c in features.columns]  # "Close" as a file spells it is close
    values = frame_values(features, source, check_finite=False)
    if np.all(codes[1:] >= codes[:-1]) and np.all((ns[1:] > ns[:-1]) | (codes[1:] != codes[:-1])):
        order = np.arange(len(ns))  # already grouped by symbol and sorted by time: no sort, no copies
    else:
        order = np.lexsort((ns, codes))
        codes, ns, values = codes[order], ns[order], values[order]
    counts = np.bincount(codes, minlength=len(names))
    ends = np.cumsum(counts)
    starts = ends - counts
    check_steps(codes, ns, names, source)
    _check_finite(values, codes, ns, names, source, order)

    need = lookback + holdout
    short = counts < need
    wanted = f"lookback {lookback}" + (f" + holdout {holdout}" if holdout else "")
    skipped = [(names[k], f"{counts[k]} rows, fewer than {wanted}") for k in np.flatnonzero(short)]
    if short.all():
        raise KronosError(f"{source}: no symbol has {need} rows (the longest has {int(counts.max())}); {none_fix}")
    if skipped and on_short == "error":
        symbol, reason = skipped[0]
        more = f" (and {len(skipped) - 1} more symbols)" if len(skipped) > 1 else ""
        raise KronosError(f"{source}: symbol {symbol} has {reason}{more}; {short_fix}")
    kept = np.flatnonzero(~short)
    rows = (ends[kept] - need)[:, None] + np.arange(lookback)[None, :]
    kept_names = [names[k] for k in kept]
    actual = None
    if holdout:
        held = (ends[kept] - holdout)[:, None] + np.arange(holdout)[None, :]
        future_ns, actual = ns[held], values[held]
    else:
        histories = [ns[starts[k]:ends[k]] for k in kept]
        future_ns = _future_for(kept_names, histories, future, pred_len, tz)
    calendar = calendar_features_ns(np.concatenate([ns[rows], future_ns], axis=1))
    group = SeriesGroup(list(range(len(kept))), values[rows], calendar[:, :lookback], calendar[:, lookback:])
    filled = tuple(c for c in ("volume", "amount") if c not in panel.columns)
    return PanelInputs(kept_names, group, future_ns, tz, skipped, actual, filled, notes, ns[rows[:, -1]])


def check_steps(codes: np.ndarray, ns: np.ndarray, names: list[str], source: str) -> None:
    """Strictly increasing stamps per symbol, and no step shorter than the symbol's median step."""
    if len(ns) < 2:
        return
    same = codes[1:] == codes[:-1]
    steps = np.diff(ns)[same]
    owners = codes[1:][same]
    at = np.flatnonzero(same) + 1  # sorted position of the later row of each step
    if (steps <= 0).any():
        bad = int(np.argmax(steps <= 0))
        stamp = pd.Timestamp(int(ns[at[bad]]))
        raise KronosError(f"{source}: symbol {names[owners[bad]]} has timestamp {stamp} twice; drop duplicates")
    order = np.lexsort((steps, owners))
    sorted_steps, sorted_owners = steps[order], owners[order]
    per_symbol = np.bincount(sorted_owners, minlength=len(names))
    first = np.cumsum(per_symbol) - per_symbol
    has = per_symbol > 0
    median = np.zeros(len(names), dtype=np.int64)
    median[has] = sorted_steps[first[has] + per_symbol[has] // 2]
    shorter = steps < median[owners]
    if shorter.any():
        bad = int(np.argmax(shorter))
        symbol = names[owners[bad]]
        raise KronosError(f"{source}: symbol {symbol} mixes bar intervals: a step of "
                          f"{pd.Timedelta(int(steps[bad]))} at {pd.Timestamp(int(ns[at[bad]]))} against its usual "
                          f"{pd.Timedelta(int(median[owners[bad]]))}; keep one interval per symbol")


def _check_finite(values: np.ndarray, codes: np.ndarray, ns: np.ndarray, names: list[str], source: str,
                  order: np.ndarray) -> None:
    finite = np.isfinite(values)
    if not finite.all():
        position, column = np.argwhere(~finite)[0]
        raise KronosError(f"{source}: symbol {names[codes[position]]}: {FEATURE_COLUMNS[column]} is NaN or inf at "
                          f"{pd.Timestamp(int(ns[position]))} (row {int(order[position])}); fill or drop it")


def panel_frame(inputs: PanelInputs, values: np.ndarray, symbol_col: str = "symbol",
                time_col: str = TIME_COLUMN) -> pd.DataFrame:
    """One long frame: symbol, timestamps, open ... amount; pred_len rows per symbol, in input symbol order."""
    count, pred_len = inputs.future_ns.shape
    stamps = pd.DatetimeIndex(inputs.future_ns.reshape(-1).view("datetime64[ns]"))
    if inputs.tz is not None:
        stamps = stamps.tz_localize(inputs.tz, ambiguous="NaT", nonexistent="shift_forward")
    flat = values.reshape(count * pred_len, len(FEATURE_COLUMNS))
    columns = {symbol_col: np.repeat(np.asarray(inputs.symbols, dtype=object), pred_len), time_col: stamps}
    columns.update({name: flat[:, k] for k, name in enumerate(FEATURE_COLUMNS)})
    return pd.DataFrame(columns)


def series_frames(inputs: PanelInputs, values: np.ndarray) -> dict[str, pd.DataFrame]:
    """Per-symbol frames indexed by their future timestamps (built only when asked)."""
    out = {}
    columns = pd.Index(FEATURE_COLUMNS)
    for k, symbol in enumerate(inputs.symbols):
        index = pd.DatetimeIndex(inputs.future_ns[k].view("datetime64[ns]"), name=TIME_COLUMN)
        if inputs.tz is not None:
            index = index.tz_localize(inputs.tz, ambiguous="NaT", nonexistent="shift_forward")
        out[symbol] = pd.DataFrame(values[k], columns=columns, index=index)
    return out


def predict_panel(predictor: KronosPredictor, inputs: PanelInputs, T: float = 1.0, top_k: int = 0,
                  top_p: float = 0.9, sample_count: int = 1, verbose: bool = False,
                  max_batch_size: int | None = None, output: str = "panel"):
    """Predict every symbol of `inputs`; output "panel" (one long frame), "frames" (dict symbol -> frame)
    or "arrays" (float32 [n, pred_len, 6], the mean over sample paths)."""
    if output not in ("panel", "frames", "arrays"):
        raise KronosError(f"output must be 'panel', 'frames' or 'arrays', got {output!r}")
    group = inputs.group
    values = predictor.predict_arrays(group.x, group.x_stamp, group.y_stamp, T=T, top_k=top_k, top_p=top_p,
                                      sample_count=sample_count, verbose=verbose, max_batch_size=max_batch_size,
                                      mean_only=True)
    if output == "arrays":
        return values
    return panel_frame(inputs, values) if output == "panel" else series_frames(inputs, values)


__all__ = ["PanelInputs", "check_steps", "panel_frame", "panel_inputs", "predict_panel", "read_panel", "series_frames"]
