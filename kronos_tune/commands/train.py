"""`kronos-tune train`: fine-tune the Kronos tokenizer and/or predictor with a live progress bar.

A view over the headless training job (kronos_tune.train.job.run_training, which
the dashboard's `t` calls too): this module maps the flags to a TrainConfig and a
TrainRequest, calls the job, and draws what it reports.

One process runs the trainer right here. `--nproc N` (or any multi-node flag)
makes the job launch `python -m torch.distributed.run ... -m kronos_core.train
--events` through the shared launcher (kronos_core.launch) instead; the bar
then shows its rank 0's progress.

Either way the progress bar shows step/total, loss, lr, tokens/s, the last
validation loss and the ETA, and every stage's folder gets metrics.jsonl and
(with the `[tensorboard]` extra) TensorBoard event files (kronos_tune.run_logs).

Before the first step it prints the run's folder and schedule (the "plan:"
lines: optimizer steps, epochs, effective batch); every run gets its own folder
(kronos_tune.runs), and the next start of a cancelled run with the same config
continues it.
"""

from __future__ import annotations

import os
import statistics
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from kronos_core.errors import KronosWarning
from kronos_core.launch import LaunchSpec
from kronos_core.train import TrainConfig
from kronos_core.units import format_bytes
from kronos_tune.commands.common import DateFormatOption, LiveProgress, OfflineOption, make_console
from kronos_tune.errors import KronosTuneError
from kronos_tune.workloads import emulated_bf16_note
from kronos_tune.resume_command import resume_line
from kronos_tune.run_logs import want_tensorboard
from kronos_tune.runs import read_run_file
from kronos_tune.train.job import PHASES_FILE, STAGES, StageResult, StageStart, TrainListener, TrainRequest, run_training
from kronos_tune.train.checks import job_checks
from kronos_tune.train.moved import Movement
from kronos_tune.train.run_folder import check_resume_folder, partial_config_note, run_label
from kronos_tune.train.schedule import TrainSchedule

if TYPE_CHECKING:
    from kronos_core.train import StepRecord
    from kronos_core.train.train_file import TrainFile


def _preset_fields(name: str) -> dict[str, Any]:
    from kronos_tune.presets import resolve_preset
    from kronos_tune.workloads import preset_train_fields

    return preset_train_fields(resolve_preset(name))


def build_config(preset: str | None, config: Path | None, resume: Path | None,
                 overrides: dict[str, Any]) -> tuple[TrainConfig, str, TrainFile | None]:
    """The run's TrainConfig from a preset, a training file (TOML or upstream YAML, kronos_core.train.train_file)
    or the resumed run's config.toml (phases.toml for a two-phase run), with `overrides` (TrainConfig keys the
    flags set; None: not given) on top; where it came from ("preset NAME", the file); and the training file
    (None for a preset or a one-phase resume). Its output_dir is decided by the job."""
    from kronos_core.train.train_file import load_train_file

    if preset and config:
        raise KronosTuneError("train: give either --preset NAME or --config FILE, not both")
    job: TrainFile | None = None
    if config is not None:
        job = load_train_file(config)
        values, source = job.values(), str(config)
    elif preset:
        values, source = _preset_fields(preset), f"preset {preset}"
    elif resume is not None:
        source = str((read_run_file(resume) or {}).get("identity", {}).get("source") or resume)
        if (Path(resume) / PHASES_FILE).is_file():
            job = load_train_file(Path(resume) / PHASES_FILE)
            values = job.values()
        else:
            values = TrainConfig.from_toml(Path(resume) / "config.toml").to_dict()
    else:
        raise KronosTuneError("train: nothing to train; give --preset NAME (see `kronos-tune presets`), "
                              "--config FILE (TrainConfig keys: `kronos-tune config keys`, or an upstream "
                              "finetune_csv YAML) or --resume DIR of an earlier run")
    if job is not None and overrides.get("what") in job.phases:  # --what names one phase of a two-phase file
        values = job.values(overrides["what"])
    values.update({key: value for key, value in overrides.items() if value is not None})
    return TrainConfig.from_dict(values, source=source), source, job


class TrainProgress(LiveProgress):
    """A Rich progress bar fed with step and evaluation dicts (in process, or rank 0's events): step/total,
    loss, lr, tokens/s, the last validation loss, memory, elapsed time and ETA."""

    label, unit = "train", "steps"

    def __init__(self, console: Console, label: str, total: int | None, start: int = 0) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("lr {task.fields[lr]}"),
            TextColumn("{task.fields[speed]} tok/s (step)"), TextColumn("val {task.fields[val]}"),
            TextColumn("mem {task.fields[memory]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=console, transient=False)
        self.task = self.progress.add_task(label, total=total, completed=start, loss="-", lr="-", speed="-",
                                           val="-", memory="-")

    def restart(self, start: int, total: int | None) -> None:
        """Where the run really starts (a resumed run's step) and ends; the ETA counts from here."""
        self.progress.reset(self.task, total=total, completed=start)

    def update(self, record: dict[str, Any]) -> None:
        peaks = record.get("peak_bytes_by_phase") or {}
        memory = max(peaks.values()) if peaks else record.get("peak_memory_bytes")
        self.progress.update(self.task, completed=record["step"], loss=f"{record['loss']:.4f}",
                             lr=f"{record.get('lr', 0.0):.2e}", speed=f"{record.get('tokens_per_s', 0.0):,.0f}",
                             memory=format_bytes(memory, "GiB"))

    def evaluated(self, values: dict[str, Any]) -> None:
        if values.get("val_loss") is not None:
            self.progress.update(self.task, val=f"{values['val_loss']:.4f}")


def print_summary(console: Console, summary: dict[str, Any], step_rates: list[float] | None = None) -> None:
    """The stage's table; `step_rates`: the tokens/s of each step the bar showed (the whole run's figure
    counts evaluations and checkpoints too, so the two are named apart)."""
    table = Table(title=f"{summary['what']} training", title_justify="left", box=box.SIMPLE_HEAD, show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    if summary["interrupted"]:
        state = "stopped early (resumable)"
    else:
        state = "done" if summary["steps"] >= summary["total_steps"] else "stopped at --steps (resumable)"
    table.add_row("steps", f"{summary['steps']} / {summary['total_steps']} ({state})")
    if summary.get("last_loss") is not None:
        table.add_row("last train loss", f"{summary['last_loss']:.4f}")
    for key, value in (summary.get("last_eval") or {}).items():
        counted = key.endswith(("_tokens", "_elements"))
        table.add_row(key.replace("_", " "), f"{int(value):,}" if counted else f"{value:.4f}")
    if summary.get("best_val_loss") is not None:
        table.add_row("best val loss", f"{summary['best_val_loss']:.4f}")
    table.add_row("throughput", f"{summary.get('tokens_per_s', 0.0):,.0f} tokens/s over the whole "
                                f"{summary['train_time_s']:.1f} s (evaluations and checkpoints included)")
    if step_rates:
        table.add_row("step speed", f"median {statistics.median(step_rates):,.0f} tokens/s over {len(step_rates)} "
                                    f"steps (the bar's tok/s: one step, training only)")
    moved = summary.get("moved")
    if moved:
        table.add_row("from its start", Movement.from_dict(moved).line())
    peaks = summary.get("peak_bytes_by_phase") or {}
    if peaks:
        table.add_row("peak memory", ", ".join(f"{k} {format_bytes(v, 'GiB')}" for k, v in peaks.items()))
    table.add_row("checkpoint", str(summary.get("checkpoint_path")))
    table.add_row("best weights", str(summary.get("best_dir") or "none yet"))
    console.print(table)


class ConsoleListener(TrainListener):
    """The job drawn on a terminal: the folder and schedule, a progress bar per stage (torchrun's own lines above
    it), then the stage's summary table and the lines that say where the results are or what went wrong."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.view: TrainProgress | None = None
        self._shown = ExitStack()
        self.step_rates: list[float] = []

    def _show(self, label: str, total: int | None, start: int = 0) -> None:
        self.view = self._shown.enter_context(TrainProgress(self.console, label, total, start=start))

    def close(self) -> None:
        """Stop the bar (also when the job raised)."""
        self._shown.close()
        self.view = None

    def announce(self, why: str, schedule: TrainSchedule) -> None:
        for line in (why, *schedule.lines()):
            self.console.print(line, highlight=False, soft_wrap=True)

    def stage_launching(self, config: TrainConfig, target: int | None) -> None:
        self._show(f"{config.what} (torchrun)", target)

    def stage_ready(self, start: StageStart) -> None:
        if self.view is None:
            self._show(start.config.what, start.target, start=start.step)
        else:
            self.view.restart(start.step, start.target)

    def step(self, record: StepRecord) -> None:
        self.step_rates.append(record.tokens_per_s)
        if self.view is not None:
            self.view.update(record.to_dict())

    def evaluated(self, values: dict[str, Any]) -> None:
        if self.view is not None:
            self.view.evaluated(values)

    def worker_line(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False)

    def stage_finished(self, result: StageResult) -> None:
        self.close()
        if result.summary is not None:
            print_summary(self.console, result.summary, self.step_rates)
        self.step_rates = []
        if result.error is not None:
            self.console.print(f"[red]error:[/] {result.error}", highlight=False, soft_wrap=True)
        elif result.summary is not None:
            self._ending(result.config, result.status, result.summary["steps"], result.summary["total_steps"])
        elif result.status == "cancelled":
            from kronos_core.train.train_state import checkpoint_path

            folder = result.config.output_dir
            if checkpoint_path(Path(folder)).is_file():
                self.console.print(f"interrupted before a checkpoint of this step could be written; the last saved "
                                   f"one in {folder} is unchanged; resume with: {resume_line('train', folder, [])}",
                                   highlight=False, markup=False, soft_wrap=True)
            else:
                self.console.print(f"interrupted before the first checkpoint: nothing to resume in {folder}; run "
                                   f"the same command again with --overwrite", highlight=False, markup=False,
                                   soft_wrap=True)

    def _ending(self, config: TrainConfig, status: str | None, step: int, total: int) -> None:
        """The closing lines: where the results are and the command that continues the run."""
        folder = config.output_dir
        resume = resume_line("train", folder, [])
        if status == "cancelled":
            self.console.print(f"interrupted after {step} of {total} steps, the checkpoint kept in {folder}; the "
                               f"next `kronos-tune train` with the same config continues it, or resume with: "
                               f"{resume}", highlight=False, markup=False, soft_wrap=True)
            return
        if status == "partial":
            self.console.print(f"stopped at --steps {step} of {total}; continue with: {resume}", highlight=False,
                               markup=False, soft_wrap=True)
        self.console.print(f"results in {folder} (best weights in {Path(folder) / 'best'})", highlight=False,
                           soft_wrap=True)


def _pretrained_weights(config: TrainConfig, what: str | None, offline: bool, console: Console) -> dict[str, Any]:
    """Resolve the hub ids among predictor_dir/tokenizer_dir before any folder is claimed (one note line each);
    the run.json record. --offline holds for the ranks too (HF_HUB_OFFLINE in their environment)."""
    from kronos_core.hub import resolve_sources

    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    used = {"tokenizer_dir": config.tokenizer_dir}
    if (what or config.what) != "tokenizer":
        used["predictor_dir"] = config.predictor_dir
    sources = resolve_sources(used)
    for label, found in sources.items():
        if found.from_hub:
            console.print(Text.assemble(("note:", "cyan"), " ", found.describe(label)), soft_wrap=True)
    return {label: found.to_dict() for label, found in sources.items()}


def checked_weights(config: TrainConfig, what: str | None) -> dict[str, str]:
    """predictor_dir and tokenizer_dir checked before any work (kronos_tune.checkpoints): a training run's
    folder becomes its best/ (with its tokenizer when none is given); what changed."""
    from kronos_tune.checkpoints import resolve_checkpoint, resolve_pair

    if (what or config.what) == "tokenizer":
        found = None if config.tokenizer_dir is None else \
            resolve_checkpoint(config.tokenizer_dir, "tokenizer_dir", stage="tokenizer").checkpoint
        chosen = {"tokenizer_dir": found}
    else:
        predictor, tokenizer = resolve_pair(config.predictor_dir, config.tokenizer_dir, "predictor_dir",
                                            "tokenizer_dir")
        chosen = {"predictor_dir": predictor, "tokenizer_dir": tokenizer}
    return {key: str(value) for key, value in chosen.items()
            if value is not None and Path(str(getattr(config, key) or "")) != value}


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        preset: Annotated[Optional[str], typer.Option("--preset", help="Workload from a preset (kronos-tune presets).")] = None,
        config: Annotated[Optional[Path], typer.Option("--config", help="TOML file of TrainConfig keys (kronos-tune config keys).", dir_okay=False)] = None,
        data: Annotated[Optional[list[str]], typer.Option("--data", help="CSV/Parquet file or folder (repeatable), or 'synthetic'.")] = None,
        symbol_column: Annotated[Optional[str], typer.Option("--symbol-column", help="--data files are panels (one long table); this column names each series.")] = None,
        date_format: DateFormatOption = None,
        what: Annotated[Optional[str], typer.Option("--what", help="tokenizer, predictor or both (tokenizer, then predictor on it).")] = None,
        steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Stop at this optimizer step (global count); past the schedule, a new run gets more epochs.")] = None,
        resume: Annotated[Optional[Path], typer.Option("--resume", help="Folder of a run to continue where it stopped.")] = None,
        nproc: Annotated[int, typer.Option("--nproc", min=1, help="Processes (devices) on this node; >1 uses torchrun.")] = 1,
        keep_batch: Annotated[bool, typer.Option("--keep-effective-batch", help="With --nproc: split the config's effective batch over the processes instead of multiplying it.")] = False,
        out: Annotated[Optional[Path], typer.Option("--out", help="Output folder [default: a new runs/train/<preset or config name>-<time>/].", file_okay=False)] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the kronos-tune run in --out (never a foreign folder).")] = False,
        new_run: Annotated[bool, typer.Option("--new-run", help="Start over in a new folder even if the same config's last run was cancelled.")] = False,
        strict: Annotated[bool, typer.Option("--strict", help="Refuse a recommended.toml from a partial (cancelled) benchmark.")] = False,
        device: Annotated[Optional[str], typer.Option("--device", help="auto, cpu or cuda (overrides the config).")] = None,
        nnodes: Annotated[Optional[str], typer.Option("--nnodes", help="torchrun: number of nodes (or MIN:MAX).")] = None,
        node_rank: Annotated[Optional[int], typer.Option("--node-rank", help="torchrun: this node's rank (static rendezvous).")] = None,
        rdzv_endpoint: Annotated[Optional[str], typer.Option("--rdzv-endpoint", help="torchrun: HOST:PORT shared by all nodes.")] = None,
        rdzv_id: Annotated[Optional[str], typer.Option("--rdzv-id", help="torchrun: job id, the same on all nodes.")] = None,
        rdzv_backend: Annotated[Optional[str], typer.Option("--rdzv-backend", help="torchrun: rendezvous backend (default c10d).")] = None,
        tensorboard: Annotated[Optional[bool], typer.Option("--tensorboard/--no-tensorboard", help="TensorBoard event files in <run>/tensorboard/ [default: on when the tensorboard package is installed].")] = None,
        offline: OfflineOption = False,
        train_until: Annotated[Optional[str], typer.Option("--train-until", help="Train on bars up to this date (2010-05-14: that whole day) or this fraction of the data's timeline (0.75); recorded in data_span.json for backtest's leakage check.")] = None,
    ) -> None:
        """Fine-tune the Kronos tokenizer and/or predictor (Ctrl-C stops at a step boundary and saves).

        Prints the plan first (optimizer steps, epochs, effective batch) and writes into a new folder per run;
        a cancelled run is continued by the next start with the same config."""
        if what is not None and what not in STAGES:
            raise KronosTuneError(f"train: --what {what!r}; use one of {', '.join(STAGES)}")
        if what == "both" and resume is not None:
            raise KronosTuneError("train: --resume continues the run as it was started; leave out --what (a "
                                  "two-phase run's folder continues its unfinished phase)")
        if resume is not None and out is not None:
            raise KronosTuneError(f"train: --resume {resume} continues in its own folder; leave out --out {out}")
        if resume is not None:
            check_resume_folder(resume)
        if train_until is not None:  # the flag's own value: its error names the flag, not the config file
            from kronos_core.train.data_span import parse_train_until

            parse_train_until(train_until)
        if date_format is not None:  # as --train-until: the flag's error names the flag
            from kronos_core.data.day_month import check_date_format

            check_date_format(date_format)
        overrides = {"data": list(data) if data else None, "what": None if what == "both" else what,
                     "device": device, "symbol_column": symbol_column, "train_until": train_until,
                     "date_format": date_format}
        base, source, job = build_config(preset, config, resume, overrides)
        both = what == "both" or (what is None and job is not None and job.two_phases)
        base = base.replace(**checked_weights(base, "both" if both else what))
        if not base.is_synthetic:  # a missing path or dates read two ways: one line before any folder is made
            from kronos_core.data.tables import check_file_dates
            from kronos_core.data.kline import find_data_files

            check_file_dates(find_data_files(base.data), base.date_format)
        if base.train_until is not None:  # reads the data: a cut outside it is one line before any folder is made
            # torch: only when the data is read here
            from kronos_core.train.loading import check_validation_split, load_training_data

            with warnings.catch_warnings():  # what reading says, the trainer's own read says once
                warnings.simplefilter("ignore", KronosWarning)
                frames, _ = load_training_data(base)
            check_validation_split(base, frames)
        if resume is not None and (preset or config):
            theirs = ((read_run_file(resume) or {}).get("identity") or {}).get("source")
            if theirs is not None and theirs != source:
                raise KronosTuneError(f"--resume {resume}: that run was started from {theirs}, not {source}; leave "
                                      f"out --preset/--config to continue it as it was")
        board = want_tensorboard(tensorboard)
        console = make_console()
        notes = list(job.notes) if job is not None else []
        emulated = emulated_bf16_note('amp = "bf16"' if base.amp == "bf16" else None, base.resolved_device())
        for line in notes + ([emulated] if emulated else []):
            console.print(Text.assemble(("note:", "cyan"), " ", line), soft_wrap=True)
        checks = job_checks(base, upstream=job is not None and job.upstream)
        weights = _pretrained_weights(base, what, offline, console)
        if config is not None:
            partial = partial_config_note(config)
            if partial and strict:
                raise KronosTuneError(f"--config {config}: written by a partial benchmark ({partial.lstrip('# ')}); "
                                      f"--strict refuses it: finish the benchmark (--resume its folder) or drop "
                                      f"--strict")
            if partial:
                console.print(f"[yellow]warning:[/] {config} comes from a partial benchmark "
                              f"({partial.lstrip('# ')}); training with it anyway (--strict refuses)",
                              highlight=False, soft_wrap=True)
        request = TrainRequest(
            base, source, label=run_label(preset, config, job) if resume is None else resume.name, both=both,
            phases=job.phases if both and job is not None else {}, checks=checks,
            steps=steps, resume=resume, out=out, overwrite=overwrite, new_run=new_run, keep_batch=keep_batch,
            launch=LaunchSpec(nproc, nnodes, node_rank, rdzv_endpoint, rdzv_id or "kronos-tune", rdzv_backend),
            tensorboard=board, weights=weights)
        listener = ConsoleListener(console)
        try:
            result = run_training(request, listener)
        finally:
            listener.close()
        if result.exit_code != 0:
            raise typer.Exit(result.exit_code)
