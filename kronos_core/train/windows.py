"""How many training and validation windows a config's data holds (the same split the trainer makes)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from kronos_core.data.dataset import split_frames
from kronos_core.errors import KronosWarning
from kronos_core.train.config import TrainConfig


@dataclass(frozen=True)
class WindowCount:
    """Windows of `window_length` rows: every start position in each series' training / validation part."""

    train: int
    val: int
    window_length: int


def count_windows(config: TrainConfig) -> WindowCount:
    """Read the config's data (cut at train_until) and count the windows on each side of the split; reading's
    notes are left to the trainer, which says them once."""
    from kronos_core.train.loading import load_training_data  # torch: only when the data is counted

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KronosWarning)
        frames, _ = load_training_data(config)
    length = config.window_length
    train, val = split_frames(frames, config.val_fraction, min_val_rows=length)
    return WindowCount(sum(max(0, len(part) - length + 1) for part in train),
                       sum(max(0, len(part) - length + 1) for part in val), length)
