"""The optional packages (pyproject.toml's extras), and the one way both packages import one.

`require` is for a package a command was asked to use (`--calendar`, `--tensorboard`, a hub id, `--runner ray`):
the module, or a KronosError of one line naming the package and the install command, which the CLI prints
with exit code 2. `missing` is for a feature that is left out without its package (the pictures, the
backtest's significance tests): None, or the same words as a note. An import that fails for another reason
than absence (a broken install) reads the same: the package cannot be used, and reinstalling it is the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from kronos_core.errors import KronosError

# extra -> (the distribution it installs, the module that proves it is there)
EXTRAS: dict[str, tuple[str, str]] = {
    "plot": ("matplotlib", "matplotlib"),
    "calendars": ("exchange-calendars", "exchange_calendars"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "hub": ("huggingface_hub", "huggingface_hub"),
    "stats": ("statsmodels", "statsmodels"),
    "ray": ("ray[data]", "ray.data"),
}


def install_command(extra: str) -> str:
    return f'pip install "kronos-tune[{extra}]"'


def _load(extra: str, module: str | None) -> ModuleType:
    # the extra's own module first: an already loaded submodule of it would otherwise hide its absence
    importlib.import_module(EXTRAS[extra][1])
    return importlib.import_module(module or EXTRAS[extra][1])


def _found(extra: str) -> bool:
    try:
        return importlib.util.find_spec(EXTRAS[extra][1].split(".")[0]) is not None
    except (ImportError, ValueError):  # blocked by a finder; a module left without a spec
        return False


def _imports(extra: str, module: str) -> bool:
    try:
        _load(extra, module)
    except Exception:  # noqa: BLE001 - absent, blocked or broken: all mean it cannot be used here
        return False
    return True


def missing(extra: str, module: str | None = None) -> str | None:
    """None when the extra's package is installed, else one line: which package is not installed and the
    command that installs it. Without `module` nothing is imported (a light command can ask); with it, that
    module must import too."""
    usable = _found(extra) if module is None else _imports(extra, module)
    return None if usable else f"{EXTRAS[extra][0]} is not installed ({install_command(extra)})"


def require(extra: str, needed_by: str, module: str | None = None, instead: str | None = None) -> ModuleType:
    """`module` (default: the extra's own), or KronosError: "`needed_by` needs PACKAGE, which is not installed:
    pip install "kronos-tune[EXTRA]"", then "; or `instead`" when there is another way."""
    try:
        return _load(extra, module)
    except Exception:  # noqa: BLE001 - as in missing()
        other = f"; or {instead}" if instead else ""
        raise KronosError(f"{needed_by} needs {EXTRAS[extra][0]}, which is not installed: "
                          f"{install_command(extra)}{other}") from None


__all__ = ["EXTRAS", "install_command", "missing", "require"]
