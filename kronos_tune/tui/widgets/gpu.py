"""One panel per NVIDIA GPU, or one panel saying why there is none and that the budget is simulated."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from kronos_tune.telemetry.nvml import GpuSnapshot
from kronos_tune.tui.format import gib, percent, ratio
from kronos_tune.tui.widgets.base import Line, Panel, meter_line, spark_line

LABEL_WIDTH = 6


class GpuPanel(Panel):
    """VRAM bar and history, utilization bar and history, temperature, power, our processes' share."""

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-{index}", classes="panel gpu")
        self.index = index
        self.border_title = f"GPU {index}"
        self._gpu: GpuSnapshot | None = None
        self._memory: Sequence[float] = ()
        self._util: Sequence[float] = ()

    def show(self, gpu: GpuSnapshot, memory_history: Sequence[float], util_history: Sequence[float]) -> None:
        self._gpu, self._memory, self._util = gpu, memory_history, util_history
        self.border_title = f"GPU {gpu.index} · {gpu.name or 'unknown'}"
        self.refresh()

    def lines(self, width: int) -> list[Line]:
        gpu = self._gpu
        if gpu is None:
            return [(0, Text("waiting for the first sample…", style="dim"))]
        used_total = f"{gib(gpu.memory_used_bytes)} / {gib(gpu.memory_total_bytes)}"
        memory = meter_line("VRAM", LABEL_WIDTH, ratio(gpu.memory_used_bytes, gpu.memory_total_bytes), used_total,
                            width)
        util_value = percent(gpu.utilization_pct)
        util_fraction = None if gpu.utilization_pct is None else gpu.utilization_pct / 100
        util = meter_line("util", LABEL_WIDTH, util_fraction, util_value.rjust(4), width)
        temperature = "n/a" if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C"
        power = "n/a" if gpu.power_w is None else f"{gpu.power_w:.0f} W"
        if gpu.power_limit_w is not None:
            power += f" / {gpu.power_limit_w:.0f} W"
        sensors = Text.assemble(("temp ", "bold"), temperature, ("  power ", "bold"), power)
        share = Text.assemble(("ours ", "bold"), (gib(gpu.our_memory_bytes), "cyan"),
                              ("  others ", "bold"), gib(gpu.others_memory_bytes))
        return [
            (0, memory),
            (3, spark_line("", LABEL_WIDTH, self._memory, width, 0.0, 100.0, style="magenta")),
            (1, util),
            (4, spark_line("", LABEL_WIDTH, self._util, width, 0.0, 100.0, style="green")),
            (2, sensors),
            (2, share),
        ]


class NoGpuPanel(Panel):
    """No NVIDIA GPU: the sampler's reason, and that the preset's memory budget is simulated on the CPU."""

    def __init__(self) -> None:
        super().__init__(id="no-gpu", classes="panel gpu")
        self.border_title = "GPU"
        self._reason = "waiting for the first sample…"
        self._budget: str | None = None

    def show(self, reason: str | None, budget: str | None) -> None:
        """`budget`: e.g. "1 × 8.0 GiB (preset cpu)", None without a preset."""
        self._reason = reason or "none visible"
        self._budget = budget
        self.refresh()

    def lines(self, width: int) -> list[Line]:
        lines: list[Line] = [(0, Text("No NVIDIA GPU", style="bold yellow"))]
        lines.append((1, Text(self._reason, style="yellow")))
        if self._budget is not None:
            lines.append((0, Text.assemble("Budget ", (self._budget, "bold"), " simulated on the CPU")))
            lines.append((2, Text("(a byte-exact tracker raises out-of-memory past it)", style="dim")))
        else:
            lines.append((0, Text("Pick a preset (p) to simulate its memory budget", style="dim")))
        return lines
