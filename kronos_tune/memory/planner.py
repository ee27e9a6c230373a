"""What fits where: per-rank memory of DDP and FSDP set-ups for a preset's cards, before running anything.

For each model size the planner estimates, per rank of the preset's
`device_count` devices, four set-ups: DDP (every rank holds everything), FSDP
(parameters, gradients and AdamW state sharded), FSDP + activation
checkpointing, and FSDP + CPU offload. Each estimate is a real training step
on fake tensors (kronos_tune.memory.estimate), with FSDP simulated as rank 0
of N (kronos_tune.memory.sharded); on a CUDA preset the CUDA emulation
(allocator rounding, AdamW implementation) applies and the budget is the card
minus the preset's CUDA context. The largest micro-batch comes from a line
through two probes (peak = fixed + per-sample x batch), verified by a third
estimate at the pick; accumulation then keeps the preset's effective batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import Preset

SETUPS = ("ddp", "fsdp", "fsdp+checkpointing", "fsdp+offload")
PLAN_SIZES = ("mini", "small", "base", "large")
CUDA_MARGIN = 0.10  # what a fake CUDA estimate cannot see (fragmentation, kernels' scratch): as autobatch
CPU_MARGIN = 0.05
MAX_MICRO_BATCH = 4096


@dataclass
class PlanRow:
    """One set-up of one model size, per rank, in bytes. `source`: estimated | measured."""

    setup: str
    ranks: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    frozen_bytes: int  # the frozen tokenizer and buffers (never sharded)
    activations_bytes: int  # the rest of the peak: activations, gathered FSDP units, temporaries
    host_bytes: int  # held in host memory per rank (CPU offload)
    peak_bytes: int  # at `micro_batch` (at 1 when nothing fits)
    micro_batch: int | None  # largest micro-batch that fits the budget (None: not even 1)
    train_micro_batch: int | None  # the largest one <= micro_batch that divides the preset's batch per rank
    accumulation_steps: int | None
    effective_batch: int | None
    preset_batch: int
    preset_batch_peak_bytes: int
    budget_bytes: int
    source: str = "estimated"
    note: str = ""

    @property
    def fits(self) -> bool:
        return self.micro_batch is not None


@dataclass
class SizePlan:
    model_size: str
    parameters: int
    rows: list[PlanRow]


@dataclass
class Plan:
    preset: str
    device: str
    ranks: int
    memory_per_device_bytes: int
    budget_bytes: int
    margin: float
    target_effective_batch: int
    sizes: list[SizePlan]
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for size in data["sizes"]:
            for row in size["rows"]:
                row["fits"] = row["micro_batch"] is not None
        return data


@dataclass
class _Probe:
    peak: int
    weights: int
    grads: int
    optimizer: int
    step_start: int
    largest_unit: int  # local bytes of the largest FSDP unit's parameters (offload's device-side copy)


def _estimate(config: Any, batch: int, ranks: int, emulation: Any) -> _Probe:
    from kronos_tune.autobatch.train_task import TrainTask
    from kronos_tune.memory.estimate import estimate_step_peak
    from kronos_tune.memory.sharded import SimulatedRanks

    def run(mesh: Any) -> _Probe:
        units: list[int] = []
        with TrainTask(config, device="cpu", mesh=mesh) as task:
            def build() -> Any:
                probe = task.estimate_step_factory(batch)
                holder["probe"] = probe
                units.append(_largest_unit_bytes(probe.model))
                return probe.model, probe.optimizer

            def step(model: Any, optimizer: Any, size: int, meter: Any = None) -> None:
                holder["probe"](meter)

            holder: dict[str, Any] = {}
            result = estimate_step_peak(build, step, batch, steps=2, cuda_emulation=emulation)
            holder.clear()
        trainable_grads = result.grad_bytes
        return _Probe(result.allocated_peak_bytes, result.param_bytes, trainable_grads,
                      result.optimizer_state_bytes, result.step_start_bytes, units[0] if units else 0)

    if config.parallelism == "fsdp":
        with SimulatedRanks(ranks) as simulated:
            return run(simulated.mesh)
    return run(None)


def estimate_setup_peak(config: Any, batch_size: int, ranks: int, cuda_emulation: Any = None) -> int:
    """Per-rank peak bytes of one steady-state training step of `config` at `batch_size` (FSDP: rank 0 of
    `ranks`), as the planner estimates it before adjustments (no DDP buckets, no offload)."""
    return _estimate(config, batch_size, ranks, cuda_emulation).peak


def _parameter_count(size: str) -> int:
    import torch

    from kronos_core.model import Kronos
    from kronos_core.sizes import size_spec

    with torch.device("meta"):
        return sum(p.numel() for p in Kronos(**size_spec(size).model).parameters())


def _largest_unit_bytes(model: Any) -> int:
    from kronos_core.train.fsdp import is_sharded, sharded_blocks

    if not is_sharded(model):
        return 0
    sizes = []
    for unit in [*sharded_blocks(model), model]:
        local = 0
        for param in unit.parameters(recurse=unit is not model):
            tensor = getattr(param, "_local_tensor", param)
            local += tensor.numel() * tensor.element_size()
        sizes.append(local)
    return max(sizes, default=0)


def _row(setup: str, probe_at: Callable[[int], _Probe], ranks: int, budget: int, margin: float,
         preset_batch: int, target_per_rank: int, offload: bool) -> PlanRow:
    """Largest micro-batch under budget x (1 - margin) from a line through two probes, checked by a third."""
    limit = budget * (1.0 - margin)

    def device_peak(p: _Probe) -> int:
        if not offload:
            return p.peak
        # Offload keeps shards, their gradients and AdamW state in host memory; the device holds a unit's
        # shard while it is gathered and its gradient until it is copied out.
        return p.peak - p.weights - p.grads - p.optimizer + 2 * p.largest_unit

    small_batch = 1
    large_batch = max(2, min(preset_batch, target_per_rank, 16))
    low, high = probe_at(small_batch), probe_at(large_batch)
    per_sample = max((device_peak(high) - device_peak(low)) / (large_batch - small_batch), 1.0)
    fixed = device_peak(low) - per_sample * small_batch
    pick: int | None = int(math.floor((limit - fixed) / per_sample))
    cap = max(target_per_rank, 1)
    pick = min(pick, cap, MAX_MICRO_BATCH) if pick >= 1 else None
    shown = high if pick == large_batch else low
    if pick is not None and pick not in (small_batch, large_batch):
        checked = probe_at(pick)
        while pick > 1 and device_peak(checked) > limit:  # the line was optimistic: step back along it
            pick = max(1, int(pick * limit / device_peak(checked)))
            checked = probe_at(pick)
        shown = checked
        if device_peak(checked) > limit:
            pick = None
    elif pick is not None and device_peak(shown) > limit:
        pick = None
    preset_peak = device_peak(probe_at(preset_batch)) if preset_batch not in (small_batch, large_batch) else \
        device_peak(low if preset_batch == small_batch else high)
    # Accumulation keeps the effective batch exactly: the micro-batch must divide the batch per rank.
    train_micro = max(d for d in range(1, pick + 1) if target_per_rank % d == 0) if pick else None
    accumulation = target_per_rank // train_micro if train_micro else None
    weights, grads, optimizer = shown.weights, shown.grads, shown.optimizer
    frozen = max(shown.step_start - weights - optimizer, 0)
    host = 0
    if offload:
        host, weights, grads, optimizer = weights + grads + optimizer, 0, 0, 0
    peak = device_peak(shown)
    note = ""
    if setup == "ddp":
        note = "grads include DDP's all-reduce buckets (one more copy of the gradients)"
    if offload:
        note = "derived from the FSDP estimate: shards, gradients and AdamW state moved to host memory"
    if pick == cap and cap < MAX_MICRO_BATCH:
        note = (note + "; " if note else "") + "micro-batch capped at the preset's batch per rank"
    return PlanRow(setup=setup, ranks=ranks, weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optimizer,
                   frozen_bytes=frozen, activations_bytes=max(peak - weights - grads - optimizer - frozen, 0),
                   host_bytes=host, peak_bytes=peak, micro_batch=pick, train_micro_batch=train_micro,
                   accumulation_steps=accumulation,
                   effective_batch=train_micro * accumulation * ranks if train_micro and accumulation else None,
                   preset_batch=preset_batch, preset_batch_peak_bytes=preset_peak, budget_bytes=budget, note=note)


def plan_preset(preset: Preset, sizes: tuple[str, ...] | None = None, ranks: int | None = None,
                setups: tuple[str, ...] | None = None, on_progress: Callable[[str], None] | None = None) -> Plan:
    """Estimate the set-ups (default: all) for every size (default: the published four) on the preset's
    cards, per rank of `ranks` (default: the preset's device count). Nothing is allocated."""
    from kronos_tune.autobatch.train_task import OPTIMIZER_EMULATION
    from kronos_tune.memory.estimate import CudaEmulation
    from kronos_tune.workloads import train_config_from_preset

    hardware, work = preset.hardware, preset.workload
    ranks = hardware.device_count if ranks is None else ranks
    if ranks < 2:
        raise KronosTuneError(f"preset {preset.name} has {ranks} device; sharding needs 2+ ranks: pass --ranks N "
                              f"to plan for N devices like it")
    sizes = tuple(sizes or PLAN_SIZES)
    setups = tuple(setups or SETUPS)
    from kronos_core.sizes import SIZES

    for name in sizes:
        if name not in SIZES:
            raise KronosTuneError(f"--size {name}: unknown model size; use one of {', '.join(PLAN_SIZES)}")
    for name in setups:
        if name not in SETUPS:
            raise KronosTuneError(f"--setup {name}: unknown set-up; use one of {', '.join(SETUPS)}")
    cuda = hardware.device == "cuda"
    budget = hardware.memory_per_device_bytes - (hardware.cuda_context_overhead_bytes if cuda else 0)
    margin = CUDA_MARGIN if cuda else CPU_MARGIN
    target_per_rank = work.batch_size * work.accumulation_steps
    plans = []
    for size in sizes:
        amp = "bf16" if work.amp == "fp16" else work.amp
        base, _ = train_config_from_preset(preset, model_size=size, amp=amp, data=["synthetic"])
        emulation = CudaEmulation(context_overhead_bytes=0,
                                  optimizer_impl=OPTIMIZER_EMULATION[base.optimizer_impl]) if cuda else None
        rows = []
        probes: dict[str, dict[int, _Probe]] = {}
        for setup in setups:
            if on_progress is not None:
                on_progress(f"{size}: {setup}")
            offload = setup == "fsdp+offload"
            changes: dict[str, Any] = {"parallelism": "ddp" if setup == "ddp" else "fsdp"}
            if setup == "fsdp+checkpointing":
                changes["activation_checkpointing"] = "all"
            config = base.replace(**changes)
            # Offload changes where the shards live, not the step: it reuses the FSDP row's estimates.
            cache = probes.setdefault("fsdp" if offload else setup, {})

            def probe_at(batch: int, config: Any = config, cache: dict[int, _Probe] = cache) -> _Probe:
                if batch not in cache:
                    probe = _estimate(config, batch, ranks, emulation)
                    if config.parallelism == "ddp":  # DDP's buckets: one more copy of the trainable gradients
                        probe = _Probe(probe.peak + probe.grads, probe.weights, 2 * probe.grads, probe.optimizer,
                                       probe.step_start, 0)
                    cache[batch] = probe
                return cache[batch]

            rows.append(_row(setup, probe_at, ranks, budget, margin, work.batch_size, target_per_rank, offload))
        params = _parameter_count(size)
        plans.append(SizePlan(size, params, rows))
    assumptions = [
        f"per rank of {ranks} {hardware.device} devices of {hardware.memory_per_device_gb:g} GiB; budget = card"
        + (f" - {hardware.cuda_context_overhead_gb:g} GiB CUDA context" if cuda else "")
        + f", picks keep a {margin:.0%} margin",
        f"workload: lookback {work.lookback_window} + predict {work.predict_window}, amp {work.amp}, "
        f"target effective batch {target_per_rank * ranks} ({target_per_rank} per rank)",
        "FSDP: rank 0 of N simulated on fake tensors (fake process group); FSDP gathers one Transformer "
        "block at a time (bf16 gathers with amp bf16)",
        "accumulation: FSDP rows assume fsdp_sync_micro_batches = true when accumulating (gradients stay "
        "sharded); without it non-final micro-batches keep unsharded gradients (+ a full gradient copy)",
        "fsdp+offload is derived from the FSDP estimate, not run: it needs a CUDA device",
    ]
    if work.amp == "fp16":
        assumptions.append("amp fp16 is estimated as bf16 (same 2-byte activations; FSDP refuses fp16)")
    return Plan(preset.name, hardware.device, ranks, hardware.memory_per_device_bytes, budget, margin,
                target_per_rank * ranks, plans, assumptions)
