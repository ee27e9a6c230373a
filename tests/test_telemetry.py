"""Telemetry sampler, NVML reader and ResourceMonitor: real psutil, real threads, a recorded fake NVML."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch

from kronos_tune import ResourceMonitor
from kronos_tune.errors import KronosTuneError
from kronos_tune.telemetry.nvml import NvmlReader
from kronos_tune.telemetry.resource_monitor import collect_environment
from kronos_tune.telemetry.sampler import Sampler, read_torch_allocator
from machine import real_nvidia_gpu_present

GIB = 2**30


needs_no_gpu = pytest.mark.skipif(real_nvidia_gpu_present(), reason="this machine has a working NVIDIA driver")


# -- a recorded NVML ---------------------------------------------------------


class FakeNVMLError(Exception):
    """Mimics pynvml.NVMLError: carries the NVML return code in `.value`."""

    messages = {3: "Not Supported", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found", 999: "Unknown Error"}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self.messages.get(self.value, f"NVML error {self.value}")


class FakeNvml:
    """The pynvml functions NvmlReader calls, answering with values recorded from a 2-GPU H100 node."""

    NVMLError = FakeNVMLError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices: list[dict], init_error: int | None = None, count_error: int | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.count_error = count_error
        self.init_calls = 0
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.init_calls += 1

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error is not None:
            raise FakeNVMLError(self.count_error)
        return len(self.devices)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict:
        return self.devices[index]

    def _get(self, handle: dict, key: str):
        value = handle[key]
        if isinstance(value, FakeNVMLError):
            raise value
        return value

    def nvmlDeviceGetName(self, handle: dict):
        return self._get(handle, "name")

    def nvmlDeviceGetMemoryInfo(self, handle: dict):
        used, total = self._get(handle, "memory")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: dict):
        return SimpleNamespace(gpu=self._get(handle, "util"), memory=0)

    def nvmlDeviceGetTemperature(self, handle: dict, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._get(handle, "temp")

    def nvmlDeviceGetPowerUsage(self, handle: dict) -> int:
        return self._get(handle, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: dict) -> int:
        return self._get(handle, "limit_mw")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._get(handle, "compute")]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: dict):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._get(handle, "graphics")]


OTHER_PID = 4_000_000  # above the default pid_max, so never one of ours


def two_gpus(child_pid: int) -> list[dict]:
    return [
        {
            "name": b"NVIDIA H100 80GB HBM3",  # older pynvml returns bytes
            "memory": (7 * GIB, 85_520_809_984),
            "util": 87,
            "temp": 64,
            "power_mw": 512_345,
            "limit_mw": 700_000,
            "compute": [(os.getpid(), 4 * GIB), (OTHER_PID, 2 * GIB)],
            # the same process in both lists is counted once; a graphics-only one counts too
            "graphics": [(OTHER_PID, 2 * GIB), (OTHER_PID + 2, GIB // 2)],
        },
        {
            "name": "NVIDIA H100 80GB HBM3",
            "memory": (3 * GIB, 85_520_809_984),
            "util": 0,
            "temp": 41,
            "power_mw": FakeNVMLError(3),  # power not supported on this board
            "limit_mw": 700_000,
            "compute": [(child_pid, 1 * GIB), (OTHER_PID + 1, None)],  # None: not exposed by the driver
            "graphics": [],
        },
    ]


@pytest.fixture
def sleeping_child():
    """A real child process of the test process."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


# -- no GPU, for real ---------------------------------------------------------


@needs_no_gpu
def test_no_gpu_path_reports_reason_once_and_fills_host(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kronos_tune.telemetry.nvml")
    sampler = Sampler(interval_s=0.5)
    first = sampler.sample_once()
    second = sampler.sample_once()
    reason = sampler.gpu_unavailable_reason
    assert reason and "NVML" in reason
    assert first.gpus == () and second.gpus == ()
    assert second.gpu_unavailable_reason == reason
    assert [r.getMessage() for r in caplog.records].count(f"GPU telemetry disabled: {reason}") == 1

    host = second.host
    assert host.ram_total_bytes == psutil.virtual_memory().total
    assert 0 < host.ram_used_bytes <= host.ram_total_bytes
    assert 0 < host.ram_available_bytes <= host.ram_total_bytes
    assert 0 <= host.swap_used_bytes <= max(host.swap_total_bytes, host.swap_used_bytes)
    assert len(host.cpu_percent_per_core) == psutil.cpu_count()
    assert all(0.0 <= p <= 100.0 for p in host.cpu_percent_per_core)
    assert 0.0 <= host.cpu_percent_total <= 100.0
    own_rss = psutil.Process().memory_info().rss
    assert 0.5 * own_rss < host.process_rss_bytes < 2 * own_rss
    assert host.process_tree_rss_bytes >= host.process_rss_bytes
    assert second.torch_cuda is None
    assert not torch.cuda.is_initialized()  # sampling never initializes CUDA
    assert second.timestamp_s >= first.timestamp_s
    assert sampler.mean_sample_cost_s > 0
    json.dumps(second.to_dict())  # JSON-ready


def test_missing_nvml_package_is_a_reason_not_a_crash() -> None:
    code = (
        "import sys; sys.modules['pynvml'] = None\n"  # makes `import pynvml` raise ImportError
        "from kronos_tune.telemetry.sampler import Sampler\n"
        "s = Sampler(); snap = s.sample_once()\n"
        "print(len(snap.gpus)); print(s.gpu_unavailable_reason)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    count, reason = done.stdout.splitlines()
    assert count == "0"
    assert reason.startswith("NVML library not found: nvidia-ml-py is not installed")


# -- process tree ---------------------------------------------------------------

GRANDCHILD = "b = b'x' * 50_000_000; print('ready', flush=True); import time; time.sleep(60)"
CHILD = (
    "import subprocess, sys; "
    f"subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}]).wait()"
)


def test_process_tree_rss_includes_grandchild_memory() -> None:
    sampler = Sampler(interval_s=0.5, children_refresh_s=0.0)
    before = sampler.sample_once()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        during = sampler.sample_once()
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    growth = during.host.process_tree_rss_bytes - before.host.process_tree_rss_bytes
    assert growth > 30_000_000
    assert during.host.child_count >= before.host.child_count + 2  # child and grandchild
    after = sampler.sample_once()
    assert after.host.child_count == before.host.child_count
    assert after.host.process_tree_rss_bytes < during.host.process_tree_rss_bytes - 30_000_000


# -- ring buffer, thread, subscribers ----------------------------------------------


def test_ring_buffer_keeps_only_the_newest() -> None:
    sampler = Sampler(interval_s=0.5, capacity=3)
    taken = [sampler.sample_once() for _ in range(5)]
    kept = sampler.snapshots()
    assert len(kept) == 3
    assert [id(s) for s in kept] == [id(s) for s in taken[-3:]]
    assert sampler.latest() is taken[-1]
    assert sampler.sample_count == 5


def test_thread_feeds_subscribers_and_survives_a_raising_one(caplog: pytest.LogCaptureFixture) -> None:
    received = []
    enough = threading.Event()

    def good(snapshot) -> None:
        received.append((threading.current_thread().name, snapshot))
        if len(received) >= 4:
            enough.set()

    def bad(snapshot) -> None:
        raise RuntimeError("subscriber bug")

    sampler = Sampler(interval_s=0.05, capacity=1000)
    sampler.subscribe(bad)
    unsubscribe = sampler.subscribe(good)
    with caplog.at_level(logging.ERROR, logger="kronos_tune.telemetry.sampler"):
        with sampler:
            assert sampler.running
            assert sampler.latest() is not None  # first sample taken synchronously by start()
            assert enough.wait(timeout=30), "sampler thread stopped delivering snapshots"
            assert sampler.running
        assert not sampler.running
    assert sampler.callback_error_count >= 4
    assert sum("subscriber" in r.getMessage() for r in caplog.records) == 1  # logged once
    assert "kronos-telemetry" in {name for name, _ in received}
    stamps = [s.timestamp_s for _, s in received]
    assert stamps == sorted(stamps)
    buffered = {id(s) for s in sampler.snapshots()}
    assert all(id(s) in buffered for _, s in received)

    count = sampler.sample_count
    time.sleep(0.2)
    assert sampler.sample_count == count  # stopped means stopped
    unsubscribe()
    delivered = len(received)
    sampler.sample_once()
    assert len(received) == delivered


@pytest.mark.parametrize("interval_s", [0, -1, 0.01, 10.5, math.nan, "fast"])
def test_interval_out_of_range_is_a_one_line_error(interval_s) -> None:
    with pytest.raises(KronosTuneError) as caught:
        Sampler(interval_s=interval_s)
    message = str(caught.value)
    assert "\n" not in message and "interval_s" in message and "0.05" in message


def test_interval_edges_and_capacity() -> None:
    assert Sampler(interval_s=0.05).interval_s == 0.05
    assert Sampler(interval_s=10).interval_s == 10.0
    with pytest.raises(KronosTuneError, match="capacity"):
        Sampler(capacity=0)


# -- NVML through a recorded fake ---------------------------------------------------


def test_fake_nvml_two_gpus_split_ours_from_others(sleeping_child, caplog) -> None:
    caplog.set_level(logging.INFO, logger="kronos_tune.telemetry.nvml")
    fake = FakeNvml(two_gpus(sleeping_child.pid))
    sampler = Sampler(interval_s=0.5, nvml=fake, children_refresh_s=0.0)
    sampler.sample_once()
    snapshot = sampler.sample_once()
    assert sampler.gpu_unavailable_reason is None
    assert sampler.nvidia_driver_version == "550.54.15"
    gpu0, gpu1 = snapshot.gpus
    assert (gpu0.index, gpu1.index) == (0, 1)
    assert gpu0.name == gpu1.name == "NVIDIA H100 80GB HBM3"
    assert gpu0.memory_used_bytes == 7 * GIB and gpu0.memory_total_bytes == 85_520_809_984
    assert gpu0.utilization_pct == 87.0 and gpu0.temperature_c == 64.0
    assert gpu0.power_w == pytest.approx(512.345) and gpu0.power_limit_w == 700.0
    assert gpu0.our_memory_bytes == 4 * GIB
    assert gpu0.others_memory_bytes == 2 * GIB + GIB // 2
    pids = [(p.pid, p.ours) for p in gpu0.processes]
    assert pids == [(os.getpid(), True), (OTHER_PID, False), (OTHER_PID + 2, False)]
    # GPU 1: the memory belongs to our child process; power is not supported.
    assert gpu1.our_memory_bytes == 1 * GIB and gpu1.others_memory_bytes == 0
    assert gpu1.power_w is None and gpu1.power_limit_w == 700.0 and gpu1.temperature_c == 41.0
    assert [p.used_bytes for p in gpu1.processes if not p.ours] == [None]
    assert sum("power unavailable" in r.getMessage() for r in caplog.records) == 1  # logged once
    metrics = snapshot.flat_metrics()
    assert metrics["gpu0.memory_used_bytes"] == 7 * GIB
    assert metrics["gpu1.our_memory_bytes"] == 1 * GIB
    assert "gpu0.power_w" in metrics and "gpu1.power_w" not in metrics
    sampler.close()
    assert fake.init_calls == 1 and fake.shutdown_calls == 1


def test_fake_nvml_failures_leave_gpu_list_empty() -> None:
    cases = {
        "NVML library not found: no NVIDIA driver on this machine": FakeNvml([], init_error=12),
        "NVIDIA driver not loaded": FakeNvml([], init_error=9),
        "NVML failed to start (Unknown Error)": FakeNvml([], init_error=999),
        "NVML could not count the GPUs (Unknown Error)": FakeNvml([{}], count_error=999),
        "NVML sees no GPU": FakeNvml([]),
    }
    for expected, fake in cases.items():
        reader = NvmlReader(fake)
        assert reader.read({os.getpid()}) == ()
        assert not reader.available
        assert reader.unavailable_reason is not None and reader.unavailable_reason.startswith(expected)


def test_fake_nvml_failing_calls_give_none_fields() -> None:
    broken = {key: FakeNVMLError(999) for key in ("name", "memory", "util", "temp", "power_mw", "limit_mw", "compute")}
    (gpu,) = NvmlReader(FakeNvml([broken])).read({os.getpid()})
    assert gpu.index == 0
    values = [gpu.name, gpu.memory_used_bytes, gpu.memory_total_bytes, gpu.utilization_pct, gpu.temperature_c]
    values += [gpu.power_w, gpu.power_limit_w, gpu.our_memory_bytes, gpu.others_memory_bytes, gpu.processes]
    assert values == [None] * 10


# -- torch allocator ------------------------------------------------------------


def test_torch_allocator_only_when_cuda_is_initialized() -> None:
    assert read_torch_allocator() is None  # CPU torch, CUDA never initialized here
    assert not torch.cuda.is_initialized()
    asleep = SimpleNamespace(is_initialized=lambda: False)
    assert read_torch_allocator(asleep) is None
    stats = {0: (1 * GIB, 2 * GIB, 3 * GIB), 1: (4, 8, 16)}
    awake = SimpleNamespace(
        is_initialized=lambda: True,
        device_count=lambda: 2,
        memory_allocated=lambda i: stats[i][0],
        memory_reserved=lambda i: stats[i][1],
        max_memory_allocated=lambda i: stats[i][2],
    )
    devices = read_torch_allocator(awake)
    assert [(d.device_index, d.allocated_bytes, d.reserved_bytes, d.max_allocated_bytes) for d in devices] == [
        (0, 1 * GIB, 2 * GIB, 3 * GIB),
        (1, 4, 8, 16),
    ]


# -- ResourceMonitor ----------------------------------------------------------------


def test_resource_monitor_report(tmp_path: Path) -> None:
    with ResourceMonitor(interval_s=0.05, capacity=3) as monitor:
        deadline = time.monotonic() + 30
        while monitor.sampler.sample_count < 5 and time.monotonic() < deadline:
            sum(i * i for i in range(20_000))  # some CPU work while sampling
    assert not monitor.sampler.running
    report_path = monitor.generate_report(tmp_path / "performance_report.json")
    report = json.loads(report_path.read_text())
    assert report == json.loads(json.dumps(monitor.summary()))
    assert [p.name for p in tmp_path.iterdir()] == ["performance_report.json"]  # no temp file left

    assert report["sample_count"] >= 6  # first, >= 4 from the thread, the final one
    assert report["sample_count"] == monitor.sampler.sample_count
    assert report["p95_window_samples"] == 3  # p95 over the ring buffer, the rest over every sample
    assert report["duration_s"] > 0
    metrics = report["metrics"]
    expected = {"host.ram_used_bytes", "host.process_tree_rss_bytes", "host.cpu_percent_total", "host.cpu0_percent"}
    assert expected <= set(metrics)
    for name, stats in metrics.items():
        assert stats["min"] <= stats["mean"] <= stats["max"], name
        assert stats["min"] <= stats["p95"] <= stats["max"], name
        assert stats["count"] == report["sample_count"], name
    ram_total = psutil.virtual_memory().total
    assert metrics["host.ram_total_bytes"]["min"] == metrics["host.ram_total_bytes"]["max"] == ram_total
    assert "host.ram_total_bytes" not in report["peaks"]
    peak = report["peaks"]["host.process_tree_rss_bytes"]
    assert peak["value"] == metrics["host.process_tree_rss_bytes"]["max"]
    assert 0 <= peak["at_s"] <= report["duration_s"] + 1

    environment = report["environment"]
    keys = {"python", "torch", "cuda_available", "cuda_device_names", "nvidia_driver_version", "cpu_model"}
    keys |= {"cpu_count_logical", "ram_total_bytes", "hostname", "git_sha"}
    assert keys <= set(environment)
    assert environment["torch"] == torch.__version__
    assert environment["ram_total_bytes"] == ram_total
    assert environment["cpu_count_logical"] == psutil.cpu_count()


def test_resource_monitor_with_fake_gpus_reports_gpu_metrics(sleeping_child) -> None:
    with ResourceMonitor(interval_s=0.5, nvml=FakeNvml(two_gpus(sleeping_child.pid))) as monitor:
        pass
    summary = monitor.summary()
    assert summary["metrics"]["gpu0.memory_used_bytes"]["max"] == 7 * GIB
    assert summary["environment"]["nvidia_driver_version"] == "550.54.15"
    assert summary["gpu_unavailable_reason"] is None


def test_environment_git_sha(tmp_path: Path) -> None:
    assert collect_environment(cwd=str(tmp_path))["git_sha"] is None  # not a repository
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert collect_environment(cwd=str(tmp_path))["git_sha"] == head


def test_unwritable_report_path_is_a_one_line_error(tmp_path: Path) -> None:
    monitor = ResourceMonitor(interval_s=0.5)
    monitor.sampler.sample_once()
    missing = tmp_path / "no_such_folder" / "report.json"
    with pytest.raises(KronosTuneError, match="no_such_folder") as caught:
        monitor.generate_report(missing)
    assert "\n" not in str(caught.value) and "does not exist" in str(caught.value)
    with pytest.raises(KronosTuneError, match="is a folder"):
        monitor.generate_report(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_read_only_folder_is_a_one_line_error(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o500)
    monitor = ResourceMonitor(interval_s=0.5)
    with pytest.raises(KronosTuneError, match="locked") as caught:
        monitor.generate_report(folder / "report.json")
    assert "\n" not in str(caught.value) and "ermission" in str(caught.value)


# -- the overhead benchmark, smallest possible run ----------------------------------


def test_bench_sampler_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import telemetry as bench_sampler

    assert bench_sampler.main(["--repeats", "1", "--steps", "2", "--interval", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "without sampler" in out and "with sampler" in out and "overhead of the medians" in out
    assert bench_sampler.main(["--repeats", "0"]) == 2
    assert bench_sampler.main(["--interval", "20"]) == 2
    assert capsys.readouterr().err.count("error:") == 2
