"""What fits where: per-rank memory of DDP and FSDP set-ups for a preset's cards, before running anything.

For each model size the planner estimates, per rank of the preset's
`device_count` devices, four set-ups: DDP (every rank holds everything), FSDP
(parameters, gradients and AdamW state sharded), FSDP + activation
checkpointing, and FSDP + CPU offload. Each estimate is a real training step
on fake tensors (kronos_tune.memory.estimate), with FSDP simulated as rank 0
of N (kronos_tune.memory.sharded); on a CUDA preset the CUDA emulation
(allocator rounding, AdamW implementation) applies and the budget is the card
minus the preset's CUDA context. The largest micro-batch is searched from the
guess of a line through two probes (peak = fixed + per-sample x batch): every
batch from 2 up has an exact estimate at no cost (below), so the search finds
the largest that fits where the line alone, which misses a peak that moves from
one point of the step to another, guessed low or high; accumulation then keeps
the preset's effective batch.

Each set-up is traced once (`_session`): one build, primed like a first step
(`ProbeStep.prime`: optimizer state, position tables and FSDP buffers made
without a forward or backward), then one step at a marker batch size whose
live bytes are split into the storages that scale with the batch and the
others (`FakeEstimate.trace_line`). A probe at any batch size from 2 takes its
peak from that `peak.PeakModel` (the live bytes at every point of the step
are affine in the batch size, so the peak is the highest of those lines) and
every other figure from the traced step, which do not depend on the batch
size; batch 1 (where some copies are views) is traced on its own when a row
needs it. Sessions run in worker processes when there are several, and land in
the trace cache (`trace_cache`), so a repeated plan traces nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import Preset

if TYPE_CHECKING:
    from kronos_tune.memory.estimate import EstimateResult, FakeEstimate, StepTrace
    from kronos_tune.memory.peak import PeakModel

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
    parameters: int  # the model's parameter count (FSDP: of the whole model, not the shard)


def _estimating(config: Any, ranks: int, emulation: Any, primed: bool,
                measure: Callable[[FakeEstimate], Any]) -> tuple[Any, int, int]:
    """`measure(estimate)` for a FakeEstimate of `config`'s training step (FSDP: rank 0 of `ranks` simulated),
    its build primed like a first step (`ProbeStep.prime`; `primed=False`: warmed up by a step instead), the
    local bytes of the model's largest FSDP unit and the model's parameter count."""
    from kronos_tune.autobatch.train_task import TrainTask
    from kronos_tune.memory.estimate import FakeEstimate
    from kronos_tune.memory.sharded import SimulatedRanks

    def run(mesh: Any) -> tuple[Any, int, int]:
        holder: dict[str, Any] = {}
        with TrainTask(config, device="cpu", mesh=mesh) as task:
            def build() -> Any:  # called inside the fake mode: the model and optimizer are fake
                probe = holder["probe"] = task.estimate_step_factory(2)  # each step passes its own size
                holder["unit"] = _largest_unit_bytes(probe.model)
                holder["parameters"] = sum(param.numel() for param in probe.model.parameters())
                return probe.model, probe.optimizer

            def step(model: Any, optimizer: Any, size: int, meter: Any = None) -> None:
                holder["probe"].run(meter, size)

            def prime() -> None:
                holder["probe"].prime()

            measured = measure(FakeEstimate(build, step, cuda_emulation=emulation,
                                            prime=prime if primed else None))
            unit, parameters = holder.pop("unit"), holder.pop("parameters")
            holder.clear()
        return measured, unit, parameters

    if config.parallelism == "fsdp":
        with SimulatedRanks(ranks) as simulated:
            return run(simulated.mesh)
    return run(None)


def _probe(result: EstimateResult, unit: int, parameters: int) -> _Probe:
    return _Probe(result.allocated_peak_bytes, result.param_bytes, result.grad_bytes,
                  result.optimizer_state_bytes, result.step_start_bytes, unit, parameters)


def _trace(config: Any, batches: tuple[int, ...], ranks: int, emulation: Any,
           primed: bool = True) -> list[tuple[_Probe, StepTrace]]:
    """Exact fake training steps of `config` at each batch size, in one session."""
    traces, unit, parameters = _estimating(config, ranks, emulation, primed,
                                           lambda estimate: estimate.trace(*batches))
    return [(_probe(trace.result, unit, parameters), trace) for trace in traces]


@dataclass
class _Session:
    """One set-up traced once (`_session`): the figures that do not depend on the batch size (`template`; its
    peak is the marker step's) and the step's peak at every batch size (`line`, from the marker step)."""

    template: _Probe
    line: PeakModel
    marker: int

    def to_json(self) -> dict[str, Any]:
        return {"template": asdict(self.template), "lines": self.line.to_json(), "marker": self.marker}

    @classmethod
    def list_from_json(cls, data: Any, count: int) -> list[_Session] | None:
        """`count` sessions from a list of what to_json wrote, else None."""
        if not isinstance(data, list) or len(data) != count:
            return None
        sessions = [cls.from_json(item) for item in data]
        return None if None in sessions else sessions  # type: ignore[return-value]

    @classmethod
    def from_json(cls, data: Any) -> _Session | None:
        """None for anything but what to_json wrote."""
        from kronos_tune.memory.peak import PeakModel

        try:
            return cls(_Probe(**data["template"]), PeakModel.lines_from_json(data["lines"]), int(data["marker"]))
        except (TypeError, KeyError, ValueError, AttributeError):
            return None


def _session(config: Any, ranks: int, emulation: Any, checkpointing: tuple[str, ...] = ("none",)) -> list[_Session]:
    """One primed build and one step at a marker batch size (`FakeEstimate.trace_line`) per activation
    checkpointing setting, in order (a switch of the same model: it changes the step, not what the step keeps).
    Batch 1 is not on the line (a size-1 dimension makes some copies views) and is traced on its own when a row
    needs it."""
    blocks = [config.replace(activation_checkpointing=setting).activation_checkpointing_blocks
              for setting in checkpointing]

    def switch(every: int) -> Callable[[Any], None]:
        return lambda model: model.set_activation_checkpointing(every)

    config = config.replace(activation_checkpointing=checkpointing[0])
    lines, unit, parameters = _estimating(config, ranks, emulation, True,
                                          lambda estimate: estimate.trace_line(*[switch(every) for every in blocks]))
    return [_Session(_probe(trace.result, unit, parameters), line, trace.result.batch_size) for trace, line in lines]


class _SetupProbes:
    """Probes of one set-up at any batch size: the peak from the session's PeakModel and the other figures
    (which do not depend on the batch size) from its traced step; batch 1 is traced on its own."""

    def __init__(self, config: Any, ranks: int, emulation: Any, session: _Session) -> None:
        self.config, self.ranks, self.emulation, self.line = config, ranks, emulation, session.line
        self.template = session.template
        self.probes: dict[int, _Probe] = {}

    def _adjusted(self, probe: _Probe) -> _Probe:
        if self.config.parallelism == "ddp":  # DDP's buckets: one more copy of the trainable gradients
            return replace(probe, peak=probe.peak + probe.grads, grads=2 * probe.grads, largest_unit=0)
        return probe

    def __call__(self, batch: int) -> _Probe:
        if batch not in self.probes:
            if batch < 2:
                probe = _trace(self.config, (batch,), self.ranks, self.emulation)[0][0]
            else:
                probe = replace(self.template, peak=self.line.peak_at(batch))
            self.probes[batch] = self._adjusted(probe)
        return self.probes[batch]


POOL_MIN_LAYERS = 16  # below this many predictor blocks to trace in all, starting worker processes costs more


Job = tuple[Any, int, Any, tuple[str, ...]]  # _session's arguments: config, ranks, CUDA emulation, checkpointing


def _run_sessions(jobs: list[Job], on_start: Callable[[int], None]) -> list[list[_Session]]:
    """`_session(*job)` for every job, read from the trace cache where it holds the answer. The others run in
    worker processes (one per CPU) when they are several and not tiny, else here. `on_start(i)` is called
    before waiting for job i."""
    import gc
    import os

    import torch.distributed as dist

    from kronos_core.sizes import size_spec
    from kronos_tune.memory import trace_cache

    keys = [trace_cache.entry_key("plan-lines", [config.to_dict(), ranks, asdict(emulation) if emulation else None,
                                                 list(checkpointing)])
            for config, ranks, emulation, checkpointing in jobs]
    sessions: dict[int, list[_Session] | None] = {index: _Session.list_from_json(trace_cache.load(key),
                                                                                  len(jobs[index][3]))
                                                  for index, key in enumerate(keys)}
    missing = [index for index, found in sessions.items() if found is None]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    layers = sum(size_spec(jobs[index][0].model_size).model["n_layers"] * len(jobs[index][3]) for index in missing)
    pooled = len(missing) > 1 and cpus > 1 and layers >= POOL_MIN_LAYERS and not (
        dist.is_available() and dist.is_initialized())
    # A worker's fake-tensor caches carry over from one session to the next, and one model size's DDP and FSDP
    # steps share most of their shapes: a worker traces a whole size, DDP (the cheaper) first, where there
    # are enough sizes to keep every worker busy.
    by_size: dict[str, list[int]] = {}
    for index in sorted(missing, key=lambda index: jobs[index][0].parallelism != "ddp"):
        by_size.setdefault(jobs[index][0].model_size, []).append(index)
    units = list(by_size.values()) if len(by_size) >= cpus else [[index] for index in missing]
    futures: dict[int, tuple[Any, int]] = {}  # job -> (its unit's future, its place in the unit)
    pool = None
    if pooled:
        import multiprocessing
        import threading
        from concurrent.futures import ProcessPoolExecutor

        # A forked worker starts at once, where a spawned one imports torch again (seconds per worker); but a
        # fork copies the locks other threads hold (a spinner's console lock, say), so only a process that
        # runs no other thread forks. The workers trace on fake tensors: one intra-op thread each.
        method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() \
            else "spawn"
        pool = ProcessPoolExecutor(min(len(units), cpus), mp_context=multiprocessing.get_context(method),
                                   initializer=_one_thread)
        if method == "fork":
            gc.freeze()  # what the workers inherit is never scanned by their collector (nor copied by its scans)
        # The last jobs are the largest models: started first, they do not finish alone at the end.
        for unit in sorted(units, key=max, reverse=True):
            future = pool.submit(_sessions_in_order, [jobs[index] for index in unit])
            futures.update({index: (future, place) for place, index in enumerate(unit)})
    try:
        for index in missing:
            on_start(index)
            if pooled:
                future, place = futures[index]
                traced = future.result()[place]
            else:
                traced = _session(*jobs[index])
            trace_cache.store(keys[index], [session.to_json() for session in traced])
            sessions[index] = traced
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
            gc.unfreeze()
    return [sessions[index] for index in range(len(jobs))]  # type: ignore[misc]


def _sessions_in_order(jobs: list[Job]) -> list[list[_Session]]:
    return [_session(*job) for job in jobs]


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def estimate_setup_peak(config: Any, batch_size: int, ranks: int, cuda_emulation: Any = None) -> int:
    """Per-rank peak bytes of one steady-state training step of `config` at `batch_size` (FSDP: rank 0 of
    `ranks`), as the planner estimates it before adjustments (no DDP buckets, no offload)."""
    return _trace(config, (batch_size,), ranks, cuda_emulation)[0][0].peak


def _probe_batches(preset_batch: int, target_per_rank: int) -> tuple[int, int]:
    """The two batch sizes the line of a row's first guess goes through (on the set-up's PeakModel unless the
    smaller is 1)."""
    large = max(2, min(preset_batch, target_per_rank, 16))
    return (2 if large > 2 else 1), large


def _largest_unit_bytes(model: Any) -> int:
    from kronos_core.torch_private import local_shard
    from kronos_core.train.fsdp import is_sharded, sharded_blocks

    if not is_sharded(model):
        return 0
    sizes = []
    for unit in [*sharded_blocks(model), model]:
        local = 0
        for param in unit.parameters(recurse=unit is not model):
            tensor = local_shard(param)
            local += tensor.numel() * tensor.element_size()
        sizes.append(local)
    return max(sizes, default=0)


def _row(setup: str, probe_at: Callable[[int], _Probe], ranks: int, budget: int, margin: float,
         preset_batch: int, target_per_rank: int, offload: bool) -> PlanRow:
    """Largest micro-batch under budget x (1 - margin), searched from the guess of a line through two probes;
    `probe_at` gives the peak at any batch size (a set-up's PeakModel: a search costs nothing), so the search
    finds the largest that fits where the line alone, which misses a peak that moves from one point of the
    step to another, guesses low or high."""
    from kronos_tune.memory.peak import largest_fitting

    limit = budget * (1.0 - margin)

    def device_peak(p: _Probe) -> int:
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

    probes: dict[tuple[str, str, str], _SetupProbes] = {}
    for key, job, sessions in zip(keys, jobs, _run_sessions(jobs, started)):
        for checkpointing, session in zip(job[3], sessions):
            config = job[0].replace(activation_checkpointing=checkpointing)
            probes[(*key, checkpointing)] = _SetupProbes(config, ranks, job[2], session)
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
