"""One estimate per trial for every figure a user sees: the step time (train) or series/s (predict).

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
`raw_and_estimate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kronos_tune.benchmark.results import Spread, TrialResult
from kronos_tune.benchmark.stats import rate_over_ratio
from kronos_tune.benchmark.tasks import get

RATE_KEYS = ("series_per_s", "tokens_per_s", "samples_per_s")
# The deltas taken from a figure an estimate or a projection sets (align_deltas); the loss's is the guard's.
DERIVED_KEYS = ("step_time_s", *RATE_KEYS, "projected_train_time_s", "projected_predict_time_s", "peak_memory_bytes")
ESTIMATE_LEGEND = ("time per step: the baseline's median x the compared ratio (paired where the trial ran in "
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


def step_time_estimate(result: TrialResult, baseline: TrialResult | None) -> float | None:
    """Seconds per optimizer step of `result` (see the module doc); None when it has no timing."""
    ratio = _ratio(result, baseline)
    if ratio is not None and baseline is not None and baseline.step_time_s is not None:
        return ratio * baseline.step_time_s.median * _per_step_scale(result, baseline)
    return None if result.step_time_s is None else float(result.step_time_s.median)


def rate_estimate(result: TrialResult, baseline: TrialResult | None, key: str) -> float | None:
    """A rate (`key`: series/s, tokens/s or samples/s) as every view shows it: the baseline's median over the
    compared time ratio (which is per token, so no batch scale), else the trial's own median; None when the
    trial did not measure it."""
    own = _median(getattr(result, key))
    if own is None:
        return None
    reference = None if baseline is None else _median(getattr(baseline, key))
    return rate_over_ratio(_ratio(result, baseline), reference, own)


def series_rate_estimate(result: TrialResult, baseline: TrialResult | None) -> float | None:
    """Series per second of a predict trial: the reference's rate over the compared time ratio."""
    return rate_estimate(result, baseline, "series_per_s")


def shown_figure(result: TrialResult, key: str, baseline: TrialResult | None) -> float | None:
    """The figure of `key` (a TrialResult field with a delta) that every view shows for `result`: the estimate
    for the time and the rates, the field itself otherwise (the projected totals already take the compared
    ratio, the memory and the loss are measured once)."""
    if key == "step_time_s":
        return None if result.step_time_s is None else step_time_estimate(result, baseline)
    if key in RATE_KEYS:
        return rate_estimate(result, baseline, key)
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
    return (series_rate_estimate if rated else step_time_estimate)(result, baseline)


def speed_key(result: TrialResult, baseline: TrialResult | None, task: str) -> float | None:
    """Lower is faster, for ranking: the step time, or minus the series/s."""
    if get(task).time_is_rate:
        rate = series_rate_estimate(result, baseline)
        return None if rate is None else -rate
    return step_time_estimate(result, baseline)


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


def raw_and_estimate(result: TrialResult, baseline: TrialResult | None) -> dict[str, Any]:
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
    (raw_and_estimate)."""
    out = report.to_dict()
    baseline = baseline_of(report.trials)
    out["shown"] = {"rule": ESTIMATE_LEGEND,
                    "trials": {t.name: raw_and_estimate(t, baseline) for t in report.trials}}
    return out


def shown_time_cell(trial: TrialResult, baseline: TrialResult | None, compact: bool) -> Any:
    """The table's time cell (its task's time_column): the estimate, with the raw spread in parentheses when
    they differ."""
    from kronos_tune.benchmark.report.cells import Cell, fmt_rate, fmt_seconds, spread_text

    task = get(trial.task)
    raw, fmt = getattr(trial, task.time_key), fmt_rate if task.time_is_rate else fmt_seconds
    raw_text = spread_text(raw, fmt, compact)
    shown = shown_time(trial, baseline)
    if raw is None or shown is None or fmt(shown) == fmt(raw.median):
        return Cell(raw_text)
    return Cell(f"{fmt(shown)}{chr(10) if compact else ' '}(raw {raw_text.replace(chr(10), ' ')})")
