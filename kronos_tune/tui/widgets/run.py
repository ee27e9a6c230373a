"""The job in progress: which trial, step progress, live loss, step time and throughput."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

from kronos_tune.tui.format import bar, duration, rate
from kronos_tune.tui.model import RunState
from kronos_tune.tui.widgets.base import Line, Panel, spark_line

LABEL_WIDTH = 10
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
PHASE_STYLES = {"running": "bold green", "cancelling": "bold yellow", "done": "bold cyan",
                "cancelled": "bold yellow", "failed": "bold red", "idle": "dim"}


def _last(values: Sequence[float]) -> float | None:
    """The newest value; None when there is none or it is NaN (a predict trial has no loss)."""
    return values[-1] if values and not math.isnan(values[-1]) else None


class RunPanel(Panel):
    """Reads a RunState; the app calls `show` after each event it applied to it."""

    def __init__(self) -> None:
        super().__init__(id="run", classes="panel")
        self.border_title = "Run"
        self._run = RunState()

    def show(self, run: RunState) -> None:
        self._run = run
        self.border_title = f"Run · {run.job}" if run.job else "Run"
        self.refresh()

    def lines(self, width: int) -> list[Line]:
        run = self._run
        if run.job is None:
            return [(0, Text("idle: b benchmark (train), B benchmark (predict), a autobatch, "
                             "t train recommended", style="dim"))]
        state = Text.assemble((run.phase, PHASE_STYLES.get(run.phase, "")), "  ", run.outcome)
        whole = state.copy() if state.cell_len > width else None
        state.truncate(width, overflow="ellipsis")  # one row: a long outcome must not push the progress out
        lines: list[Line] = [(0, state)]
        if run.trial is not None:
            trial = Text.assemble(("trial ", "bold"), f"{run.trial_index}/{run.trial_total} ", (run.trial, "cyan"))
            lines.append((0, trial))
        if run.note:  # what the job does right now when it has no steps to show (autobatch probes...)
            lines.append((0, Text.assemble(("now ", "bold"), run.note)))
        if not run.step and not run.steps_target:
            return lines + ([(5, whole)] if whole is not None else [])
        if run.count_known and run.steps_target:
            label = f"{run.step_label} {run.step}/{run.steps_target}"
            progress = Text.assemble((label.ljust(LABEL_WIDTH), "bold"),
                                     bar(run.step / run.steps_target, max(4, width - LABEL_WIDTH)))
        else:  # an open count: a spinner that turns with each step, never a bar past its end
            spinner = SPINNER[run.step % len(SPINNER)]
            progress = Text.assemble((f"{run.step_label} {run.step} ", "bold"), (spinner, "cyan"))
            if run.steps_target:
                progress.append(f"  at least {run.steps_target}, until the timing settles", style="dim")
        lines.append((1, progress))
        loss = _last(run.loss)
        step_time = _last(run.step_time_s)
        speed = _last(run.tokens_per_s)
        if loss is not None or run.step_label == "step":  # prediction has no loss
            lines.append((2, spark_line("loss", LABEL_WIDTH, run.loss, width,
                                        value="n/a" if loss is None else f"{loss:.4f}", style="yellow")))
        lines.append((3, spark_line(f"{run.step_label} time", LABEL_WIDTH, run.step_time_s, width, 0.0, None,
                                    value=duration(step_time), style="magenta")))
        lines.append((4, spark_line(run.speed_unit, LABEL_WIDTH, run.tokens_per_s, width, 0.0, None,
                                    value=rate(speed), style="green")))
        if whole is not None:  # the outcome in full, below, when the panel has the rows
            lines.append((5, whole))
        return lines
