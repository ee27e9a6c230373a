"""What this test machine has (for skip conditions), found without the project's own readers."""

from __future__ import annotations

import time
from pathlib import Path


def real_nvidia_gpu_present() -> bool:
    """NVML initializes: a driver and at least the library are here."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - missing library, no driver: all mean "no GPU"
        return False
    pynvml.nvmlShutdown()
    return True


def process_gone(pid: int, within_s: float = 5.0) -> bool:
    """Dead within `within_s` (a zombie waiting for its reaper counts as dead: signals are asynchronous)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False
