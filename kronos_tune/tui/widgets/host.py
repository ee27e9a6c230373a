"""The host: RAM and swap with history, every CPU core, and the resident memory of our process tree."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from kronos_tune.telemetry.sampler import HostSnapshot
from kronos_tune.tui.format import SPARK_LEVELS, bar, gib, level_style, ratio
from kronos_tune.tui.widgets.base import Line, Panel, meter_line, spark_line

LABEL_WIDTH = 6
CORE_CELL = 16  # "c12 ██████ 100%" plus a gap


def core_strip(per_core: Sequence[float]) -> Text:
    """Every core as one block character, its height and colour the core's load."""
    strip = Text()
    for value in per_core:
        fraction = min(1.0, max(0.0, value / 100))
        strip.append(SPARK_LEVELS[round(fraction * (len(SPARK_LEVELS) - 1))], style=level_style(fraction))
    return strip


def core_lines(per_core: Sequence[float], width: int) -> list[Text]:
    """Every core as `cN bar NN%`, as many per line as fit."""
    if not per_core:
        return [Text("no per-core readings", style="dim")]
    label = len(str(len(per_core) - 1)) + 1
    cell = max(CORE_CELL, label + 12)
    per_line = max(1, width // cell)
    bar_width = cell - label - 7
    lines = []
    for start in range(0, len(per_core), per_line):
        line = Text()
        for core in range(start, min(start + per_line, len(per_core))):
            value = per_core[core]
            line.append(f"c{core}".ljust(label), style="bold")
            line.append(" ")
            line.append_text(bar(value / 100, bar_width))
            line.append(f"{value:4.0f}%", style=level_style(value / 100))
            line.append("  ")
        line.rstrip()
        lines.append(line)
    return lines


class HostPanel(Panel):
    """RAM, swap, CPU per core and total, our process tree's RSS, each with history where it helps."""

    def __init__(self) -> None:
        super().__init__(id="host", classes="panel")
        self.border_title = "Host"
        self._host: HostSnapshot | None = None
        self._ram: Sequence[float] = ()
        self._cpu: Sequence[float] = ()
        self._rss: Sequence[float] = ()

    def show(self, host: HostSnapshot, ram_history: Sequence[float], cpu_history: Sequence[float],
             rss_history: Sequence[float]) -> None:
        self._host, self._ram, self._cpu, self._rss = host, ram_history, cpu_history, rss_history
        self.border_title = f"Host · {len(host.cpu_percent_per_core)} cores"
        self.refresh()

    def lines(self, width: int) -> list[Line]:
        host = self._host
        if host is None:
            return [(0, Text("waiting for the first sample…", style="dim"))]
        ram = meter_line("RAM", LABEL_WIDTH, ratio(host.ram_used_bytes, host.ram_total_bytes),
                         f"{gib(host.ram_used_bytes)} / {gib(host.ram_total_bytes)}", width)
        swap = meter_line("swap", LABEL_WIDTH, ratio(host.swap_used_bytes, host.swap_total_bytes),
                          f"{gib(host.swap_used_bytes)} / {gib(host.swap_total_bytes)}", width)
        cpu_total = spark_line("CPU", LABEL_WIDTH, self._cpu, width, 0.0, 100.0,
                               value=f"{host.cpu_percent_total:3.0f}%", style="green")
        children = "child" if host.child_count == 1 else "children"
        rss_value = f"{gib(host.process_tree_rss_bytes)} ({host.child_count} {children})"
        rss = spark_line("ours", LABEL_WIDTH, self._rss, width, 0.0, None, value=rss_value, style="cyan")
        lines: list[Line] = [
            (0, ram),
            (4, spark_line("", LABEL_WIDTH, self._ram, width, 0.0, 100.0, style="magenta")),
            (3, swap),
            (1, cpu_total),
        ]
        cores = Text("cores".ljust(LABEL_WIDTH), style="bold") + core_strip(host.cpu_percent_per_core)
        lines.append((2, cores))
        lines.append((5, Text("\n").join(core_lines(host.cpu_percent_per_core, width))))  # all cores or none
        lines.append((0, rss))
        return lines
