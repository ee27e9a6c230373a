"""Text helpers shared by the dashboard widgets: sizes, percentages, bars and fixed-scale sparklines."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

from kronos_core.units import UNITS, format_bytes

SPARK_LEVELS = "▁▂▃▄▅▆▇█"


def gib(value: int | float | None, digits: int = 1) -> str:
    """The dashboard's short size text: GiB with `digits` decimals, whole MiB under 1 GiB; 'n/a' when unknown."""
    if value is not None and abs(value) < UNITS["GiB"]:
        return format_bytes(value, "MiB", 0)
    return format_bytes(value, "GiB", digits)


def percent(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.0f}%"


def ratio(used: int | float | None, total: int | float | None) -> float | None:
    """used / total, None when either is unknown or the total is zero."""
    return used / total if used is not None and total else None


def level_style(fraction: float) -> str:
    """Green below 70 %, yellow below 90 %, red above."""
    return "green" if fraction < 0.7 else "yellow" if fraction < 0.9 else "red"


def bar(fraction: float | None, width: int) -> Text:
    """A horizontal bar `width` cells wide, coloured by level; dotted when unknown."""
    width = max(0, width)
    if fraction is None or math.isnan(fraction):
        return Text("·" * width, style="dim")
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    return Text("█" * filled, style=level_style(fraction)) + Text("░" * (width - filled), style="dim")


def sparkline(values: Sequence[float], width: int, low: float | None = None, high: float | None = None) -> str:
    """The last `width` values as block characters on a fixed scale [low, high].

    With no scale given the series' own min and max are used. Missing history
    on the left is padded with spaces so the newest value is always on the right.
    """
    if width <= 0:
        return ""
    shown = [v for v in list(values)[-width:] if not math.isnan(v)]
    if not shown:
        return " " * width
    low = min(shown) if low is None else low
    high = max(shown) if high is None else high
    span = high - low
    top = len(SPARK_LEVELS) - 1
    cells = []
    for value in shown:
        level = 0 if span <= 0 else round(top * min(1.0, max(0.0, (value - low) / span)))
        cells.append(SPARK_LEVELS[level])
    return " " * (width - len(cells)) + "".join(cells)


def duration(seconds: float | None) -> str:
    """Seconds as '850 ms', '12.3 s', '4m05s', '2h10m' or '3d04h'."""
    if seconds is None or math.isnan(seconds):
        return "n/a"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def rate(value: float | None) -> str:
    """A per-second rate with k/M suffixes."""
    if value is None or math.isnan(value):
        return "n/a"
    for suffix, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
