"""LiveBytesMeter: a small PhaseMeter that counts the bytes of tensor storages alive in each phase.

It is a TorchDispatchMode active only inside ``phase(...)``: every op output's
untyped storage is registered once (views share it) with a weak reference that
subtracts its bytes again when the storage is freed. Only storages created
while a phase is active are counted, so parameters and anything made before
are not. That makes it a direct measure of what a step allocates: what the
forward keeps alive for backward (activations), the gradients, temporaries.
Ops run in other threads (CUDA's autograd device threads) are not seen; on
CPU, backward runs in the calling thread. kronos_tune.memory has the
full-featured meters; this one exists so kronos_core's benchmark needs no
kronos_tune.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class _Counting(TorchDispatchMode):
    def __init__(self, meter: LiveBytesMeter) -> None:
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor) and item.device.type != "meta":
                self.meter._register(item.untyped_storage())
        return out


class LiveBytesMeter:
    """Peak live bytes per phase (``peaks()``), plus live bytes at each phase's entry and exit."""

    def __init__(self) -> None:
        self.current_bytes = 0
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self._peaks: dict[str, int] = {}
        self.entry_bytes: dict[str, int] = {}
        self.exit_bytes: dict[str, int] = {}
        self._window_peak = 0
        self._mode: _Counting | None = None

    def _register(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        nbytes = storage.nbytes()
        known = self._live.get(key)
        if known is not None:
            if known[1] == nbytes:
                return
            self._change(nbytes - known[1])  # resized in place
            self._live[key] = (known[0], nbytes)
            return

        def freed(_: weakref.ref, key: int = key) -> None:
            entry = self._live.pop(key, None)
            if entry is not None:
                self._change(-entry[1])

        self._live[key] = (weakref.ref(storage, freed), nbytes)
        self._change(nbytes)

    def _change(self, delta: int) -> None:
        self.current_bytes += delta
        if self.current_bytes > self._window_peak:
            self._window_peak = self.current_bytes

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        outer_peak = self._window_peak
        self._window_peak = self.current_bytes
        self.entry_bytes[name] = self.current_bytes
        entered = self._mode is None
        if entered:
            self._mode = _Counting(self)
            self._mode.__enter__()
        try:
            yield
        finally:
            if entered and self._mode is not None:
                self._mode.__exit__(None, None, None)
                self._mode = None
            peak = self._window_peak
            self._peaks[name] = max(self._peaks.get(name, 0), peak)
            self.exit_bytes[name] = self.current_bytes
            self._window_peak = max(outer_peak, peak)

    def peaks(self) -> dict[str, int]:
        return dict(self._peaks)

    def peak_bytes(self) -> int:
        return max(self._peaks.values(), default=0)

    def reset(self) -> None:
        """Forget peaks; storages still alive stay counted."""
        self._peaks.clear()
        self.entry_bytes.clear()
        self.exit_bytes.clear()
        self._window_peak = self.current_bytes
