"""Presets -> TrainConfig: one place that turns a preset's workload into a training run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kronos_core.cpu_features import NO_NATIVE_BF16
from kronos_core.train import TrainConfig
from kronos_tune.precision import bf16_support
from kronos_tune.presets import Preset

WORKLOAD_FIELDS = ("model_size", "lookback_window", "predict_window", "batch_size", "accumulation_steps",
                   "epochs", "samples_per_epoch", "eval_samples", "amp")


def preset_train_fields(preset: Preset) -> dict[str, Any]:
    """The TrainConfig keys a preset's workload sets (plain values, as in TOML)."""
    fields = {key: getattr(preset.workload, key) for key in WORKLOAD_FIELDS}
    fields["eval_samples"] = max(fields["eval_samples"], 1)
    fields["device"] = preset.hardware.device if preset.hardware.device in ("cpu", "cuda") else "auto"
    return fields


def runnable_device(preset: Preset) -> tuple[str, str | None]:
    """The device this machine can run the preset on, and a note when it differs from the preset's."""
    import torch  # when asked (planning a run), not on import: reading a report needs no torch

    if preset.hardware.device == "cuda" and not torch.cuda.is_available():
        return "cpu", (f"preset {preset.name} describes a CUDA device but this machine has none: running on "
                       f"the CPU; memory is simulated, times are this CPU's")
    return preset.hardware.device, None


def train_config_from_preset(preset: Preset, **overrides: Any) -> tuple[TrainConfig, list[str]]:
    """TrainConfig for the preset's workload on a device this machine has (overrides applied last),
    plus notes on what had to be adapted."""
    fields = preset_train_fields(preset)
    device, note = runnable_device(preset)
    notes = [note] if note else []
    fields["device"] = device
    fields["output_dir"] = str(Path("runs") / preset.name)
    if device != "cuda" and fields["amp"] in ("fp16", "bf16"):
        bf16 = bf16_support(preset.hardware, device)
        if fields["amp"] == "fp16":
            fields["amp"] = "bf16" if bf16.runs else "none"
            notes.append(f'amp fp16 needs a CUDA device, none is visible: the config uses {fields["amp"]} '
                         + ("(same activation bytes)" if bf16.runs else f"({bf16.reason})")
                         + '; set amp = "fp16" again on the GPU')
        if fields["amp"] == "bf16" and not bf16.native:  # asked or forced: it runs, emulated
            notes.append(f"bf16 autocast: {bf16.note or NO_NATIVE_BF16}; the run goes on")
    fields.update(overrides)
    return TrainConfig(**fields), notes
