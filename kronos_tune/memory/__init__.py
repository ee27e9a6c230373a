"""Exact memory meters, fake-tensor estimates and simulated devices.

Answers "does batch B fit on device D" by measurement:

* ``CpuExactMeter`` counts live tensor storages byte-exactly (dispatcher level);
* ``CudaMeter`` reads the CUDA caching allocator's per-phase peaks;
* ``estimate_step_peak`` / ``FakeEstimate`` run a step on fake tensors to get
  the same number without allocating, optionally emulating CUDA;
* ``MemoryBudget`` / ``apply_cuda_budget`` make a smaller device out of this one.
"""

from kronos_core.train.live_bytes import StorageTracker
from kronos_tune.memory.budget import MemoryBudget, OutOfMemoryError, apply_cuda_budget
from kronos_tune.memory.estimate import CudaEmulation, EstimateResult, FakeEstimate, estimate_step_peak
from kronos_tune.memory.meters import CpuExactMeter, CudaMeter, CudaPhaseStats, LiveMeter, make_meter

__all__ = [
    "CpuExactMeter",
    "CudaEmulation",
    "CudaMeter",
    "CudaPhaseStats",
    "EstimateResult",
    "FakeEstimate",
    "MemoryBudget",
    "OutOfMemoryError",
    "LiveMeter",
    "StorageTracker",
    "apply_cuda_budget",
    "estimate_step_peak",
    "make_meter",
]
