"""The log pane: one timestamped line per thing that happened (jobs, trials, files written, errors)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

from kronos_tune.tui.keys import PANE_BINDINGS

LEVEL_STYLES = {"info": "", "warning": "yellow", "error": "bold red", "ok": "green"}


class LogPane(RichLog):
    BINDINGS = PANE_BINDINGS

    def __init__(self) -> None:
        super().__init__(id="log", classes="panel", wrap=True, markup=False, highlight=False, max_lines=2000,
                         min_width=20)
        self.border_title = "Log"

    def add(self, text: str, level: str = "info", stamp: str = "") -> None:
        line = Text(f"{stamp} " if stamp else "", style="dim")
        line.append(text, style=LEVEL_STYLES.get(level, ""))
        self.write(line)
