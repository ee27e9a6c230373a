"""What this test machine has (for skip conditions) and how its processes are probed and signalled, found
without the project's own readers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
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


def interrupt_when(args: list[str], ready: Callable[[], bool], cwd: Path | None = None, then_wait_s: float = 0.0,
                   timeout_s: float = 120.0) -> tuple[int, str, str]:
    """Run `python -m kronos_tune.cli *args` (one torch thread), send it SIGINT `then_wait_s` after `ready()`
    is true (or once it has exited), and return its exit code, stdout and stderr. The child gets SIGINT's default handler back: a
    background job's shell ignores SIGINT, and its children would inherit that."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "kronos_tune.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while not ready() and proc.poll() is None:
            time.sleep(0.1)
        time.sleep(then_wait_s)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stdout, stderr
