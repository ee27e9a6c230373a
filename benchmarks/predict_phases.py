"""Where the time of a KV-cached prediction goes, and how far each phase is from its floor.

The cached path does one full-window prefill (about one recompute step), then
cheap one-token steps; the tokenizer's encode and decode are shared with the
recompute path. So the cached/recompute speed-up is bounded even if the cached
steps cost nothing:

    ceiling = recompute_time / (cached_time - cached_steps_time)

and a cached step cannot beat reading every weight plus the KV cache once
from memory. `python -m benchmarks.predict --breakdown` prints both.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from kronos_core.model import Kronos
from kronos_core.predict.predictor import KronosPredictor


PHASES = ("prepare", "h2d", "encode", "prefill", "steps", "decode", "d2h", "output")
PHASE_LABELS = {"prepare": "host preparation", "h2d": "to device + normalize", "encode": "tokenizer encode",
                "prefill": "prefill", "steps": "one-token steps", "decode": "tokenizer decode",
                "d2h": "de-normalize + to host", "output": "output frames"}


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds spent in each phase of one predict_batch call (summed over groups and chunks)."""

    prepare: float  # host: frames and timestamps to arrays, calendar features
    h2d: float      # copy to the device and normalization
    encode: float   # tokenizer encode
    prefill: float  # first generated step: the whole history into the cache
    steps: float    # the remaining pred_len - 1 one-token steps
    decode: float   # tokenizer decode of the window
    d2h: float      # de-normalization and the copy back to the host
    output: float   # building the output DataFrames
    step_count: int

    @property
    def total(self) -> float:
        return sum(getattr(self, name) for name in PHASES)

    @property
    def host(self) -> float:
        """Host-only work: preparation and output construction."""
        return self.prepare + self.output


def split_phases(start: float, marks: list[tuple[str, float]], end: float, pred_len: int) -> PhaseTimes:
    """Turn the phase clock's (phase, time) marks of one call into PhaseTimes.

    The predictor marks "prepare" once, per length group "h2d", per chunk "encode", "step" pred_len
    times and "decode", per group "d2h"; the time after the last mark is output construction.
    """
    totals = dict.fromkeys(PHASES, 0.0)
    previous, steps_in_chunk, step_count = start, 0, 0
    for phase, moment in marks:
        if phase == "step":
            steps_in_chunk += 1
            totals["prefill" if steps_in_chunk == 1 else "steps"] += moment - previous
            step_count += steps_in_chunk > 1
        elif phase in ("prepare", "h2d", "encode", "decode", "d2h"):
            if phase == "decode" and steps_in_chunk != pred_len:
                raise ValueError(f"expected {pred_len} step marks before decode, got {steps_in_chunk}")
            totals[phase] += moment - previous
            steps_in_chunk = 0
        else:
            raise ValueError(f"unknown phase mark {phase!r}")
        previous = moment
    totals["output"] = end - previous
    return PhaseTimes(step_count=step_count, **totals)


def time_phases(predictor: KronosPredictor, run: Callable[[], object], pred_len: int) -> PhaseTimes:
    """Run `run()` (one predict_batch call on `predictor`) with the phase clock attached."""
    sync = _synchronizer(predictor.device)
    marks: list[tuple[str, float]] = []

    def clock(phase: str) -> None:
        sync()
        marks.append((phase, time.perf_counter()))

    predictor.phase_clock = clock
    try:
        sync()
        start = time.perf_counter()
        run()
        sync()
        end = time.perf_counter()
    finally:
        predictor.phase_clock = None
    return split_phases(start, marks, end, pred_len)


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def weight_bytes_per_step(model: Kronos) -> int:
    """Bytes of every parameter a one-token step reads: all but the embedding tables
    (of which a step reads one row each)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in tables)


def mean_cache_length(history: int, pred_len: int, context: int | None = None) -> float:
    """Mean number of cached positions a one-token step attends over (steps 1..pred_len-1;
    step i sees history + i positions, at most `context` once a shifting window is full)."""
    lengths = [history + i if context is None else min(history + i, context) for i in range(1, pred_len)]
    return sum(lengths) / len(lengths) if lengths else float(history)


def kv_bytes_per_step(model: Kronos, rows: int, history: int, pred_len: int, element_bytes: int,
                      context: int | None = None) -> int:
    """Mean bytes of key/value cache a one-token step reads over the steps after the prefill."""
    return int(model.kv_cache_bytes(rows, mean_cache_length(history, pred_len, context), element_bytes))


def measure_read_bandwidth(device: torch.device, nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Streaming read bandwidth (bytes/s) of `device` now: median time to sum a large buffer."""
    buffer = torch.ones(nbytes // 4, device=device)
    sync = _synchronizer(device)
    buffer.sum()
    sync()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        sync()
        seconds.append(time.perf_counter() - start)
    return nbytes / statistics.median(seconds)


def _median_phases(runs: list[PhaseTimes]) -> PhaseTimes:
    medians = {name: statistics.median(getattr(r, name) for r in runs) for name in PHASES}
    return PhaseTimes(step_count=runs[0].step_count, **medians)


def breakdown_lines(runs: list[PhaseTimes], model: Kronos, rows: int, history: int, pred_len: int,
                    element_bytes: int, bandwidth: float, recompute_seconds: float | None,
                    context: int, window_mode: str = "refill") -> list[str]:
    """Human-readable phase breakdown, per-step memory floor and speed-up ceilings.

    Once history + generated tokens pass `context`, refill mode re-fills the cache at every
    step (no one-token floor applies); shift mode keeps one-token steps over `context` positions."""
    phases = _median_phases(runs)
    ms = 1e3
    per_step = phases.steps / max(phases.step_count, 1)
    parts = [f"{PHASE_LABELS[name]} {getattr(phases, name) * ms:.0f}" for name in PHASES if name != "steps"]
    parts.insert(4, f"{phases.step_count} one-token steps {phases.steps * ms:.0f} ({per_step * ms:.2f} per step)")
    lines = [f"cached path phases (median of {len(runs)} runs, ms): " + ", ".join(parts)
             + f"; total {phases.total * ms:.0f}"]
    floor_step = None
    if history + pred_len > context and window_mode == "refill":
        lines.append(f"the window slides after {context - history} steps and later steps re-fill the cache "
                     "exactly: no one-token memory floor is given (--window-mode shift has one)")
    else:
        weights = weight_bytes_per_step(model)
        kv = kv_bytes_per_step(model, rows, history, pred_len, element_bytes, context)
        floor_step = (weights + kv) / bandwidth
        mean_length = mean_cache_length(history, pred_len, context)
        lines.append(f"per-step memory floor: weights {weights / 1e6:.1f} MB + KV cache {kv / 1e6:.1f} MB "
                     f"(mean length {mean_length:.0f}, {rows} rows) at {bandwidth / 1e9:.1f} GB/s "
                     f"streaming read measured now = {floor_step * ms:.2f} ms; measured step is "
                     f"{per_step / floor_step:.2f}x the floor")
    if recompute_seconds is not None:
        fixed = phases.total - phases.steps
        parts = [f"measured {recompute_seconds / phases.total:.1f}x", f"steps free {recompute_seconds / fixed:.1f}x"]
        if floor_step is not None:
            at_floor = fixed + phases.step_count * floor_step
            parts.append(f"steps at the memory floor {recompute_seconds / at_floor:.1f}x")
        lines.append("speed-up over recompute (median recompute time / cached time): " + "; ".join(parts))
    return lines
