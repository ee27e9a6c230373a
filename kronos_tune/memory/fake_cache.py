"""A cheaper way through FakeTensorMode for the ops of a fake training step.

FakeTensorMode caches the metadata of an op's outputs by a key built from
everything about its arguments (`FakeTensorMode._cache_key`). On a fake
training step nearly every op is a cache hit, and building that key (tensor
metadata through generic checks, flattened into a tuple) was about half of each
op's cost. `LightKeys` keeps its own map from a key it builds from the same
facts, read directly off the tensors, to the mode's cache entry; a hit makes
the outputs as the mode makes them from the entry (`_Output` for the common
single fresh or view output, else `_output_from_cache_entry`).

A light key holds everything the mode's key holds for a dense tensor
(memory format and contiguity follow from shape and strides), so two calls
with one light key have one mode key and get the same entry. On the first
call of a light key the mode's own key is taken before the op runs (an
in-place op changes its arguments) and the op goes through the mode, which
caches it or not. Arguments the light key does not describe (another mode's
tensors, constants, symbolic sizes, functions) go through the mode; a tensor
subclass the mode does not handle (a DTensor) gets the mode's NotImplemented
at once. Of the ops the mode does not cache, those whose dispatch ends at the
op's meta kernel (FSDP's copy-in and split ops) run it directly
(`run_meta_kernel`), as the mode would after its checks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch._subclasses import fake_tensor as _fake

UNCACHED = object()  # the mode does not cache this op with these arguments
UNKNOWN = object()  # a light key not seen before
FOREIGN = object()  # an argument is a tensor subclass the mode does not handle (it answers NotImplemented)
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


class _Foreign(Exception):
    pass


class _Output:
    """One fresh or view output, made as the mode makes it from its cache entry (`_output_from_cache_entry`),
    without re-reading the entry's general form on every hit."""

    __slots__ = ("shape", "stride", "dtype", "layout", "requires_grad", "device", "storage_offset", "view_idx")

    def __init__(self, metadata: Any, view_idx: int | None) -> None:
        self.shape, self.stride, self.dtype = tuple(metadata.shape), tuple(metadata.stride), metadata.dtype
        self.layout, self.requires_grad, self.device = metadata.layout, metadata.requires_grad, metadata.device
        self.storage_offset, self.view_idx = metadata.storage_offset, view_idx

    @classmethod
    def of(cls, entry: Any, func: Any) -> _Output | None:
        """The plain form of a valid cache entry with one tensor output of plain sizes, else None."""
        infos = getattr(entry, "output_infos", None)
        if not infos or len(infos) != 1 or getattr(entry, "is_output_tuple", True):
            return None
        info = infos[0]
        metadata = info.metadata
        if info.inplace_idx is not None or metadata is None or metadata.is_conj or metadata.is_neg \
                or metadata.is_sparse or metadata.layout is not torch.strided:
            return None
        if not all(type(value) is int for value in (*metadata.shape, *metadata.stride, metadata.storage_offset)):
            return None  # symbolic sizes
        is_view = isinstance(func, torch._ops.OpOverload) and func.is_view
        if is_view and info.view_idx is None:
            return None
        return cls(metadata, info.view_idx if is_view else None)

    def make(self, mode: _fake.FakeTensorMode, args: tuple) -> _fake.FakeTensor:
        empty = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, layout=self.layout, device="meta",
                                    requires_grad=self.requires_grad)
        if self.view_idx is not None:  # a view shares its input's storage
            empty.set_(args[self.view_idx].untyped_storage(), self.storage_offset, self.shape, self.stride)
        return _fake.FakeTensor(mode, empty, self.device)


class LightKeys:
    """Light key -> FakeTensorMode cache entry, shared by every mode in the process (as the mode's cache is)."""

    entries: dict[tuple, Any] = {}

    def __init__(self, mode: _fake.FakeTensorMode) -> None:
        self.mode = mode
        self.state = _fake._CacheKeyState(mode.shape_env)

    def key(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The light key of this call; None where it does not describe the arguments; FOREIGN where one is a
        tensor subclass the mode leaves to the subclass."""
        if func in _fake._DISPATCH_META_HANDLERS or func in _fake._DISPATCH_HANDLE_DIRECTLY:
            return None  # answered by the mode before it looks at its cache or its arguments' types
        parts: list[Any] = [func, torch.get_default_dtype(), torch._C._get_default_device(),
                            torch.is_inference_mode_enabled()]
        try:
            if not self._describe(parts, args):
                return None
            if kwargs:
                parts.append(tuple(kwargs))
                if not self._describe(parts, kwargs.values()):
                    return None
        except _Foreign:
            return FOREIGN
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
                if isinstance(value, torch.Tensor) and kind is not torch.Tensor and kind is not nn.Parameter \
                        and not isinstance(value, _fake.FakeTensor):
                    raise _Foreign  # the mode's own test for a subclass it does not handle
                return False
        return True

    def outputs(self, key: tuple, func: Any, args: tuple) -> Any:
        """The outputs for a known light key, else UNCACHED (run the op through the mode) or UNKNOWN."""
        entry = self.entries.get(key, UNKNOWN)
        if entry is UNKNOWN or entry is UNCACHED:
            return entry
        if type(entry) is _Output:
            return entry.make(self.mode, args)
        return self.mode._output_from_cache_entry(self.state, entry, None, func, args)

    def mode_key(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The mode's own key of this call (taken before it runs), or None if the mode would not cache it."""
        try:
            return self.mode._cache_key(_fake._CacheKeyState(self.mode.shape_env), func, args, kwargs)
        except _fake._BypassDispatchCache:
            return None

    def learn(self, key: tuple, mode_key: Any, func: Any) -> None:
        """After the op ran through the mode: remember the entry it cached under `mode_key`, if any."""
        entry = _fake.FakeTensorMode.cache.get(mode_key) if mode_key is not None else None
        if not isinstance(entry, _fake._DispatchCacheValidEntry):
            self.entries[key] = UNCACHED
        else:
            self.entries[key] = _Output.of(entry, func) or entry


_META_ROUTES: dict[Any, bool] = {}


def _ends_at_meta_kernel(func: Any, mode: _fake.FakeTensorMode) -> bool:
    """Whether the mode's dispatch of `func` on plain fake tensors ends at its meta kernel (its own checks, in
    its order: Python decompositions it prefers, prims, custom ops' fake kernels, its own implementations)."""
    from torch._decomp import decomposition_table, meta_table

    if not isinstance(func, torch._ops.OpOverload) or func in mode.lift_fns:
        return False
    if func in _fake._DISPATCH_META_HANDLERS or func in _fake._DISPATCH_HANDLE_DIRECTLY:
        return False
    if func not in meta_table and not mode.cpp_meta_supports_symint(func):
        if func in decomposition_table and _fake.torch_decomp_decompositions(func):
            return False
        implicit = torch._C.DispatchKey.CompositeImplicitAutograd
        if implicit in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), implicit):
            return False
    if "prims::" in func._schema.name or torch._dynamo.config._custom_ops_profile is not None:
        return False
    if torch._library.simple_registry.singleton.find(func.name()).fake_impl.kernel is not None:
        return False
    if any(applies(func) for applies, _ in _fake.op_implementations_checks):
        return False
    return _fake.has_meta(func)


def run_meta_kernel(mode: _fake.FakeTensorMode, func: Any, args: tuple, kwargs: dict) -> Any:
    """For an op the mode does not cache, called with arguments a light key describes: its outputs as the mode
    makes them where its dispatch ends at the op's meta kernel (FSDP's copy-in and split ops), without the
    checks before it (about a millisecond an op); else UNCACHED."""
    direct = _META_ROUTES.get(func)
    if direct is None:
        direct = _META_ROUTES[func] = _ends_at_meta_kernel(func, mode)
    if not direct or mode.propagate_real_tensors:
        return UNCACHED
    flat_args = torch.utils._pytree.tree_leaves((args, kwargs))
    if not any(type(arg) is _fake.FakeTensor for arg in flat_args):
        return UNCACHED  # without a fake tensor the mode may compute it for real
    try:
        with _fake.in_kernel_invocation_manager(mode):
            out = func(*args, **kwargs)
    except NotImplementedError:
        _META_ROUTES[func] = False
        return UNCACHED
    return mode.wrap_meta_outputs_with_default_device_logic(out, func, flat_args, device=kwargs.get("device"))
