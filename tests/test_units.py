"""kronos_core.units.format_bytes: the one byte formatter, in the forms its callers print."""

from __future__ import annotations

import pytest

from kronos_core.units import format_bytes
from kronos_tune.tui.format import gib

GIB, MIB = 2**30, 2**20


@pytest.mark.parametrize("value, kwargs, text", [
    (9 * GIB, {}, "9.00 GiB"),                                  # simulated out-of-memory messages
    (512 * MIB, {}, "512.00 MiB"),
    (3 * 1024, {}, "3.00 KiB"),
    (512, {}, "512 B"),
    (None, {}, "n/a"),
    (None, {"missing": "–"}, "–"),                              # report tables
    (11.5 * GIB, {"unit": "GiB", "digits": 1}, "11.5 GiB"),     # benchmark device line
    (300 * MIB, {"unit": "GiB"}, "0.29 GiB"),                   # train and monitor: always GiB
    (1536.25 * MIB, {"unit": "MiB", "digits": 1}, "1,536.2 MiB"),  # predict and profile: MiB with separators
    (500 * MIB, {"unit": "MiB", "digits": 0}, "500 MiB"),
    (2 * GIB, {"unit": "GiB", "with_unit": False}, "2.00"),     # plan's table, unit in the header
])
def test_forms(value: float | None, kwargs: dict, text: str) -> None:
    assert format_bytes(value, **kwargs) == text


def test_an_unknown_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="GiB, MiB, KiB, B"):
        format_bytes(1, "GB")


def test_the_dashboard_form() -> None:
    assert gib(3 * GIB) == "3.0 GiB" and gib(3 * GIB, 2) == "3.00 GiB"
    assert gib(512 * MIB) == "512 MiB" and gib(None) == "n/a"
