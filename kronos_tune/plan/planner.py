"""What fits where: per-rank memory of DDP and FSDP set-ups for a preset's cards, before running anything.

For each model size the planner estimates, per rank of the preset's
`device_count` devices, four set-ups: DDP (every rank holds everything), FSDP
(parameters, gradients and AdamW state sharded), FSDP + activation
checkpointing, and FSDP + CPU offload. Each estimate is a real training step
on fake tensors (kronos_tune.memory.estimate), with FSDP simulated as rank 0
of N (kronos_tune.plan.setup_traces.SimulatedRanks); on a CUDA preset the CUDA emulation
(allocator rounding, AdamW implementation) applies and the budget is the card
minus the preset's CUDA context. The largest micro-batch is searched from the
guess of a line through two probes (peak = fixed + per-sample x batch): every
batch from 2 up has an exact estimate at no cost (below), so the search finds
the largest that fits where the line alone, which misses a peak that moves from
one point of the step to another, guessed low or high; accumulation then keeps
the preset's effective batch.

Each set-up is traced once, in worker processes and through the trace cache
(kronos_tune.plan.setup_traces).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kronos_tune.errors import KronosTuneError
from kronos_tune.memory.peak import CPU_MARGIN, CUDA_MARGIN, largest_fitting
from kronos_tune.plan.setup_traces import Job, SetupProbe, SetupProbes, run_sessions
from kronos_tune.presets import Preset

SETUPS = ("ddp", "fsdp", "fsdp+checkpointing", "fsdp+offload")
PLAN_SIZES = ("mini", "small", "base", "large")
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


def _probe_batches(preset_batch: int, target_per_rank: int) -> tuple[int, int]:
    """The two batch sizes the line of a row's first guess goes through (on the set-up's PeakModel unless the
    smaller is 1)."""
    large = max(2, min(preset_batch, target_per_rank, 16))
    return (2 if large > 2 else 1), large


def _row(setup: str, probe_at: Callable[[int], SetupProbe], ranks: int, budget: int, margin: float,
         preset_batch: int, target_per_rank: int, offload: bool) -> PlanRow:
    """Largest micro-batch under budget x (1 - margin), searched from the guess of a line through two probes;
    `probe_at` gives the peak at any batch size (a set-up's PeakModel: a search costs nothing), so the search
    finds the largest that fits where the line alone, which misses a peak that moves from one point of the
    step to another, guesses low or high."""
    limit = budget * (1.0 - margin)

    def device_peak(p: SetupProbe) -> int:
        if not offload:
            return p.peak
        # Offload keeps shards, their gradients and AdamW state in host memory; the device holds a unit's
        # shard while it is gathered and its gradient until it is copied out.
        return p.peak - p.weights - p.grads - p.optimizer + 2 * p.largest_unit

    small_batch, large_batch = _probe_batches(preset_batch, target_per_rank)
    low, high = probe_at(small_batch), probe_at(large_batch)
    per_sample = max((device_peak(high) - device_peak(low)) / (large_batch - small_batch), 1.0)
    fixed = device_peak(low) - per_sample * small_batch
    cap = min(max(target_per_rank, 1), MAX_MICRO_BATCH)
    guess = min(max(int(math.floor((limit - fixed) / per_sample)), 1), cap)
    pick = largest_fitting(lambda batch: device_peak(probe_at(batch)) <= limit, 1, cap, guess)  # None: not even 1
    shown = probe_at(pick or 1)
    preset_peak = device_peak(probe_at(preset_batch))
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
    from kronos_tune.autobatch.train_probes import OPTIMIZER_EMULATION
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
    # One job per size and parallelism: FSDP with and without activation checkpointing is one model switched
    # between two steps. Offload changes where the shards live, not the step: it reuses the FSDP estimates.
    traced_as = {"ddp": ("ddp", None), "fsdp": ("fsdp", None), "fsdp+offload": ("fsdp", None),
                 "fsdp+checkpointing": ("fsdp", "all")}  # None: the preset's own checkpointing
    traced: dict[tuple[str, str], tuple[str, str]] = {}  # (size, set-up) -> (parallelism, checkpointing)
    configs: dict[tuple[str, str], Any] = {}  # (size, parallelism) -> config
    settings: dict[tuple[str, str], list[str]] = {}  # and its checkpointing settings, in order
    emulations: dict[str, Any] = {}
    for size in sizes:
        amp = "bf16" if work.amp == "fp16" else work.amp
        base, _ = train_config_from_preset(preset, model_size=size, amp=amp, data=["synthetic"])
        emulations[size] = CudaEmulation(context_overhead_bytes=0,
                                         optimizer_impl=OPTIMIZER_EMULATION[base.optimizer_impl]) if cuda else None
        for setup in setups:
            parallelism, checkpointing = traced_as[setup]
            checkpointing = checkpointing or base.activation_checkpointing
            traced[(size, setup)] = (parallelism, checkpointing)
            configs.setdefault((size, parallelism), base.replace(parallelism=parallelism))
            if checkpointing not in settings.setdefault((size, parallelism), []):
                settings[(size, parallelism)].append(checkpointing)
    keys = list(configs)
    jobs: list[Job] = [(configs[key], ranks, emulations[key[0]], tuple(settings[key])) for key in keys]

    def started(index: int) -> None:
        if on_progress is not None:
            size, parallelism = keys[index]
            names = [setup for (of, setup), (how, _) in traced.items() if (of, how) == (size, parallelism)]
            on_progress(f"{size}: {', '.join(names)}")

    probes: dict[tuple[str, str, str], SetupProbes] = {}
    for key, job, sessions in zip(keys, jobs, run_sessions(jobs, started)):
        for checkpointing, session in zip(job[3], sessions):
            config = job[0].replace(activation_checkpointing=checkpointing)
            probes[(*key, checkpointing)] = SetupProbes(config, ranks, job[2], session)
    plans = []
    for size in sizes:
        rows = []
        for setup in setups:
            rows.append(_row(setup, probes[(size, *traced[(size, setup)])], ranks, budget, margin, work.batch_size,
                             target_per_rank, setup == "fsdp+offload"))
        any_setup = probes[(size, *traced[(size, setups[0])])]
        plans.append(SizePlan(size, any_setup.template.parameters, rows))
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
