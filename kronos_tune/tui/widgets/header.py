"""One status line: preset, run state, host, devices, the CPU's fast precisions (in that order, so a narrow terminal
cuts the least useful)."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


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
