"""Live telemetry: a cheap background sampler of GPUs (NVML), the host (psutil) and torch's allocator.

    with Sampler(interval_s=0.5) as sampler:     # first sample taken synchronously
        sampler.subscribe(lambda snapshot: ...)  # called on every new Snapshot
        ...
        sampler.latest(), sampler.snapshots()

Nothing here raises on a machine without a GPU: the GPU list is empty and
`sampler.gpu_unavailable_reason` says why. CUDA is never initialized here;
torch allocator numbers appear only once the program itself has initialized it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from kronos_core.hostmem import host_ram
from kronos_tune.errors import KronosTuneError
from kronos_tune.telemetry.nvml import GpuProcessMemory, GpuSnapshot, NvmlReader

__all__ = [
    "GpuProcessMemory",
    "GpuSnapshot",
    "HostSnapshot",
    "MAX_INTERVAL_S",
    "MIN_INTERVAL_S",
    "Sampler",
    "Snapshot",
    "TorchAllocatorSnapshot",
    "read_torch_allocator",
    "validate_interval",
]

logger = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.05  # 20 Hz
MAX_INTERVAL_S = 10.0


@dataclass(frozen=True)
class HostSnapshot:
    """The machine and our process tree at one instant."""

    ram_used_bytes: int
    ram_total_bytes: int
    ram_available_bytes: int
    swap_used_bytes: int
    swap_total_bytes: int
    cpu_percent_per_core: tuple[float, ...]  # busy share of each logical core since the last sample
    cpu_percent_total: float
    process_rss_bytes: int  # this process alone
    # This process plus every descendant (DataLoader workers, DDP ranks). Pages shared
    # between forked processes are counted once per process, so this is an upper bound.
    process_tree_rss_bytes: int
    child_count: int


@dataclass(frozen=True)
class TorchAllocatorSnapshot:
    """torch's CUDA caching allocator on one device."""

    device_index: int
    allocated_bytes: int
    reserved_bytes: int
    max_allocated_bytes: int


@dataclass(frozen=True)
class Snapshot:
    """Everything sampled at `timestamp_s` (seconds since the epoch)."""

    timestamp_s: float
    host: HostSnapshot
    gpus: tuple[GpuSnapshot, ...]
    gpu_unavailable_reason: str | None
    torch_cuda: tuple[TorchAllocatorSnapshot, ...] | None  # None until the program initializes CUDA
    sample_cost_s: float  # wall time this sample took to gather

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (tuples become lists)."""
        return dataclasses.asdict(self)

    def flat_metrics(self) -> dict[str, float]:
        """Every numeric reading under a flat name (`host.ram_used_bytes`, `gpu0.power_w`...); None skipped."""
        metrics: dict[str, float] = {}
        for field in dataclasses.fields(HostSnapshot):
            value = getattr(self.host, field.name)
            if isinstance(value, tuple):
                for core, percent in enumerate(value):
                    metrics[f"host.cpu{core}_percent"] = percent
            else:
                metrics[f"host.{field.name}"] = value
        for gpu in self.gpus:
            for field in dataclasses.fields(GpuSnapshot):
                value = getattr(gpu, field.name)
                if field.name != "index" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    metrics[f"gpu{gpu.index}.{field.name}"] = value
        for device in self.torch_cuda or ():
            for field in dataclasses.fields(TorchAllocatorSnapshot):
                if field.name != "device_index":
                    metrics[f"torch_cuda{device.device_index}.{field.name}"] = getattr(device, field.name)
        metrics["sampler.sample_cost_s"] = self.sample_cost_s
        return metrics


def validate_interval(interval_s: float, *, where: str, max_s: float = MAX_INTERVAL_S) -> float:
    """The interval as a float, or a one-line KronosTuneError naming `where`."""
    try:
        value = float(interval_s)
    except (TypeError, ValueError):
        value = math.nan
    if not MIN_INTERVAL_S <= value <= max_s:  # also rejects NaN
        raise KronosTuneError(
            f"{where}={interval_s!r} is out of range: use {MIN_INTERVAL_S} to {max_s:g} seconds "
            "(at most 20 samples per second)"
        )
    return value


def read_torch_allocator(cuda: Any | None = None) -> tuple[TorchAllocatorSnapshot, ...] | None:
    """Allocator stats per device if torch.cuda is already initialized, else None; never initializes it.

    `cuda` defaults to `torch.cuda` when the program has imported torch (torch is not imported here).
    """
    if cuda is None:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None:
            return None
    try:
        if not cuda.is_initialized():
            return None
        return tuple(
            TorchAllocatorSnapshot(
                device_index=index,
                allocated_bytes=int(cuda.memory_allocated(index)),
                reserved_bytes=int(cuda.memory_reserved(index)),
                max_allocated_bytes=int(cuda.max_memory_allocated(index)),
            )
            for index in range(int(cuda.device_count()))
        )
    except Exception as error:  # a half-imported torch, a lost device: stats are optional
        logger.debug("torch allocator stats unavailable: %s", error)
        return None


class _CpuMeter:
    """Per-core busy % between consecutive calls, from our own baseline.

    psutil.cpu_percent keeps one module-wide baseline that any other caller in
    the process would reset; this keeps its own.
    """

    def __init__(self) -> None:
        self._last = [self._split(times) for times in psutil.cpu_times(percpu=True)]

    @staticmethod
    def _split(times: Any) -> tuple[float, float]:
        """(busy, all) seconds; guest time is already inside user time on Linux."""
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        idle = times.idle + getattr(times, "iowait", 0.0)
        return total - idle, total

    def read(self) -> tuple[tuple[float, ...], float]:
        now = [self._split(times) for times in psutil.cpu_times(percpu=True)]
        if len(now) != len(self._last):  # a core went on/offline: restart the baseline
            self._last = [(0.0, 0.0)] * len(now)
        per_core: list[float] = []
        busy_sum = all_sum = 0.0
        for (busy, total), (last_busy, last_total) in zip(now, self._last):
            d_busy, d_total = busy - last_busy, total - last_total
            per_core.append(min(100.0, max(0.0, 100.0 * d_busy / d_total)) if d_total > 0 else 0.0)
            busy_sum += max(0.0, d_busy)
            all_sum += max(0.0, d_total)
        self._last = now
        overall = min(100.0, 100.0 * busy_sum / all_sum) if all_sum > 0 else 0.0
        return tuple(per_core), overall


class _ProcessTree:
    """RSS of one process (this one by default) and its descendants, reusing psutil.Process objects.

    Finding descendants scans every process on the machine, so the list is
    refreshed at most every `refresh_s`; RSS of the known ones is read each time.
    The figure is kronos_core.hostmem.tree_rss_bytes's, without its scan per call.
    """

    def __init__(self, refresh_s: float, pid: int | None) -> None:
        try:
            self._root = psutil.Process(pid)
        except (psutil.NoSuchProcess, ValueError):
            raise KronosTuneError(
                f"no process with pid {pid} to monitor: check the pid with `ps` and that it still runs"
            ) from None
        self.pid = self._root.pid
        self._refresh_s = refresh_s
        self._children: dict[int, psutil.Process] = {}
        self._found_at = -math.inf

    def read(self) -> tuple[int, int, int, frozenset[int]]:
        """(own rss, tree rss, live child count, pids of the tree)."""
        now = time.monotonic()
        if now - self._found_at >= self._refresh_s:
            self._found_at = now
            try:
                found = self._root.children(recursive=True)
            except psutil.Error:
                found = []
            kept: dict[int, psutil.Process] = {}
            for child in found:
                known = self._children.get(child.pid)
                kept[child.pid] = known if known is not None and known == child else child
            self._children = kept
        try:
            own_rss = self._root.memory_info().rss
        except psutil.Error:  # the watched process exited (or is not ours to read)
            own_rss = 0
        tree_rss = own_rss
        for pid, child in list(self._children.items()):
            try:
                tree_rss += child.memory_info().rss
            except psutil.Error:  # exited (or a zombie) since the last scan
                del self._children[pid]
        pids = frozenset(self._children) | {self._root.pid}
        return own_rss, tree_rss, len(self._children), pids


Subscriber = Callable[[Snapshot], None]


class Sampler:
    """Samples GPUs, host and torch allocator every `interval_s` into a ring buffer of `capacity` snapshots."""

    def __init__(
        self,
        interval_s: float = 0.5,
        capacity: int = 3600,
        nvml: Any | None = None,
        children_refresh_s: float = 1.0,
        pid: int | None = None,
    ) -> None:
        """`pid`: the process whose tree is measured as ours (default: this process).
        `children_refresh_s`: how often descendants are looked for (the RSS is read every sample)."""
        self.interval_s = validate_interval(interval_s, where="Sampler interval_s")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise KronosTuneError(f"sampler capacity {capacity!r} is invalid: use a whole number of snapshots >= 1")
        self.capacity = capacity
        self._buffer: deque[Snapshot] = deque(maxlen=capacity)
        self._buffer_lock = threading.Lock()
        self._sample_lock = threading.Lock()  # one sample at a time: the meters keep state
        self._gpus = NvmlReader(nvml)
        self._cpu = _CpuMeter()
        self._tree = _ProcessTree(children_refresh_s, pid)
        self._subscribers: list[Subscriber] = []
        self._failed_subscribers: set[int] = set()
        self.callback_error_count = 0
        self._sample_count = 0
        self._total_cost_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- state --------------------------------------------------------------
    @property
    def gpu_unavailable_reason(self) -> str | None:
        """Why there are no GPU readings (None when NVML works)."""
        self._gpus.open()
        return self._gpus.unavailable_reason

    @property
    def nvidia_driver_version(self) -> str | None:
        self._gpus.open()
        return self._gpus.driver_version

    @property
    def pid(self) -> int:
        """The root of the process tree measured as ours."""
        return self._tree.pid

    @property
    def sample_count(self) -> int:
        return self._sample_count

    @property
    def mean_sample_cost_s(self) -> float:
        """Mean wall time one sample takes to gather (0.0 before the first)."""
        return self._total_cost_s / self._sample_count if self._sample_count else 0.0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def latest(self) -> Snapshot | None:
        with self._buffer_lock:
            return self._buffer[-1] if self._buffer else None

    def snapshots(self) -> list[Snapshot]:
        """The buffered snapshots, oldest first (a copy)."""
        with self._buffer_lock:
            return list(self._buffer)

    # -- subscribers --------------------------------------------------------
    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback(snapshot)` for every new snapshot, from the thread that took it
        (the sampler thread; the caller's for `start()` and `sample_once()`).
        Exceptions are logged once per callback and otherwise ignored. Returns an unsubscribe function."""
        with self._buffer_lock:
            self._subscribers.append(callback)
        return lambda: self.unsubscribe(callback)

    def unsubscribe(self, callback: Subscriber) -> None:
        with self._buffer_lock:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

    def _notify(self, snapshot: Snapshot) -> None:
        with self._buffer_lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(snapshot)
            except Exception:
                self.callback_error_count += 1
                if id(callback) not in self._failed_subscribers:
                    self._failed_subscribers.add(id(callback))
                    logger.exception("telemetry subscriber %r failed; further errors from it are not logged", callback)

    # -- sampling -----------------------------------------------------------
    def sample_once(self) -> Snapshot:
        """Take one snapshot now, store it and notify subscribers."""
        with self._sample_lock:
            started = time.perf_counter()
            timestamp_s = time.time()
            memory = host_ram()
            swap = psutil.swap_memory()
            per_core, total = self._cpu.read()
            own_rss, tree_rss, child_count, our_pids = self._tree.read()
            gpus = self._gpus.read(our_pids)
            torch_cuda = read_torch_allocator()
            cost_s = time.perf_counter() - started
            snapshot = Snapshot(
                timestamp_s=timestamp_s,
                host=HostSnapshot(
                    ram_used_bytes=memory.used,
                    ram_total_bytes=memory.total,
                    ram_available_bytes=memory.available,
                    swap_used_bytes=int(swap.used),
                    swap_total_bytes=int(swap.total),
                    cpu_percent_per_core=per_core,
                    cpu_percent_total=total,
                    process_rss_bytes=int(own_rss),
                    process_tree_rss_bytes=int(tree_rss),
                    child_count=child_count,
                ),
                gpus=gpus,
                gpu_unavailable_reason=self._gpus.unavailable_reason,
                torch_cuda=torch_cuda,
                sample_cost_s=cost_s,
            )
            self._sample_count += 1
            self._total_cost_s += cost_s
            with self._buffer_lock:
                self._buffer.append(snapshot)
        self._notify(snapshot)
        return snapshot

    def start(self) -> Sampler:
        """Take the first sample synchronously, then keep sampling on a daemon thread."""
        if self.running:
            raise RuntimeError("Sampler.start() called while it is already running")
        self._stop.clear()
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="kronos-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and wait for it (a no-op when not running)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def close(self) -> None:
        """Stop and release NVML."""
        self.stop()
        self._gpus.close()

    def _run(self) -> None:
        next_tick = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
            try:
                self.sample_once()
            except Exception:  # psutil/NVML surprises must not end telemetry
                logger.exception("telemetry sample failed")
            next_tick += self.interval_s
            now = time.monotonic()
            if next_tick < now:  # fell behind (suspended, overloaded): skip the missed ticks
                next_tick = now + self.interval_s

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
