"""Resumable training state (checkpoints/last.pt: weights, optimizer, schedule, RNG): atomic writes,
`weights_only=True` loads, RNG states as tensors.

A checkpoint file holds only tensors, numbers, strings, lists and dicts, so it
loads with ``torch.load(..., weights_only=True)`` (nothing is unpickled beyond
those). Random-number states are stored as tensors: torch's CPU and CUDA
generator states are byte tensors already; numpy's MT19937 key and Python's
``random`` state become int64 tensors plus plain numbers.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kronos_core.errors import KronosError, one_line
from kronos_core.files import atomic_path

CHECKPOINT_FORMAT = 1
LAST_NAME = "last.pt"
CHECKPOINT_DIR = "checkpoints"


def checkpoint_path(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR / LAST_NAME


def capture_rng() -> dict[str, Any]:
    """Every random-number state that can influence a training step, as tensors and numbers."""
    kind, key, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy_key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
        "numpy_pos": int(pos),
        "numpy_has_gauss": int(has_gauss),
        "numpy_cached_gaussian": float(cached),
        "python": torch.tensor(py_state, dtype=torch.int64),
        "python_version": int(version),
        "python_gauss_next": gauss_next,
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    key = state["numpy_key"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", key, state["numpy_pos"], state["numpy_has_gauss"],
                         state["numpy_cached_gaussian"]))
    random.setstate((state["python_version"], tuple(int(v) for v in state["python"].tolist()),
                     state["python_gauss_next"]))
    cuda_states = state.get("cuda") or []
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states[:torch.cuda.device_count()])


def save_atomic(payload: dict[str, Any], path: str | os.PathLike) -> Path:
    """torch.save through `atomic_path`: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temp:
        torch.save(payload, temp)
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a training checkpoint (a .pt file, or an output folder holding checkpoints/last.pt)."""
    path = Path(path)
    if path.is_dir():
        candidate = checkpoint_path(path)
        if not candidate.is_file():
            raise KronosError(f"{path} holds no {CHECKPOINT_DIR}/{LAST_NAME}; pass the output folder of a "
                              f"training run (or the .pt file itself) to resume")
        path = candidate
    if not path.is_file():
        raise KronosError(f"checkpoint {path} not found; pass the output folder of a training run to resume")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # unpickling errors come in many types
        raise KronosError(f"{path} is not a loadable training checkpoint ({one_line(error, typed=False)}); "
                          f"use a checkpoints/{LAST_NAME} written by kronos_core.train") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise KronosError(f"{path} is not a kronos_core.train checkpoint (format "
                          f"{payload.get('format') if isinstance(payload, dict) else '?'}); "
                          f"resume from a checkpoints/{LAST_NAME} written by this version")
    payload["path"] = str(path)
    return payload
