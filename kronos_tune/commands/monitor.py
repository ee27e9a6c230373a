"""`kronos-tune monitor`: live GPU / host telemetry in the terminal, or JSON lines."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterator

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from kronos_core.cpu_features import CpuFeatures, detect_cpu_features
from kronos_core.units import format_bytes
from kronos_tune.errors import KronosTuneError
from kronos_tune.telemetry.nvml import GpuSnapshot
from kronos_tune.telemetry.sampler import MAX_INTERVAL_S, Sampler, Snapshot, validate_interval
from kronos_tune.tui.format import bar, ratio

MONITOR_MAX_INTERVAL_S = 60.0
BAR_WIDTH = 30
CORE_BAR_WIDTH = 12


def _metric_table(title: str) -> Table:
    """A headerless metric | bar | value table."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("bar")
    table.add_column("value", justify="right")
    return table


def _gpu_table(gpu: GpuSnapshot) -> Table:
    table = _metric_table(f"GPU {gpu.index}: {gpu.name or 'unknown'}")
    table.add_row(
        "Memory",
        bar(ratio(gpu.memory_used_bytes, gpu.memory_total_bytes), BAR_WIDTH),
        f"{format_bytes(gpu.memory_used_bytes, 'GiB')} / {format_bytes(gpu.memory_total_bytes, 'GiB')}",
    )
    util = gpu.utilization_pct
    util_text = "n/a" if util is None else f"{util:.0f} %"
    table.add_row("Utilization", bar(util / 100 if util is not None else None, BAR_WIDTH), util_text)
    power = "n/a" if gpu.power_w is None else f"{gpu.power_w:.0f} W"
    if gpu.power_limit_w is not None:
        power += f" / {gpu.power_limit_w:.0f} W"
    table.add_row("Power", bar(ratio(gpu.power_w, gpu.power_limit_w), BAR_WIDTH), power)
    temperature = "n/a" if gpu.temperature_c is None else f"{gpu.temperature_c:.0f} °C"
    table.add_row("Temperature", Text(""), temperature)
    table.add_row("Our processes", Text(""), format_bytes(gpu.our_memory_bytes, "GiB"))
    table.add_row("Other processes", Text(""), format_bytes(gpu.others_memory_bytes, "GiB"))
    return table


def _host_table(snapshot: Snapshot, pid: int) -> Table:
    host = snapshot.host
    table = _metric_table("Host")
    table.add_row(
        "RAM",
        bar(ratio(host.ram_used_bytes, host.ram_total_bytes), BAR_WIDTH),
        f"{format_bytes(host.ram_used_bytes, 'GiB')} / {format_bytes(host.ram_total_bytes, 'GiB')}",
    )
    table.add_row(
        "Swap",
        bar(ratio(host.swap_used_bytes, host.swap_total_bytes), BAR_WIDTH),
        f"{format_bytes(host.swap_used_bytes, 'GiB')} / {format_bytes(host.swap_total_bytes, 'GiB')}",
    )
    table.add_row("CPU total", bar(host.cpu_percent_total / 100, BAR_WIDTH), f"{host.cpu_percent_total:.0f} %")
    table.add_row(
        f"Process tree RSS (pid {pid})",
        Text(""),
        f"{format_bytes(host.process_tree_rss_bytes, 'GiB')} ({host.child_count} children)",
    )
    return table


def _cores_grid(per_core: tuple[float, ...]) -> Table:
    columns = 4 if len(per_core) > 8 else 2
    grid = Table.grid(padding=(0, 2))
    for _ in range(columns):
        grid.add_column()
    cells = [
        Text(f"cpu{index:<3}") + bar(percent / 100, CORE_BAR_WIDTH) + Text(f" {percent:5.1f}%")
        for index, percent in enumerate(per_core)
    ]
    for start in range(0, len(cells), columns):
        grid.add_row(*cells[start : start + columns])
    return grid


def render(snapshot: Snapshot, interval_s: float, pid: int, cpu: CpuFeatures | None = None) -> Group:
    """The whole live view for one snapshot; `pid` is the root of the measured process tree."""
    parts: list[Table | Text] = []
    if snapshot.gpus:
        parts.extend(_gpu_table(gpu) for gpu in snapshot.gpus)
    else:
        parts.append(Text(f"No NVIDIA GPU: {snapshot.gpu_unavailable_reason or 'none visible'}", style="yellow"))
    parts.append(Text(f"CPU: {(cpu or detect_cpu_features()).summary()}"))
    parts.append(_host_table(snapshot, pid))
    parts.append(_cores_grid(snapshot.host.cpu_percent_per_core))
    parts.append(
        Text(
            f"every {interval_s:g} s · sample cost {snapshot.sample_cost_s * 1000:.1f} ms · Ctrl-C to quit",
            style="dim",
        )
    )
    return Group(*parts)


def _ticks(interval_s: float, duration_s: float | None) -> Iterator[None]:
    """Yield on a fixed schedule (missed ticks are skipped), until `duration_s` has elapsed."""
    start = time.monotonic()
    next_tick = start
    while True:
        yield
        next_tick += interval_s
        now = time.monotonic()
        if next_tick < now:
            next_tick += math.ceil((now - next_tick) / interval_s) * interval_s
        if duration_s is not None and next_tick - start > duration_s + 1e-9:
            return
        time.sleep(max(0.0, next_tick - time.monotonic()))


def _run_json(sampler: Sampler, interval_s: float, duration_s: float | None) -> None:
    stdout = sys.stdout
    cpu = detect_cpu_features().to_dict()
    try:
        for _ in _ticks(interval_s, duration_s):
            sample = {**sampler.sample_once().to_dict(), "cpu_features": cpu}
            stdout.write(json.dumps(sample) + "\n")
            stdout.flush()
    except BrokenPipeError:  # `monitor --json | head`: the reader left, that is fine
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())


def _run_live(sampler: Sampler, interval_s: float, duration_s: float | None) -> None:
    from rich.live import Live

    console = Console()
    cpu = detect_cpu_features()
    try:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            for _ in _ticks(interval_s, duration_s):
                live.update(render(sampler.sample_once(), interval_s, sampler.pid, cpu), refresh=True)
    finally:
        if not console.is_terminal:  # Live leaves the last line open when not on a terminal
            console.line()


def monitor(
    interval: float = typer.Option(0.5, "--interval", help="Seconds between samples (0.05 to 60)."),
    json_lines: bool = typer.Option(False, "--json", help="Print one JSON object per sample instead of the live view."),
    duration: float | None = typer.Option(
        None, "--duration", help="Stop after this many seconds (default: until Ctrl-C)."
    ),
    pid: int | None = typer.Option(
        None, "--pid", help="Measure this process and its children, e.g. a training job (default: the monitor)."
    ),
) -> None:
    """Watch GPU memory/utilization/power, RAM, swap, CPU cores and a process tree live.

    The live view redraws in a terminal; use --json to log or pipe the samples.
    """
    interval_s = validate_interval(interval, where="--interval", max_s=MONITOR_MAX_INTERVAL_S)
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise KronosTuneError(f"--duration {duration!r} is invalid: give a positive number of seconds or leave it out")
    # The command paces itself (so it can go slower than the background sampler's limit);
    # the Sampler is only used for sample_once().
    sampler = Sampler(interval_s=min(interval_s, MAX_INTERVAL_S), capacity=1, pid=pid)
    try:
        if json_lines:
            _run_json(sampler, interval_s, duration)
        else:
            _run_live(sampler, interval_s, duration)
    except KeyboardInterrupt:
        pass  # Ctrl-C is the normal way out: exit 0
    finally:
        sampler.close()


def register(app: typer.Typer) -> None:
    app.command("monitor")(monitor)
