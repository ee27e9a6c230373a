"""Whether bf16 is native on the device a run actually uses: the preset's `hardware.bf16_supported` ("auto" by
default) against the GPU (`torch.cuda.is_bf16_supported()`) or the CPU's flags (kronos_core.cpu_features).

A GPU preset run on a machine without that GPU is decided by the CPU it runs on. A preset may force bf16 off
(the trial is skipped) or on (it runs, with a note where the device would emulate it).
"""

from __future__ import annotations

from dataclasses import dataclass

from kronos_core.cpu_features import NO_NATIVE_BF16, CpuFeatures, detect_cpu_features
from kronos_tune.presets import HardwareSpec

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
