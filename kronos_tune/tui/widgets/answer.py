"""The recommendation panel: what the benchmark recommends, why, the command that runs it, the fastest trial."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from kronos_tune.tui.model import Answer
from kronos_tune.tui.keys import PANE_BINDINGS
from kronos_tune.tui.widgets.base import Line
from kronos_tune.tui.widgets.results import BEST_MARK, RECOMMENDED_MARK

RUN_HERE = "  (t runs it here)"
SCROLL_HINT = "more: tab, then ↑↓ PgUp PgDn"
BAR_CELLS = 20


def memory_bar(headroom: dict) -> Text:
    """memory ████░░░░ 2.03 of 11.5 GiB used (18%): batch 50 -> about 239 would fit"""
    used = min(1.0, headroom["peak_bytes"] / max(1, headroom["budget_bytes"]))
    full = max(1 if used > 0 else 0, round(used * BAR_CELLS))
    colour = "red" if used > 0.9 else "yellow" if used > 0.7 else "green"
    return Text.assemble(("memory ", "bold"), ("█" * full, colour), ("░" * (BAR_CELLS - full), "dim"),
                         f" {headroom['text']}")


class AnswerPanel(VerticalScroll):
    """Hidden until a benchmark has an answer; then every line of it, whole. Where the screen leaves it fewer rows
    than that (DashboardApp._fit_results caps its height) it scrolls: tab gives it the focus, ↑↓ PgUp PgDn
    scroll it, and its subtitle says so."""

    BINDINGS = PANE_BINDINGS

    def __init__(self) -> None:
        super().__init__(Static(id="answer-text"), id="answer", classes="panel")
        self.border_title = "Recommendation"
        self._answer: Answer | None = None
        self.display = False

    @property
    def answer(self) -> Answer | None:
        return self._answer

    def show(self, answer: Answer | None) -> None:
        self._answer = answer
        self.display = answer is not None
        if answer is not None:
            self.border_title = f"Recommendation · preset {answer.preset} · {answer.task}"
        self._fill()

    def _fill(self) -> None:
        width = self.content_region.width or max(1, self.app.size.width - 4)
        self.query_one("#answer-text", Static).update(self.text(width))
        self._subtitle()

    def on_resize(self) -> None:
        self._fill()  # the command's "(t runs it here)" depends on the width

    def watch_virtual_size(self) -> None:  # the panel may just have become short of rows, or no longer be
        self._subtitle()

    def _subtitle(self) -> None:
        folder = (self._answer.folder or "") if self._answer is not None else ""
        self.border_subtitle = f"{SCROLL_HINT} · {folder}" if self.max_scroll_y > 0 else folder

    @property
    def plain(self) -> str:
        """What the panel shows, as plain text: every line, scrolled into view or not."""
        content = self.query_one("#answer-text", Static).content
        return content.plain if isinstance(content, Text) else str(content)

    def text(self, width: int) -> Text:
        """Every line of the answer, one after the other (each wraps at the panel's width)."""
        return Text("\n").join(text for _, text in self.lines(width))

    def content_rows(self, width: int) -> int:
        """How many rows every line takes, wrapped at `width` (the panel's inner width)."""
        console = self.app.console
        return sum(len(text.wrap(console, max(1, width))) for _, text in self.lines(width))

    def lines(self, width: int) -> list[Line]:
        answer = self._answer
        if answer is None:
            return []
        from kronos_tune.benchmark.tasks import get

        task = get(answer.task)
        lines: list[Line] = []
        if answer.recommended is not None:
            what = Text.assemble((f"{RECOMMENDED_MARK} run ", "bold"), (answer.recommended, "bold green"),
                                 f": {answer.changes_text()}")
        else:
            what = Text(task.no_recommendation, style="dim")
        if answer.best is not None:
            what.append(f"   {BEST_MARK} fastest: ", style="bold")
            what.append(answer.best, style="bold cyan")
            what.append(f" ({answer.best_figure})")
        lines.append((0, what))
        if answer.partial:
            missing = ", ".join(answer.missing) or "some trials"
            lines.append((0, Text(f"partial: cancelled before {missing}; this covers only the finished trials",
                                  style="yellow")))
        if answer.newer_partial:
            lines.append((2, Text(f"a later run was cancelled (kept in {answer.newer_partial}); this answer is from "
                                  f"the last complete run", style="yellow")))
        if answer.command:  # what to run before why: the first rows are the ones a short screen shows
            command = Text.assemble(("command ", "bold"), (answer.command, "cyan"))
            if task.dashboard_trains and command.cell_len + len(RUN_HERE) <= width:  # t trains; else: a shell
                command.append(RUN_HERE, style="dim")
            lines.append((0, command))
        if answer.reason:
            lines.append((1, Text.assemble(("why ", "bold"), answer.reason)))
        if answer.resolution:
            lines.append((0, Text.assemble(("resolution ", "bold"), answer.resolution)))
        if answer.own_evidence:
            lines.append((0, Text.assemble(("decided on their own interval ", "bold"), answer.own_evidence)))
        if answer.headroom:
            lines.append((0, memory_bar(answer.headroom)))
        return lines
