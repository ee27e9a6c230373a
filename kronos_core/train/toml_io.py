"""A tiny TOML writer for flat tables of scalars and lists, and a reader wrapper.

kronos_core must not depend on `tomli_w`, and a training config is one flat
table, so this writes just what it needs: strings, booleans, integers, floats
and lists of those. `None` values are left out (TOML has no null), so a reader
falls back to the field's default.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from kronos_core.errors import KronosError

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def _string(text: str) -> str:
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def toml_value(value: Any, key: str) -> str:
    """One TOML value; raises KronosError for what a flat config cannot hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".eEn") else text + ".0"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item, key) for item in value) + "]"
    raise KronosError(f"config key '{key}': cannot write {type(value).__name__} {value!r} to TOML; "
                      f"use a string, number, boolean or list")


def dumps_flat(values: dict[str, Any], header: str = "") -> str:
    """A TOML document with one `key = value` line per non-None entry, in the given order."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for key, value in values.items():
        if value is None:
            continue
        lines.append(f"{key} = {toml_value(value, key)}")
    return "\n".join(lines) + "\n"


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a missing file or a syntax error becomes one KronosError line."""
    path = Path(path)
    if not path.is_file():
        raise KronosError(f"config file {path} not found; check the path (kronos-tune train --config FILE)")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise KronosError(f"{path}: invalid TOML ({error}); fix the syntax") from None
    except (OSError, UnicodeDecodeError) as error:
        raise KronosError(f"{path}: cannot read ({error}); check permissions and encoding") from None
