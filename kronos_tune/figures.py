"""matplotlib (the `plot` extra) for the pictures kronos-tune writes into run folders.

matplotlib is imported only when a picture is drawn. Figures are made without pyplot: no global state, no
backend switch and no window, so a picture can be drawn in the dashboard's worker thread too (PNG goes
through matplotlib's Agg renderer, SVG through its SVG one).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_core.files import atomic_path
from kronos_core.optional import missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def have_matplotlib() -> bool:
    return missing("plot") is None


def new_figure(**kwargs: Any) -> Figure | None:
    """A matplotlib Figure (keyword arguments as Figure's), or None when matplotlib is not installed."""
    if missing("plot", "matplotlib.figure") is not None:
        return None
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def save_figure(figure: Figure, path: Path, dpi: int = 110, key: str | None = None) -> Path:
    """Write `figure` to `path` (format from its suffix) through kronos_core.files.atomic_path. SVG keeps its
    text as text (searchable, small) and carries no date, so the same figure gives the same file. `key` (PNG
    only): a text chunk that `png_key` reads back, so a caller can skip redrawing what has not changed."""
    import matplotlib

    kind = path.suffix.lstrip(".").lower()
    settings = {"svg.fonttype": "none", "svg.hashsalt": "kronos-tune"} if kind == "svg" else {}
    metadata: dict[str, Any] | None = {"Date": None} if kind == "svg" else None
    if key is not None and kind == "png":
        metadata = {PNG_KEY: key}
    with matplotlib.rc_context(settings), atomic_path(path) as temp:
        figure.savefig(temp, format=kind, dpi=dpi, metadata=metadata)
    return path


PNG_KEY = "kronos-tune key"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_key(path: Path) -> str | None:
    """The key `save_figure` wrote into a PNG (its tEXt chunks come before the image data), or None: no file,
    not a PNG, or no key. Reads a few hundred bytes and needs no matplotlib."""
    try:
        with open(path, "rb") as file:
            if file.read(8) != PNG_SIGNATURE:
                return None
            while True:
                head = file.read(8)
                if len(head) < 8:
                    return None
                length, kind = struct.unpack(">I4s", head)
                if kind in (b"IDAT", b"IEND"):
                    return None
                body = file.read(length)
                file.read(4)  # CRC
                if kind == b"tEXt":
                    name, _, text = body.partition(b"\0")
                    if name.decode("latin-1") == PNG_KEY:
                        return text.decode("latin-1")
    except OSError:
        return None
