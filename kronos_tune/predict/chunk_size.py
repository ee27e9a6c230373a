"""How many series a chunk (the job's resumable unit) holds when the user does not say (`--chunk-series`).

Enough chunks that a stop keeps finished work and ranks share the work by speed (at least
CHUNKS_PER_PROCESS per process), and no chunk larger than one predict call runs
(`kronos_core.predict.call_size.rows_per_call`: `max_batch_size` when given, else the device's cap; beyond
256 sequences a CPU call stops getting faster per series and only costs memory, and a 481-series panel ran
faster and in less memory in 64-series chunks than in one 1,024-series chunk).
"""

from __future__ import annotations

from kronos_core.predict.call_size import rows_per_call, series_per_call

CHUNKS_PER_PROCESS = 8
MIN_CHUNK_SERIES = 16      # smaller chunks spend more time per series on per-call overhead
HOW_CHOSEN = (f"chosen from the job: at least {CHUNKS_PER_PROCESS} chunks per process, none larger than one "
              "predict call (max_batch_size)")


def choose_chunk_series(total: int, processes: int, device: str, sample_count: int = 1,
                        max_batch_size: int | None = None) -> int:
    """Series per chunk for `total` series on `processes` processes of `device` ("cpu", "cuda", "cuda:1")."""
    cap = series_per_call(rows_per_call(device.split(":")[0], max_batch_size), sample_count)
    shared = -(-max(1, total) // (CHUNKS_PER_PROCESS * max(1, processes)))
    return max(1, min(cap, max(shared, min(MIN_CHUNK_SERIES, total))))


def describe_chunks(size: int, total: int, processes: int, chosen: bool) -> str:
    """One line: the chunk size, the chunk count and why."""
    chunks = -(-total // size) if total else 0
    per = f", about {chunks / processes:.0f} per process" if processes > 1 else ""
    how = ("chosen from the job: a stop keeps every finished chunk and ranks share them by speed; "
           "--chunk-series N sets it" if chosen else "as --chunk-series asks")
    return f"chunks of {size} series: {chunks} chunks{per} ({how})"


__all__ = ["CHUNKS_PER_PROCESS", "HOW_CHOSEN", "choose_chunk_series", "describe_chunks"]
