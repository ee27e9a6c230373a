"""An autobatch result in plain words: a probe's progress line and the TOML snippet of the pick (the Rich
tables and plot are the commands layer's, commands/autobatch_render.py)."""

from __future__ import annotations

from kronos_core.units import format_bytes
from kronos_tune.autobatch.probes import Probe


def toml_snippet(batch_size: int, accumulation_steps: int) -> str:
    return f"batch_size = {batch_size}\naccumulation_steps = {accumulation_steps}\n"


def probe_line(probe: Probe, unit: str = "batch") -> str:
    """One line per finished probe, for progress output."""
    peak = format_bytes(probe.peak_bytes) if probe.peak_bytes is not None else "out of memory"
    return f"{probe.kind} {unit} {probe.batch_size}: {peak} ({probe.status}, {probe.wall_time_s:.1f} s)"
