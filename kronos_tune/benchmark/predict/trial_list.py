"""The predict trials: the full recompute, the KV cache, bf16, the autobatch chunk and sharding."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.results import PredictSettings, TrialSpec
from kronos_tune.benchmark.selection import autobatch_available, device_count, selection_reason
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.chunk_size import choose_chunk_series
from kronos_tune.workloads import bf16_support
from kronos_tune.presets import Preset

if TYPE_CHECKING:
    from kronos_core.cpu_features import CpuFeatures

PREDICT_TRIALS = ("recompute", "kv-cache", "bf16", "bf16-weights", "autobatch", "sharding")
AGREEMENT_SERIES = 100  # the ranking agreement (and the exactness check) covers at least this many series
# Tokens one forward pass of the full-recompute reference holds at least: past this its cost per series no longer
# falls with more series (the cores / the GPU are busy), so it is timed on that many series, not the whole count.
REFERENCE_TOKENS = {"cpu": 4096, "cuda": 65536}


def predict_counts(series_count: int, options: BenchmarkOptions) -> tuple[int, int]:
    """(series each timed run predicts, series the quality check compares): by default the preset's whole
    series_count is timed, and quality covers at least AGREEMENT_SERIES series (or all the preset has)."""
    measured = min(series_count, options.predict_series or series_count)
    agreement = options.agreement_series or min(series_count, AGREEMENT_SERIES)
    return measured, max(measured, agreement)


def reference_series(measured: int, lookback: int, pred_len: int, sample_count: int, device: str) -> int:
    """Series the recompute reference times (the first of the measured ones): enough that each of its forward
    passes holds REFERENCE_TOKENS tokens. It recomputes the whole window for every token, so timing it on the
    whole count would cost pred_len full passes over every series per run (minutes per run at the presets'
    scale) and tell nothing more: its series/s is flat in the count once a pass fills the device."""
    window = (lookback + pred_len) * max(1, sample_count)
    return min(measured, max(1, -(-REFERENCE_TOKENS.get(device, REFERENCE_TOKENS["cuda"]) // window)))


def plan_predict(preset: Preset, options: BenchmarkOptions, device: str,
                 cpu: CpuFeatures | None = None) -> list[TrialSpec]:
    """The trial list; `cpu`: the CPU's features that decide bf16 on a CPU run (default: this machine's)."""
    p = preset.predict
    measured, agreement = predict_counts(p.series_count, options)
    cached = PredictSettings(preset.workload.model_size, p.lookback, p.pred_len, p.sample_count, p.series_count,
                             measured, use_cache=True, seed=options.seed, agreement_series=agreement,
                             chunk_series=choose_chunk_series(measured, 1, device, p.sample_count),
                             inputs=preset.job["inputs"] if preset.job is not None else None)
    reference = reference_series(measured, p.lookback, p.pred_len, p.sample_count, device)
    base = replace(cached, use_cache=False, agreement_series=None, measured_series=reference,
                   chunk_series=choose_chunk_series(reference, 1, device, p.sample_count))
    bf16 = bf16_support(preset.hardware, device, cpu)
    emulated = f" ({bf16.note})" if bf16.note else ""
    devices = shard_processes(device)
    specs = [
        TrialSpec("recompute", "baseline", {"use_cache": False}, base, None,
                  "the reference method: the whole window recomputed for every new token"
                  + (f"; timed and metered on the first {base.measured_series} of the {measured} series (its cost "
                     f"per series is flat in the count from {REFERENCE_TOKENS.get(device, REFERENCE_TOKENS['cuda'])} "
                     f"tokens a pass; its peak memory is for those series)" if base.measured_series < measured
                     else "")),
        TrialSpec("kv-cache", "single", {"use_cache": True}, cached, None,
                  "key/value cache: one new position per step (exact while the window has not slid)"),
        TrialSpec("bf16", "single", {"use_cache": True, "amp": "bf16"}, replace(cached, amp="bf16"), bf16.reason,
                  "KV cache with bf16 autocast (float32 weights, matmuls in bf16)" + emulated),
        TrialSpec("bf16-weights", "single", {"use_cache": True, "weight_dtype": "bf16"},
                  replace(cached, weight_dtype="bf16"), bf16.reason,
                  "KV cache with the weights held in bf16 (half the bytes each decode step reads)" + emulated),
        TrialSpec("autobatch", "single", {"use_cache": True, "max_batch_size": "autobatch"}, None,
                  None if autobatch_available() else "autobatch not available",
                  "KV cache with the chunk size autobatch finds within the budget"),
        TrialSpec("sharding", "single", {"use_cache": True, "devices": devices},
                  replace(cached, devices=devices, chunk_series=choose_chunk_series(measured, devices, device,
                                                                                    p.sample_count)),
                  _sharding_skip(devices, measured, device),
                  f"KV cache, predict's chunks claimed by {devices} torchrun processes "
                  + ("(one GPU each, NCCL)" if device == "cuda" else "(gloo)")),
    ]
    optional = PREDICT_TRIALS[1:]
    for spec in specs:
        spec.skip_reason = spec.skip_reason or selection_reason(spec.name, options, optional)
        settings = spec.config if spec.config is not None else cached
        # the metered run, and the quality run when quality covers more series than are timed
        spec.warmup_steps = 1 + (settings.quality_series > settings.measured_series)
        spec.measured_steps = options.predict_repeats
    return specs


def check_predict_options(options: BenchmarkOptions) -> None:
    for flag, value, least in (("--predict-series", options.predict_series, 1),
                               ("--agreement-series", options.agreement_series, 3),
                               ("--steps", options.predict_repeats, 1)):
        if value is not None and value < least:
            raise KronosTuneError(f"{flag} {value}: give at least {least}")
    if not -1 <= options.min_spearman <= 1:
        raise KronosTuneError(f"--min-spearman {options.min_spearman:g}: a Spearman correlation is between -1 and 1")


def shard_processes(device: str) -> int:
    """Processes of the sharding trial: one per visible GPU. The CPU counts as one device, so the plan skips
    the trial there; `sharding.measure_sharded` itself runs CPU ranks too (gloo), which tests use."""
    return device_count(device)


def _sharding_skip(processes: int, measured: int, device: str) -> str | None:
    if processes < 2:
        return "sharding series needs 2+ devices"
    if measured < processes:
        return f"{measured} measured series cannot be split over {processes} processes; raise --predict-series"
    return None
