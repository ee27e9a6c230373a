"""How many sequences (series x sample paths) one predict call runs: the one rule, for the predictor and for
every caller that sizes work around a call (the job's chunks, the backtest's, the benchmark's).

`max_batch_size` wins when given: the user's, or autobatch's pick from its measured peak-memory model
(`kronos-tune autobatch --task predict`, the benchmark's autobatch trial, a recommended.toml). Without it a
call holds at most the device's cap, fewer when memory holds fewer (an analytic bound per sequence) and, on
the CPU, fewer when the largest activation would leave glibc's recycled blocks. Importing this module does
not import torch.
"""

from __future__ import annotations

from typing import Any

from kronos_core.errors import KronosError

CPU_MAX_ROWS = 256  # larger batches stop paying off on CPU and only cost memory
# One number on CUDA: the predictor's own cap (the chunk chooser's 4096 was a second, unmeasured one). Below
# it, a call is bounded by free memory.
GPU_MAX_ROWS = 8192
# glibc serves a block above its mmap threshold (at most 32 MiB on 64-bit) from fresh pages each time and
# returns them when it is freed, so a CPU call whose activations exceed it faults its pages in again on every
# call: Kronos-mini at a 268-token window spent 9.2 s of 16.5 s in the kernel at 240 rows a call, 0.8 s at 60.
CPU_BLOCK_BYTES = 32 << 20
MEMORY_SHARE = 0.4  # of free memory, for the sequences in flight


def device_cap(device_type: str) -> int:
    """The most sequences a call runs on a device type ("cuda", "cpu", "mps", ...), whatever memory holds."""
    return GPU_MAX_ROWS if device_type == "cuda" else CPU_MAX_ROWS


def rows_per_call(device_type: str, max_batch_size: int | None = None, fit: int | None = None,
                  block_rows: int | None = None) -> int:
    """Sequences one call runs: `max_batch_size` when given, else the device's cap lowered to `fit` (sequences
    that free memory holds) and, off CUDA, to `block_rows` (see cpu_rows_within_blocks). Without `fit` and
    `block_rows` (no model loaded yet) it is the most a call can run."""
    if max_batch_size is not None:
        if max_batch_size < 1:
            raise KronosError(f"max_batch_size must be >= 1, got {max_batch_size}")
        return max_batch_size
    bounds = [device_cap(device_type), fit]
    if device_type != "cuda":
        bounds.append(block_rows)
    return max(1, min(bound for bound in bounds if bound is not None))


def series_per_call(rows: int, sample_count: int) -> int:
    """Series in a call of `rows` sequences (each series runs `sample_count` of them)."""
    return max(1, rows // max(1, sample_count))


def cpu_rows_within_blocks(model: Any, window: int) -> int:
    """Rows a CPU call can run while its largest activation (the feed-forward's hidden layer over the window,
    float32) stays within CPU_BLOCK_BYTES. `model`: a kronos_core.model.Kronos."""
    widest = max(model.transformer[0].ffn.w1.out_features, model.d_model)
    return max(1, CPU_BLOCK_BYTES // (window * widest * 4))


def bytes_per_sequence(model: Any, tokenizer: Any, window: int, element_bytes: int) -> int:
    """Rough upper bound of the memory one sequence in flight needs during prediction: its key/value cache
    plus the transient activations of a prefill over the window. `model`/`tokenizer`: Kronos, KronosTokenizer."""
    d = model.d_model
    ff = model.transformer[0].ffn.w1.out_features
    cache = int(model.kv_cache_bytes(1, window, element_bytes))
    prefill = window * (8 * d + 3 * ff + 4 * 2 ** model.s1_bits) * max(element_bytes, 4)
    attention_scores = model.n_heads * window * window * 4
    tokenizer_pass = window * 12 * tokenizer.d_model * 4
    return cache + prefill + attention_scores + tokenizer_pass


def memory_fit(free_bytes: int, per_sequence_bytes: int) -> int:
    """Sequences that MEMORY_SHARE of `free_bytes` holds."""
    return int(MEMORY_SHARE * free_bytes // per_sequence_bytes)
