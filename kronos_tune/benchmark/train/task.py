"""The train task of the benchmark: the preset's training step as the reference runs it, one change at a time,
then the helpful changes together (trial_list, trials, decide, summary, text)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_tune.benchmark.report.cells import (
    Cell, delta_cell, fmt_seconds, spread_text, time_delta_cell, trajectory_cell,
)
from kronos_tune.benchmark.results import BenchmarkReport, TrialResult, TrialSpec
from kronos_tune.benchmark.task import BenchmarkTask
from kronos_tune.benchmark.train import text
from kronos_tune.benchmark.train.summary import summarize_train
from kronos_tune.benchmark.train.trial_list import TRAIN_TRIALS
from kronos_tune.benchmark.train.verdicts import Decision
from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.presets import Preset

if TYPE_CHECKING:
    from kronos_tune.benchmark.task import RunContext


def loss_delta_cell(trial: TrialResult, compact: bool = False) -> Cell:
    """The val-loss change vs the baseline with the 95% interval of the paired windows (quality.py); bad when
    the guard flags it."""
    cell = delta_cell(trial.deltas.get("val_loss"), "val_loss")
    quality = trial.quality or {}
    if not cell.text or quality.get("low_pct") is None or quality.get("high_pct") is None:
        return cell
    text = f"{cell.text}{chr(10) if compact else ' '}[{quality['low_pct']:+.2f}, {quality['high_pct']:+.2f}]"
    return Cell(text, "bad" if not quality.get("passed", True) else cell.tone)


class TrainBenchmark(BenchmarkTask):
    name = "train"
    trial_names = TRAIN_TRIALS
    columns = ("configuration", "hardware", "time/step [IQR] n", "Δ time [95% CI]", "projected total", "memory",
               "Δ mem", "val loss", "Δ loss", "losses vs baseline", "MFU", "status")
    config_command = "train"
    time_key, time_column, time_text = "step_time_s", "time/step [IQR] n", "per step"
    throughput_key, throughput_unit = "tokens_per_s", "tokens/s"
    dashboard_trains = True
    no_recommendation = "no training config to recommend for this task"

    def plan(self, preset: Preset, options: BenchmarkOptions, device: str) -> list[TrialSpec]:
        from kronos_tune.benchmark.train.trial_list import plan_train

        return plan_train(preset, options, device)

    def resolve(self, run: RunContext, spec: TrialSpec, work: Path) -> tuple[TrialSpec, list[str]]:
        from kronos_tune.benchmark.train import trials

        return trials.resolve(run, spec, work)

    def run_trial(self, run: RunContext, spec: TrialSpec, work: Path) -> TrialResult:
        from kronos_tune.benchmark.train import trials

        return trials.run_trial(run, spec, work)

    def will_run(self, run: RunContext, spec: TrialSpec) -> bool:
        from kronos_tune.benchmark.train import trials

        return trials.will_run(run, spec)

    def measuring_budget_s(self, run: RunContext, spec: TrialSpec) -> float | None:
        from kronos_tune.benchmark.train import trials

        return trials.comparison_budget(run, spec)

    def after_trials(self, run: RunContext) -> list[TrialResult]:
        from kronos_tune.benchmark.train import target

        return target.measure_candidates(run) if target.wanted(run.options) else []

    def decide(self, report: BenchmarkReport, preset: Preset | None) -> None:
        summarize_train(report, preset)

    def read_decision(self, data: dict[str, Any]) -> Decision:
        return Decision.from_dict(data)

    def cells(self, trial: TrialResult, compact: bool) -> dict[str, Cell]:
        return {"time/step [IQR] n": Cell(spread_text(trial.step_time_s, fmt_seconds, compact)),
                "Δ time [95% CI]": time_delta_cell(trial, compact),
                "projected total": Cell(fmt_seconds(trial.projected_train_time_s)),
                "val loss": Cell("–" if trial.val_loss is None else f"{trial.val_loss:.4f}"),
                "Δ loss": loss_delta_cell(trial, compact),
                "losses vs baseline": trajectory_cell(trial),
                "MFU": Cell("–" if trial.mfu is None else f"{100 * trial.mfu:.1f}%")}

    def recommended_toml(self, report: BenchmarkReport) -> str | None:
        return text.recommended_toml(report)

    def markdown_lines(self, report: BenchmarkReport) -> list[str]:
        return text.markdown_lines(report)

    def notes(self, report: BenchmarkReport) -> list[str]:
        return text.console_notes(report)

    def resolution_line(self, report: BenchmarkReport) -> str | None:
        return text.resolution_line(report)

    def evidence_line(self, report: BenchmarkReport, own_only: bool = False) -> str | None:
        return text.evidence_line(report, own_only)

    def scatter_unit(self, trials: Sequence[TrialResult]) -> str:
        batches = {t.tokens_per_step for t in trials if t.tokens_per_step}
        return "step" if len(batches) <= 1 else "sample"
