"""The summary table of a benchmark report (report.md, the terminal): the shared columns here, the task's own
from its `cells`."""

from __future__ import annotations

from kronos_core.units import format_bytes
from kronos_tune.benchmark.report.cells import Cell, changes_text, delta_cell, status_cell
from kronos_tune.benchmark.report.estimate import baseline_of, shown_time_cell
from kronos_tune.benchmark.results import BenchmarkReport
from kronos_tune.benchmark.tasks import get


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
        if task.time_column in own:  # one estimate in every view (report/estimate.py)
            own[task.time_column] = shown_time_cell(t, baseline, compact)
        rows.append([own[column] if column in own else shared[column] for column in task.columns])
    return task.columns, rows
