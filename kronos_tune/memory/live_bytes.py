"""Live tensor bytes, counted at the dispatcher: the one tracker behind every exact memory figure.

``StorageTracker`` is a ``TorchDispatchMode``: after every ATen op it looks at
the op's output tensors and registers each *untyped storage* it has not seen
yet, together with a weak reference whose callback subtracts the bytes again
when the storage dies. Views share their base's storage and in-place ops
return their input, so neither is counted twice: the per-output cost is one
dict lookup (plus an ``nbytes()`` compare to notice storages that were resized
in place, e.g. by ``out=`` ops or ``resize_``).

What is counted is what tensors keep alive, as PyTorch's caching allocator
would see it for ``memory_allocated`` (optionally with its 512-byte block
rounding). Scratch buffers that a kernel allocates and frees internally never
become op outputs and are not seen; neither are allocations made in threads
where the mode is not active (CUDA's autograd device threads; on CPU,
backward runs in the calling thread).

Used as a meter (``phase(name)`` around forward, backward, ...), it records
each phase's peak and the live bytes at its entry and exit; when the mode is
not already active, a phase enters it, so only storages created inside
phases are counted. ``with tracker:`` around a whole loop sees everything,
and ``track_existing(model, optimizer)`` adds what existed before. A
``MemoryBudget`` turns it into a simulated device that raises
``torch.OutOfMemoryError`` past the budget; a real GPU is made smaller with
``apply_cuda_budget`` (a memory fraction of the card). kronos_core's training benchmark
uses it directly; kronos_tune.memory builds its CPU meter on it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from kronos_core.errors import KronosError
from kronos_tune.errors import KronosTuneError
from kronos_tune.torch_private import TorchDispatchMode, local_shard
from kronos_core.units import format_bytes

#: The exception a real CUDA allocator raises; ``torch.OutOfMemoryError`` is
#: the device-generic name (``torch.cuda.OutOfMemoryError`` is the same class).
OutOfMemoryError: type[RuntimeError] = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


@dataclass(frozen=True)
class MemoryBudget:
    """A device of ``budget_bytes`` bytes; used by the tracker and by fake-tensor estimates."""

    budget_bytes: int

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise KronosError(f"memory budget must be positive, got {self.budget_bytes} bytes")

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.budget_bytes

    def error(self, would_be_bytes: int, peak_seen_bytes: int, op: str | None = None) -> RuntimeError:
        """The exception to raise when live bytes would reach ``would_be_bytes``."""
        where = f" in {op}" if op else ""
        return OutOfMemoryError(
            f"simulated device out of memory{where}: tried to reach {format_bytes(would_be_bytes)}, "
            f"budget {format_bytes(self.budget_bytes)} (peak seen {format_bytes(peak_seen_bytes)})"
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


class _StorageRef(weakref.ref):
    """Weak reference to an untyped storage that remembers what it was counted as."""

    __slots__ = ("key", "nbytes")

    key: int
    nbytes: int


# Storage resizes (FSDP frees a gathered parameter with ``untyped_storage().resize_(0)`` and re-grows it
# before the next gather) are not ATen ops, so the dispatch mode never sees them: while any tracker is
# active, UntypedStorage.resize_ reports to every active tracker.
_ORIGINAL_RESIZE = torch.UntypedStorage.resize_
_RESIZE_WATCHERS: list[StorageTracker] = []


def _reporting_resize(storage: torch.UntypedStorage, size: int) -> Any:
    result = _ORIGINAL_RESIZE(storage, size)
    for tracker in list(_RESIZE_WATCHERS):
        tracker._storage_resized(storage)
    return result


def _watch_resizes(tracker: StorageTracker) -> None:
    if not _RESIZE_WATCHERS:
        torch.UntypedStorage.resize_ = _reporting_resize  # type: ignore[method-assign]
    _RESIZE_WATCHERS.append(tracker)


def _unwatch_resizes(tracker: StorageTracker) -> None:
    if tracker in _RESIZE_WATCHERS:
        _RESIZE_WATCHERS.remove(tracker)
    if not _RESIZE_WATCHERS:
        torch.UntypedStorage.resize_ = _ORIGINAL_RESIZE  # type: ignore[method-assign]


def round_up(nbytes: int, block_bytes: int) -> int:
    if block_bytes <= 1 or nbytes <= 0:
        return nbytes
    return -(-nbytes // block_bytes) * block_bytes


class StorageTracker(TorchDispatchMode):
    """Counts live bytes of every storage produced while the mode is active.

    Args:
        budget_bytes: simulated device size; registering a storage that would
            push live bytes above it raises ``torch.OutOfMemoryError``.
        round_bytes: count every storage rounded up to a multiple of this
            (512 emulates the CUDA caching allocator; 1 means exact bytes).
    """

    def __init__(
        self,
        budget_bytes: int | MemoryBudget | None = None,
        round_bytes: int = 1,
    ) -> None:
        super().__init__()
        if round_bytes < 1:
            raise ValueError("round_bytes must be >= 1")
        if isinstance(budget_bytes, MemoryBudget) or budget_bytes is None:
            self.budget: MemoryBudget | None = budget_bytes
        else:
            self.budget = MemoryBudget(int(budget_bytes))
        self.round_bytes = round_bytes
        self._live: dict[int, _StorageRef] = {}
        self._current_bytes = 0
        self._window_peak_bytes = 0  # peak of the innermost open window
        self._outer_peaks: list[int] = []  # peaks of enclosing windows
        self._phase_peaks: dict[str, int] = {}
        self._mode_depth = 0
        self.num_ooms = 0
        self.entry_bytes: dict[str, int] = {}  # live bytes when each phase last started
        self.exit_bytes: dict[str, int] = {}  # and when it last ended

    # ------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.see_outputs(out, func)
        return out

    def see_outputs(self, out: Any, func: Any = None) -> None:
        """Count the storages of an op's outputs (what the dispatch mode does after every op)."""
        if isinstance(out, torch.Tensor):
            self._see(out, func)
        elif isinstance(out, (tuple, list)):
            self._see_all(out, func)

    def _see_all(self, outs: Iterable[Any], func: Any) -> None:
        for item in outs:
            if isinstance(item, torch.Tensor):
                self._see(item, func)
            elif isinstance(item, (tuple, list)):
                self._see_all(item, func)

    def _see(self, tensor: torch.Tensor, func: Any = None) -> None:
        try:
            storage = local_shard(tensor).untyped_storage()  # a DTensor (FSDP): this rank holds only its shard
        except (RuntimeError, NotImplementedError, TypeError):
            return  # sparse / nested / storage-less subclasses: not counted
        ref = self._live.get(id(storage))
        if ref is None:
            self._register(storage, func)
        else:
            nbytes = round_up(storage.nbytes(), self.round_bytes)
            if nbytes != ref.nbytes:  # resized in place
                self._grow(ref, nbytes, func)

    # ------------------------------------------------------------ accounting
    def _register(self, storage: torch.UntypedStorage, func: Any) -> None:
        nbytes = round_up(storage.nbytes(), self.round_bytes)
        new_bytes = self._current_bytes + nbytes
        if self.budget is not None and new_bytes > self.budget.budget_bytes:
            self._raise_oom(new_bytes, func)
        ref = _StorageRef(storage, self._on_storage_freed)
        ref.key = id(storage)
        ref.nbytes = nbytes
        self._live[ref.key] = ref
        self._current_bytes = new_bytes
        if new_bytes > self._window_peak_bytes:
            self._window_peak_bytes = new_bytes

    def _grow(self, ref: _StorageRef, nbytes: int, func: Any) -> None:
        new_bytes = self._current_bytes + nbytes - ref.nbytes
        if self.budget is not None and nbytes > ref.nbytes and new_bytes > self.budget.budget_bytes:
            self._raise_oom(new_bytes, func)
        ref.nbytes = nbytes
        self._current_bytes = new_bytes
        if new_bytes > self._window_peak_bytes:
            self._window_peak_bytes = new_bytes

    def _storage_resized(self, storage: torch.UntypedStorage) -> None:
        ref = self._live.get(id(storage))
        if ref is not None and ref() is storage:
            nbytes = round_up(storage.nbytes(), self.round_bytes)
            if nbytes != ref.nbytes:
                self._grow(ref, nbytes, "UntypedStorage.resize_")

    def _on_storage_freed(self, ref: _StorageRef) -> None:
        if self._live.pop(ref.key, None) is ref:
            self._current_bytes -= ref.nbytes

    def _raise_oom(self, would_be_bytes: int, func: Any) -> None:
        assert self.budget is not None
        self.num_ooms += 1
        raise self.budget.error(would_be_bytes, self.peak_bytes(), op=str(func) if func else None)

    # ------------------------------------------------------------ public API
    def track_existing(self, *objects: Any) -> int:
        """Count storages that were alive before tracking started.

        Accepts modules (parameters, their ``.grad`` and buffers), optimizers
        (every tensor in ``optimizer.state``), tensors, dicts and iterables of
        these.  Returns the bytes newly registered (already-known storages are
        not counted twice).
        """
        before = self._current_bytes
        for tensor in _iter_tensors(objects):
            self._see(tensor, "track_existing")
        return self._current_bytes - before

    def current_bytes(self) -> int:
        return self._current_bytes

    def peak_bytes(self) -> int:
        """Highest live bytes since the last reset (including open phases)."""
        return max([self._window_peak_bytes, *self._outer_peaks])

    def peaks(self) -> dict[str, int]:
        """Peak live bytes per phase name since the last reset (max over repeats)."""
        return dict(self._phase_peaks)

    def reset(self) -> None:
        """Forget peaks; live storages stay counted (they still exist)."""
        self._phase_peaks.clear()
        self.entry_bytes.clear()
        self.exit_bytes.clear()
        self._window_peak_bytes = self._current_bytes
        self._outer_peaks = [self._current_bytes for _ in self._outer_peaks]

    def __enter__(self) -> StorageTracker:
        super().__enter__()
        self._activate()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._deactivate()
        super().__exit__(*exc)

    def _activate(self) -> None:
        self._mode_depth += 1
        if self._mode_depth == 1:
            _watch_resizes(self)

    def _deactivate(self) -> None:
        self._mode_depth -= 1
        if self._mode_depth == 0:
            _unwatch_resizes(self)

    @contextlib.contextmanager
    def fed(self) -> Iterator[StorageTracker]:
        """Active without being a dispatch mode of its own: another mode hands it each op's outputs
        (``see_outputs``), and phases do not enter this one. A fake-tensor mode that does so saves a Python
        dispatch layer per op (kronos_tune.memory.estimate)."""
        self._activate()
        try:
            yield self
        finally:
            self._deactivate()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the peak live bytes reached while the block runs under ``name``.

        If the mode is not active yet it is entered for the duration of the
        phase, so a loop that only knows the phase API is still measured
        (allocations made outside any phase are then not seen).
        """
        self._outer_peaks.append(self._window_peak_bytes)
        self._window_peak_bytes = self._current_bytes
        self.entry_bytes[name] = self._current_bytes
        enter_mode = self._mode_depth == 0
        if enter_mode:
            self.__enter__()
        try:
            yield
        finally:
            if enter_mode:
                self.__exit__(None, None, None)
            phase_peak = self._window_peak_bytes
            if phase_peak > self._phase_peaks.get(name, -1):
                self._phase_peaks[name] = phase_peak
            self.exit_bytes[name] = self._current_bytes
            self._window_peak_bytes = max(self._outer_peaks.pop(), phase_peak)


def _iter_tensors(objects: Iterable[Any]) -> Iterator[torch.Tensor]:
    for obj in objects:
        if obj is None:
            continue
        if isinstance(obj, torch.Tensor):
            yield obj
            grad = obj.grad if obj.is_leaf else None
            if grad is not None:
                yield grad
        elif isinstance(obj, torch.nn.Module):
            yield from _iter_tensors(obj.parameters())
            yield from obj.buffers()
        elif isinstance(obj, torch.optim.Optimizer):
            for group in obj.param_groups:
                yield from _iter_tensors(group["params"])
            for state in obj.state.values():
                yield from _iter_tensors(state.values())
        elif isinstance(obj, dict):
            yield from _iter_tensors(obj.values())
        elif isinstance(obj, (list, tuple, set)) or _is_iterator(obj):
            yield from _iter_tensors(obj)


def _is_iterator(obj: Any) -> bool:
    return hasattr(obj, "__next__") and hasattr(obj, "__iter__")
