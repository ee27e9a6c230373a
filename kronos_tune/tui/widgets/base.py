"""A bordered panel drawn as lines of text; when short of rows it keeps the most important lines."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget

from kronos_tune.tui.format import bar, sparkline

# (priority, line): lower numbers are kept first when the panel has too few rows; long lines wrap.
Line = tuple[int, Text]


def fit_lines(lines: list[tuple[int, list[Text]]], height: int) -> list[Text]:
    """Whole groups (a logical line and its wrapped rest), most important first, in their original order."""
    order = sorted(range(len(lines)), key=lambda i: (lines[i][0], i))
    kept: set[int] = set()
    used = 0
    for index in order:
        rows = len(lines[index][1])
        if used + rows <= height:
            kept.add(index)
            used += rows
    return [piece for index in sorted(kept) for piece in lines[index][1]]


def meter_line(label: str, label_width: int, fraction: float | None, value: str, width: int) -> Text:
    """`label  ████░░░  value` on one line of `width` cells, the bar taking what is left."""
    text = Text(label.ljust(label_width)[:label_width], style="bold")
    bar_width = width - label_width - len(value) - 1
    if bar_width >= 4:
        text.append_text(bar(fraction, bar_width))
        text.append(" ")
    text.append(value)
    return text


def spark_line(label: str, label_width: int, values: Sequence[float], width: int,
               low: float | None = None, high: float | None = None, value: str = "", style: str = "cyan") -> Text:
    """`label  ▁▂▄▆█  value`: the newest readings that fit, on a fixed [low, high] scale when given."""
    text = Text(label.ljust(label_width)[:label_width], style="bold")
    spark_width = width - label_width - (len(value) + 1 if value else 0)
    if spark_width >= 4:
        text.append(sparkline(values, spark_width, low, high), style=style)
    if value:
        text.append(" " + value)
    return text


class Panel(Widget):
    """Subclasses implement `lines(width)`; `render` fits them to the panel's rows."""

    def lines(self, width: int) -> list[Line]:
        return []

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        if width <= 0 or height <= 0:
            return Text()
        console = self.app.console
        groups = [(priority, list(text.wrap(console, width))) for priority, text in self.lines(width)]
        return Text("\n").join(fit_lines(groups, height))
