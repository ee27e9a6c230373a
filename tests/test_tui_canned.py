"""Canned telemetry and presets for the dashboard tests (no tests here; imported by the test_tui_* modules)."""

from __future__ import annotations

import math
from pathlib import Path

from kronos_tune.telemetry.nvml import GpuProcessMemory, GpuSnapshot
from kronos_tune.telemetry.sampler import HostSnapshot, Snapshot
from planned import with_planned_kind
from tiny_preset import write_tiny_preset as write_preset_file

GIB = 2**30
NO_GPU_REASON = "NVML library not found: no NVIDIA driver on this machine"



def write_tiny_preset(folder: Path, name: str = "tiny-cpu", memory_gb: float = 0.5) -> Path:
    """A preset TOML for the tiny model in `folder`; returns the folder (for --preset-dir)."""
    return write_preset_file(folder, name, memory_gb=memory_gb, samples_per_epoch=32, eval_samples=16)


def host(i: int, cores: int = 8) -> HostSnapshot:
    """A host whose readings move with `i` (fixed numbers: the same `i` always gives the same snapshot)."""
    return HostSnapshot(
        ram_used_bytes=int((6 + 2 * math.sin(i / 3)) * GIB), ram_total_bytes=16 * GIB,
        ram_available_bytes=8 * GIB, swap_used_bytes=GIB // 4, swap_total_bytes=2 * GIB,
        cpu_percent_per_core=tuple(float((i * 7 + core * 23) % 100) for core in range(cores)),
        cpu_percent_total=float((i * 11) % 100), process_rss_bytes=int(1.5 * GIB),
        process_tree_rss_bytes=int((1.5 + 0.02 * i) * GIB), child_count=2,
    )


def two_gpus(i: int) -> tuple[GpuSnapshot, ...]:
    """Two H100s: the first busy with our job, the second nearly idle and without a power sensor."""
    return (
        GpuSnapshot(0, "NVIDIA H100 80GB HBM3", int((20 + i) * GIB), 80 * GIB, float((i * 13) % 100), 64.0, 512.0,
                    700.0, 12 * GIB, 2 * GIB, (GpuProcessMemory(1234, 12 * GIB, True),)),
        GpuSnapshot(1, "NVIDIA H100 80GB HBM3", 3 * GIB, 80 * GIB, 0.0, 41.0, None, 700.0, 1 * GIB, 0,
                    (GpuProcessMemory(1235, 1 * GIB, True),)),
    )


def snapshot(i: int, gpus: bool = True) -> Snapshot:
    return Snapshot(
        timestamp_s=1_700_000_000.0 + i, host=host(i), gpus=two_gpus(i) if gpus else (),
        gpu_unavailable_reason=None if gpus else NO_GPU_REASON, torch_cuda=None, sample_cost_s=0.001,
    )


def series(count: int, gpus: bool = True) -> list[Snapshot]:
    return [snapshot(i, gpus) for i in range(count)]


def trial_results() -> list:
    """Eight finished train trials as the benchmark reports them: ok with deltas (some inside the noise),
    skipped, out of memory and failed with their one-line reasons."""
    from kronos_tune.benchmark.results import Delta, Spread, TrialResult

    def ok(name: str, stage: str, step: float, spread: float, tokens: float, peak_gib: float, loss: float,
           deltas: dict[str, Delta]) -> TrialResult:
        return TrialResult(
            name=name, stage=stage, status="ok", step_time_s=Spread(step, step - spread, step + spread, 5),
            samples_per_s=Spread(16 / step, 16 / (step + spread), 16 / (step - spread), 5),
            tokens_per_s=Spread(tokens, tokens * 0.97, tokens * 1.03, 5), peak_memory_bytes=int(peak_gib * GIB),
            val_loss=loss, projected_train_time_s=16 * step, mfu=None, deltas=deltas)

    return [with_planned_kind(result) for result in [
        ok("baseline", "baseline", 1.52, 0.04, 1060.0, 2.41, 7.0412, {}),
        ok("noise-probe", "baseline", 1.54, 0.05, 1046.0, 2.41, 7.0412,
           {"step_time_s": Delta(1.3, True), "tokens_per_s": Delta(-1.3, True),
            "peak_memory_bytes": Delta(0.0, True), "val_loss": Delta(0.0, True)}),
        TrialResult(name="bf16", stage="single", status="skipped",
                    reason="the preset's hardware has no bf16 (hardware.bf16_supported = false)"),
        ok("checkpointing", "single", 1.71, 0.03, 943.0, 1.62, 7.0409,
           {"step_time_s": Delta(12.5, False), "tokens_per_s": Delta(-11.0, False),
            "peak_memory_bytes": Delta(-32.8, False), "val_loss": Delta(-0.004, True),
            "projected_train_time_s": Delta(12.5, False)}),
        ok("dataloader", "single", 1.31, 0.06, 1230.0, 2.45, 7.0412,
           {"step_time_s": Delta(-13.8, False), "tokens_per_s": Delta(16.0, False),
            "peak_memory_bytes": Delta(1.7, True), "val_loss": Delta(0.0, True),
            "projected_train_time_s": Delta(-13.8, False)}),
        TrialResult(name="autobatch", stage="single", status="oom",
                    reason="simulated device out of memory in backward: tried to reach 8.41 GiB, budget 8.00 GiB"),
        TrialResult(name="compile", stage="single", status="failed",
                    reason="torch.compile needs a C compiler: install gcc or skip the compile trial"),
        ok("combined", "combined", 1.30, 0.05, 1240.0, 2.45, 7.0413,
           {"step_time_s": Delta(-14.5, False), "tokens_per_s": Delta(17.0, False),
            "peak_memory_bytes": Delta(1.7, True), "val_loss": Delta(0.001, True),
            "projected_train_time_s": Delta(-14.5, False)}),
    ]]


def trial_in_flight() -> list:
    """The benchmark's events for a trial four steps into its 1 warm-up + 5 measured steps."""
    from kronos_core.train import StepRecord
    from kronos_tune.benchmark.events import TrialStarted, TrialStep
    from kronos_tune.benchmark.results import TrialSpec

    spec = TrialSpec("checkpointing", "single", {"activation_checkpointing": "all"}, None,
                     description="activation checkpointing of every transformer block", warmup_steps=1,
                     measured_steps=5)
    events: list = [TrialStarted(spec, 4, 13)]
    for step, (loss, seconds) in enumerate([(7.21, 9.8), (7.12, 6.1), (7.05, 5.9), (6.98, 6.0)], start=1):
        record = StepRecord(step=step, epoch=0, micro_steps=1, samples=16, tokens=16 * 100, loss=loss, lr=4e-5,
                            grad_norm=1.0, data_time_s=0.01, forward_time_s=seconds / 3, backward_time_s=seconds / 2,
                            optimizer_time_s=0.1, step_time_s=seconds)
        events.append(TrialStep(spec.name, record))
    return events


def log_text(app) -> str:
    """Everything the dashboard's log pane has written (kept by the `steady_dashboard` fixture)."""
    from kronos_tune.tui.widgets import LogPane

    return "\n".join(getattr(app.query_one(LogPane), "test_lines", []))


async def until(pilot, condition, what: str, limit_s: float = 120.0) -> None:
    """Let the app run until `condition()`; a safety limit against hangs, not a timing assertion."""
    import asyncio

    import pytest

    async def wait() -> None:
        while not condition():
            await pilot.pause(0.05)
    try:
        await asyncio.wait_for(wait(), limit_s)
    except asyncio.TimeoutError:
        pytest.fail(f"never happened: {what}")


def table_rows(app) -> list[list[str]]:
    """The results table's rows as text, the name cell without its ▶ (recommended) / ★ (fastest) marks."""
    from kronos_tune.tui.widgets import ResultsTable

    table = app.query_one(ResultsTable)
    rows = [[str(cell) for cell in table.get_row_at(index)] for index in range(table.row_count)]
    for row in rows:
        row[0] = row[0].lstrip("▶★ ")
    return rows


def row_marks(app) -> dict[str, str]:
    """{trial: its marks} for the marked rows of the results table."""
    from kronos_tune.tui.widgets import ResultsTable

    table = app.query_one(ResultsTable)
    names = [str(table.get_row_at(index)[0]) for index in range(table.row_count)]
    return {name.lstrip("▶★ "): name[:len(name) - len(name.lstrip("▶★ "))].strip() for name in names
            if name.startswith(("▶", "★"))}


# A fixed trial list for the snapshots (they must not change when the benchmark's plan does).
SNAPSHOT_TRIALS = ("baseline", "noise-probe", "bf16", "fp16", "tf32", "checkpointing", "accumulation", "autobatch",
                   "drift-1", "compile", "compile-cudagraphs", "dataloader", "fused-adamw", "ddp", "fsdp",
                   "baseline-repeat", "combined")


def full_benchmark(partial: bool = False, names: tuple[str, ...] | None = None):
    """A whole training benchmark as canned results, and its report with a recommendation: every trial (ok
    ones with deltas, skipped ones with reasons), `combined` recommended. `names`: the trials (default: what
    the cpu preset's benchmark plans today)."""
    from kronos_tune.presets import resolve_preset
    from kronos_tune.benchmark import BenchmarkOptions, plan_trials
    from kronos_tune.benchmark.recommendation import Recommendation
    from kronos_tune.benchmark.results import Delta, BenchmarkReport, Spread, TrialResult

    if names is None:
        names = tuple(spec.name for spec in plan_trials(resolve_preset("cpu"), "train", BenchmarkOptions()))
    names = list(names)
    speeds = {"dataloader": 1.31, "combined": 1.28, "fused-adamw": 1.45, "checkpointing": 1.71}
    results = []
    for index, spec_name in enumerate(names):
        if spec_name in ("fp16", "compile-cudagraphs", "ddp", "fsdp", "tf32"):
            results.append(TrialResult(name=spec_name, stage="single", status="skipped",
                                       reason="needs a CUDA device (this run is on the CPU)"))
            continue
        step = speeds.get(spec_name, 1.50 + 0.01 * (index % 3))
        change = 100 * (step / 1.50 - 1)
        deltas = {} if spec_name == "baseline" else {"step_time_s": Delta(change, abs(change) < 3),
                                                     "tokens_per_s": Delta(-change, abs(change) < 3)}
        stage = "baseline" if spec_name in ("baseline", "noise-probe", "baseline-repeat") else (
            "combined" if spec_name == "combined" else "single")
        results.append(TrialResult(
            name=spec_name, stage=stage, status="ok", step_time_s=Spread(step, step - 0.03, step + 0.03, 5),
            tokens_per_s=Spread(1600 / step, 1550 / step, 1650 / step, 5), peak_memory_bytes=int(2.4 * GIB),
            val_loss=7.0412, projected_train_time_s=16 * step, deltas=deltas))
    results = [with_planned_kind(result) for result in results]
    if partial:
        results = results[:3]
    report = BenchmarkReport(preset="cpu", task="train", device="cpu", device_line="device: cpu (2 cores)",
                            budget_bytes=8 * GIB, budget_mode="simulated", trials=results, planned=names,
                            out_dir="runs/benchmark/cpu-train-20261130-120000", cancelled=partial)
    report.recommended = Recommendation(
        "baseline" if partial else "combined", "fastest of the trials that kept the validation loss within the noise",
        {} if partial else {"num_workers": 2, "optimizer_impl": "fused"},
        "kronos-tune train --config runs/benchmark/cpu-train-20261130-120000/recommended.toml",
        partial, names[3:] if partial else [])
    report.partial, report.missing = partial, (names[3:] if partial else [])
    return results, report
