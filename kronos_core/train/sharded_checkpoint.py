"""Resumable checkpoints of sharded (FSDP) runs with torch.distributed.checkpoint (DCP).

Layout under ``output_dir/checkpoints/``::

    last.pt              the small part, as for DDP runs (step, scheduler, scaler, RNG of every
                         rank, config), with "model"/"optimizer" None and "sharded_dir" naming:
    sharded-<step>-<id>/ the DCP folder: every rank writes its own shard of model and AdamW state

The DCP folder is complete before ``last.pt`` points at it (``last.pt`` is
replaced atomically), and older folders are removed only afterwards, so a
crash at any moment leaves a resumable pair.

DCP reshards on load: a sharded checkpoint resumes under another process count
(or as a plain single-process / DDP model), and a DDP checkpoint (whole
tensors in ``last.pt``) resumes into a sharded model.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from kronos_core.errors import KronosError, one_line
from kronos_core.train.train_state import save_atomic
from kronos_core.train.distributed import DistContext

SHARDED_KEY = "sharded_dir"
SHARDED_PREFIX = "sharded-"


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}


def save_sharded_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any],
                            path: Path, dist: DistContext) -> Path:
    """Every rank writes its shards into a new DCP folder next to `path`; rank 0 then points `path` at it.

    A collective: every rank calls it with the same `meta` (the small, replicated part of the state).
    """
    import torch.distributed.checkpoint as dcp

    folder = path.parent
    token = dist.broadcast_object(f"{meta['step']:08d}-{time.time_ns() % 10**9:09d}")
    name = SHARDED_PREFIX + token
    if dist.is_main:
        folder.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save(_state(model, optimizer), checkpoint_id=str(folder / name))
    dist.barrier()
    if dist.is_main:
        save_atomic({**meta, "model": None, "optimizer": None, SHARDED_KEY: name}, path)
        for old in folder.glob(SHARDED_PREFIX + "*"):
            if old.name != name and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return path


def load_sharded_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, checkpoint: dict[str, Any]) -> None:
    """Load the DCP folder a sharded `last.pt` points at into `model`/`optimizer` (sharded or not)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    where = Path(checkpoint["path"]).parent / checkpoint[SHARDED_KEY]
    if not where.is_dir():
        raise KronosError(f"{checkpoint['path']} points at the sharded folder {where}, which is missing; "
                          f"restore it or resume from another run")
    state = _state(model, optimizer)
    try:
        dcp.load(state, checkpoint_id=str(where))
    except Exception as error:  # DCP wraps shape/key mismatches of any rank in its own exception types
        first = one_line(error, typed=False)[:200]
        raise KronosError(f"{where}: the sharded weights do not fit this config's model ({first}); "
                          f"resume with the same model_size and what") from None
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_whole_into_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, checkpoint: dict[str, Any]) -> None:
    """Resume a sharded model from a DDP/single-process checkpoint (whole tensors, index-keyed AdamW state)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, set_model_state_dict, set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    try:
        set_model_state_dict(model, checkpoint["model"], options=options)
    except (RuntimeError, KeyError, ValueError) as error:
        raise KronosError(f"{checkpoint['path']}: model weights do not fit this config's model "
                          f"({one_line(error, typed=False)[:200]}); resume with the same model_size") from None
    set_optimizer_state_dict(model, optimizer, _keyed_by_name(model, checkpoint["optimizer"]), options=options)


def _keyed_by_name(model: nn.Module, saved: dict[str, Any]) -> dict[str, Any]:
    """torch.optim's state dict keys parameters by position; the DCP helpers key them by name.
    Positions follow build_optimizer: the trainable parameters in model order."""
    names = [name for name, param in model.named_parameters() if param.requires_grad]
    state = {names[index]: value for index, value in saved["state"].items()}
    groups = [{**group, "params": [names[index] for index in group["params"]]} for group in saved["param_groups"]]
    return {"state": state, "param_groups": groups}
