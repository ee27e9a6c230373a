"""kronos-tune: measure, tune and run Kronos on the hardware you have."""

from kronos_core import __version__
from kronos_tune.telemetry.resource_monitor import ResourceMonitor

__all__ = ["ResourceMonitor", "__version__"]
