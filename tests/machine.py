"""What this test machine has (for skip conditions), found without the project's own readers."""

from __future__ import annotations


def real_nvidia_gpu_present() -> bool:
    """NVML initializes: a driver and at least the library are here."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - missing library, no driver: all mean "no GPU"
        return False
    pynvml.nvmlShutdown()
    return True
