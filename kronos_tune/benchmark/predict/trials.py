"""The predict side of the runner: one predict trial in a watched process of its own (trial_worker's
predict mode), its outputs compared with the reference method's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_tune.benchmark.predict.decide import BASELINE, EXACT_TOLERANCE, REFERENCE
from kronos_tune.benchmark.predict.measure import output_max_abs_diff
from kronos_tune.benchmark.predict.pipeline import benchmark_series, histories
from kronos_tune.benchmark.predict.precision_agreement import (agreement_text, identical_token_share,
                                                               max_relative_difference, sampled_agreement)
from kronos_tune.benchmark.task import RunContext
from kronos_tune.benchmark.events import PredictStep, TrialStep
from kronos_tune.benchmark.results import Spread, TrialResult, TrialSpec
from kronos_tune.benchmark.run.isolation import raise_for_exit, timeout_reason
from kronos_tune.benchmark.run.trial_worker import PREDICT_EVENT

PAIRED_MIN_ROUNDS = 6  # the fewest pairs whose signed-rank interval exists at 95 %
FLOAT32 = "kv-cache"  # the float32 run the reduced-precision trials are held to
PRECISION_TRIALS = ("bf16", "bf16-weights")


def _outputs(path: Path, ys: list[pd.Series]) -> list[pd.DataFrame]:
    if not path.is_file():
        return []
    with np.load(path) as arrays:
        values = [arrays[f"arr_{index}"] for index in range(len(arrays.files))]
    columns = pd.Index(FEATURE_COLUMNS)
    return [pd.DataFrame(v, columns=columns, index=pd.Index(stamps)) for v, stamps in zip(values, ys)]


def paired_reference(run: RunContext, spec: TrialSpec) -> tuple[TrialResult | None, str]:
    """(the finished trial to interleave this one's timed runs with, why): its reference when that is the
    kv-cache run and both are one process; else None and why the comparison is sequential."""
    reference = REFERENCE.get(spec.name)
    if spec.stage == "baseline" or reference is None:
        return None, ""
    if reference == BASELINE:
        return None, (f"against {BASELINE} on its own runs: re-running the full recompute beside the trial would "
                      f"cost minutes for an effect far beyond any noise")
    if run.options.design == "sequential":
        return None, "asked for (--design sequential)"
    if spec.config.devices > 1:
        return None, f"{spec.config.devices} processes need every device to themselves"
    done = run.results.get(reference)
    if done is None or done.status != "ok" or not done.config:
        return None, f"no {reference} run to pair with ({reference} {done.status if done else 'did not run'})"
    return done, (f"each timed run paired with a run of {reference}'s settings on the same series in the same "
                  f"worker, the order drawn per pair of rounds and mirrored in the second")


def run_trial(run: RunContext, spec: TrialSpec, work: Path) -> TrialResult:
    settings = spec.config
    result_file, outputs_file, sampled_file = work / "result.json", work / "outputs.npz", work / "sampled.npz"
    other_seed_file, tokens_file = work / "other_seed.npz", work / "tokens.npy"
    partner, design_reason = paired_reference(run, spec)
    repeats = spec.measured_steps if partner is None else max(spec.measured_steps, PAIRED_MIN_ROUNDS)
    precision_runs = any(s.name in PRECISION_TRIALS and s.skip_reason is None for s in run.specs)
    job = {"kind": "predict", "settings": settings.to_dict(), "device": run.device, "budget_bytes": run.budget_bytes,
           "repeats": repeats, "result_file": str(result_file), "outputs_file": str(outputs_file),
           "sampled_file": str(sampled_file), "tokens_file": str(tokens_file),
           "seed_spread": spec.name == FLOAT32 and precision_runs, "other_seed_file": str(other_seed_file)}
    if partner is not None:
        job["reference_settings"] = partner.config
        job["order_seed"] = f"{run.options.seed}:{spec.name}"

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == PREDICT_EVENT:
            run.emit(TrialStep(spec.name, PredictStep(**{k: v for k, v in event.items() if k != "event"})))

    outcome, stack_file = run.launch(spec, work, job, on_event)
    hardware = f"{settings.devices} x {run.device}"
    if outcome.timed_out:
        return TrialResult(spec.name, spec.stage, "timeout", spec.changes, timeout_reason(run.trial_timeout_s, stack_file),
                           spec.description, task="predict", hardware=hardware, config=settings.to_dict())
    if not result_file.is_file():
        raise_for_exit(outcome, work)
    m = json.loads(result_file.read_text(encoding="utf-8"))
    quality = benchmark_series(settings, run.device, settings.quality_series)  # the outputs kept are its
    dfs, ys = histories(quality), quality.futures
    outputs, sampled = _outputs(outputs_file, ys), _outputs(sampled_file, ys)
    seconds = list(m["seconds"])
    rates = [settings.measured_series / s for s in seconds]
    tokens = settings.measured_series * settings.sample_count * settings.pred_len
    result = TrialResult(spec.name, spec.stage, m["status"], spec.changes, m["reason"], spec.description,
                         task="predict", hardware=hardware, series_per_s=Spread.of(rates), step_times_s=seconds,
                         tokens_per_s=Spread.of([tokens / s for s in seconds]),
                         peak_memory_bytes=m["peak_memory_bytes"], config=settings.to_dict(),
                         warmup_time_s=m["metered_time_s"], nproc=settings.devices)
    if result.series_per_s:
        result.projected_predict_time_s = settings.series_count / result.series_per_s.median
    if design_reason:
        result.design, result.design_reason = ("paired" if partner is not None else "sequential"), design_reason
    if partner is not None:
        theirs, order = list(m.get("reference_seconds") or []), list(m.get("order") or [])
        result.blocks = [{"round": index + 1, "first": first, "trial_s": [mine], "baseline_s": [other]}
                         for index, (mine, other, first) in enumerate(zip(seconds, theirs, order))]
        result.timing = {"design": "paired", "paired_with": partner.name, "rounds": len(result.blocks),
                         "order_seed": job["order_seed"], "order": order}
    reference = run.results.get("recompute")
    if reference is not None and reference.series_per_s and result.series_per_s:
        result.speedup = result.series_per_s.median / reference.series_per_s.median
    tokens = np.load(tokens_file) if tokens_file.is_file() else None
    if spec.stage == "baseline":
        run.references["outputs"], run.references["sampled"] = outputs, sampled
        return result
    compare_quality(run, result, outputs, dfs, sampled)
    if spec.name == FLOAT32:
        run.references["float32"] = {"outputs": outputs, "sampled": sampled, "tokens": tokens,
                                     "other_seed": _outputs(other_seed_file, ys)}
    elif spec.name in PRECISION_TRIALS and result.quality:
        compare_with_float32(run.references.get("float32"), result, outputs, sampled, tokens, dfs)
    return result


def compare_with_float32(float32: dict | None, result: TrialResult, outputs: list[pd.DataFrame],
                         sampled: list[pd.DataFrame], tokens: np.ndarray | None,
                         histories: list[pd.DataFrame]) -> None:
    """The agreement of a reduced-precision trial with the float32 run (precision_agreement.py), into
    result.quality and one note."""
    if not float32:
        return
    shared = min(len(outputs), len(float32["outputs"]))
    if tokens is not None and float32["tokens"] is not None:
        result.quality["identical_tokens"] = identical_token_share(tokens, float32["tokens"])
    if shared:
        result.quality["forecast_max_rel_diff"] = max_relative_difference(outputs[:shared],
                                                                          float32["outputs"][:shared])
    spread = sampled_agreement(sampled, float32["sampled"], float32["other_seed"], histories)
    if spread is not None:
        result.quality["sampled_vs_float32"] = spread
    text = agreement_text(result.quality)
    if text:
        result.notes.append(f"agreement with float32 ({FLOAT32}): {text}")


def exact_reference(run: RunContext, name: str, sampled: bool = False) -> tuple[str, list[pd.DataFrame]]:
    """The output a trial's quality is judged against: the recompute's (on the series it predicted), or, for the
    trials after kv-cache, kv-cache's over all their series once it proved identical to the recompute's.
    `sampled`: the sampled runs' outputs (per-series streams) instead of the greedy ones."""
    exact, outputs = ("exact_sampled", "sampled") if sampled else ("exact", "outputs")
    if name != "kv-cache" and run.references.get(exact):
        return "kv-cache", run.references[exact]
    return "recompute", run.references.get(outputs) or []


def compare_quality(run: RunContext, result: TrialResult, outputs: list[pd.DataFrame],
                    histories: list[pd.DataFrame], sampled: list[pd.DataFrame] | None = None) -> None:
    """The trial's output against its exact reference over the series both predicted: the largest difference
    and the ranking agreement (result.quality, with the series count and the reference's name); with `sampled`
    outputs, their largest difference from the reference's sampled run too (quality["sampled_max_abs_diff"])."""
    name, reference = exact_reference(run, result.name)
    shared = min(len(outputs), len(reference))
    if not shared:
        return
    mine, theirs, shown = outputs[:shared], reference[:shared], histories[:shared]  # the same series: a prefix
    result.output_max_abs_diff = output_max_abs_diff(mine, theirs, shown)
    result.quality = {"series": shared, "reference": name, **(rank_agreement(mine, theirs, shown, result.stage) or {})}
    _, sampled_reference = exact_reference(run, result.name, sampled=True)
    if sampled and len(sampled) >= shared and len(sampled_reference) >= shared:
        result.quality["sampled_max_abs_diff"] = output_max_abs_diff(sampled[:shared], sampled_reference[:shared],
                                                                     shown)
    if "spearman" in result.quality:
        result.notes.append(f"ranking agreement with {name}'s predicted returns: Spearman "
                            f"{result.quality['spearman']:.3f} over {shared} series")
    if result.name == "kv-cache" and result.status == "ok" and result.output_max_abs_diff <= EXACT_TOLERANCE:
        run.references["exact"] = outputs
        if sampled and result.quality.get("sampled_max_abs_diff", 1.0) <= EXACT_TOLERANCE:
            run.references["exact_sampled"] = sampled
        if len(outputs) > shared:
            result.notes.append(f"identical to the recompute's output on the {shared} series both predicted: its "
                                f"output over all {len(outputs)} is the exact reference of the later trials")


def rank_agreement(outputs: list[pd.DataFrame], reference: list[pd.DataFrame] | None, histories: list[pd.DataFrame],
                   stage: str) -> dict | None:
    """Does the approximate setting change which series come out on top? Spearman of the predicted returns
    (last predicted close over last history close) against the reference method's, across the series
    (backtest.agreement.ranking_agreement); needs 3+ series to mean anything. predict/decide.py judges it."""
    from kronos_tune.backtest.agreement import ranking_agreement, returns_from_frames

    if stage == "baseline" or not outputs or not reference or len(outputs) != len(reference) or len(outputs) < 3:
        return None
    agreement = ranking_agreement(returns_from_frames(reference, histories), returns_from_frames(outputs, histories))
    value = agreement.spearman.mean
    return None if value != value else {"spearman": value, "series": len(outputs), "measure": "rank agreement"}
