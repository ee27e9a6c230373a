"""Finished fake-tensor traces on disk, so that repeating `kronos-tune plan` answers without tracing again.

An entry's key hashes everything its figures depend on: what the caller passes (the traced config, batch
sizes, ranks, CUDA emulation), the Python and torch versions, and the source of kronos_core and of
kronos_tune's memory and autobatch packages, so a change to any of them makes new keys and old entries are
never read again. Entries are JSON files in `$KRONOS_TUNE_CACHE_DIR` (`off` turns the cache off), else
`$XDG_CACHE_HOME/kronos-tune`, else `~/.cache/kronos-tune`, under `traces/`. An entry that cannot be read is
traced again; one that cannot be written is skipped: the cache never changes an answer, only its speed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

CACHE_ENV = "KRONOS_TUNE_CACHE_DIR"
_SOURCES = ("kronos_core", "kronos_tune/memory", "kronos_tune/autobatch")


def cache_dir() -> Path | None:
    """Where entries live; None when `KRONOS_TUNE_CACHE_DIR=off`."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return None if chosen.strip().lower() == "off" else Path(chosen).expanduser() / "traces"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kronos-tune" / "traces"


@functools.cache
def _code_fingerprint() -> str:
    import torch

    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(f"{platform.python_version()} {torch.__version__}".encode())
    for folder in _SOURCES:
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def entry_key(kind: str, inputs: Any) -> str:
    """The key of `inputs` (anything json.dumps can write, with `default=str`) for traces of `kind`."""
    text = json.dumps(inputs, sort_keys=True, default=str)
    return f"{kind}-" + hashlib.sha256(f"{_code_fingerprint()} {text}".encode()).hexdigest()[:32]


def load(key: str) -> Any | None:
    folder = cache_dir()
    if folder is None:
        return None
    try:
        return json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def store(key: str, value: Any) -> None:
    """Write atomically (a reader sees the whole entry or none); failures are ignored."""
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False, encoding="utf-8") as out:
            json.dump(value, out)
        os.replace(out.name, folder / f"{key}.json")
    except OSError:
        pass
