"""The results as a scatter (`g`): time against peak memory per trial, the Pareto front, the recommendation
(▶) and the fastest trial (★) as the results table marks them, and the budget, as in the report's pareto.png.
Drawn with textual-plotext; where it is not installed, a small table of the same points. The data comes ready
from kronos_tune.benchmark.report.pareto."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Static

from kronos_tune.benchmark.report.pareto import FASTEST_MARK, RECOMMENDED_MARK
from kronos_tune.tui.format import gib

if TYPE_CHECKING:
    from kronos_tune.benchmark.report.pareto import Point, Scatter

FRONT_MARK = "◆"
EMPTY = "No finished trials yet: run the benchmark (b or B); the points appear as trials finish."


def plot_widget() -> Widget | None:
    """A PlotextPlot, or None when textual-plotext cannot be imported."""
    try:
        from textual_plotext import PlotextPlot
    except ImportError:
        return None
    return PlotextPlot(id="scatter-plot")


def _scales(scatter: Scatter) -> tuple[float, str, float, str]:
    from kronos_tune.benchmark.report.pareto import budget_in_view, memory_scale, time_scale

    memories = [p.memory_bytes for p in scatter.points]
    if budget_in_view(scatter):
        memories.append(scatter.budget_bytes)
    mem_div, mem_unit = memory_scale(memories)
    t_mul, t_unit = time_scale(p.seconds for p in scatter.points)
    return mem_div, mem_unit, t_mul, t_unit


def caption(scatter: Scatter) -> Text:
    """Below the plot: the front and the recommendation in words, the budget, what is not drawn."""
    from kronos_tune.benchmark.report.pareto import budget_in_view

    text = Text()
    if scatter.front:
        text.append(f"{FRONT_MARK} Pareto front (no other trial both faster and smaller): ", style="bold")
        text.append(", ".join(p.name for p in scatter.front))
    if scatter.recommended:
        text.append(f"\n{RECOMMENDED_MARK} recommended: ", style="bold green")
        text.append(scatter.recommended)
    if scatter.fastest:
        text.append(f"{'   ' if scatter.recommended else chr(10)}{FASTEST_MARK} fastest (by the time shown): ",
                    style="bold cyan")
        text.append(scatter.fastest)
    if scatter.budget_bytes:
        where = "the red line" if budget_in_view(scatter) else "far right of every point, off the chart"
        text.append(f"\nmemory budget {gib(scatter.budget_bytes)} ({where})", style="dim")
    if scatter.left_out:
        text.append("\n" + scatter.caption(), style="dim")
    return text


def points_table(scatter: Scatter) -> Table:
    """The fallback: one row per point, marked when on the front or recommended."""
    _, _, t_mul, t_unit = _scales(scatter)
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("trial")
    table.add_column(Text(f"{scatter.axis_label} [{t_unit}]"), justify="right")
    table.add_column("peak memory", justify="right")
    table.add_column("front", justify="center")
    on_front = {p.name for p in scatter.front}
    for point in sorted(scatter.points, key=lambda p: (p.memory_bytes, p.seconds)):
        table.add_row(Text(scatter.label(point.name), style="dim" if point.repeat else ""),
                      f"{point.seconds * t_mul:.3g}",
                      gib(point.memory_bytes, 2), FRONT_MARK if point.name in on_front else "")
    return table


def label_places(points: list[tuple[str, float, float]], cell: tuple[float, float], right: float
                 ) -> dict[str, tuple[float, float]]:
    """Where each name is written: two columns right of its marker (left of it at the right edge), on the
    marker's row, or the nearest free row above or below when another name already covers those columns
    there (overlapping names merged into one word: "dataloadere")."""
    column, row = cell
    taken: list[tuple[int, int, int]] = []  # (row, first column, last column) of every name placed
    places: dict[str, tuple[float, float]] = {}
    for name, x, y in sorted(points, key=lambda p: (p[2], p[1])):
        start = x + 2 * column if x + (len(name) + 3) * column < right else x - (len(name) + 2) * column
        first = round(start / column)
        last = first + len(name)
        home = round(y / row)
        for shift in (0, 1, -1, 2, -2, 3, -3):
            line = home + shift
            if all(line != r or last + 1 < a or first > b + 1 for r, a, b in taken):
                break
        else:
            line = home
        taken.append((line, first, last))
        places[name] = (start, line * row)
    return places


class ScatterPanel(Vertical):
    """The plot (or the fallback table) and its caption. `drawn` keeps what the last `show` plotted, by series:
    (x values, y values, names) in the plot's units."""

    def __init__(self) -> None:
        super().__init__(id="scatter")
        self.scatter: Scatter | None = None
        self.drawn: dict[str, tuple[list[float], list[float], list[str]]] = {}
        self.plot: Widget | None = None

    def compose(self) -> ComposeResult:
        self.plot = plot_widget()
        yield self.plot if self.plot is not None else Static(id="scatter-table")
        yield Static(id="scatter-caption")

    def on_resize(self) -> None:
        if self.scatter is not None and self.scatter.points:  # the names' offsets depend on the width
            self.show(self.scatter)

    def show(self, scatter: Scatter | None) -> None:
        self.scatter = scatter
        self.drawn = {}
        if scatter is None or not scatter.points:
            self.border_title = "Time vs peak memory"
            self._clear()
            self.query_one("#scatter-caption", Static).update(
                Text(EMPTY) if scatter is None else caption(scatter))
            return
        self.border_title = f"Time vs peak memory ({scatter.task}) · lower left is better"
        if self.plot is not None:
            self._plot(scatter)
        else:
            self.query_one("#scatter-table", Static).update(points_table(scatter))
        self.query_one("#scatter-caption", Static).update(caption(scatter))

    def _clear(self) -> None:
        if self.plot is not None:
            self.plot.plt.clear_figure()  # type: ignore[attr-defined]
            self.plot.refresh()
        else:
            self.query_one("#scatter-table", Static).update("")

    def _series(self, key: str, points: list[Point], mem_div: float, t_mul: float) -> tuple[list[float], ...]:
        xs, ys = [p.memory_bytes / mem_div for p in points], [p.seconds * t_mul for p in points]
        self.drawn[key] = (xs, ys, [p.name for p in points])
        return xs, ys

    def _plot(self, scatter: Scatter) -> None:
        from kronos_tune.benchmark.report.pareto import budget_in_view, front_staircase

        plt: Any = self.plot.plt  # type: ignore[union-attr]
        mem_div, mem_unit, t_mul, t_unit = _scales(scatter)
        plt.clear_figure()
        if scatter.front:  # first: the markers drawn after it stay visible on it
            xs, ys = front_staircase(scatter.front)
            xs, ys = [x / mem_div for x in xs], [y * t_mul for y in ys]
            self.drawn["front"] = (xs, ys, [p.name for p in scatter.front])
            plt.plot(xs, ys, marker="braille", color="orange", label="Pareto front")
        configs = [p for p in scatter.points if not p.repeat]
        repeats = [p for p in scatter.points if p.repeat]
        if configs:
            plt.scatter(*self._series("trials", configs, mem_div, t_mul), marker="●", color="cyan", label="trial")
        if repeats:
            plt.scatter(*self._series("repeats", repeats, mem_div, t_mul), marker="○", color="gray",
                        label="baseline again")
        chosen = scatter.point(scatter.recommended) if scatter.recommended else None
        if chosen is not None:
            plt.scatter(*self._series("recommended", [chosen], mem_div, t_mul), marker=RECOMMENDED_MARK,
                        color="green", label="recommended")
        best = scatter.point(scatter.fastest) if scatter.fastest else None
        if best is not None and best is not chosen:
            plt.scatter(*self._series("fastest", [best], mem_div, t_mul), marker=FASTEST_MARK, color="cyan",
                        label="fastest")
        right = max(p.memory_bytes for p in scatter.points)
        if budget_in_view(scatter):
            plt.vertical_line(scatter.budget_bytes / mem_div, color="red")
            self.drawn["budget"] = ([scatter.budget_bytes / mem_div], [], ["budget"])
            right = max(right, scatter.budget_bytes)
        right = 1.15 * right / mem_div
        top = 1.15 * max(p.seconds for p in scatter.points) * t_mul
        width = self.plot.size.width or self.size.width  # type: ignore[union-attr]
        height = self.plot.size.height or self.size.height  # type: ignore[union-attr]
        cell = (right / max(20, width - 12), top / max(5, height - 4))  # one column and one row, in data units
        labels = {p.name: scatter.label(p.name) for p in scatter.points}  # marks in the name itself
        places = label_places([(labels[p.name], p.memory_bytes / mem_div, p.seconds * t_mul)
                               for p in scatter.points], cell, right)
        self.drawn["labels"] = ([x for x, _ in places.values()], [y for _, y in places.values()], list(places))
        for point in scatter.points:
            x, y = places[labels[point.name]]
            plt.text(labels[point.name], x, y, alignment="left", color="gray" if point.repeat else None)
        plt.xlim(0, right)
        plt.ylim(0, top)
        plt.xlabel(f"peak memory [{mem_unit}]")
        plt.ylabel(f"time per {scatter.unit} [{t_unit}]")
        self.plot.refresh()  # type: ignore[union-attr]


class ScatterScreen(ModalScreen[None]):
    """The scatter over the dashboard; it follows the results while a benchmark runs. escape, g or q close it."""

    BINDINGS = [Binding("escape,g,q", "dismiss", "Close", show=False)]
    DEFAULT_CSS = """
    ScatterScreen { align: center middle; }
    #scatter { width: 92%; height: 85%; border: round $primary 60%; border-title-style: bold;
               background: $surface; padding: 0 1; }
    #scatter-plot { height: 1fr; }
    #scatter-table { height: 1fr; overflow-y: auto; }
    #scatter-caption { height: auto; max-height: 6; }
    #scatter-hint { width: 92%; height: 1; }
    """

    def __init__(self, scatter: Scatter | None) -> None:
        super().__init__()
        self.scatter = scatter

    def compose(self) -> ComposeResult:
        yield ScatterPanel()
        yield Static(Text("escape closes this view", style="dim"), id="scatter-hint")

    def on_mount(self) -> None:
        self.show(self.scatter)

    def show(self, scatter: Scatter | None) -> None:
        self.scatter = scatter
        self.query_one(ScatterPanel).show(scatter)
