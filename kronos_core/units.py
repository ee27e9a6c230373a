"""Byte counts as text, one way for the whole project: binary units (1 GiB = 2**30 bytes), as CUDA counts."""

from __future__ import annotations

UNITS = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1}


def format_bytes(value: float | None, unit: str | None = None, digits: int = 2, missing: str = "n/a",
                 with_unit: bool = True) -> str:
    """`value` bytes in `unit` ("GiB", "MiB", "KiB" or "B") with `digits` decimals and thousands separators.

    With no `unit` the largest one the value reaches is used (whole bytes below 1 KiB); None gives `missing`;
    `with_unit=False` leaves the unit out (a table whose header names it)."""
    if value is None:
        return missing
    if unit is None:
        unit = next((name for name, size in UNITS.items() if abs(value) >= size), "B")
    elif unit not in UNITS:
        raise ValueError(f"unit {unit!r}: use one of {', '.join(UNITS)}")
    number = f"{int(value):,}" if unit == "B" else f"{value / UNITS[unit]:,.{digits}f}"
    return f"{number} {unit}" if with_unit else number


def format_duration(seconds: float) -> str:
    """Seconds as text: "42.0 s" below two minutes, "7.5 min" below two hours, else "3.2 h"."""
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"
