"""`kronos-tune autobatch`: the largest batch (or predict call) that fits a preset's device memory.

Without a GPU of the preset's kind the probes run on the CPU against a
simulated device of the preset's budget (exact live-tensor bytes, failing like
CUDA when exceeded); `--estimate` runs them on fake tensors instead (nothing
allocated, CUDA emulated for CUDA presets). Heavy imports happen inside the
command so that `kronos-tune --help` stays fast.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Group
from rich.panel import Panel
from rich.syntax import Syntax

from kronos_core.units import format_bytes
from kronos_tune.autobatch.maximize import check_rule, scale_for_batch
from kronos_tune.commands.common import make_console
from kronos_tune.errors import KronosTuneError

if TYPE_CHECKING:
    from kronos_tune.autobatch.probes import AutobatchResult, Probe
    from kronos_tune.presets import Preset

def _budget(preset: Preset, budget_gb: float | None) -> tuple[int, str]:
    from kronos_tune.presets import BYTES_PER_GIB

    if budget_gb is None:
        hw = preset.hardware
        overhead = f" minus {hw.cuda_context_overhead_gb:g} GiB CUDA context" if hw.cuda_context_overhead_gb else ""
        return preset.budget_bytes, f"preset: {hw.memory_per_device_gb:g} GiB per device{overhead}"
    if not math.isfinite(budget_gb) or budget_gb <= 0:
        raise KronosTuneError(f"--budget-gb must be a positive number of GiB, got {budget_gb}")
    return int(round(budget_gb * BYTES_PER_GIB)), f"--budget-gb {budget_gb:g} (GiB for tensors, no context subtracted)"


def _probe_dict(probe: Probe) -> dict[str, Any]:
    return {"batch_size": probe.batch_size, "peak_bytes": probe.peak_bytes, "status": probe.status,
            "kind": probe.kind}


def _payload(result: AutobatchResult, device: str, simulated: bool, assumptions: list[str]) -> dict[str, Any]:
    return {
        "batch_size": result.batch_size,
        "accumulation_steps": result.accumulation_steps,
        "budget_bytes": result.budget_bytes,
        "usable_bytes": result.usable_bytes,
        "margin": result.margin,
        "predicted_peak_bytes": result.predicted_peak_bytes,
        "measured_peak_bytes": result.measured_peak_bytes,
        "headroom_bytes": result.headroom_bytes,
        "fixed_bytes": result.fixed_bytes,
        "bytes_per_sample": result.bytes_per_sample,
        "max_fit_batch_size": result.max_fit_batch_size,
        "largest_fitting_verified": result.largest_measured_fit,
        "largest_fitting_predicted": result.max_fit_batch_size,
        "probes": [_probe_dict(p) for p in result.probes],
        "search_time_s": result.search_time_s,
        "step_time_s": result.step_time_s,
        "device": device,
        "simulated": simulated,
        "estimate": result.estimate,
        "notes": result.notes,
        "assumptions": assumptions,
    }


def run_autobatch(preset_name: str, task: str, budget_gb: float | None, margin: float | None, estimate: bool,
                  as_json: bool, preset_dirs: list[Path] | None, max_probes: int, maximize: bool = False,
                  lr_rule: str = "sqrt") -> None:
    from kronos_tune.memory.peak import validate_margin

    margin = None if margin is None else validate_margin(margin)
    kind = KINDS.get(task)
    if kind is None:
        raise KronosTuneError(f"--task must be one of {', '.join(TASKS)}, got '{task}'")
    if max_probes < 2:
        raise KronosTuneError(f"--max-probes must be at least 2 (a line needs two points), got {max_probes}")
    from kronos_tune.presets import resolve_preset

    preset = resolve_preset(preset_name, preset_dirs)
    budget_bytes, budget_source = _budget(preset, budget_gb)
    if estimate and kind.refuses_estimate:
        raise KronosTuneError(kind.refuses_estimate)

    import torch

    from kronos_tune.autobatch.probes import probe_line

    hw = preset.hardware
    wants_cuda = hw.device == "cuda"
    if estimate:
        run_device = "cpu"
        device = "fake tensors, CUDA emulated" if wants_cuda else "fake tensors, CPU accounting"
        simulated = True
    elif wants_cuda and torch.cuda.is_available():
        run_device, device, simulated = "cuda", f"cuda ({torch.cuda.get_device_name()})", False
    else:
        run_device, device, simulated = "cpu", "cpu", wants_cuda
    round_bytes = 512 if simulated and wants_cuda and not estimate else 1
    assumptions = [f"budget {budget_bytes} bytes from {budget_source}"]
    if simulated and not estimate:
        assumptions.append(f"no CUDA device here: probes run for real on the CPU against a simulated "
                           f"{format_bytes(budget_bytes, 'GiB')} {hw.device} device (live tensor bytes counted "
                           "exactly, in 512-byte blocks like CUDA's allocator; going over raises OutOfMemoryError); "
                           "--estimate is faster")
    if estimate:
        assumptions.append("estimate: every probe runs on fake tensors (nothing allocated)")

    console = make_console(stderr=True) if as_json else make_console()
    progress = make_console(stderr=True)

    def on_probe(probe: Probe) -> None:
        progress.print(f"[dim]  {probe_line(probe, kind.unit)}[/]")

    progress.print(f"[dim]autobatch {task} on preset {preset.name}: probing on {device}...[/]")
    payload, renderables = kind.run(preset, budget_bytes, margin, max_probes, estimate, run_device, round_bytes,
                                    device, simulated, assumptions, on_probe, maximize, lr_rule)
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    console.print(*renderables)


def _train(preset: Preset, budget_bytes: int, margin: float, max_probes: int, estimate: bool, run_device: str,
           round_bytes: int, device: str, simulated: bool, assumptions: list[str], on_probe: Any,
           maximize: bool = False, lr_rule: str = "sqrt") -> tuple[dict, list]:
    from kronos_tune.commands import autobatch_render as render
    from kronos_tune.autobatch.probes import toml_snippet
    from kronos_tune.autobatch.train_probes import TrainProbes
    from kronos_tune.workloads import train_config_from_preset

    config, config_notes = train_config_from_preset(preset)
    effective = preset.workload.batch_size * preset.workload.accumulation_steps
    with TrainProbes(config, device=run_device) as task:
        emulation = task.cuda_emulation() if estimate and preset.hardware.device == "cuda" else None
        if emulation is not None:
            assumptions.append(f"the CUDA context ({preset.hardware.cuda_context_overhead_gb:g} GiB) is already "
                               "subtracted from the budget, so the emulation adds no context on top")
            assumptions.extend(emulation.assumptions())
        result = task.run(budget_bytes, margin=margin, max_probes=max_probes, estimate=estimate,
                          cuda_emulation=emulation, effective_batch=None if maximize else effective,
                          round_bytes=round_bytes, on_probe=on_probe)
        final = task.final_config(result.batch_size, result.accumulation_steps)
    result.notes[:0] = config_notes
    change = None
    if maximize:
        final, change = scale_for_batch(final.replace(batch_size=preset.workload.batch_size,
                                                      accumulation_steps=preset.workload.accumulation_steps),
                                        result.batch_size, lr_rule)
        assumptions.append(f"--maximize: {change.describe()}; the bigger batch changes the optimization: check it "
                           f"with kronos-tune benchmark (its bigger-batch trial compares at equal samples seen)")
        assumptions.extend(change.notes)
    else:
        assumptions.append(f"effective batch per device {effective} = preset batch_size x accumulation_steps, kept")
    payload = _payload(result, device, simulated, assumptions)
    payload["maximize"] = change.to_dict() if change is not None else None
    payload["task"] = "train"
    payload["preset"] = preset.name
    payload["train_config"] = final.to_dict()
    title = (f"autobatch: fine-tune Kronos-{config.model_size} on {preset.name} "
             f"({'simulated on the CPU' if simulated and not estimate else device})")
    snippet = toml_snippet(result.batch_size, result.accumulation_steps)
    summary = render.summary_table(result, title)
    return payload, _renderables(result, summary, render.probes_table(result), "batch size", snippet,
                                 "paste into the preset's \\[workload] or a training config", assumptions)


def _predict(preset: Preset, budget_bytes: int, margin: float, max_probes: int, estimate: bool, run_device: str,
             round_bytes: int, device: str, simulated: bool, assumptions: list[str], on_probe: Any,
             maximize: bool = False, lr_rule: str = "sqrt") -> tuple[dict, list]:
    """The predict call (`estimate` and `maximize` are refused before: AutobatchKind)."""
    from kronos_tune.commands import autobatch_render as render
    from kronos_tune.autobatch.predict_probes import PredictProbes

    task = PredictProbes.from_preset(preset, device=run_device)
    pick = task.run(budget_bytes, margin=margin, max_probes=max_probes, round_bytes=round_bytes, on_probe=on_probe)
    result = pick.result
    payload = _payload(result, device, simulated, assumptions)
    payload["task"] = "predict"
    payload["preset"] = preset.name
    payload["batch_size"] = pick.max_batch_size  # sequences, what max_batch_size takes
    payload["series_per_call"] = pick.series_per_call
    payload["series_per_s"] = pick.median_series_per_s
    payload["train_config"] = None
    payload["predict_config"] = task.predict_config(pick)
    rate = pick.median_series_per_s
    extra = [("max_batch_size", f"[bold green]{pick.max_batch_size}[/] sequences "
                                f"({pick.series_per_call} series x {pick.sample_count} samples)"),
             ("throughput", f"{rate:.2f} series/s at the pick (without the meter)" if rate else "n/a")]
    title = (f"autobatch: predict {preset.predict.series_count} series with Kronos-{task.model_size} on "
             f"{preset.name} ({'simulated on the CPU' if simulated else device})")
    snippet = f"max_batch_size = {pick.max_batch_size}\n"
    summary = render.summary_table(result, title, unit="series per call", per="per series", extra=extra)
    return payload, _renderables(result, summary, render.probes_table(result, unit="series"), "series per call",
                                 snippet, "KronosPredictor(max_batch_size=...) / predict_batch(max_batch_size=...)",
                                 assumptions)


@dataclass(frozen=True)
class AutobatchKind:
    """What `autobatch --task NAME` searches: the unit of its axis, the flags it refuses (one line each) and how
    it runs (its payload and what the terminal shows)."""

    unit: str
    run: Callable[..., tuple[dict, list]]
    refuses_estimate: str | None = None
    refuses_maximize: str | None = None


KINDS = {
    "train": AutobatchKind("batch size", _train),
    "predict": AutobatchKind(
        "series per call", _predict,
        refuses_estimate="--estimate covers --task train only (prediction turns tensors into numpy arrays, which "
                         "fake tensors cannot do); drop --estimate to measure the predict call",
        refuses_maximize="--maximize with --task predict: the predict call is already the largest that fits; "
                         "--maximize is for --task train"),
}
TASKS = tuple(KINDS)


def _renderables(result: Any, summary: Any, probes: Any, axis: str, snippet: str, snippet_title: str,
                 assumptions: list[str]) -> list:
    """Summary, probes, the memory plot, the snippet to paste and the notes, in that order."""
    from kronos_tune.commands import autobatch_render as render

    return [
        summary,
        probes,
        Panel(render.memory_plot(result), title=f"peak memory vs {axis}", title_align="left", expand=False),
        Panel(Syntax(snippet, "toml", theme="ansi_dark", background_color="default"),
              title=snippet_title, title_align="left", expand=False),
        _notes(result.notes + assumptions),
    ]


def _notes(lines: list[str]) -> Group:
    from rich.text import Text

    return Group(*(Text(f"• {line}", style="dim") for line in lines))


def register(app: typer.Typer) -> None:
    @app.command("autobatch")
    def autobatch_command(
        preset: Annotated[str, typer.Option("--preset", help="Preset name or .toml path (kronos-tune presets).")],
        task: Annotated[str, typer.Option("--task", help="train: batch_size x accumulation_steps; predict: the "
                                                         "predict call (max_batch_size).")] = "train",
        budget_gb: Annotated[Optional[float], typer.Option(
            "--budget-gb", help="Device memory for tensors in GiB, replacing the preset's (memory minus CUDA "
                                "context).")] = None,
        margin: Annotated[Optional[float], typer.Option(
            "--margin", help="Fraction of the budget to keep free, 0 <= F < 1 (default 0.05 on the CPU's exact "
                             "meter, 0.10 on CUDA or CUDA estimates).")] = None,
        estimate: Annotated[bool, typer.Option("--estimate", help="Fake tensors instead of real steps: no "
                                                                  "allocation, CUDA emulated for CUDA presets.")]
        = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
        preset_dir: Annotated[Optional[list[Path]], typer.Option(
            "--preset-dir", help="Extra folder of *.toml presets (repeatable).", file_okay=False)] = None,
        max_probes: Annotated[int, typer.Option("--max-probes", help="Search probes at most (verification runs "
                                                                     "come on top).")] = 6,
        maximize: Annotated[bool, typer.Option("--maximize", help="Train: the largest micro-batch that fits as the "
                                                                  "new effective batch, learning rate scaled "
                                                                  "(--lr-rule).")] = False,
        lr_rule: Annotated[str, typer.Option("--lr-rule", metavar="sqrt|linear|none", help="With --maximize: how "
                                                                                          "the lr follows the batch.")]
        = "sqrt",
    ) -> None:
        """Find the largest batch size (or predict call) that fits the preset's device memory."""
        check_rule(lr_rule)
        kind = KINDS.get(task)
        if maximize and kind is not None and kind.refuses_maximize:
            raise KronosTuneError(kind.refuses_maximize)
        run_autobatch(preset, task, budget_gb, margin, estimate, as_json, preset_dir, max_probes, maximize, lr_rule)
