"""`kronos-tune dashboard`: the interactive terminal UI over telemetry, presets, the benchmark and training."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kronos_tune.telemetry.sampler import Sampler, validate_interval

def dashboard(
    preset: Annotated[Optional[str], typer.Option(
        "--preset", help="Preset to start with (kronos-tune presets); with --config: the hardware budget.")] = None,
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="Your finetune (a training TOML or an upstream finetune_csv YAML): the benchmark's "
                         "workload.", dir_okay=False)] = None,
    preset_dir: Annotated[Optional[list[Path]], typer.Option(
        "--preset-dir", help="Extra folder of preset TOML files (repeatable).")] = None,
    interval: Annotated[float, typer.Option(
        "--interval", help="Seconds between telemetry samples (0.05 to 10).")] = 0.5,
    out: Annotated[Path, typer.Option("--out", help="Root of the run folders: OUT/benchmark/<preset>-<task>-<time>/, "
                                      "OUT/train/<preset>-<time>/, OUT/exports/; one new folder per run.",
                                      file_okay=False)] = Path("runs"),
) -> None:
    """Live GPU/host telemetry, the benchmark, autobatch and training in one screen (? lists the keys)."""
    from kronos_tune.presets import preset_dirs, resolve_preset

    dirs = list(preset_dir or [])
    interval_s = validate_interval(interval, where="--interval")
    chosen = resolve_preset(preset, dirs) if preset is not None else None  # errors before the app starts
    if config is not None:
        from kronos_tune.benchmark.user_job import user_preset

        chosen, plan = user_preset(config, None, chosen)
        for line in plan:
            typer.echo(f"plan: {line}")
    preset_dirs(dirs)  # a missing --preset-dir is an error now, not when the picker opens

    from kronos_tune.tui.app import DashboardApp
    from kronos_tune.tui.model import HISTORY_LENGTH

    sampler = Sampler(interval_s=interval_s, capacity=HISTORY_LENGTH)
    app = DashboardApp(preset=chosen, preset_dirs=dirs, sampler=sampler, out_dir=out)
    try:
        code = app.run()
    finally:
        sampler.close()
    typer.echo(app.farewell())  # after the screen is gone: where the runs are (q, Ctrl-C, or an error)
    raise typer.Exit(code or 0)


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)
