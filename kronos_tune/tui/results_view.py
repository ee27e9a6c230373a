"""The dashboard's results and answer: the trials table, the recommendation panel, and the rule that a partial
benchmark never replaces a complete answer. A mixin of DashboardApp (it reads the app's state and widgets)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual.geometry import Size

from kronos_tune.tui.model import Answer, ResultsModel, answer_from, best_trial, is_complete
from kronos_tune.tui.format import duration, rate
from kronos_tune.tui.widgets import AnswerPanel, LogPane, ResultsTable, columns
from kronos_tune.tui.widgets.scatter import ScatterScreen

if TYPE_CHECKING:
    from kronos_tune.presets import Preset
    from kronos_tune.benchmark import BenchmarkReport, TrialResult
    from kronos_tune.benchmark.report.pareto import Scatter
    from kronos_tune.tui.model import RunState


TABLE_FLOOR = 7  # rows the results table keeps beside a long recommendation: border, header, 3 trials, scrollbar
TABLE_FLOOR_FOCUSED = 5  # ... while the recommendation has the focus: 1 trial
ANSWER_FLOOR = 4  # the recommendation's rows at the least: border and 2 lines


class ResultsView:
    """Needs from the app: results, results_task, report, complete, answer, recommended, out_dir, preset,
    run_state, log_line, query_one, size, screen, push_screen."""

    results: ResultsModel
    results_task: str
    report: BenchmarkReport | None
    complete: dict[str, BenchmarkReport]
    answer: Answer | None
    recommended: Path | None
    out_dir: Path
    preset: Preset | None
    run_state: RunState

    def _fit_results(self, size: Size | None = None) -> None:
        """Share the rows the status line, the footer and the smallest telemetry and run | log (5 each) leave
        between the recommendation and the results table. The recommendation takes every line it has unless
        that would leave the table fewer than TABLE_FLOOR rows (3 trials, or 1 while the recommendation has
        the focus): then it is cut to what is left and scrolls (80x24, 100x30). The table takes the rows it
        needs in the rest: while a benchmark runs at most half the screen (the run panel's curves keep their
        room); once it has finished with an answer, all of it, so every row of a finished run stays on screen
        with the recommendation (160x50: 25+ rows); where they do not fit it scrolls."""
        width, height = size or self.size
        room = height - 2 - 10  # status line and footer; telemetry and run | log at their smallest
        answer, table = self.query_one(AnswerPanel), self.query_one(ResultsTable)
        answer_rows = 0
        if answer.display:
            floor = TABLE_FLOOR_FOCUSED if answer.has_focus else TABLE_FLOOR
            answer_cap = max(ANSWER_FLOOR, room - floor)
            answer.styles.max_height = answer_cap
            answer_rows = min(answer_cap, answer.content_rows(max(1, width - 4)) + 2)
        finished = answer.display and not self.run_state.busy
        cap = room - answer_rows if finished else round(0.5 * height)
        table.styles.max_height = max(TABLE_FLOOR_FOCUSED, min(room - answer_rows, cap))
        if table.row_count:  # a shorter table still shows the row under its cursor
            self.call_after_refresh(lambda: table.move_cursor(row=table.cursor_row, scroll=True))

    def action_next_pane(self, step: int = 1) -> None:
        """Tab (step 1) / shift+tab (-1): the focus to the next pane a benchmark is read through (the results,
        the recommendation where one is shown, the log); the recommendation takes more rows while it has it."""
        panes = [pane for pane in (self.query_one(ResultsTable), self.query_one(AnswerPanel),
                                   self.query_one(LogPane)) if pane.display]
        index = next((i for i, pane in enumerate(panes) if pane is self.focused), -1)
        panes[(index + step) % len(panes)].focus()
        self.call_after_refresh(self._fit_results)

    def _trial_finished(self, result: TrialResult) -> None:
        self.results.add(result)
        self._fit_results()  # a new run's rows: back to the running share of the screen
        self._show_results()
        if result.status == "ok":
            from kronos_tune.benchmark.tasks import get

            task = get(result.task)
            step = f", step {duration(result.step_time_s)}" if result.step_time_s is not None else ""
            speed = getattr(result, task.throughput_key)
            self.log_line(f"{result.name}: ok{step}, {rate(speed)} {task.throughput_unit}", "ok")
        else:
            level = "error" if result.status in ("oom", "failed") else "warning"
            self.log_line(f"{result.name}: {result.status}: {result.reason or 'no reason given'}", level)

    def _benchmark_answer(self, report: BenchmarkReport) -> None:
        """Show the report's answer, unless it is partial and a complete one of the same task is on screen:
        a cancelled run never replaces a finished one (both stay on disk, in their own folders)."""
        self.report = report
        if report.task == self.results_task:  # the summarized trials: their deltas and comparisons (a copy of
            for trial in report.trials:      # the rows the trials' events brought, which have neither)
                self.results.add(trial)
        kept = self.complete.get(report.task)
        if is_complete(report):
            self.complete[report.task] = report
            answer = answer_from(report)
        elif kept is not None:
            answer = answer_from(kept)
            answer.newer_partial = report.out_dir
            self.log_line(f"partial run kept in {report.out_dir}; the recommendation stays from the complete run "
                          f"in {kept.out_dir}", "warning")
            report = kept
        else:
            answer = answer_from(report)
        self.answer = answer
        from kronos_tune.benchmark.tasks import get

        recommended = Path(report.out_dir or ".") / "recommended.toml"
        if get(report.task).dashboard_trains and report.out_dir and recommended.is_file():
            self.recommended = recommended
        self.query_one(AnswerPanel).show(answer)
        self._fit_results()
        self._show_results()
        self.query_one(ResultsTable).show_row(answer.recommended or answer.best)

    def action_sort(self) -> None:
        self.results.cycle_sort()
        self._show_results()

    def action_reverse_sort(self) -> None:
        self.results.reverse = not self.results.reverse
        self._show_results()

    def _show_results(self) -> None:
        best = best_trial(self.results.results, self.results_task)
        answer = self.answer if self.answer is not None and self.answer.task == self.results_task else None
        self.query_one(ResultsTable).show(self.results_task, self.results.rows(), self.results.sort_key,
                                          self.results.reverse, best=best.name if best is not None else None,
                                          recommended=answer.recommended if answer is not None else None)
        if isinstance(self.screen, ScatterScreen):  # the scatter follows the results while it is open
            self.screen.show(self.scatter())

    def scatter(self) -> Scatter | None:
        """The results on screen as the scatter's points (None before the first trial finishes); the budget
        is the report's, or the preset's while the benchmark runs."""
        if not self.results.results:
            return None
        from kronos_tune.benchmark.report.pareto import scatter_of

        answer = self.answer if self.answer is not None and self.answer.task == self.results_task else None
        report = self.report if self.report is not None and self.report.task == self.results_task else None
        budget = report.budget_bytes if report is not None else self.preset.budget_bytes if self.preset else 0
        return scatter_of(self.results.results, self.results_task, budget,
                          answer.recommended if answer is not None else None)

    def action_scatter(self) -> None:
        if not isinstance(self.screen, ScatterScreen):
            self.push_screen(ScatterScreen(self.scatter()))

    def _clear_results(self, previous: str | None) -> None:
        had = bool(self.results.results) or self.answer is not None
        self.recommended, self.report, self.answer, self.complete = None, None, None, {}
        self.results = ResultsModel(columns(self.results_task))
        self.query_one(AnswerPanel).show(None)
        self._fit_results()
        self._show_results()
        if had:
            self.log_line(f"results of preset {previous} cleared from the screen (their folders under "
                          f"{self.out_dir} stay)")
