"""A cheaper key in front of FakeTensorMode's dispatch cache.

FakeTensorMode caches the metadata of an op's outputs by a key built from
everything about its arguments (`FakeTensorMode._cache_key`). On a fake
training step nearly every op is a cache hit, and building that key (tensor
metadata through generic checks, flattened into a tuple) is about half of each
op's cost. `LightKeys` keeps its own map from a key it builds from the same
facts, read directly off the tensors, to the mode's cache entry, which the
mode then turns into outputs as on any hit (`_output_from_cache_entry`).

A light key holds everything the mode's key holds for a dense tensor
(memory format and contiguity follow from shape and strides), so two calls
with one light key have one mode key and get the same entry. On the first
call of a light key the mode's own key is taken before the op runs (an
in-place op changes its arguments) and the op goes through the mode, which
caches it or not; a light key whose op the mode does not cache goes through
the mode every time. Arguments the light key does not describe (another mode's
tensors, constants, symbolic sizes, functions) go through the mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses import fake_tensor as _fake

UNCACHED = object()  # the mode does not cache this op with these arguments
UNKNOWN = object()  # a light key not seen before
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


class LightKeys:
    """Light key -> FakeTensorMode cache entry, shared by every mode in the process (as the mode's cache is)."""

    entries: dict[tuple, Any] = {}

    def __init__(self, mode: _fake.FakeTensorMode) -> None:
        self.mode = mode
        self.state = _fake._CacheKeyState(mode.shape_env)

    def key(self, func: Any, args: tuple, kwargs: dict) -> tuple | None:
        """The light key of this call, or None where it does not describe the arguments."""
        parts: list[Any] = [func, torch.get_default_dtype(), torch._C._get_default_device(),
                            torch.is_inference_mode_enabled()]
        if not self._describe(parts, args):
            return None
        if kwargs:
            parts.append(tuple(kwargs))
            if not self._describe(parts, kwargs.values()):
                return None
        return tuple(parts)

    def _describe(self, parts: list[Any], values: Any) -> bool:
        mode = self.mode
        for value in values:
            kind = type(value)
            if kind is _fake.FakeTensor:
                if value.fake_mode is not mode or value.constant is not None or value.layout is not torch.strided:
                    return False
                parts.append((value.dtype, value.shape, value.stride(), value.storage_offset(),
                              value.untyped_storage().nbytes(), value.requires_grad, value.fake_device,
                              value.is_inference(), value.is_conj(), value.is_neg()))
            elif kind in _SCALARS:
                parts.append(kind)
                parts.append(value)
            elif kind is list or kind is tuple:
                parts.append((kind, len(value)))
                if not self._describe(parts, value):
                    return False
            else:
                return False
        return True

    def outputs(self, key: tuple, func: Any, args: tuple) -> Any:
        """The outputs for a known light key, else UNCACHED (run the op through the mode) or UNKNOWN."""
        entry = self.entries.get(key, UNKNOWN)
        if entry is UNKNOWN or entry is UNCACHED:
            return entry
        return self.mode._output_from_cache_entry(self.state, entry, None, func, args)

    def mode_key(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The mode's own key of this call (taken before it runs), or None if the mode would not cache it."""
        try:
            return self.mode._cache_key(_fake._CacheKeyState(self.mode.shape_env), func, args, kwargs)
        except _fake._BypassDispatchCache:
            return None

    def learn(self, key: tuple, mode_key: Any) -> None:
        """After the op ran through the mode: remember the entry it cached under `mode_key`, if any."""
        entry = _fake.FakeTensorMode.cache.get(mode_key) if mode_key is not None else None
        self.entries[key] = entry if isinstance(entry, _fake._DispatchCacheValidEntry) else UNCACHED

