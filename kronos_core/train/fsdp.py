"""Sharded data parallelism (ZeRO-3 style) with PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`).

Each Transformer block becomes its own FSDP unit, then the root module takes
what is left (embeddings, final norm, dependency layer, heads), as torchtitan
does: one block's parameters are gathered at a time, so the unsharded working
set is one block plus the root's, while every rank keeps 1/N of the parameters,
gradients and AdamW state between steps.

Mixed precision follows ``amp``:

* ``none``: parameters gathered, computed and reduced in fp32 (no policy).
* ``bf16``: parameters all-gathered and computed in bf16 (half the gather
  traffic and unsharded bytes), gradients reduce-scattered in fp32 so the sum
  over ranks keeps fp32 precision; the sharded master weights and AdamW state
  stay fp32. Autocast stays on as well, so the ops autocast keeps in fp32 do
  so with FSDP as they do with DDP.
* ``fp16`` is refused at config time: it needs a grad scaler over sharded
  DTensor gradients, which this project has not verified.

With CPU offload the sharded parameters, their gradients and the optimizer
state live in host memory and AdamW steps there; FSDP copies a unit's shard
to the device just before gathering it.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from kronos_core.errors import KronosError
from kronos_core.layers import TransformerBlock
from kronos_core.train.config import TrainConfig

REDUCE_DTYPE = torch.float32


def mixed_precision_policy(amp: str):
    """FSDP2 MixedPrecisionPolicy for an ``amp`` setting (see the module docstring for the choice)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if amp == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=REDUCE_DTYPE)
    if amp == "none":
        return MixedPrecisionPolicy()
    raise KronosError(f"amp={amp!r} has no FSDP mixed-precision policy here; use amp = \"bf16\" or \"none\" "
                      f"with parallelism = \"fsdp\"")


def sharded_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules that become their own FSDP unit: every Transformer block, in forward order."""
    return [module for module in model.modules() if isinstance(module, TransformerBlock)]


def device_mesh(device: torch.device, world_size: int):
    """A 1-D mesh over every rank of the default process group."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world_size,))


def apply_fsdp(model: nn.Module, config: TrainConfig, device: torch.device, world_size: int,
               mesh=None) -> nn.Module:
    """Shard `model` in place over all ranks of the default process group; returns the same object.

    The model must hold identical weights on every rank (built from the same
    seed or checkpoint): each rank keeps its slice of those. `mesh` defaults
    to `device_mesh(device, world_size)` (pass one made outside a fake-tensor mode).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    # Our losses never modify a module's output in place, which is what this warning is about.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mesh = device_mesh(device, world_size) if mesh is None else mesh
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if config.fsdp_cpu_offload else OffloadPolicy()
    common = dict(mesh=mesh, mp_policy=mixed_precision_policy(config.amp), offload_policy=offload)
    blocks = sharded_blocks(model)
    for index, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward: keeping them saves one gather.
        reshard = config.fsdp_reshard_after_forward and index < len(blocks) - 1
        fully_shard(block, reshard_after_forward=reshard, **common)
    # FSDP2 never reshards the root after forward (backward starts with it).
    fully_shard(model, reshard_after_forward=config.fsdp_reshard_after_forward, **common)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def gather_once(model: nn.Module) -> None:
    """Gather and free every sharded unit's parameters once, which creates the buffers the first forward would
    (a memory estimate primes a step with them instead of running one). Nothing for an unsharded model."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.unshard()
            module.reshard()


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Reduce-scatter gradients in this backward (True) or keep accumulating unsharded ones locally (False)."""
    model.set_requires_gradient_sync(enabled)  # type: ignore[operator]


def local_norm_value(norm: torch.Tensor) -> float:
    """A gradient norm as a float: a DTensor norm (sharded gradients) is reduced over ranks first."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if callable(full) else norm)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state on CPU, on rank 0 (other ranks get an empty dict). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


