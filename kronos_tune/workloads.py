"""A preset on this machine: the device it runs on, whether bf16 is native there, and its workload as a training
run (one place turns a preset's workload into a TrainConfig).

Whether bf16 is native on the device a run actually uses: the preset's `hardware.bf16_supported` ("auto" by
default) against the GPU (`torch.cuda.is_bf16_supported()`) or the CPU's flags (kronos_core.cpu_features).
A GPU preset run on a machine without that GPU is decided by the CPU it runs on. A preset may force bf16 off
(the trial is skipped) or on (it runs, with a note where the device would emulate it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_core.cpu_features import NO_NATIVE_BF16, CpuFeatures, detect_cpu_features
from kronos_core.train import TrainConfig
from kronos_tune.presets import HardwareSpec, Preset

NO_GPU_BF16 = "this GPU has no bf16 support"
FORCED_OFF = "the preset turns bf16 off (hardware.bf16_supported = false)"


@dataclass(frozen=True)
class Bf16Support:
    """`runs`: bf16 trials and bf16 settings run; `reason`: why not (one line); `note`: why it runs slowly."""

    native: bool
    runs: bool
    reason: str | None = None
    note: str | None = None


def bf16_support(hardware: HardwareSpec, device: str, cpu: CpuFeatures | None = None) -> Bf16Support:
    """The decision for `device` ("cuda" or "cpu", the one the run uses); `cpu`: the CPU's features (default:
    this machine's; tests pass faked flags)."""
    if device == "cuda":
        import torch  # only a CUDA run asks the device

        native = torch.cuda.is_bf16_supported()
        if hardware.bf16_supported is False or not native:
            return Bf16Support(native, False, FORCED_OFF if native else NO_GPU_BF16)
        return Bf16Support(True, True)
    native = (cpu or detect_cpu_features()).native_bf16
    if hardware.bf16_supported is False:
        return Bf16Support(native, False, FORCED_OFF)
    if native:
        return Bf16Support(True, True)
    if hardware.bf16_supported is True:
        return Bf16Support(False, True, note=f"the preset forces bf16 (hardware.bf16_supported = true), but "
                                              f"{NO_NATIVE_BF16}")
    return Bf16Support(False, False, NO_NATIVE_BF16)


def emulated_bf16_note(flag: str | None, device: str) -> str | None:
    """The note for bf16 asked (`flag`, e.g. "--amp bf16") on a CPU that would emulate it (the run goes on);
    None where bf16 is native, not asked, or `device` (resolved: "cpu", "cuda:0") is a GPU."""
    if flag is None or not device.startswith("cpu") or detect_cpu_features().native_bf16:
        return None
    return f"{flag}: {NO_NATIVE_BF16}; the run goes on"


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
