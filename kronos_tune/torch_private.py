"""Every private PyTorch name the project uses, in this one module.

Two kinds:

* Names with no public equivalent, used always: ``TorchDispatchMode`` (the tracker of live bytes),
  ``FakeTensor``/``FakeTensorMode`` (the estimates' fake tensors), ``FakeStore`` (the fake process group of
  simulated ranks), a DTensor's local shard (``local_shard``) and the profiler's memory timeline by category
  (``memory_timeline``, for `kronos-tune profile`, which keeps its report without it).
* Shortcuts through FakeTensorMode (``CountingFakeMode`` with ``shortcuts=True``), which change how fast a
  fake step runs, never what it counts. FakeTensorMode caches the metadata of an op's outputs by a key built
  from everything about its arguments (``FakeTensorMode._cache_key``); on a fake training step nearly every op
  is a cache hit, and building that key was about half of each op's cost. ``LightKeys`` keeps its own map from
  a key it builds from the same facts, read directly off the tensors, to the mode's cache entry; a hit makes
  the outputs as the mode makes them from the entry (``_Output`` for the common single fresh or view output,
  else the mode's ``_output_from_cache_entry``). A light key holds everything the mode's key holds for a dense
  tensor (memory format and contiguity follow from shape and strides), so two calls with one light key have
  one mode key and get the same entry. On the first call of a light key the mode's own key is taken before
  the op runs (an in-place op changes its arguments) and the op goes through the mode, which caches it or not.
  Arguments the light key does not describe (another mode's tensors, constants, symbolic sizes, functions) go
  through the mode; a tensor subclass the mode does not handle (a DTensor) gets the mode's NotImplemented at
  once. Of the ops the mode does not cache, those whose dispatch ends at the op's meta kernel (FSDP's copy-in
  and split ops) run it directly (``run_meta_kernel``), as the mode would after its checks. Also: ``prim.device``
  is answered as FakeTensor answers it, the profiler ranges FSDP opens are run without dispatch, and
  torch.compile's wrapper around the dispatch is left out. An in-place element-wise op with no outputs on
  DTensors (FSDP's optimizer step, gradient clipping's scale) runs on their local shards where DTensor would
  redistribute nothing (``local_elementwise_call``), instead of after DTensor's sharding propagation (a
  second per model); the fused optimizer step runs its meta kernel directly (no outputs to look up or count).

The shortcuts are on when every private name they use exists in this PyTorch and ``KRONOS_PRIVATE_TORCH`` is
not ``off``; without them every op goes through FakeTensorMode's own (public) dispatch, with the same figures
(tests/test_fake_cache.py checks both ways give identical traces and plans).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._subclasses import fake_tensor as _fake
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["FakeTensor", "FakeTensorMode", "TorchDispatchMode", "CountingFakeMode", "SHORTCUTS", "fake_store",
           "local_shard", "memory_timeline", "shortcuts_available", "shortcuts_wanted"]

SHORTCUTS_ENV = "KRONOS_PRIVATE_TORCH"


def fake_store() -> Any:
    """The store of PyTorch's fake process group (its testing backend: collectives return at once)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (read as an attribute: ``to_local()`` would be an op that meters see), else the
    tensor itself."""
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor


def memory_timeline(prof: Any, device: str) -> tuple[list[list[int]], dict[int, str]]:
    """A finished profile's memory timeline on ``device``: bytes per category at every recorded time, and each
    column's category name. Raises whatever this PyTorch raises where its private memory profiler changed."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(device)
    names = {index + 1: (category.name.lower() if category is not None else "unknown")
             for category, index in _CATEGORY_TO_INDEX.items()}
    names[0] = "unknown"
    return sizes, names


_SHORTCUT_NAMES = (
    (_fake, ("_CacheKeyState", "_DISPATCH_META_HANDLERS", "_DISPATCH_HANDLE_DIRECTLY", "_BypassDispatchCache",
             "_DispatchCacheValidEntry", "in_kernel_invocation_manager", "op_implementations_checks", "has_meta",
             "torch_decomp_decompositions")),
    (FakeTensorMode, ("_cache_key", "_output_from_cache_entry", "cache", "cpp_meta_supports_symint",
                      "wrap_meta_outputs_with_default_device_logic", "_should_skip_dynamo")),
    (torch._C, ("_get_default_device", "_DisableTorchDispatch", "_dispatch_has_kernel_for_dispatch_key")),
    (torch._ops, ("OpOverload",)),
    (torch.utils._pytree, ("tree_leaves",)),
)


def shortcuts_available() -> bool:
    """Whether this PyTorch has every private name the shortcuts use."""
    if not all(hasattr(owner, name) for owner, names in _SHORTCUT_NAMES for name in names):
        return False
    try:
        import torch._library.simple_registry  # noqa: F401

        return hasattr(torch.ops.prim, "device")
    except (ImportError, AttributeError, RuntimeError):
        return False


def shortcuts_wanted() -> bool:
    """The shortcuts' default: on where available, unless ``KRONOS_PRIVATE_TORCH=off``."""
    return os.environ.get(SHORTCUTS_ENV, "").strip().lower() != "off" and shortcuts_available()


SHORTCUTS = shortcuts_wanted()

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


_aten = torch.ops.aten
# In-place element-wise ops with no outputs: the fused and foreach optimizer steps, gradient clipping's scale.
_LOCAL_ELEMENTWISE = frozenset(
    getattr(getattr(_aten, name, None), overload, None)
    for name, overloads in (("_fused_adamw_", ("default",)), ("_fused_adam_", ("default",)),
                            ("_foreach_mul_", ("Tensor", "Scalar", "List", "ScalarList")),
                            ("_foreach_add_", ("Tensor", "Scalar", "List", "ScalarList")),
                            ("_foreach_lerp_", ("Scalar", "List")), ("_foreach_addcmul_", ("Scalar", "ScalarList")),
                            ("_foreach_addcdiv_", ("Scalar", "ScalarList")),
                            ("_foreach_div_", ("Tensor", "Scalar", "List", "ScalarList")))
    for overload in overloads) - {None}


_FUSED_STEPS = frozenset(getattr(getattr(_aten, name, None), "default", None)
                         for name in ("_fused_adamw_", "_fused_adam_")) - {None}


def _all_fake_of(mode: _fake.FakeTensorMode, args: tuple, kwargs: dict) -> bool:
    """Whether every tensor among the arguments is a fake tensor of `mode`."""
    for value in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(value, torch.Tensor) and (type(value) is not FakeTensor or value.fake_mode is not mode):
            return False
    return True


def local_elementwise_call(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """The arguments of DTensor's own dispatch of `func` on their local shards, where DTensor redistributes
    nothing and runs the op on the local shards. That is: `func` is an in-place element-wise op with no outputs
    (``_LOCAL_ELEMENTWISE``); every tensor outside a list is 0-dim (a plain tensor, or a replicated DTensor);
    every list holds either such 0-dim tensors or DTensors of one mesh and one placement that is not a partial
    sum, with the shapes of the first such list, element by element. Else None (DTensor decides)."""
    if func not in _LOCAL_ELEMENTWISE:
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without torch.distributed has no DTensor
        return None

    layout: list[Any] = [None, None, None]  # the lists' mesh, placements and shapes

    def scalar(value: Any) -> Any:
        if value.ndim != 0:
            raise _Foreign  # broadcast against sharded tensors: DTensor may redistribute
        if isinstance(value, DTensor):
            if not all(placement.is_replicate() for placement in value.placements):
                raise _Foreign
            same_mesh(value.device_mesh)
            return local_shard(value)
        return value

    def same_mesh(mesh: Any) -> None:
        if layout[0] is None:
            layout[0] = mesh
        elif mesh is not layout[0] and mesh != layout[0]:
            raise _Foreign  # (equal meshes: DTensor's cached propagation hands out the mesh it first saw)

    def shards(values: list | tuple) -> list[Any]:
        if not isinstance(values[0], DTensor):
            raise _Foreign
        placements = values[0].placements
        if any(placement.is_partial() for placement in placements):
            raise _Foreign
        shapes = [value.shape for value in values]
        if layout[1] is None:
            layout[1], layout[2] = placements, shapes
        elif placements != layout[1] or shapes != layout[2]:
            raise _Foreign
        locals_ = []
        for value in values:
            if not isinstance(value, DTensor) or value.placements != placements:
                raise _Foreign
            same_mesh(value.device_mesh)
            locals_.append(local_shard(value))
        return locals_

    def local(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return scalar(value)
        if type(value) is list or type(value) is tuple:
            if value and not all(isinstance(item, torch.Tensor) and item.ndim == 0 for item in value):
                return type(value)(shards(value))
            return type(value)(scalar(item) for item in value)
        return value

    try:
        return tuple(local(arg) for arg in args), {name: local(value) for name, value in kwargs.items()}
    except _Foreign:
        return None


def _profiler_range_ops() -> frozenset[Any]:
    ops = []
    for name, overload in (("_record_function_enter_new", "default"), ("_record_function_exit", "_RecordFunction")):
        op = getattr(getattr(torch.ops.profiler, name, None), overload, None)
        if op is not None:
            ops.append(op)
    return frozenset(ops)


class CountingFakeMode(FakeTensorMode):
    """Fake tensors whose every top-level op's outputs go to ``seen(outputs, op)``, through FakeTensorMode's own
    dispatch. One Python dispatch layer per op instead of two (a tracking mode stacked on a fake mode): about a
    tenth of a planner trace's time. Ops the fake mode dispatches while handling one (decompositions) are not
    seen, as they were not by a mode above it. ``CountingFakeMode.make`` gives the one with the shortcuts."""

    def __init__(self, seen: Callable[[Any, Any], None]) -> None:
        super().__init__()
        self.seen = seen
        self._handling = False

    @staticmethod
    def make(seen: Callable[[Any, Any], None], shortcuts: bool | None = None) -> CountingFakeMode:
        """The counting mode, with the shortcuts where ``shortcuts`` (default: ``SHORTCUTS``) says so."""
        return (_ShortcutFakeMode if (SHORTCUTS if shortcuts is None else shortcuts) else CountingFakeMode)(seen)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return self._through_mode(func, types, args, kwargs or {})

    def _through_mode(self, func, types, args, kwargs):  # type: ignore[no-untyped-def]
        if self._handling:
            return super().__torch_dispatch__(func, types, args, kwargs)
        self._handling = True
        try:
            out = super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self._handling = False
        self.seen(out, func)
        return out


if shortcuts_available():
    _PRIM_DEVICE: Any = torch.ops.prim.device.default
    # The profiler ranges FSDP opens and closes around every unit (hundreds a step) hold no tensors (a name in,
    # a handle out and back), and the mode answers them by running them, after a search for a fake kernel that
    # costs a millisecond each: they are run directly.
    _RUN_AS_THEY_ARE = _profiler_range_ops()
else:
    _PRIM_DEVICE, _RUN_AS_THEY_ARE = None, frozenset()


class _ShortcutFakeMode(CountingFakeMode):
    """CountingFakeMode with the shortcuts (this module's docstring)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ so that torch.compile skips it: a fake
        # estimate never runs under torch.compile, and the wrapper costs a few microseconds on every op.
        return False

    def __init__(self, seen: Callable[[Any, Any], None]) -> None:
        super().__init__(seen)
        self._light_keys = LightKeys(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is _PRIM_DEVICE and len(args) == 1 and isinstance(args[0], FakeTensor):
            # Asked thousands of times a step (autograd, TensorIterator): answered as FakeTensor itself answers
            # it, without the mode's dispatch layers (a tenth of a step).
            return torch.device("meta") if args[0].fake_mode.in_kernel_invocation else args[0].fake_device
        kwargs = kwargs or {}
        if func in _RUN_AS_THEY_ARE:
            with torch._C._DisableTorchDispatch():
                return func(*args, **kwargs)
        if func in _FUSED_STEPS and _all_fake_of(self, args, kwargs):
            # No outputs, so nothing to find in a cache or to count: the keys would cost more than the op.
            out = run_meta_kernel(self, func, args, kwargs)
            if out is not UNCACHED:
                return out
        keys = self._light_keys
        key = keys.key(func, args, kwargs)
        if key is None:
            return self._through_mode(func, types, args, kwargs)
        if key is FOREIGN:
            local = local_elementwise_call(func, args, kwargs)
            if local is None:
                return NotImplemented  # as the mode answers: the subclass (a DTensor) dispatches to its locals
            return self.__torch_dispatch__(func, (FakeTensor,), *local)
        out = keys.outputs(key, func, args)
        if out is UNKNOWN:
            mode_key = keys.mode_key(func, args, kwargs)
            out = self._through_mode(func, types, args, kwargs)
            keys.learn(key, mode_key, func)
            return out
        if out is UNCACHED:
            out = run_meta_kernel(self, func, args, kwargs)
            if out is UNCACHED:
                return self._through_mode(func, types, args, kwargs)
        if not self._handling:
            self.seen(out, func)
        return out
