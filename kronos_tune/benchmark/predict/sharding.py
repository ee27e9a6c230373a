"""The sharding trial: predict's claiming ranks (`kronos-tune predict --nproc N`), timed.

Every pass is one launch of `kronos_tune.predict.ranks` through `shards.run_ranks`, with the job file predict
writes (`rank_job`: the predictor spec and chunk settings of the trial's predict config) and a temporary work
folder holding the chunks' inputs and parts, as a sharded `predict` without --out has. torchrun starts one
process per GPU (NCCL; CPU ranks use gloo). A pass's time runs from the first rank's `ready` event (its
predictor built, about to claim a chunk) to rank 0's `finished` (every chunk's part written): what the
single-process trials time, without the processes' start and the model's build. The first pass stands in for
the metered run (the memory meter cannot see other processes: the peak is not measured); then `repeats` timed
passes; then, untimed, the greedy pass over the quality series and, when those are more than the timed ones,
a sampled pass over them (measure.py has the same sequence in one process).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kronos_tune.benchmark.events import PredictStep
from kronos_tune.benchmark.predict.pipeline import (PredictMeasurement, benchmark_series, chunks_of, decoding,
                                                    frames_of, predict_config, quality_step, values_of)
from kronos_tune.benchmark.results import PredictSettings
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.config import predictor_spec
from kronos_tune.predict.series import LoadedSeries


@dataclass
class RanksPass:
    status: str  # ok | oom | cancelled | failed
    reason: str | None = None
    seconds: float | None = None
    values: np.ndarray | None = None  # mean paths [N, P, 6]


def ranks_pass(settings: PredictSettings, device: str, series: LoadedSeries, greedy: bool = False) -> RanksPass:
    """One pass of the claiming ranks over `series`."""
    from kronos_tune.predict.shards import rank_job, run_ranks
    from kronos_tune.predict.workdir import temporary_work

    config = predict_config(settings, device, len(series))
    job = rank_job(predictor_spec(config), decoding(config, greedy))
    work = temporary_work({"benchmark": "predict", "trial": "sharding"})
    marks: dict[str, float] = {}

    def on_event(event: dict) -> None:
        kind = event.get("event")
        if kind == "ready":
            marks.setdefault("ready", time.perf_counter())
        elif kind == "finished":
            marks["finished"] = time.perf_counter()

    chunks = chunks_of(series, config.chunk_series or 1)
    try:
        run_ranks(config.launch, job, work, enumerate(chunks), {}, lambda level, message: None, None,
                  command_name="benchmark sharding trial", on_event=on_event)
        if "ready" not in marks or "finished" not in marks:
            return RanksPass("failed", "the ranks finished without their ready and finished events")
        values = values_of([work.read(k) for k in range(len(chunks))], config.pred_len)
        return RanksPass("ok", seconds=marks["finished"] - marks["ready"], values=values)
    except KronosTuneError as error:
        message = str(error)
        if "stopped before every chunk" in message:
            return RanksPass("cancelled", "cancelled while the ranks ran")
        return RanksPass("oom" if "out of memory" in message.lower() else "failed", message)
    finally:
        work.remove()


def measure_sharded(settings: PredictSettings, device: str, repeats: int,
                    on_step: Callable[[PredictStep], None] | None = None,
                    should_stop: Callable[[], bool] = lambda: False) -> PredictMeasurement:
    """The metered pass and `repeats` timed passes of the ranks over the measured series, then the quality
    passes (module docstring)."""
    result = PredictMeasurement(status="ok")
    series = benchmark_series(settings, device)
    tokens = settings.measured_series * settings.sample_count * settings.pred_len
    wider = settings.quality_series > settings.measured_series
    total = repeats + 1 + wider
    sampled = None

    def failed(done: RanksPass, what: str) -> PredictMeasurement:
        result.status, result.reason = done.status, f"{what}: {done.reason}"
        return result

    for index in range(repeats + 1):
        if should_stop():
            result.status, result.reason = "cancelled", f"cancelled after {len(result.seconds)} timed runs"
            return result
        done = ranks_pass(settings, device, series)
        if done.status != "ok" or done.seconds is None:
            return failed(done, "metered run" if index == 0 else f"timed run {index}")
        if index == 0:
            result.metered_time_s, sampled = done.seconds, done.values
        else:
            result.seconds.append(done.seconds)
        if on_step is not None:
            on_step(PredictStep(index + 1, total, settings.measured_series, tokens, done.seconds, timed=index > 0))
    if should_stop():
        result.status, result.reason = "cancelled", f"cancelled after {repeats} timed runs"
        return result
    quality = benchmark_series(settings, device, settings.quality_series) if wider else series
    greedy = ranks_pass(settings, device, quality, greedy=True)
    if greedy.status != "ok" or greedy.values is None:
        return failed(greedy, "quality run")
    result.outputs = frames_of(greedy.values, quality)
    if wider:
        if on_step is not None and greedy.seconds is not None:
            on_step(quality_step(settings, repeats, greedy.seconds))
        if should_stop():
            result.status, result.reason = "cancelled", "cancelled before the sampled run"
            return result
        wide = ranks_pass(settings, device, quality)
        if wide.status != "ok":
            return failed(wide, "sampled run")
        sampled = wide.values
    result.sampled_outputs = frames_of(sampled, quality) if sampled is not None else []
    return result
