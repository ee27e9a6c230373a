"""Simulated devices: a byte budget that fails like CUDA does when exceeded."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kronos_tune.errors import KronosTuneError

_GIB = float(1 << 30)

#: The exception a real CUDA allocator raises; ``torch.OutOfMemoryError`` is
#: the device-generic name (``torch.cuda.OutOfMemoryError`` is the same class).
OutOfMemoryError: type[RuntimeError] = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def _gib(nbytes: int) -> str:
    """CUDA-style size text: GiB for big numbers, exact bytes for small ones."""
    if abs(nbytes) >= _GIB / 10:
        return f"{nbytes / _GIB:.2f} GiB"
    if abs(nbytes) >= 1 << 20:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes} B"


@dataclass(frozen=True)
class MemoryBudget:
    """A device of ``budget_bytes`` bytes; used by the CPU tracker and fake estimates."""

    budget_bytes: int

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise KronosTuneError(f"memory budget must be positive, got {self.budget_bytes} bytes")

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.budget_bytes

    def error(self, would_be_bytes: int, peak_seen_bytes: int, op: str | None = None) -> RuntimeError:
        """The exception to raise when live bytes would reach ``would_be_bytes``."""
        where = f" in {op}" if op else ""
        return OutOfMemoryError(
            f"simulated device out of memory{where}: tried to reach {_gib(would_be_bytes)}, "
            f"budget {_gib(self.budget_bytes)} (peak seen {_gib(peak_seen_bytes)})"
        )


def indexed_cuda_device(device: torch.device | int | str | None = None) -> torch.device:
    """`device` as a CUDA device with an explicit index (a bare "cuda" means the current device): some CUDA
    APIs (set_per_process_memory_fraction) reject a device without one."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device) \
        if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type != "cuda":
        raise KronosTuneError(f"expected a cuda device, got {dev}")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def apply_cuda_budget(budget_bytes: int, device: torch.device | int | str | None = None) -> str:
    """Cap the caching allocator on a real GPU at ``budget_bytes``; returns a caveat note.

    Uses ``torch.cuda.set_per_process_memory_fraction(budget / total)``.
    """
    if not torch.cuda.is_available():
        raise KronosTuneError("apply_cuda_budget needs a CUDA device; use CpuExactMeter(budget_bytes=...) instead")
    dev = indexed_cuda_device(device)
    total_bytes = torch.cuda.get_device_properties(dev).total_memory
    if budget_bytes <= 0:
        raise KronosTuneError(f"memory budget must be positive, got {budget_bytes} bytes")
    if budget_bytes > total_bytes:
        raise KronosTuneError(
            f"budget {_gib(budget_bytes)} is larger than {dev} ({_gib(total_bytes)}); pick a smaller budget"
        )
    torch.cuda.set_per_process_memory_fraction(budget_bytes / total_bytes, dev)
    return (
        f"{dev} capped at {_gib(budget_bytes)} of {_gib(total_bytes)} via set_per_process_memory_fraction: "
        "the cap applies to memory reserved by the caching allocator only; the CUDA context, cuBLAS/cuDNN "
        "handles and other processes are outside it, and a capped large card still differs from a small one "
        "(kernel choice, workspace sizes, fragmentation), so treat the result as an approximation"
    )
