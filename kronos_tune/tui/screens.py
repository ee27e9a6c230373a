"""Screens over the dashboard: key help, the preset picker, and the terminal-too-small notice."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from kronos_tune.presets import Preset
from kronos_tune.tui.format import gib

MIN_WIDTH = 80
MIN_HEIGHT = 24


class HelpScreen(ModalScreen[None]):
    """Every key binding with what it does; any of escape, ? or q closes it."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close", show=False)]

    def __init__(self, keys: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for key, description in self.keys:
            table.add_row(key, description)
        with Vertical(id="help-box", classes="dialog"):
            yield Static(Text("Keys (also in the command palette, ctrl+p)", style="bold"))
            with VerticalScroll(id="help-keys"):  # a short terminal scrolls the keys instead of cutting them
                yield Static(table)
            yield Static(Text("↑↓ PgUp/PgDn scroll · escape closes this help", style="dim"))

    def on_mount(self) -> None:
        self._fit()
        self.query_one("#help-keys").focus()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        """The keys take what the dialog (90% of the screen) leaves after its border, padding, title and
        footer: they scroll below that, and the title and footer stay on screen."""
        self.query_one("#help-keys").styles.max_height = max(3, int(0.9 * self.size.height) - 8)


def preset_option(preset: Preset) -> Option:
    """One picker line: name, devices and memory, model size; the description below it."""
    hw, work = preset.hardware, preset.workload
    line = Text.assemble((preset.name, "bold cyan"), "  ",
                         f"{hw.device_count} × {hw.device} {gib(hw.memory_per_device_bytes)}",
                         "  ", (f"Kronos-{work.model_size}", "magenta"), "\n", (preset.description, "dim"))
    return Option(line, id=preset.name)


class PresetPicker(ModalScreen[str | None]):
    """Choose one of the presets given; dismisses with its name, or None on escape."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close", show=False)]

    def __init__(self, presets: Sequence[Preset], current: str | None) -> None:
        super().__init__()
        self.presets = presets
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box", classes="dialog"):
            yield Static(Text("Pick a preset (enter selects, escape cancels)", style="bold"))
            yield OptionList(*(preset_option(p) for p in self.presets), id="preset-list")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        names = [p.name for p in self.presets]
        if self.current in names:
            options.highlighted = names.index(self.current)
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option_id)


def too_small(width: int, height: int) -> bool:
    return width < MIN_WIDTH or height < MIN_HEIGHT


class TooSmallScreen(Screen[None]):
    """Shown instead of the dashboard while the terminal is below 80x24."""

    def compose(self) -> ComposeResult:
        yield Static(id="too-small")

    def on_mount(self) -> None:
        self._describe(self.app.size.width, self.app.size.height)

    def on_resize(self, event: events.Resize) -> None:
        self._describe(event.size.width, event.size.height)

    def _describe(self, width: int, height: int) -> None:
        self.query_one("#too-small", Static).update(
            f"please enlarge the terminal to at least {MIN_WIDTH}x{MIN_HEIGHT}\n(now {width}x{height}; q quits)")
