"""`kronos-tune profile`: torch.profiler around the preset's real training step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from kronos_core.units import format_bytes
from kronos_tune.commands.common import make_console


def register(app: typer.Typer) -> None:
    @app.command()
    def profile(
        preset: Annotated[str, typer.Option("--preset", help="Workload and hardware (kronos-tune presets).")],
        steps: Annotated[int, typer.Option("--steps", min=1, help="Profiled (active) steps.")] = 3,
        warmup: Annotated[int, typer.Option("--warmup", min=0, help="Profiler warm-up steps (traced, not kept).")] = 1,
        trace: Annotated[Optional[Path], typer.Option("--trace", help="Write a Chrome/Perfetto trace JSON here.")] = None,
        tensorboard: Annotated[Optional[Path], typer.Option("--tensorboard", help="Write TensorBoard traces here.")] = None,
        top: Annotated[int, typer.Option("--top", min=1, help="Rows in the ops table.")] = 15,
        batch_size: Annotated[Optional[int], typer.Option("--batch-size", min=1, help="Override the batch.")] = None,
        preset_dir: Annotated[Optional[list[Path]], typer.Option("--preset-dir", help="Extra preset folder.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    ) -> None:
        """Profile the preset's training step: top ops, memory by category, trace files, MFU."""
        from kronos_tune.presets import resolve_preset

        chosen = resolve_preset(preset, preset_dir)  # a bad name is one line before the profiler loads torch
        from kronos_tune.profiling.profiler import check_output_paths, profile_training
        from kronos_tune.workloads import runnable_device, train_config_from_preset

        check_output_paths(trace, tensorboard)
        overrides = {"batch_size": batch_size} if batch_size else {}
        config, config_notes = train_config_from_preset(chosen, **overrides)
        device, device_note = runnable_device(chosen)
        dtype = {"bf16": "bf16", "fp16": "fp16"}.get(config.amp, "fp32")
        peak = chosen.peak_flops(dtype) if device == chosen.hardware.device else None
        console = make_console(stderr=as_json)
        if device_note:
            console.print(f"[yellow]{device_note}[/]")
        with console.status(f"profiling {steps} steps of Kronos-{config.model_size}, batch {config.batch_size}"):
            result = profile_training(config, steps=steps, warmup=warmup, top=top, trace_path=trace,
                                      tensorboard_dir=tensorboard, peak_flops=peak)
        result.notes.extend(config_notes)
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2))
            return
        basis = "CUDA time" if result.time_basis == "device" else "CPU time"
        ops = Table(title=f"top {len(result.top_ops)} ops by self {basis} over {result.steps} steps")
        ops.add_column("op", overflow="fold")  # long names wrap, never cut: two ops never look the same
        for column in ("calls", "self s", "total s", "self mem"):
            ops.add_column(column, justify="right", no_wrap=True)
        for op in result.top_ops:
            ops.add_row(op.name, str(op.calls), f"{op.self_time_s:.4f}", f"{op.total_time_s:.4f}",
                        format_bytes(op.self_memory_bytes, "MiB", 1))
        console.print(ops)
        if result.memory_at_peak_bytes:
            memory = Table(title=f"memory at peak ({format_bytes(result.memory_peak_bytes, 'MiB', 1)}) by category")
            memory.add_column("category")
            memory.add_column("bytes", justify="right")
            for name, value in sorted(result.memory_at_peak_bytes.items(), key=lambda kv: -kv[1]):
                memory.add_row(name, format_bytes(value, "MiB", 1))
            console.print(memory)
        t = result.step_time_s
        console.print(f"step time median {t['median']:.3f} s (min {t['min']:.3f}, max {t['max']:.3f}, n {t['n']}); "
                      f"{result.tokens_per_s:,.0f} tokens/s")
        flops = f"{result.flops_per_token / 1e6:.1f} MFLOP/token (6N + 12·L·H·Q·T)"
        console.print(f"MFU: {result.mfu:.1%} ({flops})" if result.mfu is not None
                      else f"MFU: unknown (no peak FLOP/s for this device in the preset); {flops}")
        for path in (result.trace_path, result.tensorboard_dir):
            if path:
                console.print(f"wrote {path}")
        for note in result.notes:
            console.print(f"[dim]note: {note}[/]")
