"""Exact memory meters, fake-tensor estimates and simulated devices.

Answers "does batch B fit on device D" by measurement:

* ``CpuExactMeter`` counts live tensor storages byte-exactly (dispatcher level);
* ``CudaMeter`` reads the CUDA caching allocator's per-phase peaks;
* ``estimate_step_peak`` / ``FakeEstimate`` run a step on fake tensors to get
  the same number without allocating, optionally emulating CUDA;
* ``MemoryBudget`` / ``apply_cuda_budget`` make a smaller device out of this one.
"""

from __future__ import annotations

from kronos_core.deferred import lazy_exports

# Loaded on first use (as kronos_core.train's names): the meters and estimates load torch, while the peak model
# and the margin check (kronos_tune.memory.peak) that a command's bad-flag errors use need none.
_EXPORTS = {
    **{name: "kronos_tune.memory.live_bytes" for name in ("MemoryBudget", "OutOfMemoryError", "StorageTracker",
                                                           "apply_cuda_budget")},
    **{name: "kronos_tune.memory.estimate" for name in ("CudaEmulation", "EstimateResult", "FakeEstimate",
                                                         "estimate_step_peak")},
    **{name: "kronos_tune.memory.meters" for name in ("CpuExactMeter", "CudaMeter", "LiveMeter",
                                                       "make_meter")},
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
