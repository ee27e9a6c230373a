"""Presets -> TrainConfig: one place that turns a preset's workload into a training run."""

from __future__ import annotations

from typing import Any

import torch

from kronos_core.train import TrainConfig
from kronos_tune.presets import Preset

WORKLOAD_FIELDS = ("model_size", "lookback_window", "predict_window", "batch_size", "accumulation_steps",
                   "epochs", "samples_per_epoch", "eval_samples", "amp")


def preset_train_fields(preset: Preset) -> dict[str, Any]:
    """The TrainConfig keys a preset's workload sets (plain values, as in TOML)."""
    fields = {key: getattr(preset.workload, key) for key in WORKLOAD_FIELDS}
    fields["device"] = preset.hardware.device if preset.hardware.device in ("cpu", "cuda") else "auto"
    return fields


def runnable_device(preset: Preset) -> tuple[str, str | None]:
    """The device this machine can run the preset on, and a note when it differs from the preset's."""
    if preset.hardware.device == "cuda" and not torch.cuda.is_available():
        return "cpu", (f"preset {preset.name} describes a CUDA device but this machine has none: running on "
                       f"the CPU; memory is simulated, times are this CPU's")
    return preset.hardware.device, None


def train_config_for_preset(preset: Preset, **overrides: Any) -> TrainConfig:
    """TrainConfig for the preset's workload on a device this machine has, with overrides applied."""
    fields = preset_train_fields(preset)
    fields["device"], _ = runnable_device(preset)
    if fields["device"] == "cpu" and fields["amp"] == "fp16":
        fields["amp"] = "none"
    fields.update(overrides)
    return TrainConfig(**fields)
