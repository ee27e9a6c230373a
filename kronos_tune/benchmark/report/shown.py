"""The figures a user sees of a benchmark: one per trial for its timing (the step time, train, or series/s,
predict), the summary table of report.md and the terminal (the shared columns here, the task's own from its
`cells`), and `summarize`, the finished (or partial) report those figures are shown from.

A trial's raw median was measured at another time than the baseline's, so two raw medians can disagree
with the comparison the decision rule makes (the paired design cancels the drift between them). Every
view (the table's time cell, its delta, the projected total, the fastest mark, the picture, the
dashboard) takes its figure from here, so they cannot contradict each other:

- a trial compared with the baseline: the baseline's median times the compared ratio (paired: the centre
  of the block ratios; sequential: the ratio of the medians), rescaled to the trial's own step when its
  batch differs (the ratio is per token);
- the baseline, and a trial without a comparison: its own median.

The rates beside the time (tokens/s, samples/s, series/s) are the baseline's median over the same ratio, and
every delta a view prints is the change between the two figures it shows (`align_deltas`, run once every
estimate and projection is set), so a delta never contradicts the figure beside it.

The raw medians stay in report.json (each trial's `step_time_s` / `series_per_s` spread, named "raw" by
`raw_and_shown`).

``summarize(report, preset)`` returns a new report: the given one's trials with what is missing, whether the
run is partial, and the sections its task derives (train/summary.py, predict/summary.py), then the deltas
aligned with the figures shown. The runner calls it at the end of a run; ``kronos-tune report`` calls it on a
results.jsonl from any machine (nothing here touches a device).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kronos_core.units import format_bytes
from kronos_tune.benchmark.report.cells import (Cell, changes_text, delta_cell, fmt_rate, fmt_seconds, spread_text,
                                                status_cell)
from kronos_tune.benchmark.results import BenchmarkReport, Spread, TrialResult
from kronos_tune.benchmark.stats import rate_over_ratio
from kronos_tune.benchmark.tasks import get
from kronos_tune.presets import Preset

RATE_KEYS = ("series_per_s", "tokens_per_s", "samples_per_s")
# The deltas taken from a figure an estimate or a projection sets (align_deltas); the loss's is the guard's.
DERIVED_KEYS = ("step_time_s", *RATE_KEYS, "projected_train_time_s", "projected_predict_time_s", "peak_memory_bytes")
SHOWN_LEGEND = ("time per step: the baseline's median x the compared ratio (paired where the trial ran in "
                "alternating blocks, else the ratio of medians); tokens/s, samples/s and series/s: the "
                "baseline's median over that ratio; every delta: the change between the two figures shown "
                "(`figures`); the raw medians are in report.json")


def _ratio(result: TrialResult, baseline: TrialResult | None) -> float | None:
    ratio = None if result.comparison is None else result.comparison.ratio
    if baseline is None or result.name == baseline.name or not ratio or ratio <= 0:
        return None
    return float(ratio)


def _median(spread: Spread | None) -> float | None:
    return None if spread is None else float(spread.median)


def _per_step_scale(result: TrialResult, baseline: TrialResult) -> float:
    """The ratio compares time per token: a trial with a bigger batch does more per step."""
    if not result.tokens_per_step or not baseline.tokens_per_step:
        return 1.0
    return result.tokens_per_step / baseline.tokens_per_step


def shown_step_time(result: TrialResult, baseline: TrialResult | None) -> float | None:
    """Seconds per optimizer step of `result` (see the module doc); None when it has no timing."""
    ratio = _ratio(result, baseline)
    if ratio is not None and baseline is not None and baseline.step_time_s is not None:
        return ratio * baseline.step_time_s.median * _per_step_scale(result, baseline)
    return None if result.step_time_s is None else float(result.step_time_s.median)


def shown_rate(result: TrialResult, baseline: TrialResult | None, key: str) -> float | None:
    """A rate (`key`: series/s, tokens/s or samples/s) as every view shows it: the baseline's median over the
    compared time ratio (which is per token, so no batch scale), else the trial's own median; None when the
    trial did not measure it."""
    own = _median(getattr(result, key))
    if own is None:
        return None
    reference = None if baseline is None else _median(getattr(baseline, key))
    return rate_over_ratio(_ratio(result, baseline), reference, own)


def shown_series_rate(result: TrialResult, baseline: TrialResult | None) -> float | None:
    """Series per second of a predict trial: the reference's rate over the compared time ratio."""
    return shown_rate(result, baseline, "series_per_s")


def shown_figure(result: TrialResult, key: str, baseline: TrialResult | None) -> float | None:
    """The figure of `key` (a TrialResult field with a delta) that every view shows for `result`: the estimate
    for the time and the rates, the field itself otherwise (the projected totals already take the compared
    ratio, the memory and the loss are measured once)."""
    if key == "step_time_s":
        return None if result.step_time_s is None else shown_step_time(result, baseline)
    if key in RATE_KEYS:
        return shown_rate(result, baseline, key)
    value = getattr(result, key)
    return None if value is None else float(value)


def shown_delta_pct(result: TrialResult, key: str, baseline: TrialResult | None) -> float | None:
    """The change of `key` vs the baseline, in percent, from the two figures the views show."""
    if baseline is None:
        return None
    mine, theirs = shown_figure(result, key, baseline), shown_figure(baseline, key, baseline)
    return None if mine is None or not theirs else 100.0 * (mine / theirs - 1.0)


def align_deltas(trials: Sequence[TrialResult]) -> None:
    """Every delta of DERIVED_KEYS recomputed from the very figures shown beside it (shown_figure), once every
    estimate is applied; the decision rule's call (`noise`) is kept. A delta whose figure is gone is dropped."""
    baseline = baseline_of(trials)
    for trial in trials:
        for key in [key for key in trial.deltas if key in DERIVED_KEYS]:
            pct = shown_delta_pct(trial, key, baseline)
            if pct is None:
                del trial.deltas[key]
            else:
                trial.deltas[key] = replace(trial.deltas[key], pct=pct)


def shown_time(result: TrialResult, baseline: TrialResult | None, task: str | None = None) -> float | None:
    """The estimate of the trial's timing (its task's time_key): the step time, or the series/s."""
    rated = get(task or result.task).time_is_rate
    return (shown_series_rate if rated else shown_step_time)(result, baseline)


def speed_key(result: TrialResult, baseline: TrialResult | None, task: str) -> float | None:
    """Lower is faster, for ranking: the step time, or minus the series/s."""
    if get(task).time_is_rate:
        rate = shown_series_rate(result, baseline)
        return None if rate is None else -rate
    return shown_step_time(result, baseline)


def baseline_of(results: Sequence[TrialResult]) -> TrialResult | None:
    """The baseline (the trial of kind reference) among `results`."""
    return next((r for r in results if r.trial_kind.kind == "reference"), None)


def fastest(results: Sequence[TrialResult], task: str) -> TrialResult | None:
    """The fastest configuration that ran ok and kept its quality guard, by the estimate (the baseline measured
    again is no configuration of its own); None before any."""
    baseline = baseline_of(results)
    ranked = [(speed_key(r, baseline, task), r) for r in results
              if r.status == "ok" and r.quality_passed and r.trial_kind.kind != "baseline-repeat"]
    ranked = [(key, r) for key, r in ranked if key is not None]
    return min(ranked, key=lambda item: item[0])[1] if ranked else None


def raw_and_shown(result: TrialResult, baseline: TrialResult | None) -> dict[str, Any]:
    """What report.json keeps beside the raw spread: the figure shown and where it comes from."""
    key = get(result.task).time_key
    raw = getattr(result, key)
    source = "compared ratio x baseline median" if _ratio(result, baseline) is not None else "own median"
    figures = {name: shown_figure(result, name, baseline) for name in DERIVED_KEYS}
    return {"key": key, "shown": shown_time(result, baseline),
            "raw_median": None if raw is None else raw.median, "source": source,
            "design": result.comparison.design if result.comparison is not None and source != "own median"
            else None, "figures": {name: value for name, value in figures.items() if value is not None}}


def report_dict(report: Any) -> dict[str, Any]:
    """report.json: the BenchmarkReport, each trial's raw spread as it was measured, and `shown`: per trial
    the figure every view shows and where it comes from, and `figures`, every figure a delta is taken from
    (raw_and_shown)."""
    out = report.to_dict()
    baseline = baseline_of(report.trials)
    out["shown"] = {"rule": SHOWN_LEGEND,
                    "trials": {t.name: raw_and_shown(t, baseline) for t in report.trials}}
    return out



def shown_time_cell(trial: TrialResult, baseline: TrialResult | None, compact: bool) -> Cell:
    """The table's time cell (its task's time_column): the estimate, with the raw spread in parentheses when
    they differ."""
    task = get(trial.task)
    raw, fmt = getattr(trial, task.time_key), fmt_rate if task.time_is_rate else fmt_seconds
    raw_text = spread_text(raw, fmt, compact)
    shown = shown_time(trial, baseline)
    if raw is None or shown is None or fmt(shown) == fmt(raw.median):
        return Cell(raw_text)
    return Cell(f"{fmt(shown)}{chr(10) if compact else ' '}(raw {raw_text.replace(chr(10), ' ')})")


def table(report: BenchmarkReport, compact: bool = False) -> tuple[tuple[str, ...], list[list[Cell]]]:
    """Header and rows of the summary table (its task's columns).

    `compact` (a terminal): the trial name without its changes, spreads on a second line, the status without
    its reason (list those below the table with `changes_text` and `TrialResult.reason`)."""
    task = get(report.task)
    baseline = baseline_of(report.trials)
    rows = []
    for t in report.trials:
        shared = {"configuration": Cell(t.name if compact else f"{t.name} ({changes_text(t)})"),
                  "hardware": Cell(t.hardware.split(" (")[0].replace(" x ", "×") if compact else t.hardware),
                  "memory": Cell(format_bytes(t.peak_memory_bytes, missing="–")),
                  "Δ mem": delta_cell(t.deltas.get("peak_memory_bytes"), "peak_memory_bytes"),
                  "status": status_cell(t, compact)}
        own = task.cells(t, compact)
        if task.time_column in own:  # one figure in every view (report/shown.py)
            own[task.time_column] = shown_time_cell(t, baseline, compact)
        rows.append([own[column] if column in own else shared[column] for column in task.columns])
    return task.columns, rows


def summarize(report: BenchmarkReport, preset: Preset | None) -> BenchmarkReport:
    """A copy of `report` with its derived sections filled (`report` itself is left as it was)."""
    summary = copy.deepcopy(report)
    names = {t.name for t in summary.trials}
    summary.missing = [name for name in summary.planned if name not in names]
    summary.partial = bool(summary.cancelled or summary.missing)
    get(summary.task).decide(summary, preset)
    align_deltas(summary.trials)  # every delta from the figures shown beside it, once all are set
    return summary
