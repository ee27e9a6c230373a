"""The train trials: the baseline, one change at a time, then the helpful changes together.

Every training trial keeps the baseline's seed, data, effective batch (so the
same windows and tokens per optimizer step) and learning-rate schedule, runs
warm-up + measured (+ padding) steps and is evaluated after the same number of
optimizer steps from the same initial weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


from kronos_core.train import TrainConfig
from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.results import NOISE_PROBE, TrialKind, TrialResult, TrialSpec
from kronos_tune.benchmark.selection import autobatch_available, device_count, quick_reason, selection_reason
from kronos_tune.workloads import bf16_support
from kronos_tune.presets import Preset

if TYPE_CHECKING:
    from kronos_core.cpu_features import CpuFeatures

TRAIN_TRIALS = ("baseline", "noise-probe", "bf16", "fp16", "tf32", "checkpointing", "accumulation", "autobatch",
                "bigger-batch", "compile", "compile-cudagraphs", "dataloader", "fused-adamw", "ddp", "fsdp",
                "baseline-repeat", "combined")
BASELINE_REPEATS = ("noise-probe", "baseline-repeat")  # the baseline run again: the noise estimates
CPU_DDP_PROCESSES = 2
MIN_WARMUP = 2  # train: AdamW creates its state in the first step; the metered step comes after the warm-up
COMPILE_EXTRA_WARMUP = 4  # compile trials may need more steps to settle (recompilations)
DRIFT_STEPS = 5  # measured steps of one interleaved baseline drift check

REFERENCE = TrialKind("reference")
REPEAT = TrialKind("baseline-repeat")
COMBINATION = TrialKind("combination")


def baseline_config(preset: Preset, options: BenchmarkOptions, device: str) -> TrainConfig:
    """The preset's workload as the reference trains it: fp32, no checkpointing, no accumulation (the
    effective batch in one micro-batch), no compile, torch's default AdamW, data read in the main process."""
    work = preset.workload
    if preset.job is not None:  # the user's own job, as they run it; the trials read the data the runner saved
        from kronos_tune.benchmark.user_job import train_values

        return TrainConfig.from_dict({**train_values(preset), "eval_samples": work.eval_samples,
                                      "output_dir": "runs/benchmark", "device": device}, source=preset.job["source"])
    return TrainConfig(
        what="predictor", model_size=work.model_size, data=["synthetic"], lookback_window=work.lookback_window,
        predict_window=work.predict_window, batch_size=work.batch_size * work.accumulation_steps,
        accumulation_steps=1, amp="none", activation_checkpointing="none", compile="off",
        optimizer_impl="foreach" if device == "cuda" else "for-loop", num_workers=0, pin_memory=False,
        preload="ram", seed=options.seed, samples_per_epoch=work.samples_per_epoch, epochs=work.epochs,
        eval_samples=max(1, min(work.eval_samples, options.eval_windows)), output_dir="runs/benchmark",
        device=device)


def _single(name: str, kind: TrialKind, base: TrainConfig, changes: dict[str, Any], description: str,
            skip: str | None = None, nproc: int = 1, config_changes: dict[str, Any] | None = None) -> TrialSpec:
    config = None
    if skip is None:
        config = base.replace(**(config_changes if config_changes is not None else changes))
    return TrialSpec(name, "single", changes, config, skip, description, nproc=nproc, kind=kind)


def _train_singles(preset: Preset, base: TrainConfig, options: BenchmarkOptions, device: str,
                   cpu: CpuFeatures | None) -> list[TrialSpec]:
    batch = base.batch_size
    bf16 = bf16_support(preset.hardware, device, cpu)
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
    parallel_skip = ddp_skip.replace("DDP", "FSDP") if ddp_skip else None
    return [
        _single("bf16", TrialKind("speed", "precision", "approximate"), base, {"amp": "bf16"},
                "bf16 autocast" + (f" ({bf16.note})" if bf16.note else ""), bf16.reason),
        _single("fp16", TrialKind("speed", "precision", "approximate"), base, {"amp": "fp16"},
                "fp16 autocast with GradScaler", "fp16 autocast needs CUDA" if device != "cuda" else None),
        _single("tf32", TrialKind("speed", "matmul", "close"), base, {"matmul_precision": "high"},
                "TF32 tensor cores for float32 matmuls (torch.set_float32_matmul_precision(\"high\"))", cuda_only),
        _single("checkpointing", TrialKind("memory", "checkpointing", "equivalent"), base,
                {"activation_checkpointing": "all"}, "activation checkpointing of every transformer block"),
        _single("accumulation", TrialKind("memory", "batch", "equivalent", True), base,
                {"batch_size": batch // 2, "accumulation_steps": 2 * base.accumulation_steps},
                "half the micro-batch, 2 accumulation steps: the same effective batch", halves),
        TrialSpec("autobatch", "single", {"batch_size": "autobatch", "accumulation_steps": "keeps the effective batch"},
                  None, None if autobatch_available() else "autobatch not available",
                  "the largest micro-batch autobatch finds within the budget, accumulation keeping the effective "
                  "batch", kind=TrialKind("memory", "batch", "equivalent", True)),
        TrialSpec("bigger-batch", "single", {"batch_size": "the largest that fits", "lr": "sqrt rule"}, None,
                  None if autobatch_available() else "autobatch not available",
                  "changes the optimization: the effective batch raised to the largest micro-batch that fits (capped "
                  "by the data), learning rate x sqrt(batch factor); compared at equal samples seen",
                  kind=TrialKind("optimization", "batch")),
        _single("compile", TrialKind("speed", "compile", "close", True), base, {"compile": "default"},
                "torch.compile (mode default); its first steps compile and are its own, longer warm-up"),
        _single("compile-cudagraphs", TrialKind("speed", "compile", "close", True), base,
                {"compile": "reduce-overhead"}, "torch.compile with CUDA graphs (mode reduce-overhead): kernel "
                "launches replayed from a graph", cuda_only),
        _single("dataloader", TrialKind("speed", "dataloader", "equivalent"), base, loader_changes,
                "2 DataLoader worker processes" + (" with pinned memory" if device == "cuda" else "") +
                "; windows are preloaded in RAM (preload = \"ram\", already the baseline's)"),
        _single("fused-adamw", TrialKind("speed", "optimizer", "close"), base, {"optimizer_impl": "fused"},
                "fused AdamW kernel"),
        _single("ddp", TrialKind("speed", "parallel", "equivalent", True), base,
                {"processes": world if world >= 2 else "2+", "batch_size": ddp_batch},
                f"DistributedDataParallel over {world} processes ({'gloo' if device == 'cpu' else 'nccl'}), "
                "the effective batch split between them", ddp_skip, nproc=world,
                config_changes={"batch_size": ddp_batch}),
        _single("fsdp", TrialKind("memory", "parallel", "equivalent", True), base,
                {"parallelism": "fsdp", "processes": world if world >= 2 else "2+", "batch_size": ddp_batch},
                f"FSDP2 over {world} processes ({'gloo' if device == 'cpu' else 'nccl'}): parameters, gradients "
                "and AdamW state sharded per transformer block, the effective batch split between them",
                parallel_skip, nproc=world, config_changes={"parallelism": "fsdp", "batch_size": ddp_batch}),
    ]


def plan_train(preset: Preset, options: BenchmarkOptions, device: str,
               cpu: CpuFeatures | None = None) -> list[TrialSpec]:
    """The trial list; `cpu`: the CPU's features that decide bf16 on a CPU run (default: this machine's)."""
    base = baseline_config(preset, options, device)
    optional = tuple(n for n in TRAIN_TRIALS if n not in ("baseline", *BASELINE_REPEATS, "combined"))
    work = preset.workload
    folded = (f"; the preset's {work.batch_size} x {work.accumulation_steps} accumulation is one micro-batch of "
              f"{base.batch_size}" if work.accumulation_steps > 1 and preset.job is None else "")
    described = ("the preset's workload as the reference trains it: fp32, no checkpointing, no accumulation, no "
                 "compile, torch's default AdamW, no loader workers" + folded) if preset.job is None else \
        f"your job as {preset.job['source']} sets it, on its data"
    specs = [TrialSpec("baseline", "baseline", {}, base, None, described, kind=REFERENCE),
             TrialSpec(NOISE_PROBE, "baseline", {"seed": base.seed + 1}, base.replace(seed=base.seed + 1), None,
                       "the baseline again from the same initial weights on the same windows, shuffled with "
                       "another seed: the run-to-run noise of the validation loss, and the A/A timing comparison "
                       "that says how small a change this run can resolve", kind=REPEAT)]
    singles = _train_singles(preset, base, options, device, cpu)
    for single in singles:
        if single.skip_reason is None:
            single.skip_reason = selection_reason(single.name, options, optional)
        if single.skip_reason is None:
            single.skip_reason = quick_reason(single, options, device)
    runnable = [s.name for s in singles if s.skip_reason is None]
    checks = 0
    for single in singles:
        specs.append(single)
        done = runnable.index(single.name) + 1 if single.name in runnable else 0
        if options.drift_every and done and done % options.drift_every == 0 and done < len(runnable):
            checks += 1
            specs.append(TrialSpec(f"drift-{checks}", "drift", {}, base, None,
                                   "a short re-measurement of the baseline between single trials: how far the same "
                                   "step's time drifts while the benchmark runs (sequential comparisons only)",
                                   kind=REPEAT))
    specs.append(TrialSpec("baseline-repeat", "baseline", {}, base, None,
                           "the baseline again, after the single changes: with the noise-probe, how far the same "
                           "step's time drifts on this machine during the benchmark (the timing noise band of "
                           "sequential comparisons)", kind=REPEAT))
    specs.append(TrialSpec("combined", "combined", {}, None, None,
                           "the single changes that helped and passed the quality guard, together (decided after "
                           "the single trials)", kind=COMBINATION))
    for spec in specs:
        if spec.skip_reason is None and spec.stage != "drift":
            spec.skip_reason = selection_reason(spec.name, options, optional)
    set_steps(specs, options)
    return specs


def set_steps(specs: list[TrialSpec], options: BenchmarkOptions) -> None:
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
        compiled = spec.group == "compile"
        spec.warmup_steps = compile_warmup if compiled else warmup
        spec.max_warmup_steps = compile_max if compiled else max_warmup
        spec.measured_steps = min(DRIFT_STEPS, options.steps) if spec.stage == "drift" else options.steps
        spec.max_measured_steps = spec.measured_steps if spec.stage == "drift" else max(options.max_steps,
                                                                                         options.steps)
        if spec.stage != "drift" and (spec.skip_reason is None or spec.stage == "combined"):
            eval_step = max(eval_step, spec.max_warmup_steps + 1 + spec.measured_steps)
    for spec in specs:
        spec.eval_step = None if spec.stage == "drift" else eval_step


def combine(specs: list[TrialSpec], results: dict[str, TrialResult], base: TrialSpec,
            members: list[str]) -> TrialSpec:
    """The combined trial from the singles the decision rule chose (decision.decide(...).combination)."""
    template = next(s for s in specs if s.name == "combined")
    chosen = {name: results[name] for name in members if name in results}
    names = list(chosen)
    spec = TrialSpec("combined", "combined", {}, None, template.skip_reason, template.description,
                     warmup_steps=template.warmup_steps, measured_steps=template.measured_steps,
                     max_warmup_steps=template.max_warmup_steps, max_measured_steps=template.max_measured_steps,
                     eval_step=template.eval_step, kind=template.kind)
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
            elif key in values and not (result.group == "parallel" and key == "batch_size"):
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
    if any(result.group == "compile" for result in chosen.values()):
        compile_spec = next(s for s in specs if s.group == "compile")
        spec.warmup_steps, spec.max_warmup_steps = compile_spec.warmup_steps, compile_spec.max_warmup_steps
    spec.changes, spec.nproc = changes, nproc
    spec.config = TrainConfig.from_dict(values, source="combined")
    spec.description = f"{' + '.join(names)} together" + (f" ({'; '.join(notes)})" if notes else "")
    return spec
