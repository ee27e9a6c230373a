"""Estimate a training step's peak memory without allocating it (FakeTensorMode).

The step runs for real, op by op, but on fake CPU tensors: shapes, dtypes and
storages exist, data does not.  ``StorageTracker`` counts the fake storages'
``nbytes`` exactly as it counts real ones, so on CPU the estimate equals the
``CpuExactMeter`` measurement of the same step.  ``CudaEmulation`` adjusts the
accounting towards a CUDA device (allocator rounding, foreach/fused optimizer,
fixed context and workspace overheads).

Fake tensors are always created on ``cpu``: fake ``cuda`` tensors abort the
process during backward on a CPU-only build.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from kronos_tune.torch_private import CountingFakeMode, local_shard
from kronos_tune.memory.live_bytes import MemoryBudget, StorageTracker, round_up
from kronos_core.units import format_bytes
from kronos_tune.errors import KronosTuneError
from kronos_tune.memory.peak import PeakModel

_MIB = 1 << 20

BuildFn = Callable[[], "tuple[nn.Module, torch.optim.Optimizer]"]
StepFn = Callable[..., None]


@dataclass(frozen=True)
class CudaEmulation:
    """How to bend a CPU fake run towards what a CUDA device would need.

    Defaults are placeholders until a device preset supplies measured values.
    """

    round_bytes: int = 512
    optimizer_impl: Literal["foreach", "fused", "as_built"] = "foreach"
    context_overhead_bytes: int = 500 * _MIB
    workspace_bytes: int = 8 * _MIB

    def __post_init__(self) -> None:
        if self.round_bytes < 1:
            raise KronosTuneError(f"CudaEmulation.round_bytes must be >= 1, got {self.round_bytes}")
        if self.optimizer_impl not in ("foreach", "fused", "as_built"):
            raise KronosTuneError(
                f"CudaEmulation.optimizer_impl must be foreach, fused or as_built, got {self.optimizer_impl!r}"
            )
        if self.context_overhead_bytes < 0 or self.workspace_bytes < 0:
            raise KronosTuneError("CudaEmulation overheads must be >= 0 bytes")

    @property
    def overhead_bytes(self) -> int:
        return self.context_overhead_bytes + self.workspace_bytes

    def assumptions(self) -> list[str]:
        return [
            f"every storage rounded up to {self.round_bytes} B (CUDA caching allocator block rounding)",
            f"optimizer implementation: {self.optimizer_impl} (CUDA default for AdamW is foreach)",
            f"CUDA context overhead {format_bytes(self.context_overhead_bytes, 'MiB', 0)} added (outside max_memory_allocated)",
            f"cuBLAS workspace {format_bytes(self.workspace_bytes, 'MiB', 0)} added",
            "allocator fragmentation / reserved-but-unused memory not modelled",
            "kernels and autocast op lists are the CPU ones (e.g. attention backend, saved tensors of "
            "CUDA-only kernels may differ); optimizer 'step' scalars counted on device",
        ]


@dataclass
class EstimateResult:
    """Peak memory of one (warm) training step, in bytes.

    ``allocated_peak_bytes`` is what a byte-exact meter (or CUDA's
    ``max_memory_allocated``) would report; ``peak_bytes`` adds the fixed
    overheads of ``CudaEmulation`` and is what must fit on the device.
    """

    batch_size: int
    peak_bytes: int
    allocated_peak_bytes: int
    overhead_bytes: int
    phase_peaks: dict[str, int]
    param_bytes: int
    buffer_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    step_start_bytes: int  # live bytes when the measured step began (params, state, kept grads...)
    steps_run: int
    assumptions: list[str] = field(default_factory=list)

    def fits(self, budget_bytes: int) -> bool:
        return self.peak_bytes <= budget_bytes


def _unique_storage_bytes(tensors: Iterable[torch.Tensor | None], round_bytes: int) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        st = local_shard(t).untyped_storage()  # DTensor (FSDP): this rank's shard
        if id(st) not in seen:
            seen.add(id(st))
            total += round_up(st.nbytes(), round_bytes)
    return total


def _apply_optimizer_impl(optimizer: torch.optim.Optimizer, impl: str) -> None:
    if impl == "as_built":
        return
    if "foreach" not in optimizer.defaults:
        raise KronosTuneError(
            f"{type(optimizer).__name__} has no foreach/fused switch; use CudaEmulation(optimizer_impl='as_built')"
        )
    if impl == "fused" and "fused" not in optimizer.defaults:
        raise KronosTuneError(f"{type(optimizer).__name__} has no fused implementation; use optimizer_impl='foreach'")
    for group in optimizer.param_groups:
        group["foreach"] = impl == "foreach"
        if "fused" in group:
            group["fused"] = impl == "fused"


class _CpuOnlyTracker(StorageTracker):
    """Refuses fake non-CPU tensors: on a CPU-only build their backward aborts the process.

    While ``timeline`` is a list, it records (op, live bytes, scaled bytes, scaled rounded bytes) after every
    allocation or resize. Scaled bytes are those of the live storages that scale with the batch: with
    ``marker`` set (a prime batch size), a new storage scales when its first tensor has a dimension divisible
    by the marker (a prime divides a product only through a factor: a tensor whose size does not depend on
    the batch has no such dimension unless one of its own is a multiple of the marker, which ``trace_line``
    rules out for every dimension made before its step). A resize of a scaled storage is not followed (a step
    resizes only FSDP's parameter buffers). While ``dims_seen`` is a set, it collects every dimension of every
    output."""

    timeline: list[tuple[object, int, int, int]] | None = None
    marker: int | None = None
    dims_seen: set[int] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scaled: dict[int, int] = {}  # storage key -> bytes, of the storages that scale with the batch
        self._scaled_bytes = 0
        self._scaled_rounded_bytes = 0
        self._scales = False  # whether the tensor being seen scales with the batch

    def _record(self, func: object) -> None:
        if self.timeline is not None:
            self.timeline.append((func, self._current_bytes, self._scaled_bytes, self._scaled_rounded_bytes))

    def _register(self, storage: torch.UntypedStorage, func: object) -> None:
        super()._register(storage, func)
        if self._scales:
            nbytes = self._scaled[id(storage)] = storage.nbytes()
            self._scaled_bytes += nbytes
            self._scaled_rounded_bytes += round_up(nbytes, self.round_bytes)
        self._record(func)

    def _grow(self, ref: Any, nbytes: int, func: object) -> None:
        super()._grow(ref, nbytes, func)
        self._record(func)

    def _on_storage_freed(self, ref: Any) -> None:
        if self._live.get(ref.key) is ref and ref.key in self._scaled:
            nbytes = self._scaled.pop(ref.key)
            self._scaled_bytes -= nbytes
            self._scaled_rounded_bytes -= round_up(nbytes, self.round_bytes)
        super()._on_storage_freed(ref)

    def _see(self, tensor: torch.Tensor, func: object = None) -> None:
        if tensor.device.type != "cpu":
            raise KronosTuneError(
                f"fake estimate got a {tensor.device} tensor from {func}; build and step must create CPU "
                "tensors (use CudaEmulation to approximate a GPU)"
            )
        if self.marker is not None or self.dims_seen is not None:
            shape = local_shard(tensor).shape
            if self.dims_seen is not None:
                self.dims_seen.update(shape)
            marker = self.marker
            if marker is not None and any(dim % marker == 0 for dim in shape):
                self._scales = True
                try:
                    super()._see(tensor, func)
                finally:
                    self._scales = False
                return
        super()._see(tensor, func)


def accepts_meter(step: Callable[..., Any]) -> bool:
    """Whether a step takes a ``meter`` keyword (for its ``meter.phase(...)`` blocks)."""
    try:
        return "meter" in inspect.signature(step).parameters
    except (TypeError, ValueError):
        return False


class FakeEstimate:
    """Runs ``build`` and ``steps`` calls of ``step`` on fake tensors and counts live bytes.

    ``build()`` is called inside the fake mode, so parameters and optimizer
    are fake; ``step(model, optimizer, batch_size)`` must create its inputs
    itself (also fake).  If ``step`` takes a ``meter`` keyword it receives the
    tracker, so its ``meter.phase(...)`` blocks give per-phase peaks.
    The reported peak is that of the last step (AdamW creates its state
    lazily, so a cold first step reads low). With ``prime`` (called after
    ``build``, inside the fake mode) the warm-up is that call instead of
    ``steps - 1`` steps: it must create what a first step creates and keeps
    (``ProbeStep.prime``), and every step it is given is measured.
    """

    def __init__(
        self,
        build: BuildFn,
        step: StepFn,
        steps: int = 2,
        cuda_emulation: CudaEmulation | None = None,
        budget_bytes: int | MemoryBudget | None = None,
        prime: Callable[[], None] | None = None,
    ) -> None:
        if steps < 1:
            raise KronosTuneError(f"steps must be >= 1, got {steps}")
        self.build = build
        self.step = step
        self.steps = steps
        self.cuda_emulation = cuda_emulation
        self.budget_bytes = budget_bytes
        self.prime = prime

    @property
    def warmup_steps(self) -> int:
        return 0 if self.prime is not None else self.steps - 1

    def estimate(self, batch_size: int) -> EstimateResult:
        return self.trace(batch_size)[0].result

    def trace(self, *batch_sizes: int) -> list[StepTrace]:
        """One build, then the warm-up (``prime``, or steps at the first batch size) and one measured step per
        batch size.

        The first batch size is measured exactly as ``estimate`` measures it; each later one right after the
        previous measured step (warm: the optimizer state already exists)."""
        if not batch_sizes:
            raise KronosTuneError("trace needs at least one batch size")
        for batch_size in batch_sizes:
            if batch_size < 1:
                raise KronosTuneError(f"batch size must be >= 1, got {batch_size}")
        return self._traces(list(batch_sizes))

    def trace_line(self, *variants: Callable[[nn.Module], None]) -> list[tuple[StepTrace, PeakModel]]:
        """The step's peak at every batch size from one measured step: one build, the warm-up (``prime``, or
        steps at batch 2), then a step at a marker batch size (a prime no dimension made so far is a multiple
        of, from MARKER_FLOOR) whose live bytes are split into the storages that scale with the batch and the
        others (``_CpuOnlyTracker``). The trace's figures other than its peak do not depend on the batch.
        With ``variants``, one such step after each (called with the model: a switch such as activation
        checkpointing that changes the step but not what it keeps between steps), in order."""
        traces = self._traces([None] * max(len(variants), 1), list(variants))
        return [(trace, PeakModel.from_marker(trace.result.batch_size, trace.live_bytes, trace.scaled_bytes,
                                              trace.scaled_counted_bytes)) for trace in traces]

    def _traces(self, batch_sizes: list[int | None],
                variants: list[Callable[[nn.Module], None]] | None = None) -> list[StepTrace]:
        """``trace`` of these batch sizes; None: a marker step of ``trace_line`` (after ``variants[i]``)."""
        emu = self.cuda_emulation
        round_bytes = emu.round_bytes if emu else 1
        overhead_bytes = emu.overhead_bytes if emu else 0
        budget = self.budget_bytes
        if budget is not None and overhead_bytes:
            # The simulated device loses the fixed overheads up front.
            size = budget.budget_bytes if isinstance(budget, MemoryBudget) else int(budget)
            if size <= overhead_bytes:
                raise KronosTuneError(
                    f"budget {size} B does not even hold the fixed CUDA overheads ({overhead_bytes} B)"
                )
            budget = MemoryBudget(size - overhead_bytes)
        tracker = _CpuOnlyTracker(budget_bytes=budget, round_bytes=round_bytes)
        if None in batch_sizes:
            tracker.dims_seen = set()
        pass_meter = accepts_meter(self.step)
        fake_mode = CountingFakeMode.make(tracker.see_outputs)
        traces = []
        with fake_mode, tracker.fed():
            model, optimizer = self.build()
            if emu:
                _apply_optimizer_impl(optimizer, emu.optimizer_impl)
            if self.prime is not None:
                self.prime()
            warmup = self.warmup_steps
            runs = [batch_sizes[0] or 2] * warmup + batch_sizes
            marker = None
            for i, size in enumerate(runs):
                measured = i >= warmup
                batch_size = size
                if size is None:
                    if marker is None:
                        marker = _marker_batch(tracker.dims_seen or ())
                    batch_size = tracker.marker = marker
                    tracker.dims_seen = None
                if measured and variants:
                    variants[i - warmup](model)
                if measured:
                    tracker.reset()
                    step_start_bytes = tracker.current_bytes()
                    tracker.timeline = [(None, step_start_bytes, 0, 0)]
                if pass_meter:
                    self.step(model, optimizer, batch_size, meter=tracker)
                else:
                    self.step(model, optimizer, batch_size)
                if measured:
                    timeline, tracker.timeline = tracker.timeline, None
                    result = self._result(batch_size, tracker, model, optimizer, overhead_bytes, round_bytes,
                                          step_start_bytes)
                    traces.append(StepTrace(result, tuple(entry[0] for entry in timeline),
                                            tuple(entry[1] for entry in timeline),
                                            tuple(entry[2] for entry in timeline) if size is None else (),
                                            tuple(entry[3] for entry in timeline) if size is None else ()))
                    tracker.marker = None
            del model, optimizer
        return traces

    def _result(
        self,
        batch_size: int,
        tracker: StorageTracker,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        overhead_bytes: int,
        round_bytes: int,
        step_start_bytes: int,
    ) -> EstimateResult:
        params = list(model.parameters())
        state_tensors = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        allocated = tracker.peak_bytes()
        warmup = (f"peak of step {self.steps} of {self.steps} (earlier steps warm up lazily created optimizer state)"
                  if self.prime is None else "peak of a steady-state step: optimizer state and first-forward tables "
                  "created beforehand without a step (primed)")
        assumptions = [
            warmup,
            "grads from the previous step are live at step start unless the step frees them "
            "(zero_grad(set_to_none=True) before backward); the measured step sees whatever the step does",
            "grad_bytes = bytes of parameters that require grad (one grad each, same dtype)",
            "live tensor storages only: kernel-internal scratch buffers and allocator caching are not counted",
        ]
        if self.cuda_emulation:
            assumptions += self.cuda_emulation.assumptions()
        return EstimateResult(
            batch_size=batch_size,
            peak_bytes=allocated + overhead_bytes,
            allocated_peak_bytes=allocated,
            overhead_bytes=overhead_bytes,
            phase_peaks=tracker.peaks(),
            param_bytes=_unique_storage_bytes(params, round_bytes),
            buffer_bytes=_unique_storage_bytes(model.buffers(), round_bytes),
            grad_bytes=_unique_storage_bytes((p for p in params if p.requires_grad), round_bytes),
            optimizer_state_bytes=_unique_storage_bytes(state_tensors, round_bytes),
            step_start_bytes=step_start_bytes,
            steps_run=self.warmup_steps + 1,
            assumptions=assumptions,
        )


@dataclass(frozen=True)
class StepTrace:
    """One measured fake step: its result, and the live bytes after every allocation or resize in it (of a
    marker step, ``trace_line``: also the bytes of the live storages that scale with the batch, exact and as
    counted, i.e. rounded)."""

    result: EstimateResult
    ops: tuple[object, ...]  # the op behind each entry (None: the step's start)
    live_bytes: tuple[int, ...]
    scaled_bytes: tuple[int, ...] = ()
    scaled_counted_bytes: tuple[int, ...] = ()


MARKER_FLOOR = 1009  # the smallest marker batch size: a prime above the small dimensions every model has


def _is_prime(number: int) -> bool:
    return number > 1 and all(number % divisor for divisor in range(2, math.isqrt(number) + 1))


def _marker_batch(dims: Iterable[int]) -> int:
    """The smallest prime from MARKER_FLOOR that divides none of `dims`."""
    large = {dim for dim in dims if dim >= MARKER_FLOOR}
    candidate = MARKER_FLOOR
    while not _is_prime(candidate) or any(dim % candidate == 0 for dim in large):
        candidate += 1
    return candidate


def estimate_step_peak(
    build: BuildFn,
    step: StepFn,
    batch_size: int,
    steps: int = 2,
    cuda_emulation: CudaEmulation | None = None,
    budget_bytes: int | MemoryBudget | None = None,
) -> EstimateResult:
    """Peak bytes of step number ``steps`` at ``batch_size``, computed on fake tensors.

    With ``budget_bytes`` the fake run raises ``torch.OutOfMemoryError`` like a
    device of that size would (after subtracting the emulated fixed overheads).
    """
    return FakeEstimate(build, step, steps, cuda_emulation, budget_bytes).estimate(batch_size)
