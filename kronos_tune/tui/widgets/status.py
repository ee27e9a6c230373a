"""What the dashboard says in words: the status line (preset, run state, host, devices, the CPU's fast precisions,
in that order, so a narrow terminal cuts the least useful) and the log pane (one timestamped line per thing that
happened: jobs, trials, files written, errors)."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget
from textual.widgets import RichLog

from kronos_tune.tui.keys import PANE_BINDINGS

LEVEL_STYLES = {"info": "", "warning": "yellow", "error": "bold red", "ok": "green"}


class StatusBar(Widget):
    def __init__(self) -> None:
        super().__init__(id="status")
        self._parts: list[tuple[str, str]] = [("kronos-tune", "bold")]

    def show(self, host: str, devices: str, preset: str, state: str, state_style: str = "", cpu: str = "") -> None:
        self._parts = [("kronos-tune", "bold"), (preset, "cyan"), (state, state_style), (host, ""), (devices, "")]
        if cpu:
            self._parts.append((cpu, "dim"))
        self.refresh()

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        for index, (part, style) in enumerate(self._parts):
            if index:
                text.append(" │ ", style="dim")
            text.append(part, style=style)
        return text


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
