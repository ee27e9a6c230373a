"""What several commands share: the options of the prediction commands, the console every command prints
on, and a Rich bar that `with` shows."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

CheckpointOption = Annotated[Optional[Path], typer.Option(
    "--checkpoint", help="Predictor folder (config.json + model.safetensors) or Hugging Face hub id, e.g. "
                         "NeoQuasar/Kronos-small or ...@REVISION (needs the \\[hub] extra); needs --tokenizer.")]
OfflineOption = Annotated[bool, typer.Option(
    "--offline", help="Hub ids from the local Hugging Face cache only, never downloaded (as HF_HUB_OFFLINE=1).")]
SizeOption = Annotated[Optional[str], typer.Option(
    "--size", help="Random-init model of a named size (agreement/timing only), e.g. tiny, mini, small, base.")]
DeviceOption = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
AmpOption = Annotated[str, typer.Option("--amp", help="none, bf16 or fp16 (CUDA only).")]
SampleCountOption = Annotated[int, typer.Option("--sample-count", help="Sample paths averaged per series.")]
TemperatureOption = Annotated[float, typer.Option("--T", help="Sampling temperature.")]
TopPOption = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.")]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed for random weights, synthetic data and sampling.")]
WindowModeOption = Annotated[str, typer.Option(
    "--window-mode", help="After the window slides: refill (exact) or shift (approximate, faster).")]

NnodesOption = Annotated[Optional[str], typer.Option("--nnodes", help="torchrun: number of nodes (or MIN:MAX).")]
NodeRankOption = Annotated[Optional[int], typer.Option("--node-rank", help="torchrun: this node's rank.")]
RdzvEndpointOption = Annotated[Optional[str], typer.Option(
    "--rdzv-endpoint", help="torchrun: HOST:PORT shared by all nodes.")]
RdzvIdOption = Annotated[Optional[str], typer.Option("--rdzv-id", help="torchrun: job id, same on all nodes.")]
RdzvBackendOption = Annotated[Optional[str], typer.Option(
    "--rdzv-backend", help="torchrun: rendezvous backend (default c10d).")]


CalendarOption = Annotated[Optional[str], typer.Option(
    "--calendar", help="Exchange calendar for the future timestamps (sessions, lunch breaks, holidays), e.g. XSHG, "
                       "XSHE, XHKG, XNYS; needs the \\[calendars] extra. Default: each series' own bar grid.")]

DateFormatOption = Annotated[Optional[str], typer.Option(
    "--date-format", help="How the --data files write their dates, as strptime directives, e.g. '%d/%m/%Y %H:%M'. "
                          "Needed when every date reads both day and month first (01/07/2024); default: each "
                          "file's dates read the one way they allow.")]


# Redirected output without COLUMNS: wide enough that no table cell or progress line is cut (Rich would use 80).
REDIRECTED_WIDTH = 400


def make_console(stderr: bool = False) -> Console:
    """The console a command prints on: a terminal's own width; redirected to a file or pipe, the width from
    COLUMNS when set, else REDIRECTED_WIDTH, so tables and the final progress lines come out whole."""
    console = Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        console.width = REDIRECTED_WIDTH
    return console


class LiveProgress:
    """A view over a Rich ``Progress`` (``self.progress``): ``with view:`` shows it while the work runs, and
    where the console is not a terminal prints plain progress lines on stderr (progress_lines.py), each
    starting with ``label`` and counting in ``unit``."""

    progress: Any
    label = ""
    unit = ""

    def __enter__(self) -> Any:
        from kronos_tune.commands.progress_lines import lines_when_piped

        self.progress.start()
        self._lines = lines_when_piped(self.progress, self.label, self.unit)
        self._lines.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lines.stop()
        self.progress.stop()
