"""Rich output for an autobatch result: summary, probe table, memory-vs-batch plot (the plain lines: autobatch/probes.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rich import box
from rich.table import Table
from rich.text import Text

from kronos_core.units import format_bytes
from kronos_tune.autobatch.probes import AutobatchResult

PLOT_WIDTH = 56
PLOT_HEIGHT = 10
_MARKS = {"ok": ("o", "green"), "verify": ("◆", "bold cyan"), "oom": ("x", "bold red")}


def summary_table(result: AutobatchResult, title: str, unit: str = "batch size", per: str = "per sample",
                  extra: Sequence[tuple[str, str]] = ()) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=box.SIMPLE, pad_edge=False)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value")
    pct = f"{result.margin:.0%}"
    table.add_row("budget", f"{format_bytes(result.budget_bytes)} (usable {format_bytes(result.usable_bytes)} "
                            f"after the {pct} margin)")
    table.add_row("fixed", f"{format_bytes(result.fixed_bytes)}  (least-squares intercept, {result.governing_series})")
    table.add_row(per, f"{format_bytes(result.bytes_per_sample)}  (slope)")
    pick = f"[bold green]{result.batch_size}[/]"
    if result.accumulation_steps > 1 or result.effective_batch is not None:
        pick += f" x {result.accumulation_steps} accumulation steps"
    if result.max_fit_batch_size != result.batch_size:
        pick += f"  (the fit allows {result.max_fit_batch_size})"
    table.add_row(unit, pick)
    table.add_row("predicted peak", format_bytes(result.predicted_peak_bytes))
    kind = "estimated" if result.estimate else "measured"
    table.add_row(f"{kind} peak", f"{format_bytes(result.measured_peak_bytes)} "
                                  f"({result.measured_peak_bytes / result.budget_bytes:.0%} of the budget)")
    table.add_row("headroom", format_bytes(result.headroom_bytes))
    search_probes = sum(1 for p in result.probes if p.kind == "probe")
    verify = sum(1 for p in result.probes if p.kind == "verify")
    table.add_row("search", f"{result.search_time_s:.1f} s, {search_probes} probes + {verify} verification "
                            f"run(s), {result.probe_steps} steps on {result.device}")
    if result.step_time_s is not None:
        table.add_row("step at pick", f"{result.step_time_s:.3f} s (timed under the meter)")
    for name, value in extra:
        table.add_row(name, value)
    return table


def probes_table(result: AutobatchResult, unit: str = "batch") -> Table:
    table = Table(title="probes", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("run")
    table.add_column(unit, justify="right")
    table.add_column("peak", justify="right")
    table.add_column("of budget", justify="right")
    table.add_column("status")
    table.add_column("wall s", justify="right")
    for i, probe in enumerate(result.probes, 1):
        mark, style = _MARKS[probe.status]
        peak = format_bytes(probe.peak_bytes) if probe.peak_bytes is not None else f"> {format_bytes(probe.cap_bytes)}"
        share = f"{probe.peak_bytes / result.budget_bytes:.0%}" if probe.peak_bytes is not None else "-"
        table.add_row(str(i), probe.kind, str(probe.batch_size), peak, share, Text(f"{mark} {probe.status}", style),
                      f"{probe.wall_time_s:.1f}")
    return table


def memory_plot(result: AutobatchResult, width: int = PLOT_WIDTH, height: int = PLOT_HEIGHT) -> Text:
    """Peak memory (rows) against batch size (columns): fit ·, budget ─, usable ┄, probes o/x/◆, pick ▲."""
    probes = [p for p in result.probes if p.kind != "diagnose"]
    xs_curve = np.array([b for b, _ in result.curve], dtype=np.float64)
    ys_curve = np.array([v for _, v in result.curve], dtype=np.float64)
    x_max = float(max([result.batch_size, *(p.batch_size for p in probes), *(xs_curve.tolist() or [1])]))
    peaks = [p.peak_bytes for p in probes if p.peak_bytes is not None]
    y_max = 1.08 * max([result.budget_bytes, *peaks])
    grid = [[" "] * width for _ in range(height)]
    styles: list[list[str | None]] = [[None] * width for _ in range(height)]

    def row_of(value: float) -> int:
        return height - 1 - int(round(min(max(value / y_max, 0.0), 1.0) * (height - 1)))

    def col_of(batch: float) -> int:
        return min(width - 1, max(0, int(round(batch / x_max * (width - 1)))))

    def put(row: int, col: int, char: str, style: str | None) -> None:
        grid[row][col], styles[row][col] = char, style

    for col in range(width):
        put(row_of(result.usable_bytes), col, "┄", "yellow")
        put(row_of(result.budget_bytes), col, "─", "red")
    if len(xs_curve):
        for col in range(width):
            batch = x_max * col / (width - 1)
            if batch < xs_curve[0]:
                continue
            value = float(np.interp(batch, xs_curve, ys_curve))
            if value <= y_max:
                put(row_of(value), col, "·", "blue")
    for probe in probes:
        mark, style = _MARKS[probe.status]
        value = probe.peak_bytes if probe.peak_bytes is not None else y_max
        put(row_of(value), col_of(probe.batch_size), mark, style)

    labels = {0: format_bytes(y_max), row_of(result.budget_bytes): f"{format_bytes(result.budget_bytes)} budget",
              height - 1: "0"}
    label_width = max(len(v) for v in labels.values())
    out = Text()
    for row in range(height):
        out.append(labels.get(row, "").rjust(label_width) + " │", style="dim")
        for col in range(width):
            out.append(grid[row][col], style=styles[row][col])
        out.append("\n")
    axis = [" "] * width
    axis[col_of(result.batch_size)] = "▲"
    out.append(" " * label_width + " └", style="dim")
    out.append("".join(axis), style="bold green")
    out.append("\n")
    left, right = "0", f"{int(x_max)}"
    pick = f"pick {result.batch_size}"
    span = width - len(left) - len(right)
    out.append(" " * (label_width + 2) + left + pick.center(span) + right + "\n", style="dim")
    out.append(" " * (label_width + 2) + "· fit   o probe   ◆ verified   x out of memory\n", style="dim")
    out.append(" " * (label_width + 2) + "─ budget   ┄ usable (budget - margin)   ▲ pick", style="dim")
    return out
