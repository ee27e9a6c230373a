"""Smaller devices out of this one: a real GPU capped with a memory fraction (a simulated CPU device's budget,
MemoryBudget, lives with the tracker in kronos_tune.memory.live_bytes)."""

from __future__ import annotations

import torch

from kronos_tune.memory.live_bytes import MemoryBudget, OutOfMemoryError
from kronos_core.units import format_bytes
from kronos_tune.errors import KronosTuneError

__all__ = ["MemoryBudget", "OutOfMemoryError", "apply_cuda_budget", "indexed_cuda_device"]


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
            f"budget {format_bytes(budget_bytes)} is larger than {dev} ({format_bytes(total_bytes)}); "
            "pick a smaller budget"
        )
    torch.cuda.set_per_process_memory_fraction(budget_bytes / total_bytes, dev)
    return (
        f"{dev} capped at {format_bytes(budget_bytes)} of {format_bytes(total_bytes)} via "
        "set_per_process_memory_fraction: "
        "the cap applies to memory reserved by the caching allocator only; the CUDA context, cuBLAS/cuDNN "
        "handles and other processes are outside it, and a capped large card still differs from a small one "
        "(kernel choice, workspace sizes, fragmentation), so treat the result as an approximation"
    )
