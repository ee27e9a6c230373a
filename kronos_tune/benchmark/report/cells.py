"""The cells of a benchmark report's table (text and tone), shared by report.md, the terminal and the dashboard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kronos_tune.benchmark.results import Delta, TrialResult

LOWER_IS_BETTER = ("step_time_s", "peak_memory_bytes", "val_loss", "projected_train_time_s", "projected_predict_time_s")


# Formatting -----------------------------------------------------------------------------------------------

def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 1:
        return f"{1000 * value:.0f} ms"
    if value < 120:
        return f"{value:.2f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    if value < 172800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def fmt_rate(value: float | None) -> str:
    return "–" if value is None else (f"{value:,.0f}" if value >= 100 else f"{value:.3g}")


@dataclass(frozen=True)
class Cell:
    """Text of one table cell; tone good | bad | noise | warn | '' (colours in the CLI, marks in Markdown)."""

    text: str
    tone: str = ""


def delta_cell(delta: Delta | None, key: str) -> Cell:
    if delta is None:
        return Cell("")
    text = f"{delta.pct:+.1f}%"
    if delta.noise:
        return Cell(f"~{text}", "noise")
    better = delta.pct < 0 if key in LOWER_IS_BETTER else delta.pct > 0
    return Cell(text, "good" if better else "bad") if delta.pct else Cell(text)


def spread_text(spread: Any, fmt: Any, compact: bool = False) -> str:
    """Median, then the interquartile range (min–max for results kept without quartiles) and n."""
    if spread is None:
        return "–"
    low, high = (spread.q1, spread.q3) if spread.iqr is not None else (spread.min, spread.max)
    if compact:
        return f"{fmt(spread.median)}\n{fmt(low).replace(' ', '')}–{fmt(high).replace(' ', '')} n={spread.n}"
    kind = "IQR" if spread.iqr is not None else "min–max"
    return f"{fmt(spread.median)} [{kind} {fmt(low)}–{fmt(high)}] n={spread.n}"


def time_delta_cell(result: TrialResult, compact: bool = False) -> Cell:
    """The step-time change vs the baseline (the two step times shown) with its 95% interval; ~ when the rule
    does not call it. The rule compares time per token: where the trial's batch differs, the interval is put on
    the same per-step footing as the change, and the per-token change the rule decided on follows."""
    delta = result.deltas.get("step_time_s")
    cell = delta_cell(delta, "step_time_s")
    comparison = result.comparison
    if delta is None or comparison is None or comparison.low is None or comparison.high is None \
            or not comparison.ratio > 0:
        return cell
    per_step = (1 + delta.pct / 100) / comparison.ratio  # the trial's step over a baseline-sized one
    low, high = 100 * (comparison.low * per_step - 1), 100 * (comparison.high * per_step - 1)
    sep = "\n" if compact else " "
    tone = {"faster": "good", "slower": "bad", "unresolved": "warn"}.get(comparison.verdict, cell.tone)
    text = f"{cell.text}{sep}[{low:+.0f}, {high:+.0f}]"
    if abs(per_step - 1) > 0.005:
        text += f"{sep}{'~' if delta.noise else ''}{100 * (comparison.ratio - 1):+.1f}% per token"
    return Cell(text, tone)


def trajectory_cell(result: TrialResult) -> Cell:
    check = result.trajectory
    if check is None:
        return Cell("")
    return Cell(f"{check.measured} ({check.max_rel_deviation:.1g})", "bad" if check.defect else "")


def changes_text(result: TrialResult) -> str:
    return ", ".join(f"{k}={v}" for k, v in result.changes.items()) or "reference"


def status_cell(result: TrialResult, compact: bool = False) -> Cell:
    tone = {"ok": "", "oom": "bad", "failed": "bad", "skipped": "noise", "cancelled": "warn",
            "timeout": "bad"}[result.status]
    text = result.status if not result.reason or compact else f"{result.status}: {result.reason}"
    if not result.quality_passed:
        guard = result.quality.get("text")  # predict: its exactness class's verdict; train: the guard's
        text, tone = f"{text}; {guard or 'quality guard: worse than the noise allows'}", "bad"
    if result.trajectory is not None and result.trajectory.defect:
        text, tone = (f"{text}; defect: losses deviate {result.trajectory.max_rel_deviation:.2g} from the "
                      f"baseline's, promised {result.trajectory.expected}"), "bad"
    return Cell(text, tone)


def speedup_cell(result: TrialResult, compact: bool = False) -> Cell:
    """Predict: series/s over the reference method's, with the 95% interval; ~ when the rule does not call it."""
    if not result.speedup:
        return Cell("")
    comparison = result.comparison
    text = f"{result.speedup:.2f}x"
    if comparison is None:
        return Cell(text)
    if comparison.low is not None and comparison.high is not None:
        text += ("\n" if compact else " ") + f"[{1 / comparison.high:.2f}, {1 / comparison.low:.2f}]"
    if comparison.verdict in ("faster", "slower"):
        return Cell(text, "good" if comparison.verdict == "faster" else "bad")
    return Cell(f"~{text}", "noise")


def predict_quality_cell(result: TrialResult) -> Cell:
    quality = result.quality or {}
    if "passed" not in quality:
        return Cell("")
    if quality.get("class") == "exact":
        return Cell("exact" if quality["passed"] else "not exact", "" if quality["passed"] else "bad")
    if quality.get("spearman") is None:
        return Cell("not measured", "warn")
    return Cell(f"ρ {quality['spearman']:.3f}", "" if quality["passed"] else "bad")
