"""Batched prediction on arrays: one conversion on the host, normalization and de-normalization batched.

`KronosPredictor.predict_batch` (lists of DataFrames) and `predict_panel`
(one long DataFrame with a symbol column) both come down to `KronosPredictor.run_group`:
arrays x [n, L, 6] (raw features), x_stamp [n, L, 5], y_stamp [n, P, 5]
(calendar features) of series that share one history length.

- Host preparation (`prepare_lists`) turns each frame into a float32 block
  and each timestamp list into int64 wall-clock nanoseconds; calendar features
  are then computed once per distinct timestamp for all series together.
- Normalization is one batched op: on CUDA in torch on the device after one
  pinned, non-blocking copy; on the CPU in numpy, which reduces exactly like
  the reference's per-series numpy code (bit-identical statistics; torch's
  reductions differ in the last bits, which can flip a token).
- De-normalization runs on the device; one pinned device-to-host copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from kronos_core.data.kline import FEATURE_COLUMNS, NAT_NS, PRICE_COLUMNS, calendar_features_ns, wall_clock_ns
from kronos_core.errors import KronosError

NORM_EPS = 1e-5
N_FEATURES = len(FEATURE_COLUMNS)
_FEATURE_INDEX = pd.Index(FEATURE_COLUMNS)


@dataclass
class SeriesGroup:
    """Series of one history length, ready for `KronosPredictor.run_group`."""

    members: list[int]    # positions in the caller's list
    x: np.ndarray         # [n, L, 6] float32, raw (not normalized)
    x_stamp: np.ndarray   # [n, L, 5] float32 calendar features
    y_stamp: np.ndarray   # [n, P, 5]
    last_ns: np.ndarray | None = None  # [n] int64 wall-clock ns of each member's last history bar (series keys)


@dataclass
class PreparedLists:
    groups: list[SeriesGroup]  # in order of first appearance of each length
    indexes: list[pd.Index]    # output index of each series (its y_timestamp)
    longest: int


def frame_values(df: pd.DataFrame, where: str, check_finite: bool = True) -> np.ndarray:
    """[rows, 6] float32 features of one frame (reference rules for missing volume/amount)."""
    if not isinstance(df, pd.DataFrame):
        raise KronosError(f"{where}: input must be a pandas DataFrame, got {type(df).__name__}")
    columns = df.columns
    if columns.equals(_FEATURE_INDEX):  # the common case, checked once instead of column by column
        try:
            values = df.to_numpy(dtype=np.float64)
        except (TypeError, ValueError):
            pass
        else:
            return _checked(values, where, check_finite)
    missing = [c for c in PRICE_COLUMNS if c not in columns]
    if missing:
        raise KronosError(f"{where}: missing price column(s) {missing}; found {list(columns)}; "
                          f"provide open, high, low, close")
    try:
        if "volume" in columns and "amount" in columns:
            values = (df.to_numpy(dtype=np.float64) if list(columns) == list(FEATURE_COLUMNS)
                      else df[list(FEATURE_COLUMNS)].to_numpy(dtype=np.float64))
        else:
            prices = df[list(PRICE_COLUMNS)].to_numpy(dtype=np.float64)
            values = np.zeros((len(df), N_FEATURES))
            values[:, :4] = prices
            if "volume" in columns:  # amount = volume * mean price of the row (reference rule)
                values[:, 4] = df["volume"].to_numpy(dtype=np.float64)
                values[:, 5] = values[:, 4] * df[list(PRICE_COLUMNS)].mean(axis=1).to_numpy()
    except (TypeError, ValueError):
        frame = df if "volume" in columns else df[list(PRICE_COLUMNS)]
        bad = next(c for c in FEATURE_COLUMNS if c in frame.columns
                   and not pd.api.types.is_numeric_dtype(frame[c]))
        raise KronosError(f"{where}: column '{bad}' is not numeric; clean it before predicting") from None
    return _checked(values, where, check_finite)


def _checked(values: np.ndarray, where: str, check_finite: bool) -> np.ndarray:
    if len(values) == 0:
        raise KronosError(f"{where}: the history is empty; pass at least one row")
    if check_finite:
        raise_non_finite(values, where)
    return values.astype(np.float32)


def raise_non_finite(values: np.ndarray, where: str | Callable[[int], str]) -> None:
    """One-line error naming the first NaN/inf (series, row, column) of [rows, 6] or [n, rows, 6] values."""
    finite = np.isfinite(values)
    if finite.all():
        return
    first = np.argwhere(~finite)[0]
    kind = "NaN" if np.isnan(values[tuple(first)]) else "inf"
    *series, row, col = (int(i) for i in first)
    place = where(series[0]) if series else where
    raise KronosError(f"{place}: {kind} in column '{FEATURE_COLUMNS[col]}' at row {row}; "
                      f"fill or drop it before predicting")


def _stamps_ns(stamps, expected: int, what: str, where: str, hint: str) -> np.ndarray:
    try:
        ns = wall_clock_ns(stamps)
    except (TypeError, ValueError, OverflowError) as error:
        text = " ".join(str(error).split())[:120]
        raise KronosError(f"{where}: {what} could not be read as timestamps ({text}); pass datetimes") from None
    if len(ns) != expected:
        raise KronosError(f"{where}: {what} has {len(ns)} entries but {hint}")
    missing = ns == NAT_NS
    if missing.any():
        raise KronosError(f"{where}: {what} is missing a timestamp at position {int(np.argmax(missing))}; "
                          f"fill it before predicting")
    return ns


def prepare_lists(df_list: Sequence[pd.DataFrame], x_timestamp_list: Sequence, y_timestamp_list: Sequence,
                  pred_len: int) -> PreparedLists:
    """Validate and convert every series once; group them by history length."""
    values, x_ns, y_ns, indexes = [], [], [], []
    for i, (df, xs, ys) in enumerate(zip(df_list, x_timestamp_list, y_timestamp_list)):
        where = f"series {i}"
        features = frame_values(df, where, check_finite=False)  # checked below, all series at once
        values.append(features)
        x_ns.append(_stamps_ns(xs, len(features), "x_timestamp", where, f"the DataFrame has {len(features)} rows"))
        y_ns.append(_stamps_ns(ys, pred_len, "y_timestamp", where,
                               f"pred_len={pred_len}; pass exactly pred_len future timestamps"))
        indexes.append(ys if isinstance(ys, pd.Index) else pd.Index(ys))
    by_length: dict[int, list[int]] = {}
    for i, features in enumerate(values):
        by_length.setdefault(len(features), []).append(i)
    groups = []
    for length, members in by_length.items():
        x = np.stack([values[i] for i in members])
        raise_non_finite(x, lambda position: f"series {members[position]}")
        stamps = np.concatenate([np.stack([x_ns[i] for i in members]), np.stack([y_ns[i] for i in members])], 1)
        calendar = calendar_features_ns(stamps)
        groups.append(SeriesGroup(members, x, calendar[:, :length], calendar[:, length:], stamps[:, length - 1]))
    return PreparedLists(groups, indexes, max(by_length))


def to_device(array: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """One copy to the device; from pinned host memory and non-blocking on CUDA."""
    tensor = torch.from_numpy(np.ascontiguousarray(array)) if isinstance(array, np.ndarray) else array
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_host(tensor: torch.Tensor) -> np.ndarray:
    if tensor.device.type == "cuda":
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        torch.cuda.current_stream(tensor.device).synchronize()
        return host.numpy()
    return tensor.cpu().numpy()


def normalize(x: np.ndarray | torch.Tensor, clip: float,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_norm, mean, std) on `device` for raw x [n, L, 6]: z-score per series and column, clipped."""
    if device.type == "cpu":
        array = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float32)
        # Reduce along a contiguous time axis: numpy then sums pairwise, exactly as the reference does on
        # a DataFrame's column-major `.values`; a strided reduction rounds differently.
        by_column = np.ascontiguousarray(array.transpose(0, 2, 1))
        mean = by_column.mean(axis=2, keepdims=True).transpose(0, 2, 1)
        std = by_column.std(axis=2, keepdims=True).transpose(0, 2, 1)
        x_norm = np.clip((array - mean) / (std + NORM_EPS), -clip, clip)
        return torch.from_numpy(x_norm), torch.from_numpy(mean), torch.from_numpy(std)
    values = to_device(x, device).float()
    mean = values.mean(dim=1, keepdim=True)
    std = values.std(dim=1, unbiased=False, keepdim=True)
    return ((values - mean) / (std + NORM_EPS)).clamp_(-clip, clip), mean, std
