"""How a probe runs: on the CPU meter (simulated device), on CUDA, or on fake tensors."""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from kronos_core.errors import one_line
from kronos_tune.memory.live_bytes import MemoryBudget, OutOfMemoryError, StorageTracker, apply_cuda_budget
from kronos_tune.errors import KronosTuneError
from kronos_tune.memory.estimate import CudaEmulation, estimate_step_peak
from kronos_tune.memory.meters import make_meter

from kronos_tune.autobatch.probes import Probe, ProbeKind, ProbeStep, StepFactory, _call


def is_out_of_memory(error: BaseException) -> bool:
    """torch's OOM, or the RuntimeErrors CUDA libraries raise when an allocation fails."""
    if isinstance(error, OutOfMemoryError):
        return True
    if isinstance(error, RuntimeError):
        text = str(error)
        return any(s in text for s in ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED"))
    return False


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        close()


class _Runner:
    """Runs one probe: fresh build, steps, eval, clean-up; returns its Probe."""

    device: str = "cpu"

    def __init__(self, step_factory: StepFactory, eval_factory: StepFactory | None, steps_per_probe: int) -> None:
        self.step_factory = step_factory
        self.eval_factory = eval_factory
        self.steps_per_probe = steps_per_probe

    def run(self, batch_size: int, cap_bytes: int | None, kind: ProbeKind) -> Probe:
        raise NotImplementedError

    def current_bytes(self) -> int:
        return 0

    def close(self) -> None:
        """Undo anything the runner changed (allocator caps)."""

    def _timed_steps(self, step: Callable[..., Any], meter: Any, sync: Callable[[], None]) -> float | None:
        last: float | None = None
        for _ in range(self.steps_per_probe):
            sync()
            start = time.perf_counter()
            _call(step, meter)
            sync()
            last = time.perf_counter() - start
        return last

    def _measure(self, probe: Probe, step: Callable[..., Any], meter: Any, batch_size: int, kind: ProbeKind,
                 sync: Callable[[], None]) -> Any:
        """Timed steps plus the eval batch under `meter`; fills the probe. Returns the eval callable,
        which the caller drops with the step."""
        probe.step_time_s = self._timed_steps(step, meter, sync)
        probe.steps_run = self.steps_per_probe
        evaluate = None
        if self.eval_factory is not None:
            evaluate = self.eval_factory(batch_size)
            _call(evaluate, meter)
        probe.peak_bytes = meter.peak_bytes()
        probe.phase_peak_bytes = meter.peaks()
        probe.status = "verify" if kind == "verify" else "ok"
        return evaluate


class _CpuRunner(_Runner):
    """A simulated device: a StorageTracker whose budget raises torch.OutOfMemoryError."""

    def __init__(self, step_factory: StepFactory, eval_factory: StepFactory | None, steps_per_probe: int,
                 round_bytes: int) -> None:
        super().__init__(step_factory, eval_factory, steps_per_probe)
        self.device = "cpu"
        self.meter = StorageTracker(budget_bytes=None, round_bytes=round_bytes)

    def current_bytes(self) -> int:
        gc.collect()
        return self.meter.current_bytes()

    def run(self, batch_size: int, cap_bytes: int | None, kind: ProbeKind) -> Probe:
        meter = self.meter
        gc.collect()
        base_bytes = meter.current_bytes()
        started = time.perf_counter()
        step: Any = None
        evaluate: Any = None
        probe = Probe(batch_size, None, "oom", kind, cap_bytes or 0)
        try:
            with meter:
                meter.budget = None  # the build is measured, not limited: a too-big model is reported below
                step = self.step_factory(batch_size)
                probe.build_bytes = meter.current_bytes() - base_bytes
                meter.budget = MemoryBudget(cap_bytes) if cap_bytes is not None else None
                if cap_bytes is not None and meter.current_bytes() > cap_bytes:
                    raise meter.budget.error(meter.current_bytes(), meter.current_bytes(), op="building the step")
                meter.reset()
                evaluate = self._measure(probe, step, meter, batch_size, kind, lambda: None)
        except Exception as error:  # noqa: BLE001 - only out-of-memory is a measurement; the rest re-raises
            if not is_out_of_memory(error):
                raise
            probe.error = one_line(error, typed=False)
        finally:
            meter.budget = None
            _close(step)
            step = evaluate = None
            gc.collect()
            probe.leaked_bytes = meter.current_bytes() - base_bytes
            probe.wall_time_s = time.perf_counter() - started
        return probe


class _CudaRunner(_Runner):
    """A real GPU; capped with set_per_process_memory_fraction when it is bigger than the cap."""

    def __init__(self, step_factory: StepFactory, eval_factory: StepFactory | None, steps_per_probe: int,
                 device: torch.device) -> None:
        super().__init__(step_factory, eval_factory, steps_per_probe)
        self.torch_device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self.device = str(self.torch_device)
        self.total_bytes = torch.cuda.get_device_properties(self.torch_device).total_memory
        self.capped = False
        self.notes: list[str] = []

    def current_bytes(self) -> int:
        gc.collect()
        torch.cuda.empty_cache()
        return torch.cuda.memory_allocated(self.torch_device)

    def _cap(self, cap_bytes: int | None) -> None:
        if cap_bytes is not None and cap_bytes < self.total_bytes:
            note = apply_cuda_budget(cap_bytes, self.torch_device)
            if not self.notes:
                self.notes.append(note)
            self.capped = True
        elif self.capped:
            torch.cuda.set_per_process_memory_fraction(1.0, self.torch_device)
            self.capped = False

    def run(self, batch_size: int, cap_bytes: int | None, kind: ProbeKind) -> Probe:
        dev = self.torch_device
        base_bytes = self.current_bytes()
        started = time.perf_counter()
        self._cap(cap_bytes)
        step: Any = None
        evaluate: Any = None
        probe = Probe(batch_size, None, "oom", kind, cap_bytes or 0)
        try:
            meter = make_meter(dev)  # capped by _cap, not by the meter
            step = self.step_factory(batch_size)
            probe.build_bytes = torch.cuda.memory_allocated(dev) - base_bytes
            meter.reset()
            evaluate = self._measure(probe, step, meter, batch_size, kind, lambda: torch.cuda.synchronize(dev))
            probe.reserved_peak_bytes = meter.peak_reserved_bytes()
        except Exception as error:  # noqa: BLE001
            if not is_out_of_memory(error):
                raise
            probe.error = one_line(error, typed=False)
        finally:
            _close(step)
            step = evaluate = None
            probe.leaked_bytes = self.current_bytes() - base_bytes
            probe.wall_time_s = time.perf_counter() - started
        return probe

    def close(self) -> None:
        if self.capped:
            torch.cuda.set_per_process_memory_fraction(1.0, self.torch_device)
            self.capped = False


class _EstimateRunner(_Runner):
    """Fake tensors through estimate_step_peak: the same search, nothing allocated.

    The returned step must expose ``.model`` and ``.optimizer`` (what
    ``estimate_step_peak``'s build returns) and create its inputs with torch
    ops, so that everything is fake inside the estimate.
    """

    def __init__(self, step_factory: StepFactory, eval_factory: StepFactory | None, steps_per_probe: int,
                 cuda_emulation: CudaEmulation | None) -> None:
        super().__init__(step_factory, eval_factory, steps_per_probe)
        self.cuda_emulation = cuda_emulation
        self.device = "fake-cuda" if cuda_emulation is not None else "fake-cpu"

    def run(self, batch_size: int, cap_bytes: int | None, kind: ProbeKind) -> Probe:
        started = time.perf_counter()
        holder: dict[str, Any] = {}
        probe = Probe(batch_size, None, "oom", kind, cap_bytes or 0)
        steps = self.steps_per_probe
        eval_factory = self.eval_factory

        def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
            step = self.step_factory(batch_size)
            model, optimizer = getattr(step, "model", None), getattr(step, "optimizer", None)
            if not isinstance(model, torch.nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
                raise KronosTuneError("estimate mode needs step_factory(B) to return a step with .model and "
                                      ".optimizer attributes (see kronos_tune.autobatch.ProbeStep)")
            holder["step"] = step
            holder["calls"] = 0
            return model, optimizer

        def fake_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, size: int, meter: Any = None) -> None:
            holder["calls"] += 1
            _call(holder["step"], meter)
            if holder["calls"] == steps and eval_factory is not None:
                _call(eval_factory(size), meter)

        try:
            with warnings.catch_warnings():  # caches keyed on data_ptr() warn on fake tensors; harmless here
                warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
                result = estimate_step_peak(build, fake_step, batch_size, steps=steps,
                                            cuda_emulation=self.cuda_emulation, budget_bytes=cap_bytes)
            probe.peak_bytes = result.peak_bytes
            probe.phase_peak_bytes = {k: v + result.overhead_bytes for k, v in result.phase_peaks.items()}
            probe.build_bytes = result.param_bytes + result.buffer_bytes
            probe.steps_run = steps
            probe.status = "verify" if kind == "verify" else "ok"
        except Exception as error:  # noqa: BLE001
            if not is_out_of_memory(error):
                raise
            probe.error = one_line(error, typed=False)
        finally:
            _close(holder.get("step"))
            holder.clear()
            gc.collect()
            probe.wall_time_s = time.perf_counter() - started
        return probe


# ---------------------------------------------------------------------------- helpers
