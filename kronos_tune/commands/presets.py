"""`kronos-tune presets`: list the hardware + workload presets, or show one as TOML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.syntax import Syntax
from rich.table import Table

from kronos_tune.commands.common import make_console
from kronos_tune.presets import (
    BYTES_PER_GIB,
    Preset,
    builtin_preset_dir,
    list_presets,
    preset_to_toml,
    resolve_preset,
)

presets_app = typer.Typer(
    help="List the hardware + workload presets, or show one.",
    invoke_without_command=True,
    no_args_is_help=False,
)

PresetDirOption = Annotated[
    Optional[list[Path]],
    typer.Option(
        "--preset-dir",
        help="Extra folder of *.toml presets (repeatable); overrides built-ins and KRONOS_TUNE_PRESET_DIR by name.",
        file_okay=False,
    ),
]


def _display_path(path: Path | None) -> str:
    """Built-in presets by file name alone (the table caption names their folder), others in full."""
    if path is None:
        return "-"
    return path.name if path.resolve().parent == builtin_preset_dir().resolve() else str(path)


def _presets_table(presets: list[Preset]) -> Table:
    table = Table(
        title="kronos-tune presets",
        title_justify="left",
        caption=f"built-in folder: {builtin_preset_dir()}",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("name", no_wrap=True, style="bold")
    table.add_column("devices\nx memory", no_wrap=True)
    table.add_column("bf16")
    table.add_column("peak\nbf16\nTFLOP/s", justify="right", min_width=7)
    table.add_column("model", min_width=5)
    table.add_column("batch x\naccum", no_wrap=True)
    table.add_column("predict\nseries", justify="right", min_width=7)
    table.add_column("source file", overflow="fold")
    for preset in presets:
        hw, wl = preset.hardware, preset.workload
        peak = hw.peak_tflops("bf16")
        memory = f"{hw.memory_per_device_gb:g} GiB"
        table.add_row(
            preset.name,
            f"{hw.device_count} x {memory}" if hw.device == "cuda" else f"{hw.device} {memory}",
            {True: "yes", False: "no"}.get(hw.bf16_supported, str(hw.bf16_supported)),
            "unknown" if peak is None else f"{peak:g}",
            wl.model_size,
            f"{wl.batch_size} x {wl.accumulation_steps}",
            str(preset.predict.series_count),
            _display_path(preset.source_path),
        )
    return table


@presets_app.callback()
def presets_main(ctx: typer.Context, preset_dir: PresetDirOption = None) -> None:
    """List every preset (built-in, KRONOS_TUNE_PRESET_DIR, --preset-dir) in one table."""
    if ctx.invoked_subcommand is None:
        make_console().print(_presets_table(list_presets(preset_dir)))


@presets_app.command("show")
def show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Preset name, or a path to a preset .toml file.")],
    preset_dir: PresetDirOption = None,
) -> None:
    """Print one preset as TOML, with the memory budget derived from it (`> file.toml` gives a valid preset)."""
    parent_dirs: list[Path] = list(ctx.parent.params.get("preset_dir") or []) if ctx.parent else []
    preset = resolve_preset(name, parent_dirs + list(preset_dir or []))
    console = make_console()
    if not console.is_terminal:  # a file or a pipe: plain TOML, whatever the width
        typer.echo(show_text(preset), nl=False)
    else:  # colours; lines are never wrapped (soft wrap), so a copied line stays TOML
        head, body, tail = show_parts(preset)
        console.print(head, markup=False, highlight=False, soft_wrap=True)
        console.print(Syntax(body, "toml", theme="ansi_dark", background_color="default", word_wrap=False),
                      soft_wrap=True)
        console.print(tail, markup=False, highlight=False, soft_wrap=True)


def show_parts(preset: Preset) -> tuple[str, str, str]:
    """(comment naming the file, the preset's TOML, comment with the derived budget): every line valid TOML."""
    hw = preset.hardware
    head = f"# {preset.name}: {_display_path(preset.source_path)}"
    tail = (f"# budget per device: {preset.budget_bytes:,} bytes "
            f"({hw.memory_per_device_gb:g} GiB - {hw.cuda_context_overhead_gb:g} GiB CUDA context overhead; "
            f"1 GiB = {BYTES_PER_GIB:,} bytes)")
    return head, preset_to_toml(preset).rstrip("\n"), tail


def show_text(preset: Preset) -> str:
    """What `presets show` writes to a file or pipe: plain TOML, no colours, no wrapping."""
    return "\n".join(show_parts(preset)) + "\n"


def register(app: typer.Typer) -> None:
    """Add the `presets` command group to the root app."""
    app.add_typer(presets_app, name="presets")
