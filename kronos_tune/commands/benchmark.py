"""`kronos-tune benchmark`: the incremental optimization benchmark (kronos_tune.benchmark), with live progress.

Parse the flags, call run_benchmark, render its report; Ctrl-C asks the benchmark to stop at the next step
boundary (a second Ctrl-C interrupts at once) and the finished trials are still reported.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kronos_core.signals import STOP_SIGNALS, TERMINATING_SIGNALS, forget_stop_signals, record_stop_signal
from kronos_tune.commands.common import LiveProgress, make_console
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import BYTES_PER_GIB, resolve_preset
from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.events import (BenchmarkFinished, BenchmarkStarting, TimeEstimate, TrialFinished,
                                          TrialStarted, TrialStep)
from kronos_tune.benchmark.results import BenchmarkReport
from kronos_tune.benchmark.selection import DESIGN_CHOICES
from kronos_tune.benchmark.report.picture import picture_line
from kronos_tune.benchmark.report.cells import changes_text, fmt_seconds
from kronos_tune.benchmark.report.shown import table
from kronos_tune.benchmark.tasks import TASKS, check_options, get
from kronos_tune.benchmark.report.files import resolution_line
from kronos_core.units import format_bytes, format_duration
from kronos_tune.resume_command import resume_line

TONES = {"good": "green", "bad": "red", "noise": "dim", "warn": "yellow", "": ""}
EXIT_CANCELLED = 130


EXIT_TERMINATED = 143


@contextlib.contextmanager
def cancel_on_signals(cancel: threading.Event) -> Iterator[list[int]]:
    """SIGINT/SIGTERM/SIGHUP set `cancel` (the runner kills the trial in flight within seconds and writes the
    report); a second SIGINT interrupts at once. Yields the list of signals received."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, frame: Any) -> None:
        if received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        received.append(signum)
        record_stop_signal(signum)
        cancel.set()

    forget_stop_signals()
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class BenchmarkProgress(LiveProgress):
    """Two Rich bars fed by the benchmark's events: trials done, and the steps of the trial in flight."""

    label = "benchmark"

    def __init__(self, console: Console) -> None:
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                 TextColumn("{task.fields[left]}"), console=console)
        self.trials = self.progress.add_task("trials", total=None, info="", left="", left_s=None, rate_per_s=None)
        self.steps = self.progress.add_task("-", total=None, info="", visible=False, left="")

    def on_event(self, event: Any) -> None:
        p = self.progress
        if isinstance(event, BenchmarkStarting):
            for line in starting_lines(event):
                p.console.print(line, highlight=False, markup=False, soft_wrap=True)
        elif isinstance(event, TimeEstimate):
            p.update(self.trials, left=estimate_text(event), left_s=event.seconds)
        elif isinstance(event, TrialStarted):
            p.update(self.trials, total=event.total, completed=event.index, info=event.spec.name)
            p.reset(self.steps, total=event.spec.total_steps, description=event.spec.name, info="", left="",
                    visible=True)
        elif isinstance(event, TrialStep):
            record = event.record
            loss = "" if record.loss != record.loss else f"loss {record.loss:.4f}, "  # NaN: predict runs
            p.update(self.steps, advance=1, info=f"{loss}{fmt_seconds(record.step_time_s)}/step")
        elif isinstance(event, TrialFinished):
            result = event.result
            info = result.status if not result.reason else f"{result.status}: {result.reason}"
            p.update(self.trials, advance=1, info=f"{result.name} {info}"[:80])
            p.update(self.steps, visible=False)
        elif isinstance(event, BenchmarkFinished):
            p.update(self.trials, info="done")


# What the table's marks mean, per task (its footer names only columns it has).
CAPTIONS = {
    "train": "; time/step: the baseline's median x the compared ratio (raw median in parentheses); Δ vs the "
             "baseline, ~ = inside the noise",
    "predict": "; series/s: the reference's x the compared speed-up (raw median in parentheses); speed-up vs the "
               "reference method and Δ mem vs the baseline, ~ = inside the noise",
}


def starting_lines(event: BenchmarkStarting) -> list[str]:
    """What the run will measure, where, and roughly how long: printed before the first trial."""
    resumed = f", {event.resumed} finished before" if event.resumed else ""
    lines = [f"benchmark {event.preset} ({event.task}): {len(event.trials)} of {event.planned} planned trials "
             f"likely to run{resumed} ({', '.join(event.trials) or 'none'}); run folder {event.out_dir}",
             event.device_line]
    if event.device_note:
        lines.append(f"note: {event.device_note}; the preset's {format_bytes(event.budget_bytes, 'GiB', 1)} budget "
                     f"is kept; for what fits on the real card, without running it: {event.plan_command}")
    time_line = "time: "
    if event.measuring_s:
        time_line += (f"at least {format_duration(event.measuring_s)} of measuring (the trials' budgets) plus each "
                      f"trial's start-up and warm-up; ")
    time_line += "an estimate from the measured trials follows the first one"
    if event.time_cap_s is not None:
        time_line += (f"; time cap {format_duration(event.time_cap_s)}: no trial starts after it and each trial's "
                      f"watchdog is at most it (--time-cap SECONDS)")
    return [*lines, time_line]


def estimate_text(event: TimeEstimate) -> str:
    """The trials bar's figure: the time the likely trials left take at this run's measured pace."""
    if event.seconds is None or event.trials_left == 0:
        return ""
    text = f"about {format_duration(event.seconds)} left ({event.trials_left} trials)"
    if event.cap_left_s is not None and event.cap_left_s < event.seconds:
        text += f", the time cap stops it in {format_duration(event.cap_left_s)}"
    return text


def interrupted_line(report: BenchmarkReport) -> str:
    """How far an interrupted run got, and the command that continues it."""
    done = sum(1 for trial in report.trials if trial.status not in ("cancelled", "skipped"))
    skipped = sum(1 for trial in report.trials if trial.status == "skipped")
    skipped_text = f" ({skipped} skipped)" if skipped else ""
    fallback = ["--preset", report.preset_source or report.preset, "--task", report.task]
    return (f"interrupted after {done} of {len(report.planned)} planned trials{skipped_text}; the finished "
            f"ones are kept in {report.out_dir}; not run: {', '.join(report.not_run) or 'none'}; resume with: "
            f"{resume_line('benchmark', report.out_dir, fallback)}")


def render(console: Console, report: BenchmarkReport) -> None:
    header, rows = table(report, compact=True)
    if report.cancelled:
        console.print(f"[yellow]{escape(interrupted_line(report).split(';', 1)[0])}[/]", highlight=False)
    # title and caption as lines of their own: a table's wrap to its width, a few columns when few trials ran
    console.print(f"[bold]kronos-tune benchmark: {escape(report.subject)}, task {report.task}[/]",
                  highlight=False, soft_wrap=True)
    out = Table(box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False)
    short = {"configuration": "trial", "hardware": "hw", "time/step [IQR] n": "time/step",
             "series/s [IQR] n": "series/s", "projected total": "projected", "max Δ output vs ref": "Δ output",
             "Δ time": "Δ", "Δ mem": "Δ", "Δ loss": "Δ"}
    shown = [i for i, name in enumerate(header) if any(row[i].text not in ("–", "") for row in rows)]
    for i in shown:  # columns with nothing to show (MFU without a peak figure) are left out
        out.add_column(short.get(header[i], header[i]), no_wrap=header[i] != "status", overflow="fold",
                       min_width=7 if header[i] == "status" else None)
    for row in rows:
        out.add_row(*(f"[{TONES[c.tone]}]{escape(c.text)}[/]" if TONES[c.tone] else escape(c.text)
                      for c in (row[i] for i in shown)))
    console.print(out)
    console.print(escape(report.device_line + CAPTIONS.get(report.task, "")), highlight=False, soft_wrap=True)
    for trial in report.trials:
        reason = f" — {trial.status}: {trial.reason}" if trial.reason else ""
        console.print(f"  [bold]{trial.name}[/]: {escape(changes_text(trial))}{escape(reason)}", highlight=False,
                      soft_wrap=True)
        for note in trial.notes:
            console.print(f"    [dim]{escape(note)}[/]", highlight=False, soft_wrap=True)
    lines = list(report.notes) + get(report.task).notes(report)
    for line in lines:
        console.print(f"[dim]- {escape(line)}[/]", highlight=False, soft_wrap=True)
    resolution = resolution_line(report)
    if resolution:
        console.print(f"[bold]resolution[/]: {escape(resolution)}", highlight=False, soft_wrap=True)
    if report.recommended is not None:
        rec = report.recommended
        partial = " [yellow](partial run)[/]" if report.partial else ""
        console.print(f"recommended{partial}: [bold]{escape(rec.source)}[/]: {escape(rec.reason)}",
                      highlight=False, soft_wrap=True)
        if any(trial.status == "ok" for trial in report.trials):  # else "next" would run nothing measured
            console.print(f"next: {escape(rec.command)}", highlight=False, soft_wrap=True)
    if report.out_dir:
        console.print(f"reports in {report.out_dir}", highlight=False, soft_wrap=True)
        picture = picture_line(report)
        if picture:
            console.print(escape(picture), highlight=False, soft_wrap=True)
    if report.cancelled:
        console.print(escape(interrupted_line(report)), highlight=False, soft_wrap=True)


def _names(values: list[str] | None) -> tuple[str, ...]:
    return tuple(part.strip() for value in values or [] for part in value.split(",") if part.strip())


def register(app: typer.Typer) -> None:
    @app.command("benchmark")
    def benchmark(
        preset: Annotated[Optional[str], typer.Option("--preset", help="Preset name or TOML file (kronos-tune presets); with --config: the hardware budget to simulate.")] = None,
        config: Annotated[Optional[Path], typer.Option("--config", help="Your job: a training TOML (kronos-tune config keys) or an upstream finetune_csv YAML; with --task predict a [predict] file. The workload measured is its own.", dir_okay=False)] = None,
        phase: Annotated[Optional[str], typer.Option("--phase", help="With --config of two phases: tokenizer or predictor [default: predictor].")] = None,
        task: Annotated[str, typer.Option("--task", help="train or predict.")] = "train",
        out: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="Run folder (default: runs/benchmark/<preset>-<task>-<time>/).", file_okay=False)] = None,
        resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out: finished trials are kept.")] = False,
        overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the kronos-tune run in --out.")] = False,
        steps: Annotated[Optional[int], typer.Option("--steps", min=1, metavar="N", help="At least N measured steps per trial (train) / timed runs (predict).")] = None,
        max_steps: Annotated[Optional[int], typer.Option("--max-steps", min=1, metavar="N", help="At most N measured steps per trial (train).")] = None,
        warmup: Annotated[Optional[int], typer.Option("--warmup", min=0, metavar="N", help="At least N warm-up steps (train runs at least 2, then until the step time settles).")] = None,
        trial_budget: Annotated[Optional[float], typer.Option("--trial-budget", metavar="SECONDS", help="Measuring time per trial before it stops adding steps (default 10 s CPU, 20 s CUDA).")] = None,
        trial_timeout: Annotated[Optional[float], typer.Option("--trial-timeout", metavar="SECONDS", help="Watchdog: a trial running longer is killed and recorded as timeout (default: the preset's).")] = None,
        objective: Annotated[str, typer.Option("--objective", metavar="speed|memory|time-to-quality", help="speed: memory savers only when memory binds; memory: recommend saving memory; time-to-quality: recommend by the time to the baseline's val loss (runs --time-to-target).")] = "speed",
        time_to_target: Annotated[bool, typer.Option("--time-to-target", help="Train: after the trials, train each candidate with 3 seeds until the baseline's val loss at the evaluation step and report the time to that target (minutes; not in the quick run).")] = False,
        skip: Annotated[Optional[list[str]], typer.Option("--skip", metavar="TRIAL", help="Trial to leave out (repeatable or comma-separated).")] = None,
        only: Annotated[Optional[list[str]], typer.Option("--only", metavar="TRIAL", help="Run only these single changes (plus the baseline).")] = None,
        cpu_ddp: Annotated[bool, typer.Option("--cpu-ddp", help="DDP trial on the CPU: 2 gloo processes via torchrun.")] = False,
        budget_gb: Annotated[Optional[float], typer.Option("--budget-gb", metavar="GIB", help="Per-device memory budget in GiB (default: the preset's).")] = None,
        preset_dir: Annotated[Optional[list[Path]], typer.Option("--preset-dir", metavar="DIR", help="Extra folder of preset TOML files.")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print report.json to stdout (progress goes to stderr).")] = False,
        predict_series: Annotated[Optional[int], typer.Option("--predict-series", min=1, metavar="N", help="Predict: series each timed run predicts (default: the preset's series_count).")] = None,
        agreement_series: Annotated[Optional[int], typer.Option("--agreement-series", min=3, metavar="N", help="Predict: series whose outputs the quality check compares (default: at least 100, or all the preset has).")] = None,
        min_spearman: Annotated[float, typer.Option("--min-spearman", metavar="R", help="Predict: the ranking agreement (Spearman) an approximate setting such as bf16 needs.")] = 0.95,
        full: Annotated[bool, typer.Option("--full", help="Measure every trial the device can run; the default quick run leaves out what rarely pays here (compile and bigger-batch on a CPU, memory savers while memory does not bind) and says so.")] = False,
        design: Annotated[str, typer.Option("--design", metavar="auto|paired|sequential", help="How trials are timed against the baseline: paired (alternating blocks with a live baseline worker), sequential (one after the other, with drift checks), auto (paired where two workers fit).")] = "auto",
        block: Annotated[Optional[float], typer.Option("--block", metavar="SECONDS", help="Length of one paired block (default 0.5 s; at least one step).")] = None,
        time_cap: Annotated[Optional[float], typer.Option("--time-cap", metavar="SECONDS", help="Start no trial after this long, and stop the one running at it (default: none; 600 s for a preset whose device this machine lacks).")] = None,
        tensorboard: Annotated[bool, typer.Option("--tensorboard", help="Also write each trial's curves as TensorBoard files in <run>/tensorboard/<trial>/ (the \\[tensorboard] extra); curves/<trial>.jsonl is always written.")] = False,
    ) -> None:
        """Measure your finetune (--config) or a preset's workload as it runs, then one optimization at a time,
        then the helpful ones together; writes the reports and a recommended config into the run folder."""
        if task not in TASKS:
            raise KronosTuneError(f"--task {task}: use {' or '.join(TASKS)}")
        if preset is None and config is None:
            raise KronosTuneError("benchmark: give --config FILE (your finetune: a training TOML or an upstream "
                                  "finetune_csv YAML) or --preset NAME (an example job, kronos-tune presets)")
        if phase is not None and phase not in ("tokenizer", "predictor"):
            raise KronosTuneError(f"--phase {phase}: use tokenizer or predictor")
        if phase is not None and config is None:
            raise KronosTuneError("--phase chooses a phase of a --config file; give --config FILE")
        if phase is not None and task != "train":
            raise KronosTuneError(f"--phase chooses a training phase; --task {task} has none")
        if design not in DESIGN_CHOICES:
            raise KronosTuneError(f"--design {design}: use one of {', '.join(DESIGN_CHOICES)}")
        if resume and out is None:
            raise KronosTuneError("--resume needs --out DIR, the folder of the run to continue")
        if budget_gb is not None and not budget_gb > 0:
            raise KronosTuneError(f"--budget-gb {budget_gb}: give a positive number of GiB")
        for flag, value in (("--trial-timeout", trial_timeout), ("--trial-budget", trial_budget), ("--block", block),
                            ("--time-cap", time_cap)):
            if value is not None and not value > 0:
                raise KronosTuneError(f"{flag} {value:g}: give a positive number of seconds")
        if tensorboard:
            from kronos_tune.run_logs import want_tensorboard

            want_tensorboard(True)  # not installed: the pip line, exit 2
        chosen = None if preset is None else resolve_preset(preset, list(preset_dir or []))
        plan_lines: list[str] = []
        if config is not None:
            from kronos_tune.benchmark.user_job import user_predict_preset, user_preset

            chosen, plan_lines = (user_preset(config, phase, chosen) if task == "train" else
                                  user_predict_preset(config, chosen))
        assert chosen is not None
        defaults = BenchmarkOptions()
        options = BenchmarkOptions(
            steps=steps or defaults.steps, max_steps=max(max_steps or defaults.max_steps, steps or 1),
            warmup=defaults.warmup if warmup is None else warmup, trial_budget_s=trial_budget,
            trial_timeout_s=trial_timeout, objective=objective, skip=_names(skip), only=_names(only),
            cpu_ddp=cpu_ddp, budget_bytes=None if budget_gb is None else round(budget_gb * BYTES_PER_GIB),
            predict_repeats=steps or defaults.predict_repeats, predict_series=predict_series,
            agreement_series=agreement_series, min_spearman=min_spearman, full=full, design=design,
            time_to_target=time_to_target, time_cap_s=time_cap,
            block_s=defaults.block_s if block is None else block)
        console = make_console(stderr=json_out)
        if not console.is_terminal:
            console.width = max(console.width, 140)  # a file or pipe: no reason to fold the table
        check_options(task, options)  # bad flags: one line before the runner (and torch) loads
        for line in plan_lines:
            console.print(f"plan: {escape(line)}", highlight=False, soft_wrap=True)
        from kronos_tune.benchmark.run.runner import run_benchmark

        cancel = threading.Event()
        with cancel_on_signals(cancel) as received, BenchmarkProgress(console) as view:
            report = run_benchmark(chosen, task=task, options=options, out_dir=out, resume=resume,
                                  on_event=view.on_event, cancel=cancel, overwrite=overwrite, tensorboard=tensorboard)
        if json_out:  # report.json as written: with the figures every view shows (`shown`)
            from kronos_tune.benchmark.report.shown import report_dict

            typer.echo(json.dumps(report_dict(report), indent=2))
        else:
            render(console, report)
        if report.cancelled:
            raise typer.Exit(EXIT_TERMINATED if set(received) & set(TERMINATING_SIGNALS) else EXIT_CANCELLED)
