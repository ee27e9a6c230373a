"""The host's memory, read one way: psutil for what is available and what a process holds now.

The peak resident set of this process comes from the kernel's high-water mark
(`getrusage`, kilobytes on Linux, bytes on macOS; the peak working set on
Windows): psutil has no portable peak, and sampling would miss short spikes.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import psutil


class HostRam(NamedTuple):
    total: int
    available: int  # what a new allocation can get without swapping (MemAvailable on Linux)
    used: int


def host_ram() -> HostRam:
    """Total, available and used RAM from one reading (for samplers that record all three)."""
    memory = psutil.virtual_memory()
    return HostRam(int(memory.total), int(memory.available), int(memory.used))


def available_ram_bytes() -> int:
    """RAM a new allocation can get without swapping (MemAvailable on Linux)."""
    return host_ram().available


def total_ram_bytes() -> int:
    return host_ram().total


def rss_bytes(pid: int | None = None) -> int:
    """Resident set of a process now (this one by default)."""
    return int(psutil.Process(pid).memory_info().rss)


def tree_rss_bytes(pid: int | None = None) -> int:
    """Resident set of a process and all its live descendants (loader workers, torchrun ranks)."""
    root = psutil.Process(pid)
    total = int(root.memory_info().rss)
    for child in root.children(recursive=True):
        try:
            total += int(child.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def peak_rss_bytes() -> int:
    """The highest resident set this process has had so far (never below the current one: Linux counts
    resident pages in per-CPU batches, so its high-water mark can trail the current reading by a few pages)."""
    try:  # Linux: the mm's own high-water mark; getrusage's would carry a forking parent's peak into the child
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return max(int(line.split()[1]) * 1024, rss_bytes())
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # Windows
        return int(psutil.Process().memory_info().peak_wset)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(int(peak if sys.platform == "darwin" else peak * 1024), rss_bytes())
