"""Per-rank memory of sharded (FSDP) training for N ranks, in one process and without N devices.

``SimulatedRanks(N)`` joins a *fake* process group as rank 0 of N (PyTorch's
testing backend: collectives return at once, nothing is communicated) and
builds the device mesh outside any fake-tensor mode. Inside it, a model
sharded with ``kronos_core.train.fsdp.apply_fsdp(..., mesh=ranks.mesh)`` holds
exactly rank 0's shards, gathers into real-sized buffers, and its step can
run on fake tensors under ``estimate_step_peak``: the estimate is rank 0's
peak. Rank 0 holds the largest shards when a dimension does not divide
evenly (FSDP pads the last ranks' shards, so they are never larger).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from kronos_tune.errors import KronosTuneError


class SimulatedRanks:
    """Context manager: this process is rank 0 of a fake `world_size`-rank group (with a CPU mesh)."""

    def __init__(self, world_size: int) -> None:
        if world_size < 1:
            raise KronosTuneError(f"world size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.mesh: Any = None
        self._owns = False

    def __enter__(self) -> SimulatedRanks:
        if not dist.is_available():
            raise KronosTuneError("this PyTorch build has no torch.distributed; sharded estimates need it")
        if dist.is_initialized():
            raise KronosTuneError("a process group is already running in this process; estimate sharded "
                                  "memory from a plain process (not under torchrun)")
        from kronos_tune.torch_private import fake_store
        from kronos_core.train.fsdp import device_mesh

        dist.init_process_group("fake", store=fake_store(), rank=0, world_size=self.world_size)
        self._owns = True
        self.mesh = device_mesh(torch.device("cpu"), self.world_size)
        return self

    def __exit__(self, *exc: object) -> None:
        self.mesh = None
        if self._owns and dist.is_initialized():
            dist.destroy_process_group()
        self._owns = False
