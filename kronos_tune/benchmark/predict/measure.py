"""Measuring the predict protocol's trials (planned in `trial_list.plan_predict`): the reference's full recompute vs the
KV cache vs bf16 vs the autobatch chunk vs sharding the series over processes, on the preset's predict shape.

Each trial predicts the same `measured_series` synthetic series (the preset's
lookback, pred_len and sample paths; random weights of the preset's model
size; greedy decoding so the outputs of the methods can be compared): one
metered run first (peak memory, the budget enforced: simulated on the CPU),
then `repeats` timed runs without the meter. series/s is per timed run; the
projection is the preset's series_count at the median rate. The outputs kept
for the quality check are the metered run's; when the check is asked to
cover more series than are timed (`agreement_series`), one more untimed run
predicts those (the timed series are the first of them). Last, one untimed
sampled run over the same series (T 1.0, top-p 0.9, per-series random streams
keyed by each series' name) lets the check cover sampled output too: with the
streams, an exact method must give the same sampled forecast as its reference.

The sharding trial runs torchrun processes (one per GPU, NCCL; CPU ranks
use gloo with the cores split between them), not threads: the host work of a
prediction holds the GIL. Each rank loads the model once, predicts
its block of series `repeats` + 1 times between barriers, and rank 0 reports
each run's wall time; the first run stands in for the metered run (the
memory meter cannot see other processes: on CUDA the ranks report their
allocator peak, on the CPU the peak is not measured).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from kronos_core.data.kline import FEATURE_COLUMNS, wall_clock_ns
from kronos_core.errors import one_line
from kronos_core.launch import LaunchSpec, run_launch, torchrun_command
from kronos_core.predict.arrays import prepare_lists
from kronos_core.predict.sharded import ShardJob, read_merged, write_job
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.predict.streams import series_key
from kronos_core.predict.spec import PredictorSpec, build_predictor
from kronos_core.sizes import SIZES
from kronos_core.data.synthetic import synthetic_series
from kronos_core.units import format_bytes
from kronos_tune.benchmark.run.order import trial_leads
from kronos_tune.benchmark.events import PredictStep
from kronos_tune.benchmark.results import PredictSettings

SAMPLED = dict(T=1.0, top_k=0, top_p=0.9)  # the exactness check's sampled run (greedy: top_k=1)
GREEDY = dict(T=1.0, top_k=1, top_p=1.0)

@dataclass
class PredictMeasurement:
    status: str  # ok | oom | cancelled
    reason: str | None = None
    seconds: list[float] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    metered_time_s: float | None = None
    outputs: list[pd.DataFrame] = field(default_factory=list)
    sampled_outputs: list[pd.DataFrame] = field(default_factory=list)  # the untimed sampled run's (quality set)
    reference_seconds: list[float] = field(default_factory=list)  # paired: the reference's run in each round
    order: list[str] = field(default_factory=list)  # paired: which side ran first in each round


def series_inputs(settings: PredictSettings, count: int | None = None
                  ) -> tuple[list[pd.DataFrame], list[pd.Series], list[pd.Series]]:
    """The first `count` (default: measured_series) synthetic series: histories, their stamps, future stamps."""
    frames = synthetic_series(count or settings.measured_series, n_rows=settings.lookback + settings.pred_len,
                              seed=settings.seed)
    dfs = [f.iloc[:settings.lookback][list(FEATURE_COLUMNS)].reset_index(drop=True) for f in frames]
    xs = [f["timestamps"].iloc[:settings.lookback].reset_index(drop=True) for f in frames]
    ys = [f["timestamps"].iloc[settings.lookback:].reset_index(drop=True) for f in frames]
    return dfs, xs, ys


def series_names(count: int) -> list[str]:
    """The synthetic series' names: what their random streams are keyed by."""
    return [f"series-{index:05d}" for index in range(count)]


def _predictor(settings: PredictSettings, device: str) -> KronosPredictor:
    return build_predictor(predictor_spec(settings, device))


def predictor_spec(settings: PredictSettings, device: str) -> PredictorSpec:
    """The predictor a trial's settings describe (random weights of the preset's size)."""
    return PredictorSpec(size=settings.model_size, seed=settings.seed, device="cuda:0" if device == "cuda" else "cpu",
                         max_context=SIZES[settings.model_size].context,
                         amp=None if settings.amp == "none" else settings.amp, use_cache=settings.use_cache,
                         max_batch_size=settings.max_batch_size)


def _run(predictor: KronosPredictor, settings: PredictSettings,
         inputs: tuple[list[pd.DataFrame], list[pd.Series], list[pd.Series]], sampled: bool = False
         ) -> list[pd.DataFrame]:
    """Predict every measured series, greedy and seeded; `sampled`: T 1.0, top-p 0.9 from per-series streams."""
    dfs, xs, ys = inputs
    torch.manual_seed(settings.seed)
    sampling = dict(SAMPLED, keys=series_names(len(dfs)), seed=settings.seed) if sampled else GREEDY
    frames = predictor.predict_batch(dfs, xs, ys, settings.pred_len, sample_count=settings.sample_count,
                                     verbose=False, **sampling)
    if predictor.device.type == "cuda":
        torch.cuda.synchronize(predictor.device)
    return frames


def _timed_run(predictor: KronosPredictor, settings: PredictSettings,
               inputs: tuple[list[pd.DataFrame], list[pd.Series], list[pd.Series]]) -> float:
    start = time.perf_counter()
    _run(predictor, settings, inputs)
    return time.perf_counter() - start


def measure_sharded(settings: PredictSettings, device: str, repeats: int,
                    on_step: Callable[[PredictStep], None] | None = None,
                    should_stop: Callable[[], bool] = lambda: False) -> PredictMeasurement:
    """The sharding trial: `settings.devices` torchrun ranks, each predicting its block `repeats` + 1 times;
    then, when quality covers more series than are timed, one more launch predicting those once; last, one
    launch of the sampled run over the quality series."""
    result = _launch_sharded(settings, device, repeats, settings.measured_series, on_step, should_stop)
    if result.status == "ok" and settings.quality_series > settings.measured_series:
        if should_stop():
            result.status, result.reason = "cancelled", "cancelled before the quality run"
            return result
        quality = _launch_sharded(settings, device, 0, settings.quality_series, None, should_stop)
        if quality.status != "ok":
            result.status, result.reason = quality.status, f"quality run: {quality.reason}"
        result.outputs = quality.outputs
        if on_step is not None and quality.metered_time_s is not None:
            on_step(_quality_step(settings, repeats, quality.metered_time_s))
    if result.status == "ok":
        if should_stop():
            result.status, result.reason = "cancelled", "cancelled before the sampled run"
            return result
        sampled = _launch_sharded(settings, device, 0, settings.quality_series, None, should_stop, sampled=True)
        if sampled.status != "ok":
            result.status, result.reason = sampled.status, f"sampled run: {sampled.reason}"
        result.sampled_outputs = sampled.outputs
    return result


def _quality_step(settings: PredictSettings, repeats: int, seconds: float) -> PredictStep:
    tokens = settings.quality_series * settings.sample_count * settings.pred_len
    return PredictStep(repeats + 2, repeats + 2, settings.quality_series, tokens, seconds, timed=False)


def _launch_sharded(settings: PredictSettings, device: str, repeats: int, count: int,
                    on_step: Callable[[PredictStep], None] | None,
                    should_stop: Callable[[], bool], sampled: bool = False) -> PredictMeasurement:
    import shutil
    import tempfile
    from pathlib import Path

    result = PredictMeasurement(status="ok")
    dfs, xs, ys = series_inputs(settings, count)
    (group,) = prepare_lists(dfs, xs, ys, settings.pred_len).groups
    processes = settings.devices
    threads = None if device == "cuda" else max(1, (os.cpu_count() or 1) // processes)
    job = ShardJob(size=settings.model_size, seed=settings.seed, device="cuda" if device == "cuda" else "cpu",
                   amp=None if settings.amp == "none" else settings.amp,
                   max_context=SIZES[settings.model_size].context, max_batch_size=settings.max_batch_size,
                   top_k=(SAMPLED if sampled else GREEDY)["top_k"], top_p=(SAMPLED if sampled else GREEDY)["top_p"],
                   sample_count=settings.sample_count, repeats=repeats, threads=threads)
    keys = None if not sampled else np.array(
        [series_key(name, int(wall_clock_ns(stamps)[-1])) for name, stamps in zip(series_names(count), xs)])
    work = Path(tempfile.mkdtemp(prefix="kronos-predict-trial-"))
    tokens = count * settings.sample_count * settings.pred_len
    total = repeats + 1 + (settings.quality_series > settings.measured_series)
    peaks: list[int] = []

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "run":
            index, seconds = int(event["index"]), float(event["seconds"])
            if index == 0:
                result.metered_time_s = seconds
            else:
                result.seconds.append(seconds)
            if on_step is not None:
                on_step(PredictStep(index + 1, total, count, tokens, seconds, timed=index > 0))
        elif event.get("event") == "part" and event.get("peak_gpu_bytes") is not None:
            peaks.append(int(event["peak_gpu_bytes"]))

    try:
        job_file = write_job(work, job, group.x, group.x_stamp, group.y_stamp, keys=keys)
        launched = run_launch(torchrun_command(LaunchSpec(nproc=processes), "kronos_core.predict.sharded",
                                               [str(job_file)]), on_event=on_event, should_stop=should_stop)
        if launched.stopped:
            result.status, result.reason = "cancelled", f"cancelled after {len(result.seconds)} timed runs"
            return result
        if not launched.ok:
            errors = launched.error_events()
            message = errors[0].get("message", "") if errors else (launched.tail or ["no message"])[-1]
            oom = "out of memory" in message.lower()
            result.status = "oom" if oom else "failed"
            result.reason = f"rank {errors[0].get('rank')}: {message}" if errors else f"torchrun: {message}"
            return result
        merged = read_merged(work)
        columns = pd.Index(FEATURE_COLUMNS)
        result.outputs = [pd.DataFrame(values, columns=columns, index=pd.Index(stamps))
                          for values, stamps in zip(merged, ys)]
        result.peak_memory_bytes = max(peaks) if peaks else None
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure_prediction(settings: PredictSettings, device: str, budget_bytes: int, repeats: int,
                       on_step: Callable[[PredictStep], None] | None = None,
                       should_stop: Callable[[], bool] = lambda: False,
                       reference: PredictSettings | None = None, order_seed: str = "") -> PredictMeasurement:
    """One metered run (peak, budget), then `repeats` timed runs; out-of-memory is a result. With `reference`
    (paired), each timed run is a round: the trial's run and the reference settings' run on the same series, in
    an order drawn from `order_seed` per pair of rounds and mirrored in the second (order.trial_leads). The
    reference's predictor is built after the metered run, so the meter sees the trial alone."""
    from kronos_tune.memory import make_meter

    if settings.devices > 1:
        return measure_sharded(settings, device, repeats, on_step, should_stop)
    result = PredictMeasurement(status="ok")
    inputs = series_inputs(settings)
    tokens = settings.measured_series * settings.sample_count * settings.pred_len
    total = repeats + 1 + (settings.quality_series > settings.measured_series)
    try:
        predictor = _predictor(settings, device)
        start = time.perf_counter()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats(predictor.device)
            result.outputs = _run(predictor, settings, inputs)
            result.peak_memory_bytes = torch.cuda.max_memory_allocated(predictor.device)
        else:
            meter = make_meter(device, budget_bytes)
            try:
                meter.track_existing(predictor.model, predictor.tokenizer)
                with meter:
                    result.outputs = _run(predictor, settings, inputs)
            finally:
                result.peak_memory_bytes = meter.peak_bytes()
        result.metered_time_s = time.perf_counter() - start
        if on_step is not None:
            on_step(PredictStep(1, total, settings.measured_series, tokens, result.metered_time_s, timed=False))
        other = None
        if reference is not None:
            other = _predictor(reference, device)
            _run(other, reference, inputs)  # its first run (allocations, caches) is not timed, as the trial's
        leads = trial_leads(order_seed)
        for index in range(repeats):
            if should_stop():
                result.status, result.reason = "cancelled", f"cancelled after {index} timed runs"
                return result
            if other is None or reference is None:
                result.seconds.append(_timed_run(predictor, settings, inputs))
            else:
                trial_first = next(leads)
                result.order.append("trial" if trial_first else "baseline")
                if trial_first:
                    result.seconds.append(_timed_run(predictor, settings, inputs))
                result.reference_seconds.append(_timed_run(other, reference, inputs))
                if not trial_first:
                    result.seconds.append(_timed_run(predictor, settings, inputs))
            if on_step is not None:
                on_step(PredictStep(index + 2, total, settings.measured_series, tokens, result.seconds[-1]))
        if settings.quality_series > settings.measured_series:
            if should_stop():
                result.status, result.reason = "cancelled", f"cancelled after {repeats} timed runs"
                return result
            start = time.perf_counter()
            result.outputs = _run(predictor, settings, series_inputs(settings, settings.quality_series))
            if on_step is not None:
                on_step(_quality_step(settings, repeats, time.perf_counter() - start))
        if should_stop():
            result.status, result.reason = "cancelled", "cancelled before the sampled run"
            return result
        result.sampled_outputs = _run(predictor, settings, series_inputs(settings, settings.quality_series),
                                      sampled=True)
        return result
    except torch.OutOfMemoryError as error:
        result.status, result.reason = "oom", one_line(error, typed=False)
        return result


def autobatch_chunk(settings: PredictSettings, device: str, budget_bytes: int, margin: float) -> tuple[int, list[str]]:
    """Sequences per chunk (KronosPredictor max_batch_size) that autobatch finds for the whole workload."""
    from kronos_tune.autobatch import autobatch
    from kronos_tune.autobatch.predict_task import PredictTask

    task = PredictTask(settings.model_size, settings.lookback, settings.pred_len, settings.sample_count,
                       settings.series_count, device=device, seed=settings.seed)
    result = autobatch(task.step_factory, budget_bytes, margin=margin, min_batch=1, max_batch=settings.series_count,
                       device=device, steps_per_probe=1)
    notes = [f"autobatch: {result.batch_size} series per chunk ({result.batch_size * settings.sample_count} "
             f"sequences), measured peak {format_bytes(result.measured_peak_bytes, 'MiB', 0)} of a "
             f"{format_bytes(budget_bytes, 'GiB')} budget, search {result.search_time_s:.1f} s"]
    if result.batch_size >= settings.measured_series:
        notes.append(f"the chunk holds all {settings.measured_series} measured series, as the default does: the "
                     f"timed runs are the kv-cache runs again; the pick matters for the full "
                     f"{settings.series_count}-series run")
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
