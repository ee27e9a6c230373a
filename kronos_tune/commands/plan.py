"""`kronos-tune plan`: per-rank memory of DDP and FSDP set-ups on a preset's cards, estimated before running."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from kronos_core.units import format_bytes
from kronos_tune.commands.common import make_console


def render_plan(plan, console: Console) -> None:  # type: ignore[no-untyped-def]
    """One table per model size: per-rank bytes by kind, the largest micro-batch, the effective batch."""
    for size in plan.sizes:
        table = Table(title=f"Kronos-{size.model_size} ({size.parameters / 1e6:.1f}M parameters) on "
                            f"{plan.ranks} x {plan.memory_per_device_bytes / 2**30:g} GiB ({plan.preset}), "
                            f"GiB per rank", title_justify="left")
        for column in ("set-up", "weights", "grads", "optimizer", "frozen", "activations+temp", "host",
                       f"peak @ {size.rows[0].preset_batch if size.rows else '?'}", "max micro-batch",
                       "micro x accum", "effective batch", "fits", "source"):
            table.add_column(column, justify="left" if column in ("set-up", "source") else "right")
        for row in size.rows:
            fits = "yes" if row.fits else "no"
            gib = [format_bytes(value, "GiB", with_unit=False) for value in (
                row.weights_bytes, row.grads_bytes, row.optimizer_bytes, row.frozen_bytes, row.activations_bytes,
                row.host_bytes, row.preset_batch_peak_bytes)]
            table.add_row(row.setup, *gib,
                          str(row.micro_batch) if row.micro_batch else "none fits",
                          f"{row.train_micro_batch} x {row.accumulation_steps}" if row.train_micro_batch else "-",
                          str(row.effective_batch or "-"), fits, row.source)
        console.print(table)
        for row in size.rows:
            if row.note:
                console.print(f"[dim]{row.setup}: {row.note}[/]")
    console.print(f"budget per rank {format_bytes(plan.budget_bytes, 'GiB')}, margin {plan.margin:.0%}; the bytes "
                  f"columns are at the max micro-batch (at 1 when none fits) and add up to its peak; 'peak @ N' is "
                  f"at the preset's micro-batch; micro x accum keeps the preset's effective batch")
    for note in plan.assumptions:
        console.print(f"[dim]note: {note}[/]")


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        preset: Annotated[str, typer.Option("--preset", help="Hardware and workload (kronos-tune presets).")],
        size: Annotated[Optional[list[str]], typer.Option(
            "--size", help="Model size (repeatable); default mini, small, base and large.")] = None,
        setup: Annotated[Optional[list[str]], typer.Option(
            "--setup", help="Only these set-ups (repeatable): ddp, fsdp, fsdp+checkpointing, fsdp+offload.")] = None,
        ranks: Annotated[Optional[int], typer.Option(
            "--ranks", min=1, help="Plan for this many devices (default: the preset's device_count).")] = None,
        preset_dir: Annotated[Optional[list[Path]], typer.Option("--preset-dir", help="Extra preset folder.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    ) -> None:
        """What fits where: per-rank memory of DDP, FSDP, FSDP + checkpointing and FSDP + CPU offload."""
        from kronos_tune.presets import resolve_preset

        chosen = resolve_preset(preset, preset_dir)  # a bad name is one line before the planner loads torch
        from kronos_tune.plan.planner import plan_preset

        console = make_console(stderr=as_json)
        # The spinner (a thread) starts at the first progress report, once the planner's workers exist: a
        # process running no other thread can fork them instead of spawning (kronos_tune.plan.planner).
        status = console.status("estimating on fake tensors")
        started = False

        def progress(what: str) -> None:
            nonlocal started
            if not started:
                status.start()
                started = True
            status.update(f"estimating {what}")

        try:
            result = plan_preset(chosen, tuple(size or ()) or None, ranks, tuple(setup or ()) or None,
                                 on_progress=progress)
        finally:
            status.stop()
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2))
            return
        render_plan(result, console)
