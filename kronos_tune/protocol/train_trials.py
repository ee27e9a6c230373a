"""The training side of the runner: deciding autobatch/combined/noise-probe trials, running one trial in a
watched process of its own (alone, or its ranks under torchrun), and turning its measurement into a TrialResult.
What the results mean (verdicts, the recommendation) is decided in decision.py and summary.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from kronos_core.data.synthetic import synthetic_series
from kronos_core.train import StepRecord, TrainConfig
from kronos_core.train.builders import build_models
from kronos_tune.profiling.flops import mfu
from kronos_tune.protocol.decision import DecisionContext, decide
from kronos_tune.protocol.isolation import raise_for_exit, timeout_reason
from kronos_tune.protocol.measure import StepPlan, TrainMeasurement
from kronos_tune.protocol.plan import combine
from kronos_tune.protocol.quality import quality_guard
from kronos_tune.protocol.context import RunContext
from kronos_tune.protocol.records import Spread, TrialResult, TrialSpec, TrialStep
from kronos_tune.protocol.trial_worker import STEP_EVENT


PEAK_DTYPE = {"bf16": "bf16", "fp16": "fp16"}
DEFAULT_TRIAL_BUDGET_S = {"cpu": 10.0, "cuda": 20.0}


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _spec(run: RunContext, name: str) -> TrialSpec:
    return next(s for s in run.specs if s.name == name)


# Trials decided while running ---------------------------------------------------------------------------

def decision_context(run: RunContext) -> DecisionContext:
    from kronos_tune.protocol.summary import model_has_dropout

    margin = run.options.autobatch_margin
    return DecisionContext(budget_bytes=run.budget_bytes, objective=run.options.objective,
                           model_has_dropout=model_has_dropout(run.preset.workload.model_size),
                           **({} if margin is None else {"margin": margin}))


def resolve(run: RunContext, spec: TrialSpec, work: Path) -> tuple[TrialSpec, list[str]]:
    if spec.name == "combined":
        results = list(run.results.values())
        members = decide(results, decision_context(run)).combination
        return combine(run.specs, run.results, _spec(run, "baseline"), members), []
    if spec.name == "autobatch":
        return resolve_autobatch(run, spec)
    if spec.name == "bigger-batch":
        return resolve_bigger_batch(run, spec)
    if spec.name == "noise-probe":
        spec.config = materialize_probe(spec.config, _spec(run, "baseline").config, work)
        return spec, []
    return spec, []


def search_batch(run: RunContext, base: TrainConfig, **limits: Any) -> tuple[Any, str]:
    """autobatch over the baseline's config within the run's budget (cancellable between probes); `limits` go to
    TrainTask.run (effective_batch, max_batch). Returns the result and how it was measured."""
    from kronos_tune.autobatch.records import SearchCancelled
    from kronos_tune.autobatch.train_task import TrainTask

    estimate = run.options.autobatch_estimate
    estimate = run.device == "cpu" if estimate is None else estimate

    def on_probe(probe: Any) -> None:
        if run.cancel.is_set():
            raise SearchCancelled

    try:
        with TrainTask(base, device=run.device) as task:
            found = task.run(run.budget_bytes, margin=run.options.autobatch_margin, estimate=estimate,
                             on_probe=on_probe, **limits)
    except SearchCancelled:
        raise KeyboardInterrupt from None
    return found, "fake-tensor estimate" if estimate else "real probes"


def resolve_autobatch(run: RunContext, spec: TrialSpec) -> tuple[TrialSpec, list[str]]:
    """autobatch's micro-batch within the budget (the effective batch kept); skipped when it is the baseline's."""
    base: TrainConfig = _spec(run, "baseline").config
    found, how = search_batch(run, base, effective_batch=base.batch_size * base.accumulation_steps)
    notes = [f"autobatch ({how}, {found.search_time_s:.1f} s, margin {found.margin:g}): "
             f"{found.batch_size} x {found.accumulation_steps}, largest fitting micro-batch {found.max_fit_batch_size}"]
    spec.changes = {"batch_size": found.batch_size, "accumulation_steps": found.accumulation_steps}
    if (found.batch_size, found.accumulation_steps) == (base.batch_size, base.accumulation_steps):
        spec.skip_reason = (f"autobatch keeps {base.batch_size} x {base.accumulation_steps}, the baseline's own "
                            f"split: nothing else to measure")
        return spec, notes
    spec.config = base.replace(batch_size=found.batch_size, accumulation_steps=found.accumulation_steps)
    return spec, notes


def resolve_bigger_batch(run: RunContext, spec: TrialSpec) -> tuple[TrialSpec, list[str]]:
    """The effective batch raised to the largest micro-batch that fits (an autobatch search without the
    effective batch's limit), lr scaled by the sqrt rule, evaluated after the baseline's samples."""
    from kronos_tune.autobatch.maximize import data_cap, scale_for_batch

    base: TrainConfig = _spec(run, "baseline").config
    # searching past the data's cap tells the user what the card could hold (the headroom line)
    effective = base.batch_size * base.accumulation_steps
    found, how = search_batch(run, base, max_batch=max(4 * data_cap(base), effective + 1))
    largest = found.max_fit_batch_size
    notes = [f"autobatch ({how}, {found.search_time_s:.1f} s): largest fitting micro-batch {largest}"]
    config, change = scale_for_batch(base, largest, "sqrt")
    notes += [change.describe(), *change.notes]
    if change.batch_to <= change.batch_from:
        spec.skip_reason = (f"the budget holds no batch above the baseline's {change.batch_from} (largest fitting "
                            f"micro-batch {largest})")
        return spec, notes
    spec.config = config
    spec.changes = {"batch_size": config.batch_size, "accumulation_steps": 1, "lr": config.lr,
                    "pct_start": config.pct_start, "memory_allows": largest}
    if spec.eval_step is not None:  # the same samples seen as the baseline at its evaluation
        spec.eval_step = max(1, round(spec.eval_step * change.batch_from / change.batch_to))
    return spec, notes


def materialize_probe(config: TrainConfig, base: TrainConfig, work: Path) -> TrainConfig:
    """The noise probe reads the baseline's synthetic series from CSV files and starts from its initial
    weights, so only the sampler seed (the order of the training windows) differs from the baseline."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    frames = synthetic_series(base.synthetic_series, n_rows=base.synthetic_rows, seed=base.seed)
    for index, frame in enumerate(frames):
        frame.to_csv(data / f"series-{index:03d}.csv", index=False)
    model, tokenizer = build_models(base)
    model.save_pretrained(work / "predictor")
    assert tokenizer is not None
    tokenizer.save_pretrained(work / "tokenizer")
    return config.replace(data=[str(data)], predictor_dir=str(work / "predictor"),
                          tokenizer_dir=str(work / "tokenizer"))


# Running one trial -----------------------------------------------------------------------------------------

def step_plan(run: RunContext, spec: TrialSpec) -> StepPlan:
    options = run.options
    budget = options.trial_budget_s or DEFAULT_TRIAL_BUDGET_S.get(run.device, 20.0)
    return StepPlan(min_warmup=spec.warmup_steps, max_warmup=spec.max_warmup_steps,
                    settle_tolerance=options.settle_tolerance, min_steps=spec.measured_steps,
                    max_steps=max(spec.max_measured_steps, spec.measured_steps), target_ci=options.target_ci,
                    budget_s=budget, eval_step=spec.eval_step)


def run_trial(run: RunContext, spec: TrialSpec, work: Path) -> TrialResult:
    """The trial in its own process (torchrun for 2+ processes) under the run's watchdog."""
    config = spec.config.replace(output_dir=str(work / "run"))
    result_file = work / "result.json"
    job = {"trial": spec.name, "config": config.to_dict(), "plan": step_plan(run, spec).to_dict(),
           "budget_bytes": run.budget_bytes, "result_file": str(result_file)}

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == STEP_EVENT:
            run.emit(TrialStep(spec.name, StepRecord.from_dict(event)))

    outcome, stack_file = run.launch(spec, work, job, on_event)
    if outcome.timed_out:
        return TrialResult(spec.name, spec.stage, "timeout", dict(spec.changes), timeout_reason(run.trial_timeout_s, stack_file),
                           spec.description, task="train", config=spec.config.to_dict(), nproc=spec.nproc)
    measured = None
    if result_file.is_file():
        measured = TrainMeasurement.from_dict(json.loads(result_file.read_text(encoding="utf-8")))
    else:
        for rank_file in sorted(work.glob(f"{result_file.name}.rank*")):
            measured = TrainMeasurement.from_dict(json.loads(rank_file.read_text(encoding="utf-8")))
            break
    if measured is None:
        raise_for_exit(outcome, work)
    return train_result(run, spec, measured)


def _dtype(config: dict[str, Any]) -> str:
    if config.get("amp") in PEAK_DTYPE:
        return PEAK_DTYPE[config["amp"]]
    if config.get("device") == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "fp32"


def train_result(run: RunContext, spec: TrialSpec, m: TrainMeasurement) -> TrialResult:
    config = spec.config.to_dict()
    times = [r["step_time_s"] for r in m.timed]
    device_name = run.device if run.device == "cpu" else torch.cuda.get_device_name(torch.cuda.current_device())
    backend = " (gloo)" if spec.nproc > 1 and run.device == "cpu" else ""
    result = TrialResult(
        spec.name, spec.stage, m.status, dict(spec.changes), m.reason, spec.description, task="train",
        hardware=f"{spec.nproc} x {device_name}{backend}", step_time_s=Spread.of(times),
        samples_per_s=Spread.of([r["samples"] / r["step_time_s"] for r in m.timed]),
        tokens_per_s=Spread.of([r["tokens"] / r["step_time_s"] for r in m.timed]), tokens_per_step=m.tokens_per_step,
        peak_memory_bytes=m.peak_memory_bytes, peak_bytes_by_phase=m.peak_bytes_by_phase, val_loss=m.val_loss,
        val_loss_step=m.val_loss_step, warmup_time_s=m.warmup_time_s, train_losses=m.losses, config=config,
        nproc=spec.nproc, step_times_s=times, warmup_times_s=list(m.warmup_times_s), timing=dict(m.timing))
    if result.samples_per_s:
        result.projected_train_time_s = config["epochs"] * config["samples_per_epoch"] / result.samples_per_s.median
    peak = run.preset.peak_flops(_dtype(config)) if run.device == run.preset.hardware.device else None
    if result.tokens_per_s and m.flops_per_token and peak:
        result.mfu = mfu(result.tokens_per_s.median, m.flops_per_token, peak * spec.nproc)
    if config.get("compile") != "off" and run.device == "cpu" and m.peak_memory_bytes is not None:
        result.notes.append("memory: the CPU meter's dispatch mode keeps Dynamo from compiling the metered step, "
                            "so its peak is the eager step's")
    if spec.nproc > 1:
        result.notes.append(f"{spec.nproc} processes: time and throughput of the whole step; memory per process "
                            f"(rank 0), batch_size is per process")
    if m.warmup_time_s is not None and config.get("compile") != "off":
        result.notes.append(f"{len(m.warmup_times_s)} warm-up steps (compilation) took {m.warmup_time_s:.1f} s")
    base = run.results.get("baseline")
    if spec.stage not in ("baseline", "drift") and result.val_loss is not None and base is not None \
            and base.val_loss is not None:
        result.quality = quality_guard(base.val_loss, result.val_loss, run.noise(), run.options.noise_factor,
                                       run.options.quality_floor).to_dict()
    return result


