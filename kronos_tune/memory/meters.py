"""Phase meters: what the training loop calls around forward/backward/optimizer/eval/data.

Every meter follows ``LiveMeter`` (kronos_core's ``PhaseMeter`` plus the live bytes); kronos_core only
duck-types it::

    with meter.phase("forward"):
        loss = model(batch)

Peaks are of *live* bytes, so a phase's peak includes everything already alive
when it starts (parameters, grads, optimizer state, saved activations).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ContextManager, Protocol, runtime_checkable

import torch

from kronos_tune.memory.live_bytes import MemoryBudget, StorageTracker, apply_cuda_budget, indexed_cuda_device
from kronos_core.train.records import PhaseMeter
from kronos_tune.errors import KronosTuneError


@runtime_checkable
class LiveMeter(PhaseMeter, Protocol):
    """kronos_core's trainer interface, plus the live bytes now."""

    def current_bytes(self) -> int: ...


class MeterSwitch:
    """A PhaseMeter for the Trainer that forwards to `meter` while `enabled` (always, with ``always``).

    The benchmark switches it on for the metered step only; autobatch keeps it on and swaps `meter`
    for each probe, so one Trainer serves every probe."""

    def __init__(self, meter: Any | None, always: bool = False) -> None:
        self.meter = meter
        self.always = always
        self.enabled = always

    def phase(self, name: str) -> ContextManager[None]:
        if self.enabled and self.meter is not None:
            return self.meter.phase(name)
        return contextlib.nullcontext()

    def peaks(self) -> dict[str, int]:
        return dict(self.meter.peaks()) if self.meter is not None else {}

    def peak_bytes(self) -> int:
        return int(self.meter.peak_bytes()) if self.meter is not None else 0

    def reset(self) -> None:
        if self.meter is not None:
            self.meter.reset()

    def start(self, trainer: Any) -> None:
        """Count what exists (weights, optimizer state, tokenizer) and meter from now on."""
        if self.meter is None:
            return
        if hasattr(self.meter, "track_existing"):
            self.meter.track_existing(trainer.model, trainer.tokenizer, trainer.optimizer)
        self.enabled = True

    def stop(self) -> None:
        self.enabled = self.always


class CpuExactMeter(StorageTracker):
    """Byte-exact meter of live tensor storages (dispatcher level, any device).

    Use ``with meter:`` around the whole loop so every allocation is seen, and
    ``meter.track_existing(model, optimizer)`` for tensors created before.
    ``budget_bytes`` turns it into a simulated device that raises
    ``torch.OutOfMemoryError`` when exceeded.
    """

    def __init__(self, budget_bytes: int | MemoryBudget | None = None) -> None:
        super().__init__(budget_bytes=budget_bytes, round_bytes=1)


class CudaMeter:
    """Per-phase peaks from the CUDA caching allocator's own statistics.

    Each phase synchronizes, resets the allocator's peak counters and reads
    ``max_memory_allocated``/``max_memory_reserved`` at the end.
    """

    def __init__(self, device: torch.device | int | str | None = None, notes: list[str] | None = None) -> None:
        if not torch.cuda.is_available():
            raise KronosTuneError("CudaMeter needs a CUDA device; use CpuExactMeter on this machine")
        self.device = indexed_cuda_device(device)
        self.notes: list[str] = list(notes or [])
        self._peaks: dict[str, int] = {}  # each phase's allocated peak (max over repeats)
        # Peaks (allocated, reserved) of each open window that the allocator's
        # counters no longer show because an inner phase reset them; index 0 is
        # the window since the last reset().
        self._hidden: list[tuple[int, int]] = [(0, 0)]
        self.reset()

    def _window(self) -> tuple[int, int]:
        return torch.cuda.max_memory_allocated(self.device), torch.cuda.max_memory_reserved(self.device)

    def _fold_into_top(self, allocated: int, reserved: int) -> None:
        top_a, top_r = self._hidden[-1]
        self._hidden[-1] = (max(top_a, allocated), max(top_r, reserved))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        torch.cuda.synchronize(self.device)
        self._fold_into_top(*self._window())
        self._hidden.append((0, 0))
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            torch.cuda.synchronize(self.device)
            hidden_a, hidden_r = self._hidden.pop()
            window_a, window_r = self._window()
            allocated, reserved = max(hidden_a, window_a), max(hidden_r, window_r)
            self._peaks[name] = max(self._peaks.get(name, 0), allocated)
            self._fold_into_top(allocated, reserved)

    def peaks(self) -> dict[str, int]:
        return dict(self._peaks)

    def peak_bytes(self) -> int:
        return max(self._window()[0], *(a for a, _ in self._hidden))

    def peak_reserved_bytes(self) -> int:
        return max(self._window()[1], *(r for _, r in self._hidden))

    def reset(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._peaks.clear()
        now = (self.current_bytes(), torch.cuda.memory_reserved(self.device))
        self._hidden = [now for _ in self._hidden]

    def current_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device)


def make_meter(device: torch.device | str, budget_bytes: int | None = None, *,
               exact_on_cpu: bool = True) -> LiveMeter | None:
    """The meter for `device`, the one place that picks it.

    CUDA (a bare "cuda" is the current device): a CudaMeter; a budget smaller than the card caps it with
    ``apply_cuda_budget`` (the caveat is in the meter's notes), a budget as large as the card leaves it whole.
    Anything else: a CpuExactMeter, a simulated device of `budget_bytes` when one is given; or, with
    `exact_on_cpu=False` (plain training, which should not pay for byte-exact tracking), no meter."""
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = indexed_cuda_device(dev)
        notes = []
        if budget_bytes is not None and budget_bytes < torch.cuda.get_device_properties(dev).total_memory:
            notes.append(apply_cuda_budget(budget_bytes, dev))
        return CudaMeter(dev, notes=notes)
    return CpuExactMeter(budget_bytes=budget_bytes) if exact_on_cpu else None
