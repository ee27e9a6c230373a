"""Measuring the predict benchmark's trials (planned in `trial_list.plan_predict`): the reference's full recompute vs the
KV cache vs bf16 vs the autobatch chunk vs sharding the series over processes, on the preset's predict shape.

Each trial runs what `kronos-tune predict --config RUN/recommended.toml` runs (pipeline.py: predict's config,
predictor, synthetic series and chunk pipeline) on the same `measured_series` series (the preset's lookback,
pred_len and sample paths; random weights of the preset's model size): one metered pass first (peak memory,
the budget enforced: simulated on the CPU), then `repeats` timed passes without the meter, each decoding as
predict does (temperature 1, top-p 0.9, each series' own random stream, so an exact method gives the same
sampled forecast as its reference). series/s is per timed pass; the projection is the preset's series_count
at the median rate. Then, untimed, one greedy pass (top-k 1) over the series the quality check covers
(`agreement_series`; the timed series are the first of them) gives the outputs compared for exactness and
ranking agreement, and, when that set is larger than the timed one, one sampled pass over it gives the
sampled outputs (else the metered pass's are used).

The sharding trial (sharding.py) runs predict's claiming ranks instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_core.errors import one_line
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.predict.spec import build_predictor
from kronos_core.units import format_bytes
from kronos_tune.benchmark.run.order import trial_leads
from kronos_tune.benchmark.events import PredictStep
from kronos_tune.benchmark.predict.pipeline import (PredictMeasurement, benchmark_series, frames_of,
                                                    greedy_pass_with_tokens, predict_config, predict_pass,
                                                    quality_step, with_chunk)
from kronos_tune.benchmark.results import PredictSettings
from kronos_tune.predict.config import PredictConfig, predictor_spec


def _predictor(config: PredictConfig) -> KronosPredictor:
    """The trial's predictor: random weights of its size, or the user's checkpoint (`benchmark --config`)."""
    if config.checkpoint is None:
        return build_predictor(predictor_spec(config))
    from kronos_tune.predict.job import resolve_weights

    return build_predictor(predictor_spec(config, resolve_weights(config, lambda level, message: None)))


def _timed(predictor: KronosPredictor, config: PredictConfig, series) -> float:
    start = time.perf_counter()
    predict_pass(predictor, config, series)
    return time.perf_counter() - start


def measure_prediction(settings: PredictSettings, device: str, budget_bytes: int, repeats: int,
                       on_step: Callable[[PredictStep], None] | None = None,
                       should_stop: Callable[[], bool] = lambda: False,
                       reference: PredictSettings | None = None, order_seed: str = "",
                       seed_spread: bool = False) -> PredictMeasurement:
    """One metered pass (peak, budget), then `repeats` timed passes; out-of-memory is a result. `seed_spread`:
    one more untimed sampled pass on the next seed (the float32 sampling noise the bf16 trials are held to).
    With `reference` (paired), each timed pass is a round: the trial's pass and the reference settings' pass on
    the same series, in an order drawn from `order_seed` per pair of rounds and mirrored in the second
    (order.trial_leads). The reference's predictor is built after the metered pass, so the meter sees the trial alone."""
    from kronos_tune.memory import make_meter

    settings = with_chunk(settings, device)
    if settings.devices > 1:
        from kronos_tune.benchmark.predict.sharding import measure_sharded

        return measure_sharded(settings, device, repeats, on_step, should_stop)
    result = PredictMeasurement(status="ok")
    config = predict_config(settings, device)
    series = benchmark_series(settings, device)
    tokens = settings.measured_series * settings.sample_count * settings.pred_len
    total = repeats + 1 + (settings.quality_series > settings.measured_series)
    try:
        predictor = _predictor(config)
        start = time.perf_counter()
        if predictor.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(predictor.device)
            sampled = predict_pass(predictor, config, series)
            result.peak_memory_bytes = torch.cuda.max_memory_allocated(predictor.device)
        else:
            meter = make_meter(device, budget_bytes)
            try:
                meter.track_existing(predictor.model, predictor.tokenizer)
                with meter:
                    sampled = predict_pass(predictor, config, series)
            finally:
                result.peak_memory_bytes = meter.peak_bytes()
        result.metered_time_s = time.perf_counter() - start
        if on_step is not None:
            on_step(PredictStep(1, total, settings.measured_series, tokens, result.metered_time_s, timed=False))
        other = other_config = None
        if reference is not None:
            other_config = predict_config(with_chunk(reference, device), device)
            other = _predictor(other_config)
            predict_pass(other, other_config, series)  # its first pass (allocations, caches) is not timed either
        leads = trial_leads(order_seed)
        for index in range(repeats):
            if should_stop():
                result.status, result.reason = "cancelled", f"cancelled after {index} timed runs"
                return result
            if other is None or other_config is None:
                result.seconds.append(_timed(predictor, config, series))
            else:
                trial_first = next(leads)
                result.order.append("trial" if trial_first else "baseline")
                if trial_first:
                    result.seconds.append(_timed(predictor, config, series))
                result.reference_seconds.append(_timed(other, other_config, series))
                if not trial_first:
                    result.seconds.append(_timed(predictor, config, series))
            if on_step is not None:
                on_step(PredictStep(index + 2, total, settings.measured_series, tokens, result.seconds[-1]))
        if should_stop():
            result.status, result.reason = "cancelled", f"cancelled after {repeats} timed runs"
            return result
        wider = settings.quality_series > settings.measured_series
        quality = benchmark_series(settings, device, settings.quality_series) if wider else series
        start = time.perf_counter()
        greedy, result.greedy_tokens = greedy_pass_with_tokens(predictor, config, quality)
        result.outputs = frames_of(greedy, quality)
        if wider and on_step is not None:
            on_step(quality_step(settings, repeats, time.perf_counter() - start))
        if wider:
            if should_stop():
                result.status, result.reason = "cancelled", "cancelled before the sampled run"
                return result
            sampled = predict_pass(predictor, config, quality)
        result.sampled_outputs = frames_of(sampled, quality)
        if seed_spread and not should_stop():
            result.other_seed_outputs = frames_of(predict_pass(predictor, config, quality, seed=config.seed + 1),
                                                  quality)
        return result
    except torch.OutOfMemoryError as error:
        result.status, result.reason = "oom", one_line(error, typed=False)
        return result


def autobatch_chunk(settings: PredictSettings, device: str, budget_bytes: int, margin: float) -> tuple[int, list[str]]:
    """Sequences per call (KronosPredictor max_batch_size) that autobatch finds for the whole workload; the trial
    runs chunks of that many series (task.resolve)."""
    from kronos_tune.autobatch import autobatch
    from kronos_tune.autobatch.predict_probes import PredictProbes

    task = PredictProbes(settings.model_size, settings.lookback, settings.pred_len, settings.sample_count,
                         settings.series_count, device=device, seed=settings.seed)
    result = autobatch(task.step_factory, budget_bytes, margin=margin, min_batch=1, max_batch=settings.series_count,
                       device=device, steps_per_probe=1)
    notes = [f"autobatch: {result.batch_size} series per call ({result.batch_size * settings.sample_count} "
             f"sequences), measured peak {format_bytes(result.measured_peak_bytes, 'MiB', 0)} of a "
             f"{format_bytes(budget_bytes, 'GiB')} budget, search {result.search_time_s:.1f} s"]
    if result.batch_size >= settings.measured_series:
        notes.append(f"the chunk holds all {settings.measured_series} measured series: one predict call per "
                     f"timed pass; the pick matters for the full {settings.series_count}-series run")
    return result.batch_size * settings.sample_count, notes


def output_max_abs_diff(outputs: list[pd.DataFrame], reference: list[pd.DataFrame],
                        histories: list[pd.DataFrame]) -> float | None:
    """Largest |prediction - reference prediction| over every series, step and feature, in units of that
    series' history standard deviation per feature (the z-score scale the model works in); None without both."""
    if not outputs or not reference or len(outputs) != len(reference):
        return None
    worst = 0.0
    for mine, theirs, history in zip(outputs, reference, histories):
        scale = np.maximum(history[list(FEATURE_COLUMNS)].to_numpy().std(axis=0), 1e-12)
        worst = max(worst, float(np.max(np.abs(mine.to_numpy() - theirs.to_numpy()) / scale)))
    return worst
