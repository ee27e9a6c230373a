"""The benchmark's trials as a table, one row per finished trial; sorting is the ResultsModel's job.

Each figure cell shows the value and, for trials other than the baseline, its
change vs the baseline as the benchmark's report classifies it: green when
better, red when worse, dim with "~" when inside the noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from kronos_tune.benchmark.report.pareto import FASTEST_MARK as BEST_MARK, RECOMMENDED_MARK
from kronos_tune.tui.format import duration, gib, rate
from kronos_tune.tui.keys import PANE_BINDINGS
from kronos_tune.tui.model import Column

if TYPE_CHECKING:
    from kronos_tune.benchmark import TrialResult

STATUS_STYLES = {"ok": "green", "oom": "bold red", "failed": "bold red", "skipped": "dim", "cancelled": "yellow"}
NOTE_WIDTH = 44  # the reason column is cut at this width (the log pane has every reason whole)
LEGEND = "▶ recommended · ★ fastest (by the time shown) · ↑↓ PgUp/PgDn scroll · tab: next pane"
TONE_STYLES = {"good": "green", "bad": "red", "noise": "dim", "warn": "yellow", "": ""}


ESTIMATED = ("step_time_s", "series_per_s", "tokens_per_s", "samples_per_s")  # the compared estimate's keys


def shown_value(result: TrialResult, key: str, baseline: TrialResult | None = None) -> Any:
    """The figure a cell shows: the compared estimate for the time and the rates (the figures the delta beside
    it is taken from, and the projected total, the ★ and the scatter use: kronos_tune.benchmark.report.shown), else
    the field itself."""
    if key not in ESTIMATED or getattr(result, key) is None:
        return getattr(result, key)
    from kronos_tune.benchmark.report.shown import shown_figure

    return shown_figure(result, key, baseline)


def figure(result: TrialResult, key: str, render: Callable[[Any], str], baseline: TrialResult | None = None
           ) -> Text:
    """The value of `key` and its delta, right-aligned; '–' when the trial has no such figure."""
    from kronos_tune.benchmark.report.cells import delta_cell

    value = shown_value(result, key, baseline)
    text = Text("–" if value is None else render(value), style="dim" if value is None else "")
    delta = delta_cell(result.deltas.get(key), key)  # the benchmark's verdict: good, bad or noise ("~")
    if delta.text:
        text.append(" " + delta.text, style=TONE_STYLES.get(delta.tone, ""))
    text.justify = "right"
    return text


def _loss(value: float) -> str:
    return f"{value:.4f}"


def _mfu(value: float) -> str:
    return f"{100 * value:.1f}%"


def _speedup(value: float) -> str:
    return f"{value:.2f}×"


# (key, header, how to draw the value) per task; the first three columns are the same for both.
FIGURES: dict[str, tuple[tuple[str, str, Callable[[Any], str]], ...]] = {
    "train": (
        ("step_time_s", "step time", duration),
        ("tokens_per_s", "tokens/s", rate),
        ("peak_memory_bytes", "peak mem", gib),
        ("val_loss", "val loss", _loss),
        ("projected_train_time_s", "projected", duration),
        ("mfu", "MFU", _mfu),
    ),
    "predict": (
        ("series_per_s", "series/s", rate),
        ("tokens_per_s", "tokens/s", rate),
        ("peak_memory_bytes", "peak mem", gib),
        ("speedup", "speed-up", _speedup),
        ("projected_predict_time_s", "projected", duration),
        ("output_max_abs_diff", "max diff", lambda v: f"{v:.2g}"),
    ),
}


def columns(task: str) -> tuple[Column, ...]:
    """The sortable columns for `task` (train or predict); None values sort last."""
    head = (
        Column("name", "trial", lambda r: r.name),
        Column("stage", "stage", lambda r: r.stage),
        Column("status", "status", lambda r: r.status),
    )
    body = tuple(Column(key, label, lambda r, b=None, key=key: shown_value(r, key, b), key in ESTIMATED)
                 for key, label, _ in FIGURES[task])
    return head + body + (Column("reason", "note", lambda r: r.reason or ""),)


def note(result: TrialResult) -> Text:
    """Why a trial did not run ok (its one-line reason), or that it failed the benchmark's quality guard."""
    if result.reason:
        return Text(result.reason, style="red" if result.status in ("oom", "failed") else "dim")
    if not result.quality_passed:
        # predict: the exactness class's verdict (benchmark/predict/decide.py); train's guard has no text
        return Text(str(result.quality.get("text") or "quality guard: val loss worse than the noise allows"),
                    style="red")
    return Text("")


def name_cell(name: str, best: str | None, recommended: str | None) -> Text:
    """The trial's name, marked ▶ when it is the recommended one and ★ when it is the fastest."""
    marks = (RECOMMENDED_MARK if name == recommended else "") + (BEST_MARK if name == best else "")
    style = "bold green" if name == recommended else "bold cyan" if name == best else "bold"
    return Text.assemble((marks + " " if marks else "", style), (name, style))


def row_cells(result: TrialResult, task: str, best: str | None = None, recommended: str | None = None,
              baseline: TrialResult | None = None) -> list[Text]:
    """One table row: name, stage, status, the task's figures with their deltas, the note."""
    cells = [
        name_cell(result.name, best, recommended),
        Text(result.stage, style="dim"),
        Text(result.status, style=STATUS_STYLES.get(result.status, "")),
    ]
    cells += [figure(result, key, render, baseline) for key, _, render in FIGURES[task]]
    cells.append(note(result))
    return cells


class ResultsTable(DataTable):
    """Rebuilt from the model's sorted rows whenever a trial finishes or the order changes. One line per row
    (a long note is cut here; the log has it whole), so the table's height is its row count."""

    BINDINGS = PANE_BINDINGS

    def __init__(self) -> None:
        super().__init__(id="results", cursor_type="row", zebra_stripes=True)
        self.border_title = "Results"
        self.border_subtitle = LEGEND
        self.shown_task: str | None = None

    def show(self, task: str, rows: Sequence[TrialResult], sort_key: str | None, reverse: bool,
             best: str | None = None, recommended: str | None = None) -> None:
        if task != self.shown_task:
            self.clear(columns=True)
            for column in columns(task):
                width = NOTE_WIDTH if column.key == "reason" else None
                self.add_column(column.label, key=column.key, width=width)
            self.shown_task = task
        arrow = "▼" if reverse else "▲"
        for column in columns(task):  # the sorted column's header carries the arrow
            self.columns[ColumnKey(column.key)].label = Text(
                f"{column.label} {arrow}" if column.key == sort_key else column.label)
        cursor = self.cursor_row
        self.clear()
        from kronos_tune.benchmark.report.shown import baseline_of

        baseline = baseline_of(rows)
        for result in rows:
            cells = row_cells(result, task, best, recommended, baseline)
            cells[-1].truncate(NOTE_WIDTH, overflow="ellipsis")
            self.add_row(*cells, key=result.name)
        if rows:
            self.move_cursor(row=min(cursor, len(rows) - 1), scroll=False)
        labels = {c.key: c.label for c in columns(task)}
        order = "arrival order" if sort_key is None else f"by {labels[sort_key]} {arrow}"
        count = f"{len(rows)} trial" + ("" if len(rows) == 1 else "s")
        self.border_title = f"Results ({task}) · {count} · {order}"

    def show_row(self, name: str | None) -> None:
        """Put the cursor on the row of trial `name` and scroll it into view."""
        if name is None:
            return
        try:
            index = self.get_row_index(name)
        except Exception:  # noqa: BLE001 - no such row (yet): nothing to show
            return
        self.move_cursor(row=index, scroll=True)
