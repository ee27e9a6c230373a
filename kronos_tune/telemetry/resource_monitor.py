"""Monitor a block of code and write a performance report.

    from kronos_tune import ResourceMonitor

    with ResourceMonitor(interval_s=0.5) as monitor:
        train()
    monitor.generate_report("performance_report.json")

The report holds, for every numeric metric the sampler reads (flattened names
such as `host.ram_used_bytes` or `gpu0.memory_used_bytes`), its min, mean and
max over the whole run, its p95 over the last `capacity` samples, and the
moment each peak happened, plus a description of the machine (`environment`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from kronos_core.cpu_features import detect_cpu_features
from kronos_core.files import write_text_atomic
from kronos_core.hostmem import total_ram_bytes
from kronos_tune.errors import KronosTuneError
from kronos_tune.telemetry.sampler import Sampler, Snapshot

__all__ = ["ResourceMonitor", "collect_environment"]

GIT_TIMEOUT_S = 5.0


@dataclass
class _Running:
    """Exact min/mean/max and time of the peak of one metric, over every sample."""

    count: int = 0
    total: float = 0.0
    minimum: float = math.inf
    maximum: float = -math.inf
    peak_timestamp_s: float = field(default=0.0)

    def add(self, value: float, timestamp_s: float) -> None:
        self.count += 1
        self.total += value
        self.minimum = min(self.minimum, value)
        if value > self.maximum:
            self.maximum = value
            self.peak_timestamp_s = timestamp_s


def _git_sha(cwd: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and sha else None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _torch_facts(nvml_gpu_names: list[str]) -> dict[str, Any]:
    """torch version and CUDA facts without initializing CUDA (device names come from NVML unless it is)."""
    try:
        import torch
    except ImportError:
        return {"torch": None, "torch_cuda_version": None, "cuda_available": False, "cuda_device_names": []}
    cuda_available = bool(torch.cuda.is_available())
    if cuda_available and torch.cuda.is_initialized():
        names = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    else:
        names = list(nvml_gpu_names) if cuda_available else []
    return {
        "torch": torch.__version__,
        "torch_cuda_version": torch.version.cuda,
        "cuda_available": cuda_available,
        "cuda_device_names": names,
    }


def collect_environment(sampler: Sampler | None = None, cwd: str | None = None) -> dict[str, Any]:
    """Python, torch, CUDA, driver, CPU, RAM, host and git facts for a report."""
    latest = sampler.latest() if sampler is not None else None
    cpu = detect_cpu_features()
    gpu_names = [gpu.name or f"GPU {gpu.index}" for gpu in latest.gpus] if latest is not None else []
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        **_torch_facts(gpu_names),
        "nvidia_driver_version": sampler.nvidia_driver_version if sampler is not None else None,
        "gpu_unavailable_reason": sampler.gpu_unavailable_reason if sampler is not None else None,
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_features": cpu.to_dict(),
        "cpu_summary": cpu.summary(),
        "cpu_count_logical": psutil.cpu_count(logical=True),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "ram_total_bytes": total_ram_bytes(),
        "hostname": socket.gethostname(),
        "git_sha": _git_sha(cwd or os.getcwd()),
    }


class ResourceMonitor:
    """Samples in the background while active; `summary()` / `generate_report()` describe the run."""

    def __init__(self, interval_s: float = 0.5, capacity: int = 7200, nvml: Any | None = None) -> None:
        self._sampler = Sampler(interval_s=interval_s, capacity=capacity, nvml=nvml)
        self._lock = threading.Lock()
        self._metrics: dict[str, _Running] = {}
        self._sample_count = 0
        self._started_s: float | None = None  # epoch seconds
        self._started_monotonic_s: float | None = None
        self._duration_s: float | None = None  # set once stopped
        self._environment: dict[str, Any] | None = None
        self._sampler.subscribe(self._record)

    @property
    def sampler(self) -> Sampler:
        return self._sampler

    def _record(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._sample_count += 1
            for name, value in snapshot.flat_metrics().items():
                self._metrics.setdefault(name, _Running()).add(float(value), snapshot.timestamp_s)

    def start(self) -> ResourceMonitor:
        self._started_s = time.time()
        self._started_monotonic_s = time.monotonic()
        self._duration_s = None
        self._sampler.start()
        return self

    def stop(self) -> None:
        """Stop sampling after one last sample, so even a short block has its end state."""
        if not self._sampler.running:
            return
        self._sampler.stop()
        self._sampler.sample_once()
        if self._started_monotonic_s is not None:
            self._duration_s = time.monotonic() - self._started_monotonic_s
        if self._environment is None:  # while NVML is still open
            self._environment = collect_environment(self._sampler)
        self._sampler.close()

    def __enter__(self) -> ResourceMonitor:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        """The report as a dict (works while running too)."""
        if self._environment is None:
            self._environment = collect_environment(self._sampler)
        window = self._sampler.snapshots()
        window_values: dict[str, list[float]] = {}
        for snapshot in window:
            for name, value in snapshot.flat_metrics().items():
                window_values.setdefault(name, []).append(float(value))
        started = self._started_s
        with self._lock:
            metrics = {
                name: {
                    "min": running.minimum,
                    "mean": running.total / running.count,
                    "max": running.maximum,
                    "p95": float(np.quantile(window_values.get(name) or [running.maximum], 0.95)),
                    "count": running.count,
                }
                for name, running in sorted(self._metrics.items())
            }
            peaks = {
                name: {
                    "value": running.maximum,
                    "at_s": running.peak_timestamp_s - started if started is not None else None,
                }
                for name, running in sorted(self._metrics.items())
                if not name.endswith("_total_bytes")  # constants, their peak says nothing
            }
            sample_count = self._sample_count
        duration_s = self._duration_s
        if duration_s is None:
            duration_s = time.monotonic() - self._started_monotonic_s if self._started_monotonic_s else 0.0
        return {
            "duration_s": duration_s,
            "sample_count": sample_count,
            "interval_s": self._sampler.interval_s,
            "started_at_s": started,
            "p95_window_samples": len(window),
            "mean_sample_cost_s": self._sampler.mean_sample_cost_s,
            "gpu_unavailable_reason": self._environment["gpu_unavailable_reason"],
            "metrics": metrics,
            "peaks": peaks,
            "environment": self._environment,
        }

    def generate_report(self, path: str | os.PathLike[str] = "performance_report.json") -> Path:
        """Write `summary()` as JSON to `path` atomically (temp file + rename); returns the path."""
        target = Path(path)
        text = json.dumps(self.summary(), indent=2, allow_nan=False) + "\n"
        _write_report(target, text)
        return target


def _write_report(target: Path, text: str) -> None:
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise KronosTuneError(
            f"cannot write report {str(target)!r}: folder {str(folder)!r} does not exist; "
            "create it or choose another path"
        )
    if target.is_dir():
        raise KronosTuneError(
            f"cannot write report {str(target)!r}: it is a folder; give a file name such as report.json"
        )
    try:
        write_text_atomic(target, text)
    except OSError as error:
        raise KronosTuneError(
            f"cannot write report {str(target)!r}: {error.strerror or error}; choose a writable path"
        ) from error
