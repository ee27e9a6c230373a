"""Read and write the safetensors format with torch alone.

The format is an 8-byte little-endian header length, a JSON header mapping each
tensor name to {dtype, shape, data_offsets}, then the raw little-endian bytes.
Nothing is ever unpickled. Errors name the file and what is wrong with it.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import torch

from kronos_core.errors import KronosError

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def load_safetensors(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Load every tensor of a .safetensors file; a truncated or corrupt file raises KronosError."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise KronosError(f"cannot read {path}: {error.strerror or error}; check the path and permissions") from None
    if len(data) < 8:
        raise KronosError(f"{path} is truncated ({len(data)} bytes, no header); download or save it again")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > _MAX_HEADER_BYTES or 8 + header_len > len(data):
        raise KronosError(f"{path} is truncated or not a safetensors file (header of {header_len} bytes "
                          f"in a {len(data)}-byte file); download or save it again")
    try:
        header = json.loads(data[8:8 + header_len])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise KronosError(f"{path} has a corrupt header (not JSON); download or save it again") from None
    body = memoryview(data)[8 + header_len:]
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise KronosError(f"{path}: tensor '{name}' has unsupported dtype {info.get('dtype')!r}")
        start, end = info["data_offsets"]
        if end > len(body):
            raise KronosError(f"{path} is truncated: tensor '{name}' needs bytes {start}..{end} of the data "
                              f"section but only {len(body)} are present; download or save it again")
        shape = tuple(info["shape"])
        if start == end:
            tensor = torch.empty(shape, dtype=dtype)
        else:
            tensor = torch.frombuffer(bytearray(body[start:end]), dtype=dtype).reshape(shape)
            if sys.byteorder == "big":
                tensor = tensor.byteswap() if hasattr(tensor, "byteswap") else tensor
        tensors[name] = tensor.to(device)
    return tensors


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write tensors atomically (temp file, then rename) in name order."""
    path = Path(path)
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        if tensor.dtype not in _NAMES:
            raise KronosError(f"cannot save tensor '{name}' of dtype {tensor.dtype} to safetensors")
        raw = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    temp = path.with_name(path.name + ".tmp")
    with open(temp, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for raw in blobs:
            handle.write(raw)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
