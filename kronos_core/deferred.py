"""A module imported at the first use of one of its attributes, and a package's names imported at their first use.

Importing pandas takes 0.3-0.5 s. The training package's data modules use it only inside functions, so a command
that never reads a table (`kronos-tune plan` traces fake steps on random tensors) need not pay for it at start-up:
those modules hold `pd = deferred("pandas")` and pandas is imported by the first `pd.<name>`. In the same way a
package re-exports its public names without importing their modules (and torch) with itself:
`__getattr__ = lazy_exports(__name__, {"Trainer": "kronos_core.train.trainer", ...})`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
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


def lazy_exports(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The module-level `__getattr__` of `package`: a name of `homes` (name -> the module defining it) is imported
    from there at its first read and kept in the package, any other name is an AttributeError."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
