"""TOML for the test-only tiny model: a preset file, and a training config of a few steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kronos_core.files import dumps_toml

TINY_TRAIN: dict[str, Any] = dict(model_size="tiny", lookback_window=16, predict_window=4, batch_size=8,
                                 samples_per_epoch=64, epochs=1, eval_samples=16, synthetic_series=2,
                                 synthetic_rows=200)


def tiny_train_toml(**changes: Any) -> str:
    """A TrainConfig TOML for Kronos-tiny on two small synthetic series (8 steps an epoch); `changes` replace
    or add keys."""
    return dumps_toml({**TINY_TRAIN, **changes})


def tiny_preset_toml(name: str = "tiny-cpu", *, memory_gb: float = 1.0, bf16_supported: bool = False,
                     lookback_window: int = 16, predict_window: int = 4, batch_size: int = 8,
                     accumulation_steps: int = 1, samples_per_epoch: int = 64, eval_samples: int = 8,
                     series_count: int = 2, lookback: int = 32, pred_len: int = 4, sample_count: int = 1) -> str:
    return f"""name = "{name}"
description = "Kronos-tiny on a small CPU device, for tests"

[hardware]
device = "cpu"
device_count = 1
memory_per_device_gb = {memory_gb}
bf16_supported = {str(bf16_supported).lower()}
cuda_context_overhead_gb = 0.0

[workload]
model_size = "tiny"
tokenizer = "tiny"
lookback_window = {lookback_window}
predict_window = {predict_window}
batch_size = {batch_size}
accumulation_steps = {accumulation_steps}
epochs = 1
samples_per_epoch = {samples_per_epoch}
eval_samples = {eval_samples}
amp = "none"

[predict]
series_count = {series_count}
lookback = {lookback}
pred_len = {pred_len}
sample_count = {sample_count}
"""


def write_tiny_preset(folder: Path, name: str = "tiny-cpu", **fields: object) -> Path:
    """Write `<name>.toml` into `folder` (created); return the folder, for --preset-dir."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(tiny_preset_toml(name, **fields), encoding="utf-8")  # type: ignore[arg-type]
    return folder
