"""How many series a chunk holds when the user does not say (`--chunk-series`).

Enough chunks that a stop keeps finished work and ranks share the work by speed (at least
CHUNKS_PER_PROCESS per process), and no chunk larger than one predict call fills on the device (beyond
CPU_ROWS sequences a CPU call stops getting faster per series and only costs memory; a 481-series panel ran
faster and in less memory in 64-series chunks than in one 1,024-series chunk).
"""

from __future__ import annotations

CHUNKS_PER_PROCESS = 8
MIN_CHUNK_SERIES = 16      # smaller chunks spend more time per series on per-call overhead
ROWS_PER_CALL = {"cpu": 256, "cuda": 4096}


def choose_chunk_series(total: int, processes: int, device: str, sample_count: int = 1) -> int:
    """Series per chunk for `total` series on `processes` processes of `device` ("cpu" or "cuda")."""
    rows = ROWS_PER_CALL.get(device.split(":")[0], ROWS_PER_CALL["cuda"])
    cap = max(1, rows // max(1, sample_count))
    shared = -(-max(1, total) // (CHUNKS_PER_PROCESS * max(1, processes)))
    return max(1, min(cap, max(shared, min(MIN_CHUNK_SERIES, total))))


def describe_chunks(size: int, total: int, processes: int, chosen: bool) -> str:
    """One line: the chunk size, the chunk count and why."""
    chunks = -(-total // size) if total else 0
    per = f", about {chunks / processes:.0f} per process" if processes > 1 else ""
    how = ("chosen from the job: a stop keeps every finished chunk and ranks share them by speed; "
           "--chunk-series N sets it" if chosen else "as --chunk-series asks")
    return f"chunks of {size} series: {chunks} chunks{per} ({how})"


__all__ = ["CHUNKS_PER_PROCESS", "choose_chunk_series", "describe_chunks"]
