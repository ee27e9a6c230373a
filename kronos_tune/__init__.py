"""kronos-tune: measure, tune and run Kronos on the hardware you have."""

from kronos_core import __version__
from kronos_tune.telemetry.resource_monitor import ResourceMonitor

__all__ = ["ResourceMonitor", "__version__", "autobatch"]


def __getattr__(name: str):  # noqa: ANN202 - lazy exports: `import kronos_tune` stays torch-free
    if name == "autobatch":  # the package kronos_tune.autobatch is callable as its autobatch() function
        import importlib

        return importlib.import_module("kronos_tune.autobatch")
    raise AttributeError(f"module 'kronos_tune' has no attribute '{name}'")
