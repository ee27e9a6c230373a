"""Checkpoint tensors in and out through the `safetensors` package.

Reads are memory-mapped (`safe_open`): on the CPU each tensor is a view of the
file's pages, so loading copies nothing and a page becomes resident only when
something reads it; for an accelerator the library copies each tensor there
straight from the map. Writes go through `kronos_core.files.atomic_path`, so a
failed save leaves the old file as it was (and a model still mapping it keeps
its weights). The library's errors become one KronosError line naming the file
and, where it can be told, the tensor, and saying what to do.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from kronos_core.errors import KronosError, one_line
from kronos_core.files import atomic_path

# Bytes per element of the header's dtype names: only used to say which tensor the library rejected.
_ELEMENT_BYTES = {"F64": 8, "I64": 8, "U64": 8, "C64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                  "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_REDO = "download or save it again"

DtypeChoice = torch.dtype | Mapping[str, torch.dtype] | None


def _device_name(device: str | torch.device) -> str:
    """The device as safe_open spells it ('cpu', 'cuda:0', ...); it rejects 'cpu:0'."""
    device = torch.device(device)
    return "cpu" if device.type == "cpu" else str(device)


def _what_is_wrong(path: Path, reason: str) -> str:
    """Read just the header again to name the tensor behind the library's `reason` (which names none)."""
    try:
        with open(path, "rb") as handle:
            size = path.stat().st_size
            raw_length = handle.read(8)
            (length,) = struct.unpack("<Q", raw_length) if len(raw_length) == 8 else (None,)
            if length is None or 8 + length > size:
                return f"{path} is truncated or not a safetensors file ({size} bytes); {_REDO}"
            header = json.loads(handle.read(length))
    except (OSError, ValueError):
        return f"{path} is not a valid safetensors file ({reason}); {_REDO}"
    body = size - 8 - length
    last_end = 0
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        try:
            start, end = (int(value) for value in info["data_offsets"])
            shape = [int(value) for value in info["shape"]]
        except (KeyError, TypeError, ValueError):
            return f"{path}: tensor '{name}' has no valid shape or data_offsets in the header; {_REDO}"
        element = _ELEMENT_BYTES.get(info.get("dtype"))
        if element is not None and end - start != math.prod(shape) * element:
            return (f"{path}: tensor '{name}' is {info['dtype']} of shape {tuple(shape)} ({math.prod(shape) * element} "
                    f"bytes) but its data span is {end - start} bytes; the file is corrupt, {_REDO}")
        if end > body:
            return (f"{path} is truncated: tensor '{name}' needs bytes {start}..{end} of the data section but only "
                    f"{body} are present; {_REDO}")
        last_end = max(last_end, end)
    if body > last_end:
        return f"{path} has {body - last_end} bytes after its last tensor; the file is corrupt, {_REDO}"
    return f"{path} is not a valid safetensors file ({reason}); {_REDO}"


@contextmanager
def _opened(path: Path, device: str | torch.device) -> Iterator:
    try:
        handle = safe_open(str(path), framework="pt", device=_device_name(device))
    except FileNotFoundError:
        raise KronosError(f"{path} does not exist; check the path") from None
    except OSError as error:
        raise KronosError(f"cannot read {path}: {error.strerror or error}; check the path and permissions") from None
    except SafetensorError as error:
        message = str(error)
        if "device" in message and "invalid" in message:
            raise KronosError(f"cannot load {path} onto device '{device}': {message}; "
                              f"use cpu, cuda or cuda:N") from None
        raise KronosError(_what_is_wrong(path, message)) from None
    with handle:
        yield handle


def _target_dtype(name: str, tensor: torch.Tensor, dtype: DtypeChoice) -> torch.dtype:
    if isinstance(dtype, Mapping):
        return dtype.get(name, tensor.dtype)
    if dtype is not None and tensor.is_floating_point():
        return dtype
    return tensor.dtype


def load_safetensors(path: str | Path, device: str | torch.device = "cpu", dtype: DtypeChoice = None,
                     check: Callable[[dict[str, tuple[int, ...]]], None] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a .safetensors file, memory-mapped, on `device`.

    `dtype`: one dtype for the floating-point tensors (integer ones keep theirs), or a dtype per name.
    `check` sees each tensor's shape from the header before any tensor data is touched or moved.
    """
    path = Path(path)
    with _opened(path, device) as handle:
        names = list(handle.keys())
        if check is not None:
            check({name: tuple(handle.get_slice(name).get_shape()) for name in names})
        tensors: dict[str, torch.Tensor] = {}
        for name in names:
            try:
                tensor = handle.get_tensor(name)
            except SafetensorError as error:
                raise KronosError(f"{path}: cannot read tensor '{name}' ({error}); {_REDO}") from None
            except RuntimeError as error:  # the device: no CUDA, out of memory
                raise KronosError(f"cannot load tensor '{name}' of {path} onto {device}: "
                                  f"{one_line(error, typed=False)}") from None
            target = _target_dtype(name, tensor, dtype)
            tensors[name] = tensor if tensor.dtype == target else tensor.to(target)
    return tensors


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: str | Path,
                     metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` (any device; copied to the host as the library writes) to `path` atomically."""
    path = Path(path)
    prepared = {name: tensor.detach().contiguous() for name, tensor in tensors.items()}
    try:
        with atomic_path(path) as temp:
            save_file(prepared, str(temp), metadata=metadata)
    except OSError as error:
        raise KronosError(f"cannot write {path}: {error.strerror or error}; check free space and permissions") from None
    except (SafetensorError, ValueError, RuntimeError) as error:  # a failed write, shared or sparse tensors
        first = one_line(error, typed=False)
        if "I/O error" in first:
            raise KronosError(f"cannot write {path} ({first}); check free space and permissions") from None
        raise KronosError(f"cannot save tensors to {path}: {first}") from None
