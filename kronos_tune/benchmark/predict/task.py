"""The predict task of the benchmark: the full recompute, then the KV cache, bf16, the autobatch chunk and
sharding against it (trial_list, trials, decide, summary)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.predict.summary import (
    predict_decision_lines, predict_markdown_lines, recommended_predict_toml, summarize_predict,
)
from kronos_tune.benchmark.predict.trial_list import PREDICT_TRIALS, check_predict_options
from kronos_tune.benchmark.predict.verdicts import PredictDecision
from kronos_tune.benchmark.report.cells import (
    Cell, fmt_rate, fmt_seconds, predict_quality_cell, speedup_cell, spread_text,
)
from kronos_tune.benchmark.results import BenchmarkReport, TrialResult, TrialSpec
from kronos_tune.benchmark.task import BenchmarkTask
from kronos_tune.presets import Preset

if TYPE_CHECKING:
    from kronos_tune.benchmark.task import RunContext


class PredictBenchmark(BenchmarkTask):
    name = "predict"
    trial_names = PREDICT_TRIALS
    columns = ("configuration", "hardware", "series/s [IQR] n", "speed-up [95% CI]", "projected total", "memory",
               "Δ mem", "max Δ output vs ref", "quality", "status")
    config_command = "predict"  # the [predict] settings file
    probes_in_process = True  # the autobatch chunk is searched in the runner's process
    time_key, time_is_rate, time_column, time_text = "series_per_s", True, "series/s [IQR] n", "series/s"
    throughput_key, throughput_unit = "series_per_s", "series/s"
    no_recommendation = "no prediction settings to recommend: the reference did not run"

    def check(self, options: BenchmarkOptions) -> None:
        check_predict_options(options)

    def plan(self, preset: Preset, options: BenchmarkOptions, device: str) -> list[TrialSpec]:
        from kronos_tune.benchmark.predict.trial_list import plan_predict

        return plan_predict(preset, options, device)

    def resolve(self, run: RunContext, spec: TrialSpec, work: Path) -> tuple[TrialSpec, list[str]]:
        if spec.name != "autobatch":
            return spec, []
        from kronos_core.predict.call_size import series_per_call
        from kronos_tune.benchmark.predict.measure import autobatch_chunk

        base = next(s for s in run.specs if s.name == "kv-cache").config
        chunk, notes = autobatch_chunk(base, run.device, run.budget_bytes, run.options.autobatch_margin)
        series = min(base.measured_series, series_per_call(chunk, base.sample_count))
        spec.config = dataclasses.replace(base, max_batch_size=chunk, chunk_series=series)
        spec.changes = {"use_cache": True, "max_batch_size": chunk, "chunk_series": series}
        return spec, notes

    def run_trial(self, run: RunContext, spec: TrialSpec, work: Path) -> TrialResult:
        from kronos_tune.benchmark.predict import trials

        return trials.run_trial(run, spec, work)

    def report_options(self, specs: Sequence[TrialSpec]) -> dict[str, Any]:
        if not specs:
            return {}
        return {"predict_series_used": max(getattr(s.config, "measured_series", 0) for s in specs)}

    def decide(self, report: BenchmarkReport, preset: Preset | None) -> None:
        summarize_predict(report)

    def read_decision(self, data: dict[str, Any]) -> PredictDecision:
        return PredictDecision.from_dict(data)

    def cells(self, trial: TrialResult, compact: bool) -> dict[str, Cell]:
        diff = trial.output_max_abs_diff
        return {"series/s [IQR] n": Cell(spread_text(trial.series_per_s, fmt_rate, compact)),
                "speed-up [95% CI]": speedup_cell(trial, compact),
                "projected total": Cell(fmt_seconds(trial.projected_predict_time_s)),
                "max Δ output vs ref": Cell("–" if diff is None else f"{diff:.3g} σ"),
                "quality": predict_quality_cell(trial)}

    def recommended_toml(self, report: BenchmarkReport) -> str | None:
        return recommended_predict_toml(report)

    def markdown_lines(self, report: BenchmarkReport) -> list[str]:
        return [""] + predict_markdown_lines(report)  # what was predicted, the rule, each trial's verdict

    def notes(self, report: BenchmarkReport) -> list[str]:
        return predict_decision_lines(report)

    def scatter_unit(self, trials: Sequence[TrialResult]) -> str:
        return "series"
