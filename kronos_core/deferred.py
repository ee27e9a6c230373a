"""A module imported at the first use of one of its attributes.

Importing pandas takes 0.3-0.5 s. The training package's data modules use it only inside functions, so a command
that never reads a table (`kronos-tune plan` traces fake steps on random tensors) need not pay for it at start-up:
those modules hold `pd = deferred("pandas")` and pandas is imported by the first `pd.<name>`.
"""

from __future__ import annotations

import importlib
from typing import Any


class deferred:  # noqa: N801 - it stands in for a module name
    """Stands in for module `name`: the first attribute read imports it, every read is the module's own."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<deferred module {self._name}>"
