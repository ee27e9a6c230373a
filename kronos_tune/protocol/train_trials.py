"""The training side of the runner: deciding autobatch/combined/noise-probe trials, running one trial (in
this process or through torchrun), turning its measurement into a TrialResult, and the recommendation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kronos_core.model import Kronos
from kronos_core.sizes import SIZES
from kronos_core.synthetic import synthetic_series
from kronos_core.train import StepRecord, TrainConfig
from kronos_core.train.builders import build_models
from kronos_tune.flops import mfu, train_flops_per_token
from kronos_tune.protocol.ddp_worker import STEP_PREFIX
from kronos_tune.protocol.measure import TrainMeasurement, measure_training
from kronos_tune.protocol.plan import combine, evaluation_step
from kronos_tune.protocol.quality import helps, is_slower, quality_guard, quality_rule
from kronos_tune.protocol.records import ProtocolReport, Spread, TrialResult, TrialSpec, TrialStep

if TYPE_CHECKING:
    from kronos_tune.protocol.runner import ProtocolRun

FLOPS_FORMULA = ("model FLOPs per token = 6N + 12·L·H·Q·T (PaLM appendix B): N non-embedding parameters of the "
                 "predictor, L transformer layers, H heads, Q head dimension, T tokens per window; the frozen "
                 "tokenizer's encode pass and the causal mask are not counted")
PEAK_DTYPE = {"bf16": "bf16", "fp16": "fp16"}


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _spec(run: ProtocolRun, name: str) -> TrialSpec:
    return next(s for s in run.specs if s.name == name)


# Trials decided while running ---------------------------------------------------------------------------

def resolve(run: ProtocolRun, spec: TrialSpec, work: Path) -> tuple[TrialSpec, list[str]]:
    if spec.name == "combined":
        return combine(run.specs, run.results, _spec(run, "baseline")), []
    if spec.name == "autobatch":
        return resolve_autobatch(run, spec)
    if spec.name == "noise-probe":
        spec.config = materialize_probe(spec.config, _spec(run, "baseline").config, work)
        return spec, []
    return spec, []


class _Cancelled(Exception):
    pass


def resolve_autobatch(run: ProtocolRun, spec: TrialSpec) -> tuple[TrialSpec, list[str]]:
    """autobatch's micro-batch within the budget (the effective batch kept); skipped when it is the baseline's."""
    from kronos_tune.autobatch.train_task import TrainTask

    base: TrainConfig = _spec(run, "baseline").config
    estimate = run.options.autobatch_estimate
    estimate = run.device == "cpu" if estimate is None else estimate

    def on_probe(probe: Any) -> None:
        if run.cancel.is_set():
            raise _Cancelled

    try:
        with TrainTask(base, device=run.device) as task:
            found = task.run(run.budget_bytes, margin=run.options.autobatch_margin, estimate=estimate,
                             effective_batch=base.batch_size * base.accumulation_steps, on_probe=on_probe)
    except _Cancelled:
        raise KeyboardInterrupt from None
    how = "fake-tensor estimate" if estimate else "real probes"
    notes = [f"autobatch ({how}, {found.search_time_s:.1f} s, margin {found.margin:g}): "
             f"{found.batch_size} x {found.accumulation_steps}, largest fitting micro-batch {found.max_fit_batch_size}"]
    spec.changes = {"batch_size": found.batch_size, "accumulation_steps": found.accumulation_steps}
    if (found.batch_size, found.accumulation_steps) == (base.batch_size, base.accumulation_steps):
        spec.skip_reason = (f"autobatch keeps {base.batch_size} x {base.accumulation_steps}, the baseline's own "
                            f"split: nothing else to measure")
        return spec, notes
    spec.config = base.replace(batch_size=found.batch_size, accumulation_steps=found.accumulation_steps)
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

def make_meter(device: str, budget_bytes: int) -> Any:
    from kronos_tune.memory import CpuExactMeter, CudaMeter

    if device == "cuda":
        return CudaMeter(torch.device("cuda", torch.cuda.current_device()))  # the cap is set once by the runner
    return CpuExactMeter(budget_bytes=budget_bytes)


def run_trial(run: ProtocolRun, spec: TrialSpec, work: Path) -> TrialResult:
    config = spec.config.replace(output_dir=str(work / "run"))

    def on_record(record: StepRecord) -> None:
        run.emit(TrialStep(spec.name, record))

    if spec.nproc > 1:
        measured = run_torchrun(run, spec, config, work, on_record)
    else:
        measured = measure_training(config, make_meter(run.device, run.budget_bytes), spec.warmup_steps,
                                    spec.measured_steps, spec.pad_steps, on_record, run.cancel.is_set,
                                    meter_always=run.device == "cuda")
    return train_result(run, spec, measured)


def run_torchrun(run: ProtocolRun, spec: TrialSpec, config: TrainConfig, work: Path,
                 on_record: Any) -> TrainMeasurement:
    """The trial as `spec.nproc` processes under torchrun (own session: a Ctrl-C here reaches it as the stop
    file, so every rank stops at the same step boundary)."""
    result_file, stop_file, job_file = work / "result.json", work / "stop", work / "job.json"
    job = {"config": config.to_dict(), "warmup": spec.warmup_steps, "steps": spec.measured_steps,
           "pad": spec.pad_steps, "budget_bytes": run.budget_bytes, "stop_file": str(stop_file),
           "result_file": str(result_file)}
    job_file.write_text(json.dumps(job), encoding="utf-8")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(spec.nproc),
               "-m", "kronos_tune.protocol.ddp_worker", "--job", str(job_file)]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    env["PYTHONUNBUFFERED"] = "1"
    with open(work / "stderr.txt", "w", encoding="utf-8") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                                start_new_session=True)

        def watch() -> None:
            while proc.poll() is None:
                if run.cancel.wait(0.2):
                    stop_file.touch()
                    return

        threading.Thread(target=watch, daemon=True).start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(STEP_PREFIX):
                    values = json.loads(line[len(STEP_PREFIX):])
                    values.pop("tokens_per_s", None)
                    on_record(StepRecord(**values))
            code = proc.wait()
        except KeyboardInterrupt:
            stop_file.touch()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if result_file.is_file():
        return TrainMeasurement.from_dict(json.loads(result_file.read_text(encoding="utf-8")))
    for rank_file in sorted(work.glob(f"{result_file.name}.rank*")):
        return TrainMeasurement.from_dict(json.loads(rank_file.read_text(encoding="utf-8")))
    errors = [line for line in (work / "stderr.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    last = next((line for line in reversed(errors) if "Error" in line or "error" in line), errors[-1] if errors else "")
    raise RuntimeError(f"torchrun exited with code {code}: {last.strip()[:300]}")


def _dtype(config: dict[str, Any]) -> str:
    if config.get("amp") in PEAK_DTYPE:
        return PEAK_DTYPE[config["amp"]]
    if config.get("device") == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "fp32"


def train_result(run: ProtocolRun, spec: TrialSpec, m: TrainMeasurement) -> TrialResult:
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
        nproc=spec.nproc)
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
        result.notes.append(f"{spec.warmup_steps} warm-up steps (compilation) took {m.warmup_time_s:.1f} s")
    base = run.results.get("baseline")
    if spec.stage != "baseline" and result.val_loss is not None and base is not None and base.val_loss is not None:
        result.quality = quality_guard(base.val_loss, result.val_loss, run.noise(), run.options.noise_factor,
                                       run.options.quality_floor).to_dict()
    return result


# The report's train sections --------------------------------------------------------------------------------

def flops_section(run: ProtocolRun) -> dict[str, Any]:
    work = run.preset.workload
    spec = SIZES[work.model_size].model
    with torch.device("meta"):
        model = Kronos(**spec)
    tokens = work.lookback_window + work.predict_window
    peaks = {dtype: run.preset.peak_flops(dtype) for dtype in ("fp32", "tf32", "bf16", "fp16")}
    return {"formula": FLOPS_FORMULA, "flops_per_token": train_flops_per_token(model, tokens),
            "layers": spec["n_layers"], "heads": spec["n_heads"], "head_dim": spec["d_model"] // spec["n_heads"],
            "tokens_per_window": tokens, "peak_flops_per_device": peaks,
            "mfu_note": None if run.device == run.preset.hardware.device else
            "MFU not computed: this machine's device differs from the preset's"}


def recommend(run: ProtocolRun) -> dict[str, Any]:
    results = run.results
    base, combined = results.get("baseline"), results.get("combined")

    def passes(result: TrialResult) -> bool:
        return result.quality is None or bool(result.quality.get("passed", True))

    helping = [r for r in results.values() if r.stage == "single" and helps(r, base)]
    fastest = min(helping, key=lambda r: r.step_time_s.median if r.step_time_s else float("inf"), default=None)
    if combined is not None and combined.status == "ok" and passes(combined) and not (
            base is not None and base.status == "ok" and is_slower(combined)):
        chosen, reason = combined, "the helpful changes together"
    elif fastest is not None:
        chosen, reason = fastest, "the fastest single change that helped"
        if combined is not None and combined.status == "ok":
            reason += ("; the combination was slower than the baseline" if is_slower(combined)
                       else "; the combination failed the quality guard")
        elif combined is not None and combined.status != "skipped":
            reason += f"; the combination ended {combined.status}"
    elif base is not None and base.status == "ok":
        chosen, reason = base, "no change helped"
    else:
        chosen = base
        reason = "nothing ran within the budget: this is the reference config, which does not fit either"
    config = dict(chosen.config if chosen is not None and chosen.config else _spec(run, "baseline").config.to_dict())
    config["eval_samples"] = max(1, run.preset.workload.eval_samples)
    config["output_dir"] = f"runs/{run.preset.name}"
    nproc = chosen.nproc if chosen is not None else 1
    command = "kronos-tune train --config recommended.toml" + (f" --nproc {nproc}" if nproc > 1 else "")
    return {"source": chosen.name if chosen is not None else "baseline", "reason": reason,
            "changes": dict(chosen.changes) if chosen is not None else {}, "config": config, "nproc": nproc,
            "command": command}


def complete_report(run: ProtocolRun, report: ProtocolReport) -> None:
    threshold = run.threshold()
    base = run.results.get("baseline")
    report.quality = {
        "rule": quality_rule(run.options.noise_factor, run.options.quality_floor), "noise": run.noise(),
        "noise_source": "noise-probe" if run.noise() is not None else None, "threshold": threshold,
        "threshold_pct": (None if threshold is None or base is None or not base.val_loss
                          else 100 * threshold / base.val_loss),
        "noise_factor": run.options.noise_factor, "floor": run.options.quality_floor,
        "val_loss_step": evaluation_step(run.specs), "eval_windows": _spec(run, "baseline").config.eval_samples,
        "flagged": [r.name for r in run.results.values() if r.quality and not r.quality.get("passed", True)]}
    report.flops = flops_section(run)
    report.recommended = recommend(run)
