"""The trials of the protocol: the baseline, one change at a time, then the helpful changes together.

Every training trial keeps the baseline's seed, data, effective batch (so the
same windows and tokens per optimizer step) and learning-rate schedule, runs
warm-up + measured (+ padding) steps and is evaluated after the same number of
optimizer steps from the same initial weights.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

import torch

from kronos_core.train import TrainConfig
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import Preset, resolve_preset
from kronos_tune.protocol.decision import OBJECTIVES
from kronos_tune.protocol.records import TASKS, PredictSettings, ProtocolOptions, TrialResult, TrialSpec
from kronos_tune.workloads import runnable_device

TRAIN_TRIALS = ("baseline", "noise-probe", "bf16", "fp16", "tf32", "checkpointing", "accumulation", "autobatch",
                "bigger-batch", "compile", "compile-cudagraphs", "dataloader", "fused-adamw", "ddp", "fsdp",
                "baseline-repeat", "combined")
BASELINE_REPEATS = ("noise-probe", "baseline-repeat")  # the baseline run again: the noise estimates
REQUIRED = ("baseline",)
CPU_DDP_PROCESSES = 2
MIN_WARMUP = 2  # train: AdamW creates its state in the first step; the metered step comes after the warm-up
COMPILE_EXTRA_WARMUP = 4  # compile trials may need more steps to settle (recompilations)
DRIFT_STEPS = 5  # measured steps of one interleaved baseline drift check


def autobatch_available() -> bool:
    return importlib.util.find_spec("kronos_tune.autobatch.train_task") is not None


def resolve(preset: Preset | str) -> Preset:
    return preset if isinstance(preset, Preset) else resolve_preset(preset)


def device_count(device: str) -> int:
    return torch.cuda.device_count() if device == "cuda" else 1


def check_names(task: str, options: ProtocolOptions, names: tuple[str, ...]) -> None:
    if task not in TASKS:
        raise KronosTuneError(f"unknown task '{task}'; use one of {', '.join(TASKS)}")
    for flag, given in (("--skip", options.skip), ("--only", options.only)):
        for name in given:
            if name not in names:
                raise KronosTuneError(f"{flag} {name}: no such {task} trial; trials are {', '.join(names)}")
    for name in REQUIRED:
        if name in options.skip:
            raise KronosTuneError(f"--skip {name}: the {name} cannot be skipped, every delta is measured against it")
    if options.steps < 1:
        raise KronosTuneError(f"--steps {options.steps}: give at least 1 measured step")
    if options.warmup < 0 or options.compile_warmup < 0:
        raise KronosTuneError(f"--warmup {min(options.warmup, options.compile_warmup)}: give 0 or more warm-up steps")
    if options.trial_timeout_s is not None and not options.trial_timeout_s > 0:
        raise KronosTuneError(f"--trial-timeout {options.trial_timeout_s:g}: give a positive number of seconds")
    if options.trial_budget_s is not None and not options.trial_budget_s > 0:
        raise KronosTuneError(f"--trial-budget {options.trial_budget_s:g}: give a positive number of seconds")
    if options.objective not in OBJECTIVES:
        raise KronosTuneError(f"--objective {options.objective}: use one of {', '.join(OBJECTIVES)}")


def selection_reason(name: str, options: ProtocolOptions, optional: tuple[str, ...]) -> str | None:
    """Why the user's --skip/--only leave `name` out (None when it runs)."""
    if name in options.skip:
        return "skipped by --skip"
    if options.only and name in optional and name not in options.only:
        return "not selected by --only"
    return None


def baseline_config(preset: Preset, options: ProtocolOptions, device: str) -> TrainConfig:
    """The preset's workload as the reference trains it: fp32, no checkpointing, no accumulation (the
    effective batch in one micro-batch), no compile, torch's default AdamW, data read in the main process."""
    work = preset.workload
    return TrainConfig(
        what="predictor", model_size=work.model_size, data=["synthetic"], lookback_window=work.lookback_window,
        predict_window=work.predict_window, batch_size=work.batch_size * work.accumulation_steps,
        accumulation_steps=1, amp="none", activation_checkpointing="none", compile="off",
        optimizer_impl="foreach" if device == "cuda" else "for-loop", num_workers=0, pin_memory=False,
        preload="ram", seed=options.seed, samples_per_epoch=work.samples_per_epoch, epochs=work.epochs,
        eval_samples=max(1, min(work.eval_samples, options.eval_windows)), output_dir="runs/benchmark",
        device=device)


def _single(name: str, base: TrainConfig, changes: dict[str, Any], description: str, group: str | None = None,
            skip: str | None = None, nproc: int = 1, config_changes: dict[str, Any] | None = None) -> TrialSpec:
    config = None
    if skip is None:
        config = base.replace(**(config_changes if config_changes is not None else changes))
    return TrialSpec(name, "single", changes, config, skip, description, group=group, nproc=nproc)


def _train_singles(preset: Preset, base: TrainConfig, options: ProtocolOptions, device: str) -> list[TrialSpec]:
    batch = base.batch_size
    bf16_skip = None
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        bf16_skip = "this GPU has no bf16 support"
    elif not preset.hardware.bf16_supported:
        bf16_skip = "the preset's hardware has no native bf16 (hardware.bf16_supported = false)"
    cuda_only = None if device == "cuda" else "needs a CUDA device (this run is on the CPU)"
    halves = None if batch % 2 == 0 else f"batch size {batch} is odd: it cannot be halved keeping the effective batch"
    world = device_count(device) if device == "cuda" else (CPU_DDP_PROCESSES if options.cpu_ddp else 1)
    ddp_skip = None
    if world < 2:
        ddp_skip = "DDP needs 2+ devices" + (" (--cpu-ddp runs 2 gloo processes on the CPU)" if device == "cpu" else "")
    elif batch % world:
        ddp_skip = f"batch size {batch} does not split evenly over {world} processes"
    ddp_batch = batch // world if not ddp_skip else batch
    loader_changes: dict[str, Any] = {"num_workers": 2}
    if device == "cuda":
        loader_changes["pin_memory"] = True
    return [
        _single("bf16", base, {"amp": "bf16"}, "bf16 autocast", "precision", bf16_skip),
        _single("fp16", base, {"amp": "fp16"}, "fp16 autocast with GradScaler", "precision",
                "fp16 autocast needs CUDA" if device != "cuda" else None),
        _single("tf32", base, {"matmul_precision": "high"}, "TF32 tensor cores for float32 matmuls "
                "(torch.set_float32_matmul_precision(\"high\"))", "matmul", cuda_only),
        _single("checkpointing", base, {"activation_checkpointing": "all"},
                "activation checkpointing of every transformer block"),
        _single("accumulation", base, {"batch_size": batch // 2, "accumulation_steps": 2},
                "half the micro-batch, 2 accumulation steps: the same effective batch", "batch", halves),
        TrialSpec("autobatch", "single", {"batch_size": "autobatch", "accumulation_steps": "keeps the effective batch"},
                  None, None if autobatch_available() else "autobatch not available",
                  "the largest micro-batch autobatch finds within the budget, accumulation keeping the effective "
                  "batch", group="batch"),
        TrialSpec("bigger-batch", "single", {"batch_size": "the largest that fits", "lr": "sqrt rule"}, None,
                  None if autobatch_available() else "autobatch not available",
                  "changes the optimization: the effective batch raised to the largest micro-batch that fits (capped "
                  "by the data), learning rate x sqrt(batch factor); compared at equal samples seen", group="batch"),
        _single("compile", base, {"compile": "default"}, "torch.compile (mode default); its first steps compile "
                "and are its own, longer warm-up", "compile"),
        _single("compile-cudagraphs", base, {"compile": "reduce-overhead"}, "torch.compile with CUDA graphs "
                "(mode reduce-overhead): kernel launches replayed from a graph", "compile", cuda_only),
        _single("dataloader", base, loader_changes, "2 DataLoader worker processes" +
                (" with pinned memory" if device == "cuda" else "") +
                "; windows are preloaded in RAM (preload = \"ram\", already the baseline's)"),
        _single("fused-adamw", base, {"optimizer_impl": "fused"}, "fused AdamW kernel"),
        _single("ddp", base, {"processes": world if world >= 2 else "2+", "batch_size": ddp_batch},
                f"DistributedDataParallel over {world} processes ({'gloo' if device == 'cpu' else 'nccl'}), "
                "the effective batch split between them", "ddp", ddp_skip, nproc=world,
                config_changes={"batch_size": ddp_batch}),
        _single("fsdp", base, {"parallelism": "fsdp", "processes": world if world >= 2 else "2+",
                               "batch_size": ddp_batch},
                f"FSDP2 over {world} processes ({'gloo' if device == 'cpu' else 'nccl'}): parameters, gradients "
                "and AdamW state sharded per transformer block, the effective batch split between them", "parallel",
                ddp_skip.replace("DDP", "FSDP") if ddp_skip else None, nproc=world,
                config_changes={"parallelism": "fsdp", "batch_size": ddp_batch}),
    ]


def plan_train(preset: Preset, options: ProtocolOptions, device: str) -> list[TrialSpec]:
    base = baseline_config(preset, options, device)
    optional = tuple(n for n in TRAIN_TRIALS if n not in ("baseline", *BASELINE_REPEATS, "combined"))
    work = preset.workload
    folded = (f"; the preset's {work.batch_size} x {work.accumulation_steps} accumulation is one micro-batch of "
              f"{base.batch_size}" if work.accumulation_steps > 1 else "")
    specs = [TrialSpec("baseline", "baseline", {}, base, None, "the preset's workload as the reference trains it: "
                       "fp32, no checkpointing, no accumulation, no compile, torch's default AdamW, no loader "
                       "workers" + folded),
             TrialSpec("noise-probe", "baseline", {"seed": base.seed + 1}, base.replace(seed=base.seed + 1), None,
                       "the baseline again from the same initial weights on the same windows, shuffled with "
                       "another seed: the run-to-run noise of the validation loss")]
    singles = _train_singles(preset, base, options, device)
    for single in singles:
        if single.skip_reason is None:
            single.skip_reason = selection_reason(single.name, options, optional)
    runnable = [s.name for s in singles if s.skip_reason is None]
    checks = 0
    for single in singles:
        specs.append(single)
        done = runnable.index(single.name) + 1 if single.name in runnable else 0
        if options.drift_every and done and done % options.drift_every == 0 and done < len(runnable):
            checks += 1
            specs.append(TrialSpec(f"drift-{checks}", "drift", {}, base, None,
                                   "a short re-measurement of the baseline between single trials: how far the same "
                                   "step's time drifts while the protocol runs"))
    specs.append(TrialSpec("baseline-repeat", "baseline", {}, base, None,
                           "the baseline again, after the single changes: with the noise-probe, how far the same "
                           "step's time drifts on this machine during the protocol (the timing noise band)"))
    specs.append(TrialSpec("combined", "combined", {}, None, None,
                           "the single changes that helped and passed the quality guard, together (decided after "
                           "the single trials)"))
    for spec in specs:
        if spec.skip_reason is None and spec.stage != "drift":
            spec.skip_reason = selection_reason(spec.name, options, optional)
    set_steps(specs, options)
    return specs


def set_steps(specs: list[TrialSpec], options: ProtocolOptions) -> None:
    """Warm-up and measured steps (at least / at most) and the common evaluation step.

    At least MIN_WARMUP warm-up steps run (AdamW creates its state in the first), then one metered step, then
    the measured steps; compile trials may warm up COMPILE_EXTRA_WARMUP steps longer. Every trial is evaluated
    after the same optimizer step: the latest step at which any trial can have measured its minimum."""
    warmup = max(options.warmup, MIN_WARMUP)
    max_warmup = max(options.max_warmup, warmup)
    compile_warmup = max(warmup, options.compile_warmup)
    compile_max = max(max_warmup + COMPILE_EXTRA_WARMUP, compile_warmup)
    eval_step = 0
    for spec in specs:
        compiled = spec.name.startswith("compile")
        spec.warmup_steps = compile_warmup if compiled else warmup
        spec.max_warmup_steps = compile_max if compiled else max_warmup
        spec.measured_steps = min(DRIFT_STEPS, options.steps) if spec.stage == "drift" else options.steps
        spec.max_measured_steps = spec.measured_steps if spec.stage == "drift" else max(options.max_steps,
                                                                                         options.steps)
        if spec.stage != "drift" and (spec.skip_reason is None or spec.stage == "combined"):
            eval_step = max(eval_step, spec.max_warmup_steps + 1 + spec.measured_steps)
    for spec in specs:
        spec.eval_step = None if spec.stage == "drift" else eval_step


# The predict task ----------------------------------------------------------------------------------

PREDICT_TRIALS = ("recompute", "kv-cache", "bf16", "autobatch", "sharding")
AGREEMENT_SERIES = 100  # the ranking agreement (and the exactness check) covers at least this many series
# Tokens one forward pass of the full-recompute reference holds at least: past this its cost per series no longer
# falls with more series (the cores / the GPU are busy), so it is timed on that many series, not the whole count.
REFERENCE_TOKENS = {"cpu": 4096, "cuda": 65536}


def predict_counts(series_count: int, options: ProtocolOptions) -> tuple[int, int]:
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


def plan_predict(preset: Preset, options: ProtocolOptions, device: str) -> list[TrialSpec]:
    p = preset.predict
    measured, agreement = predict_counts(p.series_count, options)
    cached = PredictSettings(preset.workload.model_size, p.lookback, p.pred_len, p.sample_count, p.series_count,
                             measured, use_cache=True, seed=options.seed, agreement_series=agreement)
    base = replace(cached, use_cache=False, agreement_series=None,
                   measured_series=reference_series(measured, p.lookback, p.pred_len, p.sample_count, device))
    bf16_skip = None
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        bf16_skip = "this GPU has no bf16 support"
    elif not preset.hardware.bf16_supported:  # as the train task: the preset says the hardware has none
        bf16_skip = "the preset's hardware has no native bf16 (hardware.bf16_supported = false)"
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
        TrialSpec("bf16", "single", {"use_cache": True, "amp": "bf16"}, replace(cached, amp="bf16"), bf16_skip,
                  "KV cache with bf16 autocast"),
        TrialSpec("autobatch", "single", {"use_cache": True, "max_batch_size": "autobatch"}, None,
                  None if autobatch_available() else "autobatch not available",
                  "KV cache with the chunk size autobatch finds within the budget"),
        TrialSpec("sharding", "single", {"use_cache": True, "devices": devices}, replace(cached, devices=devices),
                  _sharding_skip(devices, measured, device),
                  f"KV cache, the series split over {devices} torchrun processes "
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


def check_predict_options(options: ProtocolOptions) -> None:
    for flag, value, least in (("--predict-series", options.predict_series, 1),
                               ("--agreement-series", options.agreement_series, 3),
                               ("--steps", options.predict_repeats, 1)):
        if value is not None and value < least:
            raise KronosTuneError(f"{flag} {value}: give at least {least}")
    if not -1 <= options.min_spearman <= 1:
        raise KronosTuneError(f"--min-spearman {options.min_spearman:g}: a Spearman correlation is between -1 and 1")


def shard_processes(device: str) -> int:
    """Processes of the sharding trial: one per visible GPU. The CPU counts as one device, so the plan skips
    the trial there; `measure_sharded` itself runs CPU ranks too (gloo), which tests use."""
    return device_count(device)


def _sharding_skip(processes: int, measured: int, device: str) -> str | None:
    if processes < 2:
        return "sharding series needs 2+ devices"
    if measured < processes:
        return f"{measured} measured series cannot be split over {processes} processes; raise --predict-series"
    return None


def plan_trials(preset: Preset | str, task: str = "train",
                options: ProtocolOptions = ProtocolOptions()) -> list[TrialSpec]:
    """Every trial of the protocol in run order (baseline first, combined last), skipped ones with their reason."""
    preset = resolve(preset)
    if task == "predict":
        check_names(task, options, PREDICT_TRIALS)
        check_predict_options(options)
        device, _ = runnable_device(preset)
        return plan_predict(preset, options, device)
    check_names(task, options, TRAIN_TRIALS)
    device, _ = runnable_device(preset)
    return plan_train(preset, options, device)


def combine(specs: list[TrialSpec], results: dict[str, TrialResult], base: TrialSpec,
            members: list[str]) -> TrialSpec:
    """The combined trial from the singles the decision rule chose (decision.decide(...).combination)."""
    template = next(s for s in specs if s.name == "combined")
    chosen = {name: results[name] for name in members if name in results}
    names = list(chosen)
    spec = TrialSpec("combined", "combined", {}, None, template.skip_reason, template.description,
                     warmup_steps=template.warmup_steps, measured_steps=template.measured_steps,
                     max_warmup_steps=template.max_warmup_steps, max_measured_steps=template.max_measured_steps,
                     eval_step=template.eval_step)
    if spec.skip_reason:
        return spec
    if not names:
        spec.skip_reason = "no single change qualified (faster beyond the noise, or a memory saver where memory binds)"
        return spec
    if len(names) == 1:
        spec.changes = dict(chosen[names[0]].changes)
        spec.skip_reason = f"only '{names[0]}' qualified: the combination is that trial"
        return spec
    values = base.config.to_dict()
    nproc = 1
    for result in chosen.values():
        for key, value in result.changes.items():
            if key == "processes":
                nproc = int(value)  # its batch_size is the split below, not a change of its own
            elif key in values and not (result.name in ("ddp", "fsdp") and key == "batch_size"):
                values[key] = value
    notes = []
    if nproc > 1:
        batch, accumulation = values["batch_size"], values["accumulation_steps"]
        if batch % nproc == 0:
            values["batch_size"] = batch // nproc
        elif (batch * accumulation) % nproc == 0:
            values["batch_size"], values["accumulation_steps"] = batch * accumulation // nproc, 1
        else:
            notes.append(f"ddp left out: the effective batch does not split over {nproc} processes")
            nproc = 1
    changes = {k: v for k, v in values.items() if v != base.config.to_dict().get(k)}
    if nproc > 1:
        changes["processes"] = nproc
    if any(name.startswith("compile") for name in names):
        compile_spec = next(s for s in specs if s.name.startswith("compile"))
        spec.warmup_steps, spec.max_warmup_steps = compile_spec.warmup_steps, compile_spec.max_warmup_steps
    spec.changes, spec.nproc = changes, nproc
    spec.config = TrainConfig.from_dict(values, source="combined")
    spec.description = f"{' + '.join(names)} together" + (f" ({'; '.join(notes)})" if notes else "")
    return spec
