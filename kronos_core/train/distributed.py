"""Process-group setup from torchrun's environment, and the reductions the trainer needs.

torchrun (``python -m torch.distributed.run``) starts one process per device and
sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; with
WORLD_SIZE > 1 we join its process group (gloo on CPU, nccl on CUDA). A plain
``python`` run is rank 0 of 1 and never touches torch.distributed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from kronos_core.errors import KronosError


@dataclass
class DistContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str | None = None
    owns_group: bool = False  # we created the process group, so we destroy it

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device_type: str) -> DistContext:
        """Join torchrun's process group when WORLD_SIZE > 1; otherwise a single-process context."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        backend = "nccl" if device_type == "cuda" else "gloo"
        if dist.is_initialized():
            return cls(dist.get_rank(), local_rank, dist.get_world_size(), dist.get_backend(), owns_group=False)
        if not dist.is_available():
            raise KronosError("WORLD_SIZE > 1 but this PyTorch build has no torch.distributed; "
                              "install a full PyTorch or run one process")
        if device_type == "cuda":
            if local_rank >= torch.cuda.device_count():
                raise KronosError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices are "
                                  f"visible; start at most that many processes per node (--nproc)")
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=30))
        return cls(rank, local_rank, world, backend, owns_group=True)

    def device(self, device_type: str) -> torch.device:
        return torch.device("cuda", self.local_rank) if device_type == "cuda" else torch.device("cpu")

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def all_gather_object(self, value: Any) -> list[Any]:
        if not self.enabled:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def broadcast_object(self, value: Any) -> Any:
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            # Every rank finishes its last collective before any tears its connections
            # down: a rank that leaves early can make gloo abort the others mid-call.
            try:
                if dist.get_backend() == "gloo":
                    dist.monitored_barrier(timeout=timedelta(seconds=60))
                else:
                    dist.barrier()
            except Exception:  # noqa: BLE001 - a rank already gone: nothing left to wait for
                pass
            dist.destroy_process_group()
            self.owns_group = False
