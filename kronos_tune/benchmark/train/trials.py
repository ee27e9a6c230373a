"""The training side of the runner: deciding autobatch/combined/noise-probe trials (and what the quick run leaves
out), running one trial in watched processes of its own, and turning its measurement into a TrialResult.

The baseline's worker stays alive after its own measurement; each later comparison is paired with it
(paired.py: alternating blocks) or, where two workers cannot live side by side, runs alone as today (the
sequential design: its process measures, evaluates and exits; the drift checks then run too). What the results
mean (verdicts, the recommendation) is decided in decision.py and summary.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kronos_core.data.synthetic import synthetic_series
from kronos_core.train import StepRecord, TrainConfig
from kronos_core.train.builders import build_models
from kronos_tune.profiling.flops import mfu
from kronos_tune.benchmark.task import RunContext
from kronos_tune.benchmark.stats import verdict_open
from kronos_tune.benchmark.train.decide import DecisionContext, decide, measuring_threshold, memory_binding
from kronos_tune.benchmark.run.isolation import raise_for_exit, timeout_reason
from kronos_tune.benchmark.run.live_worker import LiveWorker, WorkerGone
from kronos_tune.benchmark.train.measure import TrialSteps, TrainMeasurement
from kronos_tune.benchmark.run.paired import BASELINE_WORKER, Interleaver, choose_design, steps_per_block
from kronos_tune.benchmark.train.trial_list import combine
from kronos_tune.benchmark.selection import left_out
from kronos_tune.benchmark.quality import guard_trial
from kronos_tune.benchmark.events import TrialStep
from kronos_tune.benchmark.results import NOISE_PROBE, Spread, TrialResult, TrialSpec
from kronos_tune.benchmark.run.trial_worker import STEP_EVENT


PEAK_DTYPE = {"bf16": "bf16", "fp16": "fp16"}
DEFAULT_TRIAL_BUDGET_S = {"cpu": 10.0, "cuda": 20.0}
RESOLUTION_BUDGET_FACTOR = 3.0  # the A/A comparison's rounds over a trial's (comparison_budget)


def _spec(run: RunContext, name: str) -> TrialSpec:
    return next(s for s in run.specs if s.name == name)


# Trials decided while running ---------------------------------------------------------------------------

def decision_context(run: RunContext) -> DecisionContext:
    from kronos_tune.benchmark.train.summary import model_has_dropout

    margin = run.options.autobatch_margin
    return DecisionContext(budget_bytes=run.budget_bytes, objective=run.options.objective,
                           model_has_dropout=model_has_dropout(run.preset.workload.model_size),
                           **({} if margin is None else {"margin": margin}))


def resolve(run: RunContext, spec: TrialSpec, work: Path) -> tuple[TrialSpec, list[str]]:
    if spec.kind is not None and spec.kind.kind == "baseline-repeat" and spec.name != NOISE_PROBE \
            and not run.paired.sequential_ran:
        spec.skip_reason = ("not needed: every comparison so far was paired with a live baseline, in which drift "
                            "cancels; re-measurements of the baseline guard sequential comparisons only")
        return spec, []
    if spec.kind is not None and spec.kind.kind == "memory":
        why = quick_memory_reason(run, spec)
        if why is not None:
            spec.skip_reason = why
            return spec, []
    if spec.stage == "combined":
        results = list(run.results.values())
        members = decide(results, decision_context(run)).combination
        return combine(run.specs, run.results, _spec(run, "baseline"), members), []
    if spec.name == "autobatch":
        return resolve_autobatch(run, spec)
    if spec.name == "bigger-batch":
        return resolve_bigger_batch(run, spec)
    if spec.name == NOISE_PROBE:
        spec.config = materialize_probe(spec.config, _spec(run, "baseline").config, work)
        return spec, []
    return spec, []


def will_run(run: RunContext, spec: TrialSpec) -> bool:
    """What `resolve` is likely to decide, without its side effects: a baseline re-measurement runs only once a
    comparison was sequential, a memory saver once the baseline shows memory binding (before it: counted)."""
    if spec.skip_reason is not None:
        return False
    if spec.kind is not None and spec.kind.kind == "baseline-repeat" and spec.name != NOISE_PROBE:
        return run.paired.sequential_ran or run.options.design == "sequential"
    if spec.kind is not None and spec.kind.kind == "memory":
        return quick_memory_reason(run, spec) is None
    return True


def quick_memory_reason(run: RunContext, spec: TrialSpec) -> str | None:
    """Why the quick run leaves a memory saver out: memory does not bind and the objective is speed (None: the
    saver runs, as with --full, --only or --objective memory)."""
    options = run.options
    if options.full or spec.name in options.only or options.objective == "memory":
        return None
    base = run.results.get("baseline")
    if base is None:
        return None
    binds, why = memory_binding(list(run.results.values()), decision_context(run))
    return None if binds else left_out(spec.name, f"a memory saver, and {why}")


def search_batch(run: RunContext, base: TrainConfig, **limits: Any) -> tuple[Any, str]:
    """autobatch over the baseline's config within the run's budget (cancellable between probes); `limits` go to
    TrainProbes.run (effective_batch, max_batch). Returns the result and how it was measured."""
    from kronos_tune.autobatch.probes import SearchCancelled
    from kronos_tune.autobatch.train_probes import TrainProbes

    estimate = run.options.autobatch_estimate
    estimate = run.device == "cpu" if estimate is None else estimate
    if run.device == "cuda" and not estimate:
        run.paired.close()  # real probes need the card to themselves; the next paired trial starts it again

    def on_probe(probe: Any) -> None:
        if run.cancel.is_set():
            raise SearchCancelled

    try:
        with TrainProbes(base, device=run.device) as task:
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
    run.setup_costs[spec.name] = {"autobatch search": float(found.search_time_s)}
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
    run.setup_costs[spec.name] = {"autobatch search": float(found.search_time_s)}
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
    """The noise probe reads the baseline's series from CSV files (synthetic ones written here) and starts from
    its initial weights, so only the sampler seed (the order of the training windows) differs from the baseline."""
    data = base.data
    if base.is_synthetic:  # a user's job already reads files (the run's saved copy of them)
        folder = work / "data"
        folder.mkdir(parents=True, exist_ok=True)
        frames = synthetic_series(base.synthetic_series, n_rows=base.synthetic_rows, seed=base.seed)
        for index, frame in enumerate(frames):
            frame.to_csv(folder / f"series-{index:03d}.csv", index=False)
        data = [str(folder)]
    model, tokenizer = build_models(base)
    if base.what == "tokenizer":  # the tokenizer phase trains the tokenizer itself: only it has a start
        model.save_pretrained(work / "tokenizer")
        return config.replace(data=data, tokenizer_dir=str(work / "tokenizer"))
    model.save_pretrained(work / "predictor")
    assert tokenizer is not None
    tokenizer.save_pretrained(work / "tokenizer")
    return config.replace(data=data, predictor_dir=str(work / "predictor"),
                          tokenizer_dir=str(work / "tokenizer"))


# Running one trial -----------------------------------------------------------------------------------------

def trial_steps(run: RunContext, spec: TrialSpec, budget_s: float | None = None) -> TrialSteps:
    options = run.options
    return TrialSteps(min_warmup=spec.warmup_steps, max_warmup=spec.max_warmup_steps,
                    settle_tolerance=options.settle_tolerance, min_steps=spec.measured_steps,
                    max_steps=max(spec.max_measured_steps, spec.measured_steps), target_ci=options.target_ci,
                    budget_s=trial_budget(run) if budget_s is None else budget_s, eval_step=spec.eval_step)


def trial_budget(run: RunContext) -> float:
    return (run.options.trial_budget_s or run.preset.benchmark.trial_budget_s
            or DEFAULT_TRIAL_BUDGET_S.get(run.device, 20.0))


def comparison_budget(run: RunContext, spec: TrialSpec) -> float:
    """Seconds of paired rounds for one comparison. The A/A comparison (the noise-probe) gets more: its interval
    is the run's resolution, the threshold every other verdict is held to, and its rounds are where that figure
    comes from (``resolution_budget_s``, else RESOLUTION_BUDGET_FACTOR x the trial budget; a --trial-budget
    given on the command line scales it too)."""
    if spec.name != NOISE_PROBE:
        return trial_budget(run)
    preset_figure = run.preset.benchmark.resolution_budget_s
    if run.options.trial_budget_s is None and preset_figure:
        return preset_figure
    return RESOLUTION_BUDGET_FACTOR * trial_budget(run)


def block_seconds(run: RunContext) -> float:
    """The paired blocks' length: ``block_s``, or shorter when the trial's budget would not hold ``min_rounds``
    rounds of two such blocks."""
    return min(run.options.block_s, trial_budget(run) / (2 * max(1, run.options.min_rounds)))


def _job(run: RunContext, spec: TrialSpec, work: Path, budget_s: float | None = None) -> dict[str, Any]:
    config = spec.config.replace(output_dir=str(work / "run"))
    return {"trial": spec.name, "config": config.to_dict(), "steps": trial_steps(run, spec, budget_s).to_dict(),
            "budget_bytes": run.budget_bytes, "result_file": str(work / "result.json")}


def _on_step(run: RunContext, name: str) -> Any:
    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == STEP_EVENT:
            run.emit(TrialStep(name, StepRecord.from_dict(event)))
    return on_event


def _ended(spec: TrialSpec, status: str, reason: str, **figures: Any) -> TrialResult:
    result = TrialResult(spec.name, spec.stage, status, dict(spec.changes), reason, spec.description, task="train",
                         config=spec.config.to_dict() if spec.config is not None else None, nproc=spec.nproc,
                         **figures)
    result.set_kind(spec.kind)
    return result


def run_trial(run: RunContext, spec: TrialSpec, work: Path) -> TrialResult:
    """The baseline (its worker kept alive for the comparisons), or one comparison in the design that fits."""
    if spec.kind is not None and spec.kind.kind == "reference":
        return run_baseline(run, spec, work)
    if spec.stage == "drift" or (spec.kind is not None and spec.kind.kind == "baseline-repeat"
                                 and spec.name != NOISE_PROBE):
        result = run_sequential(run, spec, work)
        result.design, result.design_reason = "sequential", "a re-measurement of the baseline on its own"
        return result
    design, why = choose_design(run, spec, run.results.get("baseline"))
    if design == "paired":
        result = run_paired(run, spec, work)
    else:
        run.paired.sequential_ran = True
        if run.device == "cuda":
            run.paired.close()  # its cached memory is not for a trial that needs the cards (started again later)
        result = run_sequential(run, spec, work)
    result.design, result.design_reason = design, why
    return result


def run_baseline(run: RunContext, spec: TrialSpec, work: Path) -> TrialResult:
    """The baseline's own row, measured in a worker that then stays alive (paused) for the paired comparisons;
    measured as a sequential trial when the run pairs nothing."""
    if run.options.design == "sequential":
        return run_sequential(run, spec, work)
    # its own row matters less where every comparison pairs with it: half the measuring budget
    worker = run.paired.start(run, spec, lambda folder: _job(run, spec, folder, trial_budget(run) / 2))
    on_step = _on_step(run, spec.name)
    try:
        measured = worker.ready(on_step)
        if measured.status == "ok":
            measured = worker.measure(on_step)
    except WorkerGone as gone:
        run.paired.close()
        if gone.cancelled:
            raise KeyboardInterrupt from None
        status = "timeout" if gone.timed_out else "failed"
        return _ended(spec, status, gone.reason)
    if measured.status != "ok":
        run.paired.close()
    result = train_result(run, spec, measured)
    run.paired.step_time_s = result.step_time_s.median if result.step_time_s else None
    if result.status == "ok" and choose_design(run, spec, result)[0] == "sequential":
        run.paired.close()  # two baseline-sized workers do not fit: every comparison will run alone
    return result


def baseline_worker(run: RunContext) -> LiveWorker:
    """The live baseline worker, started again (warm-up, no measurement) when the run has none: after a resume,
    or after it died in an earlier comparison."""
    worker = run.paired.alive()
    if worker is not None:
        return worker
    spec = _spec(run, "baseline")
    worker = run.paired.start(run, spec, lambda folder: _job(run, spec, folder))
    worker.ready()
    if run.paired.step_time_s is None:
        base = run.results.get("baseline")
        run.paired.step_time_s = base.step_time_s.median if base is not None and base.step_time_s else None
    return worker


def _open_verdict(run: RunContext, spec: TrialSpec) -> Callable[[list[float]], bool] | None:
    """Whether a change's block ratios leave its verdict open when its budget is spent, against the run's
    threshold as the A/A measured it (then it is measured on: paired.Interleaver). None for a trial with
    another batch size than the baseline's: its raw block ratios are not the per-token ones it is judged on."""
    base = run.results.get("baseline")
    if spec.config is not None and base is not None and base.config and \
            spec.config.batch_size != base.config.get("batch_size"):
        return None
    threshold = measuring_threshold(list(run.results.values()), decision_context(run))
    return lambda ratios: verdict_open(ratios, threshold)


def run_paired(run: RunContext, spec: TrialSpec, work: Path) -> TrialResult:
    """The trial's worker and the baseline's in alternating blocks (paired.Interleaver), then the trial's
    evaluation; whatever was measured before a worker died, timed out or was cancelled is kept."""
    on_step = _on_step(run, spec.name)
    aa = spec.name == NOISE_PROBE
    interleaver = Interleaver(run, spec.name, 1, comparison_budget(run, spec), whole_budget=aa,
                              min_rounds=run.options.resolution_min_rounds if aa else None,
                              open_verdict=None if aa else _open_verdict(run, spec))
    worker: LiveWorker | None = None
    ready: TrainMeasurement | None = None
    try:
        base = baseline_worker(run)
        interleaver.steps = steps_per_block(run.paired.step_time_s, block_seconds(run))
        worker = LiveWorker(run, spec, work, _job(run, spec, work))
        ready = worker.ready(on_step)
        if ready.status != "ok":
            return train_result(run, spec, ready)
        interleaver.measure(base, worker, on_step)
        if interleaver.stop in ("cancelled", "ended"):
            measured = worker.measurement() or ready
            if interleaver.stop == "cancelled" or measured.status == "ok":
                measured.status, measured.reason = "cancelled", f"cancelled after {len(interleaver.blocks)} rounds"
        else:
            measured = worker.finish(on_step)
    except WorkerGone as gone:
        if gone.who == BASELINE_WORKER:
            run.paired.close()  # the next comparison starts a fresh one
        status = "cancelled" if gone.cancelled else "timeout" if gone.timed_out else "failed"
        result = _ended(spec, status, gone.reason, blocks=list(interleaver.blocks))
        if ready is not None:
            result.peak_memory_bytes, result.warmup_times_s = ready.peak_memory_bytes, list(ready.warmup_times_s)
        _paired_figures(run, result, interleaver)
        return result
    finally:
        if worker is not None:
            worker.close()
    result = train_result(run, spec, measured, interleaver)
    return result


def run_sequential(run: RunContext, spec: TrialSpec, work: Path) -> TrialResult:
    """The trial in its own process (torchrun for 2+ processes) under the run's watchdog: warm-up, the metered
    step, measured steps, the evaluation, exit."""
    job = _job(run, spec, work)
    result_file = Path(job["result_file"])
    outcome, stack_file = run.launch(spec, work, job, _on_step(run, spec.name))
    if outcome.timed_out:
        return _ended(spec, "timeout", timeout_reason(run.trial_timeout_s, stack_file))
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


def _paired_figures(run: RunContext, result: TrialResult, interleaver: Interleaver) -> None:
    """The trial's step times from its blocks, and how they were measured."""
    times = [t for block in interleaver.blocks for t in block["trial_s"]]
    result.step_times_s, result.step_time_s = times, Spread.of(times)
    result.blocks = list(interleaver.blocks)
    result.timing = {**{k: v for k, v in result.timing.items() if k in ("warmup_steps", "settled",
                                                                          "settle_tolerance")},
                     **interleaver.timing()}


def train_result(run: RunContext, spec: TrialSpec, m: TrainMeasurement,
                 interleaver: Interleaver | None = None) -> TrialResult:
    config = spec.config.to_dict()
    device_name = run.device if run.device == "cpu" else torch.cuda.get_device_name(torch.cuda.current_device())
    backend = " (gloo)" if spec.nproc > 1 and run.device == "cpu" else ""
    result = TrialResult(
        spec.name, spec.stage, m.status, dict(spec.changes), m.reason, spec.description, task="train",
        hardware=f"{spec.nproc} x {device_name}{backend}", tokens_per_step=m.tokens_per_step,
        peak_memory_bytes=m.peak_memory_bytes, peak_bytes_by_phase=m.peak_bytes_by_phase, val_loss=m.val_loss,
        val_loss_step=m.val_loss_step, val_windows=[list(w) for w in m.val_windows],
        warmup_time_s=m.warmup_time_s, train_losses=m.losses, config=config,
        nproc=spec.nproc, warmup_times_s=list(m.warmup_times_s), timing=dict(m.timing),
        setup_costs_s=dict(run.setup_costs.get(spec.name, {})))
    result.set_kind(spec.kind)
    if interleaver is not None:
        _paired_figures(run, result, interleaver)
    else:
        result.step_times_s = [r["step_time_s"] for r in m.timed]
        result.step_time_s = Spread.of(result.step_times_s)
    times = result.step_times_s
    if m.samples_per_step and m.tokens_per_step:
        result.samples_per_s = Spread.of([m.samples_per_step / t for t in times if t > 0])
        result.tokens_per_s = Spread.of([m.tokens_per_step / t for t in times if t > 0])
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
    if spec.stage not in ("baseline", "drift"):
        verdict = guard_trial(run.results.get("baseline"), result, run.results.get(NOISE_PROBE),
                              run.options.noise_factor, run.options.quality_floor)
        result.quality = None if verdict is None else verdict.to_dict()
    return result
