"""kronos-tune: measure, tune and run Kronos on the hardware you have."""

from kronos_core import __version__

__all__ = ["__version__"]
