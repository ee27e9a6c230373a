"""Per-GPU readings through NVML (the `pynvml` module of nvidia-ml-py), degrading to nothing.

`NvmlReader` is the only place that talks to NVML. It never raises on a machine
without a GPU: a missing library, a missing driver or a failing device count
leaves it *unavailable* with a one-line `unavailable_reason`, and every read
returns no GPUs. On a working machine a single metric that NVML refuses (power
on a board without a sensor, for instance) becomes `None` for that field only.

The NVML object is injectable (`NvmlReader(nvml=...)`): anything exposing the
handful of `pynvml` functions used below plus an `NVMLError` class works, which
is how the tests drive the GPU path on a machine without one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# NVML return codes that mean "no usable NVIDIA driver here" (values from nvml.h).
_NVML_ERROR_DRIVER_NOT_LOADED = 9
_NVML_ERROR_LIBRARY_NOT_FOUND = 12
_NVML_TEMPERATURE_GPU = 0


@dataclass(frozen=True)
class GpuProcessMemory:
    """GPU memory held by one process on one GPU, as NVML reports it."""

    pid: int
    used_bytes: int | None  # None when the driver does not expose it (e.g. some containers)
    ours: bool  # the sampling process or one of its descendants


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one instant; any field NVML could not read is None."""

    index: int
    name: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_pct: float | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    our_memory_bytes: int | None  # summed over our process tree
    others_memory_bytes: int | None  # summed over every other process
    processes: tuple[GpuProcessMemory, ...] | None


def _describe_init_error(error: Exception) -> str:
    code = getattr(error, "value", None)
    if code == _NVML_ERROR_LIBRARY_NOT_FOUND or type(error).__name__.endswith("LibraryNotFound"):
        return "NVML library not found: no NVIDIA driver on this machine"
    if code == _NVML_ERROR_DRIVER_NOT_LOADED or type(error).__name__.endswith("DriverNotLoaded"):
        return "NVIDIA driver not loaded: check `nvidia-smi` and the driver installation"
    return f"NVML failed to start ({error}): check `nvidia-smi` and the driver installation"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Reads every GPU NVML can see; opened lazily, safe to call from any thread."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._opened = False
        self._initialized = False
        self._handles: list[Any] = []
        self._names: list[str | None] = []
        self._failed_fields: set[tuple[int, str]] = set()
        self.unavailable_reason: str | None = None
        self.driver_version: str | None = None

    @property
    def available(self) -> bool:
        self.open()
        return self.unavailable_reason is None

    def open(self) -> None:
        """Start NVML once; on failure remember why (logged once) and stay unavailable."""
        with self._lock:
            if self._opened:
                return
            self._opened = True
            reason = self._open_locked()
            if reason is not None:
                self.unavailable_reason = reason
                logger.info("GPU telemetry disabled: %s", reason)

    def _open_locked(self) -> str | None:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                return "NVML library not found: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            self._nvml = pynvml
        nvml = self._nvml
        error_type = getattr(nvml, "NVMLError", Exception)
        try:
            nvml.nvmlInit()
        except error_type as error:
            return _describe_init_error(error)
        self._initialized = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except error_type as error:
            return f"NVML could not count the GPUs ({error}): check `nvidia-smi`"
        if count == 0:
            return "NVML sees no GPU: the driver is loaded but no device is visible"
        try:
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        except error_type:
            self.driver_version = None
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except error_type:
                handle = None
            self._handles.append(handle)
            name = self._call(index, "name", nvml.nvmlDeviceGetName, handle) if handle is not None else None
            self._names.append(_text(name) if name is not None else None)
        return None

    def close(self) -> None:
        """Release NVML (it is reference-counted, other users keep theirs)."""
        with self._lock:
            if self._initialized:
                try:
                    self._nvml.nvmlShutdown()
                except getattr(self._nvml, "NVMLError", Exception):
                    pass
                self._initialized = False
            self._handles = []
            self._names = []
            self._opened = False

    def _call(self, index: int, field: str, function: Callable[..., _T], *args: Any) -> _T | None:
        """One NVML call; an NVMLError gives None and is logged once per GPU and field."""
        try:
            return function(*args)
        except getattr(self._nvml, "NVMLError", Exception) as error:
            if (index, field) not in self._failed_fields:
                self._failed_fields.add((index, field))
                logger.info("GPU %d: %s unavailable (%s)", index, field, error)
            return None

    def read(self, our_pids: Collection[int] = ()) -> tuple[GpuSnapshot, ...]:
        """Every GPU now; `our_pids` decides which processes count as ours."""
        self.open()
        if self.unavailable_reason is not None:
            return ()
        return tuple(self._read_one(index, our_pids) for index in range(len(self._handles)))

    def _read_one(self, index: int, our_pids: Collection[int]) -> GpuSnapshot:
        handle = self._handles[index]
        if handle is None:
            return GpuSnapshot(index, None, None, None, None, None, None, None, None, None, None)
        nvml = self._nvml
        memory = self._call(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        rates = self._call(index, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU)
        temperature = self._call(index, "temperature", nvml.nvmlDeviceGetTemperature, handle, sensor)
        power_mw = self._call(index, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        limit_mw = self._call(index, "power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        processes = self._processes(index, handle, our_pids)
        our_bytes = others_bytes = None
        if processes is not None:
            our_bytes = sum(p.used_bytes or 0 for p in processes if p.ours)
            others_bytes = sum(p.used_bytes or 0 for p in processes if not p.ours)
        return GpuSnapshot(
            index=index,
            name=self._names[index],
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            utilization_pct=float(rates.gpu) if rates is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            our_memory_bytes=our_bytes,
            others_memory_bytes=others_bytes,
            processes=processes,
        )

    def _processes(
        self, index: int, handle: Any, our_pids: Collection[int]
    ) -> tuple[GpuProcessMemory, ...] | None:
        """Compute and graphics processes merged by pid (one process may appear in both lists)."""
        nvml = self._nvml
        compute = self._call(index, "compute processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if compute is None:
            return None
        graphics_fn = getattr(nvml, "nvmlDeviceGetGraphicsRunningProcesses", None)
        graphics = self._call(index, "graphics processes", graphics_fn, handle) if graphics_fn else None
        used_by_pid: dict[int, int | None] = {}
        for info in list(compute) + list(graphics or ()):
            pid = int(info.pid)
            used = getattr(info, "usedGpuMemory", None)
            used = int(used) if used is not None else None
            previous = used_by_pid.get(pid)
            used_by_pid[pid] = used if previous is None else max(previous, used or 0)
        return tuple(
            GpuProcessMemory(pid=pid, used_bytes=used, ours=pid in our_pids)
            for pid, used in sorted(used_by_pid.items())
        )
