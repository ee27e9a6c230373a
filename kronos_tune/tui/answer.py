"""The benchmark's answer as the dashboard shows it: what to run, why, the command, and the fastest trial.

Plain Python (no Textual): built from a BenchmarkReport's `recommended` (a Recommendation: source, reason,
command, changes, partial, missing) and the finished trials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kronos_tune.tui.format import duration, rate
from kronos_tune.tui.model import best_trial


@dataclass
class Answer:
    preset: str
    task: str
    folder: str | None
    recommended: str | None  # the trial whose config is recommended
    changes: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    command: str | None = None
    best: str | None = None  # the fastest trial that ran ok and kept the quality guard
    best_figure: str = ""
    partial: bool = False
    missing: list[str] = field(default_factory=list)
    newer_partial: str | None = None  # a later, partial run's folder: this answer comes from an earlier one
    headroom: dict[str, Any] | None = None  # BenchmarkReport.headroom: peak vs budget, the batch that would fit
    resolution: str | None = None  # "changes under 3.8% could not be told from noise in this run (...)"
    own_evidence: str | None = None  # the verdicts called on their own interval, not on the resolution above

    def changes_text(self) -> str:
        return ", ".join(f"{key} = {value}" for key, value in self.changes.items()) or "the baseline config"


def _figure(result: Any, trials: list[Any], task: str) -> str:
    """The fastest trial's figure, as its row shows it (the compared estimate)."""
    from kronos_tune.benchmark.report.shown import baseline_of, shown_time
    from kronos_tune.benchmark.tasks import get

    if result is None:
        return ""
    chosen = get(task)
    shown = shown_time(result, baseline_of(trials), task)
    return f"{(rate if chosen.time_is_rate else duration)(shown)} {chosen.time_text}"


def answer_from(report: Any) -> Answer:
    """The answer of a finished (or cancelled) benchmark run."""
    from kronos_tune.benchmark.report.files import evidence_line, resolution_line

    rec = report.recommended
    best = best_trial(report.trials, report.task)
    missing = list((rec.missing if rec is not None else None) or getattr(report, "missing", []) or [])
    partial = rec.partial if rec is not None else bool(getattr(report, "partial", False) or report.cancelled)
    return Answer(preset=report.preset, task=report.task, folder=report.out_dir,
                  recommended=rec.source if rec is not None else None,
                  changes=dict(rec.changes) if rec is not None else {},
                  reason=rec.reason if rec is not None else "", command=rec.command if rec is not None else None,
                  best=best.name if best is not None else None, best_figure=_figure(best, report.trials, report.task),
                  partial=partial, missing=missing, headroom=getattr(report, "headroom", None),
                  resolution=resolution_line(report) if getattr(report, "timing", None) else None,
                  own_evidence=evidence_line(report, own_only=True) if getattr(report, "timing", None) else None)


def is_complete(report: Any) -> bool:
    return not (getattr(report, "partial", False) or report.cancelled)
