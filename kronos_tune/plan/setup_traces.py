"""The fake-tensor traces behind `kronos-tune plan`: one traced session per set-up, in worker processes, kept
in the trace cache.

Each set-up is traced once (`trace_session`): one build, primed like a first step (`ProbeStep.prime`: optimizer
state, position tables and FSDP buffers made without a forward or backward), then one step at a marker batch
size whose live bytes are split into the storages that scale with the batch and the others
(`FakeEstimate.trace_line`). A probe at any batch size from 2 (`SetupProbes`) takes its peak from that
`peak.PeakModel` (the live bytes at every point of the step are affine in the batch size, so the peak is the
highest of those lines) and every other figure from the traced step, which do not depend on the batch size;
batch 1 (where some copies are views) is traced on its own when a row needs it. Sessions run in worker
processes when there are several (`run_sessions`), and land in the trace cache (`trace_cache`), so a repeated
plan traces nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from kronos_tune.errors import KronosTuneError

if TYPE_CHECKING:
    from kronos_tune.memory.estimate import EstimateResult, FakeEstimate, StepTrace
    from kronos_tune.memory.peak import PeakModel


@dataclass
class SetupProbe:
    peak: int
    weights: int
    grads: int
    optimizer: int
    step_start: int
    largest_unit: int  # local bytes of the largest FSDP unit's parameters (offload's device-side copy)
    parameters: int  # the model's parameter count (FSDP: of the whole model, not the shard)


class SimulatedRanks:
    """Context manager: this process is rank 0 of a fake `world_size`-rank group (with a CPU mesh), to estimate
    the per-rank memory of sharded (FSDP) training for N ranks in one process and without N devices.

    It joins PyTorch's testing backend (collectives return at once, nothing is communicated) and builds the
    device mesh outside any fake-tensor mode. Inside it, a model sharded with
    ``kronos_core.train.fsdp.apply_fsdp(..., mesh=ranks.mesh)`` holds exactly rank 0's shards, gathers into
    real-sized buffers, and its step can run on fake tensors under ``estimate_step_peak``: the estimate is rank
    0's peak. Rank 0 holds the largest shards when a dimension does not divide evenly (FSDP pads the last
    ranks' shards, so they are never larger)."""

    def __init__(self, world_size: int) -> None:
        if world_size < 1:
            raise KronosTuneError(f"world size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.mesh: Any = None
        self._owns = False

    def __enter__(self) -> SimulatedRanks:
        import torch
        import torch.distributed as dist

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
        import torch.distributed as dist

        self.mesh = None
        if self._owns and dist.is_initialized():
            dist.destroy_process_group()
        self._owns = False


def estimating(config: Any, ranks: int, emulation: Any, primed: bool,
                measure: Callable[[FakeEstimate], Any]) -> tuple[Any, int, int]:
    """`measure(estimate)` for a FakeEstimate of `config`'s training step (FSDP: rank 0 of `ranks` simulated),
    its build primed like a first step (`ProbeStep.prime`; `primed=False`: warmed up by a step instead), the
    local bytes of the model's largest FSDP unit and the model's parameter count."""
    from kronos_tune.autobatch.train_probes import TrainProbes
    from kronos_tune.memory.estimate import FakeEstimate

    def run(mesh: Any) -> tuple[Any, int, int]:
        holder: dict[str, Any] = {}
        with TrainProbes(config, device="cpu", mesh=mesh) as task:
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


def _setup_probe(result: EstimateResult, unit: int, parameters: int) -> SetupProbe:
    return SetupProbe(result.allocated_peak_bytes, result.param_bytes, result.grad_bytes,
                  result.optimizer_state_bytes, result.step_start_bytes, unit, parameters)


def trace_steps(config: Any, batches: tuple[int, ...], ranks: int, emulation: Any,
           primed: bool = True) -> list[tuple[SetupProbe, StepTrace]]:
    """Exact fake training steps of `config` at each batch size, in one session."""
    traces, unit, parameters = estimating(config, ranks, emulation, primed,
                                           lambda estimate: estimate.trace(*batches))
    return [(_setup_probe(trace.result, unit, parameters), trace) for trace in traces]


@dataclass
class TracedSession:
    """One set-up traced once (`trace_session`): the figures that do not depend on the batch size (`template`; its
    peak is the marker step's) and the step's peak at every batch size (`line`, from the marker step)."""

    template: SetupProbe
    line: PeakModel
    marker: int

    def to_json(self) -> dict[str, Any]:
        return {"template": asdict(self.template), "lines": self.line.to_json(), "marker": self.marker}

    @classmethod
    def list_from_json(cls, data: Any, count: int) -> list[TracedSession] | None:
        """`count` sessions from a list of what to_json wrote, else None."""
        if not isinstance(data, list) or len(data) != count:
            return None
        sessions = [cls.from_json(item) for item in data]
        return None if None in sessions else sessions  # type: ignore[return-value]

    @classmethod
    def from_json(cls, data: Any) -> TracedSession | None:
        """None for anything but what to_json wrote."""
        from kronos_tune.memory.peak import PeakModel

        try:
            return cls(SetupProbe(**data["template"]), PeakModel.lines_from_json(data["lines"]), int(data["marker"]))
        except (TypeError, KeyError, ValueError, AttributeError):
            return None


def trace_session(config: Any, ranks: int, emulation: Any,
                  checkpointing: tuple[str, ...] = ("none",)) -> list[TracedSession]:
    """One primed build and one step at a marker batch size (`FakeEstimate.trace_line`) per activation
    checkpointing setting, in order (a switch of the same model: it changes the step, not what the step keeps).
    Batch 1 is not on the line (a size-1 dimension makes some copies views) and is traced on its own when a row
    needs it."""
    blocks = [config.replace(activation_checkpointing=setting).activation_checkpointing_blocks
              for setting in checkpointing]

    def switch(every: int) -> Callable[[Any], None]:
        return lambda model: model.set_activation_checkpointing(every)

    config = config.replace(activation_checkpointing=checkpointing[0])
    lines, unit, parameters = estimating(config, ranks, emulation, True,
                                          lambda estimate: estimate.trace_line(*[switch(every) for every in blocks]))
    return [TracedSession(_setup_probe(trace.result, unit, parameters), line, trace.result.batch_size)
            for trace, line in lines]


class SetupProbes:
    """Probes of one set-up at any batch size: the peak from the session's PeakModel and the other figures
    (which do not depend on the batch size) from its traced step; batch 1 is traced on its own."""

    def __init__(self, config: Any, ranks: int, emulation: Any, session: TracedSession) -> None:
        self.config, self.ranks, self.emulation, self.line = config, ranks, emulation, session.line
        self.template = session.template
        self.probes: dict[int, SetupProbe] = {}

    def _adjusted(self, probe: SetupProbe) -> SetupProbe:
        if self.config.parallelism == "ddp":  # DDP's buckets: one more copy of the trainable gradients
            return replace(probe, peak=probe.peak + probe.grads, grads=2 * probe.grads, largest_unit=0)
        return probe

    def __call__(self, batch: int) -> SetupProbe:
        if batch not in self.probes:
            if batch < 2:
                probe = trace_steps(self.config, (batch,), self.ranks, self.emulation)[0][0]
            else:
                probe = replace(self.template, peak=self.line.peak_at(batch))
            self.probes[batch] = self._adjusted(probe)
        return self.probes[batch]


POOL_MIN_LAYERS = 16  # below this many predictor blocks to trace in all, starting worker processes costs more


Job = tuple[Any, int, Any, tuple[str, ...]]  # _session's arguments: config, ranks, CUDA emulation, checkpointing


def run_sessions(jobs: list[Job], on_start: Callable[[int], None]) -> list[list[TracedSession]]:
    """`trace_session(*job)` for every job, read from the trace cache where it holds the answer. The others run in
    worker processes (one per CPU) when they are several and not tiny, else here. `on_start(i)` is called
    before waiting for job i."""
    import gc
    import os

    import torch.distributed as dist

    from kronos_core.sizes import size_spec
    from kronos_tune.plan import trace_cache

    keys = [trace_cache.entry_key("plan-lines", [config.to_dict(), ranks, asdict(emulation) if emulation else None,
                                                 list(checkpointing)])
            for config, ranks, emulation, checkpointing in jobs]
    sessions: dict[int, list[TracedSession] | None] = {
        index: TracedSession.list_from_json(trace_cache.load(key), len(jobs[index][3]))
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
                traced = trace_session(*jobs[index])
            trace_cache.store(keys[index], [session.to_json() for session in traced])
            sessions[index] = traced
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
            gc.unfreeze()
    return [sessions[index] for index in range(len(jobs))]  # type: ignore[misc]


def _sessions_in_order(jobs: list[Job]) -> list[list[TracedSession]]:
    return [trace_session(*job) for job in jobs]


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def estimate_setup_peak(config: Any, batch_size: int, ranks: int, cuda_emulation: Any = None) -> int:
    """Per-rank peak bytes of one steady-state training step of `config` at `batch_size` (FSDP: rank 0 of
    `ranks`), as the planner estimates it before adjustments (no DDP buckets, no offload)."""
    return trace_steps(config, (batch_size,), ranks, cuda_emulation)[0][0].peak


def _largest_unit_bytes(model: Any) -> int:
    from kronos_tune.torch_private import local_shard
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
