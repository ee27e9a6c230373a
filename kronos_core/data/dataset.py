"""Window datasets over K-line series for training and validation.

Every series is packed once into one float32 array ``[rows, 6 + 5]`` (the six
features, then the five calendar features) with per-series offsets. A window
is ``lookback + predict_window + 1`` consecutive rows of one series, z-scored
with the mean/std of its first ``lookback`` rows, exactly like the reference
Kronos fine-tuning dataset.

Sharding: ``KlineWindowDataset[idx]`` is a pure function of (seed, epoch, idx).
Every process that builds the dataset from the same frames and seed sees the
same index -> window mapping, so DataLoader workers and DDP ranks get distinct
windows just by reading distinct indices (the trainer hands rank r its slice of
each global batch); no sampler state has to be shared.
"""

from __future__ import annotations

import operator
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from kronos_core.data.kline import (
    FEATURE_COLUMNS,
    TIME_COLUMN,
    TIME_FEATURES,
    calendar_features,
    fill_volume_amount,
    normalize_window,
    validate_kline,
)
from kronos_core.deferred import deferred
from kronos_core.errors import KronosError

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)

N_FEATURES = len(FEATURE_COLUMNS)
N_COLUMNS = N_FEATURES + len(TIME_FEATURES)


def _remove_memmap(path: Path, made_dir: Path | None, owner_pid: int) -> None:
    # Forked DataLoader workers inherit this finalizer; only the builder deletes.
    if os.getpid() != owner_pid:
        return
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
    if made_dir is not None:
        shutil.rmtree(made_dir, ignore_errors=True)


class _PackedWindows:
    """Series packed into one array, plus the (series, start) of every window."""

    def __init__(
        self,
        frames: Sequence[pd.DataFrame],
        lookback: int,
        predict_window: int,
        clip: float,
        preload: str,
        memmap_dir: str | Path | None,
    ) -> None:
        for name, value, low in (("lookback", lookback, 1), ("predict_window", predict_window, 0)):
            if not isinstance(value, (int, np.integer)) or value < low:
                raise KronosError(f"dataset: {name}={value!r}; it must be an integer >= {low}")
        if preload not in ("ram", "memmap"):
            raise KronosError(f"dataset: preload={preload!r}; use 'ram' or 'memmap'")
        if clip <= 0:
            raise KronosError(f"dataset: clip={clip!r}; it must be > 0")
        if len(frames) == 0:
            raise KronosError("dataset: no series given; pass at least one K-line frame")
        self.lookback = int(lookback)
        self.predict_window = int(predict_window)
        self.window_length = self.lookback + self.predict_window + 1
        self.clip = float(clip)
        self.preload = preload

        lengths = np.array([len(f) for f in frames], dtype=np.int64)
        usable = np.flatnonzero(lengths >= self.window_length)
        if len(usable) == 0:
            raise KronosError(
                f"dataset: no series is long enough for one window: need at least {self.window_length} rows "
                f"(lookback {self.lookback} + predict_window {self.predict_window} + 1), longest series "
                f"has {int(lengths.max())} rows; lower lookback/predict_window or add data"
            )
        self.series_ids = usable
        n_rows = lengths[usable]
        self.offsets = np.concatenate([[0], np.cumsum(n_rows)[:-1]]).astype(np.int64)
        counts = n_rows - self.window_length + 1
        self.window_ends = np.cumsum(counts).astype(np.int64)  # exclusive end of each series' windows
        self.num_windows = int(self.window_ends[-1])
        total = int(n_rows.sum())

        self._memmap_path: Path | None = None
        self._finalizer: weakref.finalize | None = None
        if preload == "ram":
            data = np.empty((total, N_COLUMNS), dtype=np.float32)
        else:
            made_dir = None
            if memmap_dir is None:
                made_dir = Path(tempfile.mkdtemp(prefix="kronos-klines-"))
                directory = made_dir
            else:
                directory = Path(memmap_dir)
                directory.mkdir(parents=True, exist_ok=True)
            self._memmap_path = directory / f"klines-{os.getpid()}-{uuid.uuid4().hex[:12]}.npy"
            self._finalizer = weakref.finalize(
                self, _remove_memmap, self._memmap_path, made_dir, os.getpid()
            )
            data = np.lib.format.open_memmap(
                self._memmap_path, mode="w+", dtype=np.float32, shape=(total, N_COLUMNS)
            )
        for offset, sid in zip(self.offsets, usable):
            frame = frames[int(sid)]
            source = str(frame.attrs.get("source", f"series {int(sid)}"))
            validate_kline(frame, source=source)
            filled = fill_volume_amount(frame)
            stop = offset + len(frame)
            data[offset:stop, :N_FEATURES] = filled[list(FEATURE_COLUMNS)].to_numpy(dtype=np.float32)
            data[offset:stop, N_FEATURES:] = calendar_features(frame[TIME_COLUMN])
        if preload == "memmap":
            data.flush()
            del data
            self._data: np.ndarray | None = None  # opened read-only on first use
        else:
            self._data = data

    def _array(self) -> np.ndarray:
        if self._data is None:
            self._data = np.load(self._memmap_path, mmap_mode="r")
        return self._data

    def _resolve(self, window: int) -> tuple[int, int]:
        """(position among packed series, first row within that series) of a window."""
        pos = int(np.searchsorted(self.window_ends, window, side="right"))
        first = int(self.window_ends[pos - 1]) if pos else 0
        return pos, window - first

    def locate(self, window: int) -> tuple[int, int]:
        """(index of the series in the given frames, first row) of a window."""
        pos, start = self._resolve(window)
        return int(self.series_ids[pos]), start

    def window(self, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos, start = self._resolve(window)
        row = int(self.offsets[pos]) + start
        rows = self._array()[row : row + self.window_length]
        x, _, _ = normalize_window(rows[:, :N_FEATURES], clip=self.clip, stats_rows=self.lookback)
        stamp = np.array(rows[:, N_FEATURES:], dtype=np.float32)  # copy: memmap pages are read-only
        return torch.from_numpy(x), torch.from_numpy(stamp)

    def __getstate__(self) -> dict:
        # A pickled np.memmap would carry all its data; workers reopen the file instead.
        state = self.__dict__.copy()
        state["_finalizer"] = None
        if self.preload == "memmap":
            state["_data"] = None
        return state


class KlineWindowDataset(_PackedWindows, Dataset):
    """Random training windows: ``samples_per_epoch`` items per epoch.

    Item ``idx`` of epoch ``e`` is window ``order[idx]``, where ``order`` is drawn
    by a numpy Generator seeded with ``(seed, e)``: distinct windows when
    ``samples_per_epoch`` <= the number of windows, otherwise back-to-back fresh
    permutations (each window used equally often, +-1). Call ``set_epoch`` before
    each epoch; DataLoader workers pick it up when created, so use
    ``persistent_workers=False`` or rebuild the loader per epoch.

    Items are ``(x, stamp)``: ``x`` float32 [L, 6] (open, high, low, close, volume,
    amount) z-scored with the first ``lookback`` rows' mean/std, then clipped to
    [-clip, clip]; ``stamp`` float32 [L, 5] (minute, hour, weekday, day, month);
    L = lookback + predict_window + 1.

    ``preload="ram"`` keeps the packed array in this process; ``"memmap"`` writes it
    once as a .npy in ``memmap_dir`` (a temp dir when None) and maps it read-only,
    so workers share the pages. The file is deleted when the dataset is collected.
    Series shorter than L give no windows; frames are checked with
    ``validate_kline`` (errors raise KronosError).
    """

    def __init__(
        self,
        frames: Sequence[pd.DataFrame],
        lookback: int,
        predict_window: int,
        samples_per_epoch: int,
        seed: int = 0,
        clip: float = 5.0,
        preload: Literal["ram", "memmap"] = "ram",
        memmap_dir: str | Path | None = None,
    ) -> None:
        if not isinstance(samples_per_epoch, (int, np.integer)) or samples_per_epoch < 1:
            raise KronosError(f"dataset: samples_per_epoch={samples_per_epoch!r}; it must be an integer >= 1")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise KronosError(f"dataset: seed={seed!r}; it must be an integer >= 0")
        super().__init__(frames, lookback, predict_window, clip, preload, memmap_dir)
        self.samples_per_epoch = int(samples_per_epoch)
        self.seed = int(seed)
        self.epoch = 0
        self._order_cache: tuple[int, np.ndarray] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the draw of windows for ``epoch`` (an integer >= 0)."""
        if not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise KronosError(f"dataset: epoch={epoch!r}; it must be an integer >= 0")
        self.epoch = int(epoch)

    def epoch_order(self) -> np.ndarray:
        """Window numbers of this epoch's items, int64 [samples_per_epoch]."""
        if self._order_cache is None or self._order_cache[0] != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            total, wanted = self.num_windows, self.samples_per_epoch
            if wanted <= total:
                order = rng.choice(total, size=wanted, replace=False)
            else:
                rounds = -(-wanted // total)
                order = np.concatenate([rng.permutation(total) for _ in range(rounds)])[:wanted]
            self._order_cache = (self.epoch, order.astype(np.int64))
        return self._order_cache[1]

    def __len__(self) -> int:
        return self.samples_per_epoch

    def _check_index(self, idx: int) -> int:
        i = operator.index(idx)
        if not 0 <= i < self.samples_per_epoch:
            raise IndexError(f"index {i} out of range for {self.samples_per_epoch} samples per epoch")
        return i

    def window_location(self, idx: int) -> tuple[int, int]:
        """(series index in ``frames``, first row) of item ``idx`` this epoch."""
        return self.locate(int(self.epoch_order()[self._check_index(idx)]))

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.window(int(self.epoch_order()[self._check_index(idx)]))

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_order_cache"] = None
        return state


class KlineEvalDataset(_PackedWindows, Dataset):
    """A fixed, evenly spaced set of windows for validation (no randomness).

    Takes every window when there are at most ``max_windows``, otherwise
    ``max_windows`` evenly spaced over all windows of all series (so longer
    series get proportionally more). Items are as in KlineWindowDataset.
    """

    def __init__(
        self,
        frames: Sequence[pd.DataFrame],
        lookback: int,
        predict_window: int,
        max_windows: int = 512,
        clip: float = 5.0,
        preload: Literal["ram", "memmap"] = "ram",
        memmap_dir: str | Path | None = None,
    ) -> None:
        if not isinstance(max_windows, (int, np.integer)) or max_windows < 1:
            raise KronosError(f"dataset: max_windows={max_windows!r}; it must be an integer >= 1")
        super().__init__(frames, lookback, predict_window, clip, preload, memmap_dir)
        if self.num_windows <= max_windows:
            self.windows = np.arange(self.num_windows, dtype=np.int64)
        else:
            self.windows = np.round(np.linspace(0, self.num_windows - 1, int(max_windows))).astype(np.int64)

    def __len__(self) -> int:
        return len(self.windows)

    def _check_index(self, idx: int) -> int:
        i = operator.index(idx)
        if not 0 <= i < len(self.windows):
            raise IndexError(f"index {i} out of range for {len(self.windows)} eval windows")
        return i

    def window_location(self, idx: int) -> tuple[int, int]:
        """(series index in ``frames``, first row) of item ``idx``."""
        return self.locate(int(self.windows[self._check_index(idx)]))

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.window(int(self.windows[self._check_index(idx)]))


def split_frames(
    frames: Sequence[pd.DataFrame], val_fraction: float = 0.2, min_val_rows: int = 0
) -> tuple[list[pd.DataFrame], list[pd.DataFrame]]:
    """Split each series in time: the first rows train, the last ``val_fraction`` validate.

    Returns (train, val), aligned with ``frames`` (a part may be empty; the
    datasets skip series too short for a window). Pass ``min_val_rows`` =
    lookback + predict_window + 1 to grow a too-small validation part to one
    window, done only when the series has at least twice that many rows so the
    training part keeps a window too. Both parts are re-indexed from 0.
    """
    if not 0.0 < val_fraction < 1.0:
        raise KronosError(f"split: val_fraction={val_fraction!r}; it must be between 0 and 1 (e.g. 0.2)")
    if min_val_rows < 0:
        raise KronosError(f"split: min_val_rows={min_val_rows!r}; it must be >= 0")
    train: list[pd.DataFrame] = []
    val: list[pd.DataFrame] = []
    for frame in frames:
        n = len(frame)
        n_val = int(round(n * val_fraction))
        if n_val < min_val_rows and n >= 2 * min_val_rows:
            n_val = min_val_rows
        cut = n - n_val
        train.append(frame.iloc[:cut].reset_index(drop=True))
        val.append(frame.iloc[cut:].reset_index(drop=True))
    return train, val
