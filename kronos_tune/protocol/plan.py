"""The trials of the protocol: the baseline, one change at a time, then the helpful changes together.

Every training trial keeps the baseline's seed, data, effective batch (so the
same windows and tokens per optimizer step) and learning-rate schedule, runs
warm-up + measured (+ padding) steps and is evaluated after the same number of
optimizer steps from the same initial weights.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from kronos_core.train import TrainConfig
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import Preset, resolve_preset
from kronos_tune.protocol.quality import helps
from kronos_tune.protocol.records import TASKS, ProtocolOptions, TrialResult, TrialSpec
from kronos_tune.workloads import runnable_device

TRAIN_TRIALS = ("baseline", "noise-probe", "bf16", "fp16", "checkpointing", "accumulation", "autobatch", "compile",
                "dataloader", "fused-adamw", "ddp", "baseline-repeat", "combined")
BASELINE_REPEATS = ("noise-probe", "baseline-repeat")  # the baseline run again: the noise estimates
REQUIRED = ("baseline",)
CPU_DDP_PROCESSES = 2
MIN_WARMUP = 2  # train: the metered step is the last warm-up step and must come after AdamW created its state


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
    elif preset.hardware.device == "cuda" and not preset.hardware.bf16_supported:
        bf16_skip = "the preset's hardware has no bf16 (hardware.bf16_supported = false)"
    bf16_note = ""
    if device == "cpu" and not preset.hardware.bf16_supported:
        bf16_note = "; the preset marks bf16 unsupported (no native bf16 units), so it is measured emulated"
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
        _single("bf16", base, {"amp": "bf16"}, "bf16 autocast" + bf16_note, "precision", bf16_skip),
        _single("fp16", base, {"amp": "fp16"}, "fp16 autocast with GradScaler", "precision",
                "fp16 autocast needs CUDA" if device != "cuda" else None),
        _single("checkpointing", base, {"activation_checkpointing": "all"},
                "activation checkpointing of every transformer block"),
        _single("accumulation", base, {"batch_size": batch // 2, "accumulation_steps": 2},
                "half the micro-batch, 2 accumulation steps: the same effective batch", "batch", halves),
        TrialSpec("autobatch", "single", {"batch_size": "autobatch", "accumulation_steps": "keeps the effective batch"},
                  None, None if autobatch_available() else "autobatch not available",
                  "the largest micro-batch autobatch finds within the budget, accumulation keeping the effective "
                  "batch", group="batch"),
        _single("compile", base, {"compile": "default"}, "torch.compile (mode default); its first steps compile "
                "and are its own, longer warm-up"),
        _single("dataloader", base, loader_changes, "2 DataLoader worker processes" +
                (" with pinned memory" if device == "cuda" else "") +
                "; windows are preloaded in RAM (preload = \"ram\", already the baseline's)"),
        _single("fused-adamw", base, {"optimizer_impl": "fused"}, "fused AdamW kernel"),
        _single("ddp", base, {"processes": world if world >= 2 else "2+", "batch_size": ddp_batch},
                f"DistributedDataParallel over {world} processes ({'gloo' if device == 'cpu' else 'nccl'}), "
                "the effective batch split between them", "ddp", ddp_skip, nproc=world,
                config_changes={"batch_size": ddp_batch}),
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
    specs += _train_singles(preset, base, options, device)
    specs.append(TrialSpec("baseline-repeat", "baseline", {}, base, None,
                           "the baseline again, after the single changes: with the noise-probe, how far the same "
                           "step's time drifts on this machine during the protocol (the timing noise band)"))
    specs.append(TrialSpec("combined", "combined", {}, None, None,
                           "the single changes that helped and passed the quality guard, together (decided after "
                           "the single trials)"))
    for spec in specs:
        if spec.skip_reason is None:
            spec.skip_reason = selection_reason(spec.name, options, optional)
    set_steps(specs, options, compile_runs=any(s.name == "compile" and s.skip_reason is None for s in specs))
    return specs


def set_steps(specs: list[TrialSpec], options: ProtocolOptions, compile_runs: bool) -> None:
    """Warm-up, measured and padding steps so that every trial is evaluated after the same optimizer step.

    At least MIN_WARMUP warm-up steps run: the last one is metered, and AdamW's state exists only from the
    second step on. The compile trial's longer warm-up comes out of its measured steps (at least one is
    left); only when that is not enough do the other trials run untimed padding steps."""
    warmup = max(options.warmup, MIN_WARMUP)
    total = warmup + options.steps
    compile_warmup = max(warmup, options.compile_warmup)
    if compile_runs:
        total = max(total, compile_warmup + 1)
    for spec in specs:
        spec.warmup_steps = compile_warmup if spec.name == "compile" else warmup
        spec.measured_steps = min(options.steps, total - spec.warmup_steps)
        spec.pad_steps = total - spec.warmup_steps - spec.measured_steps


def plan_trials(preset: Preset | str, task: str = "train",
                options: ProtocolOptions = ProtocolOptions()) -> list[TrialSpec]:
    """Every trial of the protocol in run order (baseline first, combined last), skipped ones with their reason."""
    preset = resolve(preset)
    if task == "predict":
        from kronos_tune.protocol.predict_protocol import PREDICT_TRIALS, plan_predict

        check_names(task, options, PREDICT_TRIALS)
        device, _ = runnable_device(preset)
        return plan_predict(preset, options, device)
    check_names(task, options, TRAIN_TRIALS)
    device, _ = runnable_device(preset)
    return plan_train(preset, options, device)


def evaluation_step(specs: list[TrialSpec]) -> int:
    """The optimizer step every training trial is evaluated at."""
    return max((s.total_steps for s in specs if s.stage != "combined"), default=0)


def combine(specs: list[TrialSpec], results: dict[str, TrialResult], base: TrialSpec) -> TrialSpec:
    """The combined trial from the single results: every change that helped, one per group (the fastest)."""
    template = next(s for s in specs if s.name == "combined")
    baseline = results.get("baseline")
    chosen: dict[str, TrialResult] = {}
    for spec in specs:
        result = results.get(spec.name)
        if spec.stage != "single" or result is None or not helps(result, baseline):
            continue
        key = spec.group or spec.name
        best = chosen.get(key)
        if best is None or _faster(result, best):
            chosen[key] = result
    names = [r.name for r in chosen.values()]
    spec = TrialSpec("combined", "combined", {}, None, template.skip_reason, template.description,
                     warmup_steps=template.warmup_steps, measured_steps=template.measured_steps,
                     pad_steps=template.pad_steps)
    if spec.skip_reason:
        return spec
    if not names:
        spec.skip_reason = "no single change helped: the baseline is the recommendation"
        return spec
    if len(names) == 1:
        spec.changes = dict(chosen[next(iter(chosen))].changes)
        spec.skip_reason = f"only '{names[0]}' helped: the combination is that trial"
        return spec
    values = base.config.to_dict()
    nproc = 1
    for result in chosen.values():
        for key, value in result.changes.items():
            if key == "processes":
                nproc = int(value)  # its batch_size is the split below, not a change of its own
            elif key in values and not (result.name == "ddp" and key == "batch_size"):
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
    compile_spec = next((s for s in specs if s.name == "compile"), None)
    if "compile" in chosen and compile_spec is not None:
        spec.warmup_steps, spec.measured_steps, spec.pad_steps = (compile_spec.warmup_steps,
                                                                  compile_spec.measured_steps, compile_spec.pad_steps)
    spec.changes, spec.nproc = changes, nproc
    spec.config = TrainConfig.from_dict(values, source="combined")
    spec.description = f"{' + '.join(names)} together" + (f" ({'; '.join(notes)})" if notes else "")
    return spec


def _faster(result: TrialResult, other: TrialResult) -> bool:
    mine, theirs = result.step_time_s, other.step_time_s
    if mine is None or theirs is None:
        return (result.peak_memory_bytes or 0) < (other.peak_memory_bytes or 0)
    return mine.median < theirs.median
