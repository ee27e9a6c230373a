"""`kronos-tune train`: fine-tune the Kronos tokenizer and/or predictor with a live progress bar.

One process runs the trainer right here. `--nproc N` (or any multi-node flag)
launches `python -m torch.distributed.run ... -m kronos_core.train --events`
through the shared launcher (kronos_core.launch) instead and draws the
progress of its rank 0 from the events it prints.

Either way the progress bar shows step/total, loss, lr, tokens/s, the last
validation loss and the ETA, and every stage's folder gets metrics.jsonl and
(with the `[tensorboard]` extra) TensorBoard event files (kronos_tune.run_logs).

Before the first step it prints the run's folder and plan (optimizer steps,
epochs, effective batch); every run gets its own folder (kronos_tune.runs), and
the next start of a cancelled run with the same config continues it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import torch
import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from kronos_core.errors import one_line
from kronos_core.launch import LaunchSpec, run_launch, torchrun_command
from kronos_core.train import TrainConfig, Trainer
from kronos_core.train.__main__ import EXIT_INTERRUPTED, EXIT_OOM, EXIT_USAGE, oom_message
from kronos_core.train.config import WHAT
from kronos_core.train.loading import load_training_data
from kronos_core.train.records import PhaseMeter
from kronos_core.train.signals import StopForwarder, stop_on_signals
from kronos_core.units import format_bytes
from kronos_tune.commands.common import LiveProgress
from kronos_tune.errors import KronosTuneError
from kronos_tune.run_logs import METRICS_FILE, TENSORBOARD_DIR, RunLog, check_log_paths, stage_log, want_tensorboard
from kronos_tune.runs import RunDir, read_run_file
from kronos_tune.train.runs import (
    Start, adopt_legacy_run, check_resume_folder, checkpoint_step, choose_folder, claim_train_dir, finish_status,
    partial_config_note, plan_training, run_label, run_step, world_size,
)

STAGES = (*WHAT, "both")
STOP_GRACE_S = 60.0  # after Ctrl-C, the ranks' time to finish the step and save before they are killed


def _preset_fields(name: str) -> dict[str, Any]:
    from kronos_tune.presets import resolve_preset
    from kronos_tune.workloads import preset_train_fields

    return preset_train_fields(resolve_preset(name))


def build_config(preset: str | None, config: Path | None, resume: Path | None, data: list[str] | None,
                 what: str | None, device: str | None) -> tuple[TrainConfig, str]:
    """The run's TrainConfig from a preset, a TOML file or the resumed run's config.toml, plus the flags;
    and where it came from ("preset NAME", the file). Its output_dir is decided by `choose_folder`."""
    if preset and config:
        raise KronosTuneError("train: give either --preset NAME or --config FILE, not both")
    if config is not None:
        values = TrainConfig.from_toml(config).to_dict()
        source = str(config)
    elif preset:
        values, source = _preset_fields(preset), f"preset {preset}"
    elif resume is not None:
        values = TrainConfig.from_toml(Path(resume) / "config.toml").to_dict()
        source = str((read_run_file(resume) or {}).get("identity", {}).get("source") or resume)
    else:
        raise KronosTuneError("train: nothing to train; give --preset NAME (see `kronos-tune presets`), "
                              "--config FILE (TrainConfig keys: `kronos-tune config keys`) or --resume DIR of an "
                              "earlier run")
    if data:
        values["data"] = list(data)
    if what is not None and what != "both":
        values["what"] = what
    if device is not None:
        values["device"] = device
    return TrainConfig.from_dict(values, source=source), source


def stages(base: TrainConfig, what: str | None) -> list[TrainConfig]:
    """`both`: the tokenizer first (OUT/tokenizer), then the predictor on its best weights (OUT/predictor)."""
    if what != "both":
        return [base]
    root = Path(base.output_dir)
    tokenizer = base.replace(what="tokenizer", output_dir=str(root / "tokenizer"))
    predictor = base.replace(what="predictor", output_dir=str(root / "predictor"),
                             tokenizer_dir=str(root / "tokenizer" / "best"))
    return [tokenizer, predictor]


class TrainProgress(LiveProgress):
    """A Rich progress bar fed with step and evaluation dicts (in process, or rank 0's events): step/total,
    loss, lr, tokens/s, the last validation loss, memory, elapsed time and ETA."""

    def __init__(self, console: Console, label: str, total: int | None, start: int = 0) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("lr {task.fields[lr]}"),
            TextColumn("{task.fields[speed]} tok/s"), TextColumn("val {task.fields[val]}"),
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


def print_summary(console: Console, summary: dict[str, Any]) -> None:
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
    table.add_row("throughput", f"{summary.get('tokens_per_s', 0.0):,.0f} tokens/s over {summary['train_time_s']:.1f} s")
    peaks = summary.get("peak_bytes_by_phase") or {}
    if peaks:
        table.add_row("peak memory", ", ".join(f"{k} {format_bytes(v, 'GiB')}" for k, v in peaks.items()))
    table.add_row("checkpoint", str(summary.get("checkpoint_path")))
    table.add_row("best weights", str(summary.get("best_dir") or "none yet"))
    console.print(table)


def _finish(run: RunDir | None, status: str, **extra: Any) -> None:
    if run is not None:
        run.mark(status, **extra)


def run_in_process(config: TrainConfig, steps: int | None, resume: Path | None, console: Console,
                   meter: PhaseMeter | None = None, run: RunDir | None = None, tensorboard: bool = False) -> int:
    """Train here; returns the exit code (0 done, 130 stopped by Ctrl-C after saving, 1 out of memory).
    `run`: the claimed folder, whose run.json records how the run ended. The stage's folder gets
    metrics.jsonl and, with `tensorboard`, TensorBoard event files."""
    if meter is None:
        from kronos_tune.memory.meters import make_meter

        meter = make_meter(config.resolved_device(), exact_on_cpu=False)
    stopper = StopForwarder()
    trainer: Trainer | None = None
    log: RunLog | None = None
    try:
        with stop_on_signals(stopper, second_interrupts=True):
            trainer = Trainer(config, meter=meter, resume=resume)
            stopper.attach(trainer)
            target = trainer.total_steps if steps is None else min(steps, trainer.total_steps)
            log = stage_log(Path(config.output_dir), tensorboard, resumed_at=trainer.step)
            with TrainProgress(console, config.what, target, start=trainer.step) as view:
                def on_step(record: Any) -> None:
                    values = record.to_dict()
                    view.update(values)
                    log.step(values)

                def on_eval(record: Any) -> None:
                    values = record.to_dict()
                    view.evaluated(values)
                    log.eval(values)

                trainer.callback, trainer.eval_callback = on_step, on_eval
                summary = trainer.fit(steps)
    except torch.OutOfMemoryError:
        step = trainer.step if trainer is not None else 0
        peak = trainer.peak_bytes_seen() if trainer is not None else None
        console.print(f"[red]error:[/] {oom_message(step, peak, str(trainer.device) if trainer else config.device)}",
                      highlight=False, soft_wrap=True)
        _finish(run, "failed", reason="out of memory", step=_saved_step(config))
        return EXIT_OOM
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/] before a checkpoint could be written; the last saved one is "
                      "unchanged", highlight=False)
        _finish(run, "cancelled", step=_saved_step(config))
        return EXIT_INTERRUPTED
    except BaseException as error:
        _finish(run, "failed", reason=one_line(error, typed=False), step=_saved_step(config))
        raise
    finally:
        if log is not None:
            log.close()
        if trainer is not None:
            trainer.close()
    print_summary(console, summary.to_dict())
    status = finish_status(summary.interrupted, summary.steps, summary.total_steps)
    _finish(run, status, step=summary.steps, total_steps=summary.total_steps)
    return _ending(console, config, status, summary.steps, summary.total_steps)


def _saved_step(config: TrainConfig) -> int:
    """The step of the run's last checkpoint (0 without one): where a resume would continue."""
    try:
        return checkpoint_step(Path(config.output_dir))
    except Exception:  # noqa: BLE001 - an unreadable checkpoint only loses this number
        return 0


def _ending(console: Console, config: TrainConfig, status: str, step: int, total: int) -> int:
    """The closing lines: where the results are and the command that continues the run."""
    folder = config.output_dir
    if status == "cancelled":
        console.print(f"stopped at step {step} of {total}; the next `kronos-tune train` with the same config "
                      f"continues it, or resume with: kronos-tune train --resume {folder}",
                      highlight=False, soft_wrap=True)
        return EXIT_INTERRUPTED
    if status == "partial":
        console.print(f"stopped at --steps {step} of {total}; continue with: kronos-tune train --resume {folder}",
                      highlight=False, soft_wrap=True)
    console.print(f"results in {folder} (best weights in {Path(folder) / 'best'})", highlight=False, soft_wrap=True)
    return 0


def worker_args(config_file: Path, steps: int | None, resume: Path | None) -> list[str]:
    """The arguments of `python -m kronos_core.train` on every rank."""
    args = ["--config", str(config_file), "--events"]
    if steps is not None:
        args += ["--steps", str(steps)]
    if resume is not None:
        args += ["--resume", str(resume)]
    return args


class LaunchedRun:
    """Rank 0's events of a torchrun training run: the progress bar, the run's logs, the summary, errors.
    The log opens on rank 0's first event, so on a multi-node run only the node hosting rank 0 writes it."""

    def __init__(self, config: TrainConfig, view: TrainProgress, tensorboard: bool) -> None:
        self.config, self.view, self.tensorboard = config, view, tensorboard
        self.log: RunLog | None = None
        self.summary: dict[str, Any] | None = None
        self.errors: list[dict[str, Any]] = []

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "error":
            self.errors.append(event)
            return
        if self.log is None and kind in ("start", "step", "eval"):
            resumed_at = int(event.get("step", 0)) if kind == "start" else 0
            self.log = stage_log(Path(self.config.output_dir), self.tensorboard, resumed_at=resumed_at)
        if kind == "start":
            total = self.view.progress.tasks[0].total
            self.view.restart(int(event["step"]), total if total is not None else event.get("total_steps"))
        elif kind == "step":
            self.view.update(event)
            self.log.step(event)
        elif kind == "eval":
            self.view.evaluated(event)
            self.log.eval(event)
        elif kind == "summary":
            self.summary = event

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def run_torchrun(config: TrainConfig, command: list[str], total: int | None, console: Console,
                 run: RunDir | None = None, tensorboard: bool = False) -> int:
    """Run torchrun through the shared launcher (Ctrl-C or SIGTERM here: every rank stops after its step and
    saves; killed after a grace period), draw rank 0's progress and write the run's logs from its events."""
    with TrainProgress(console, f"{config.what} (torchrun)", total) as view:
        watcher = LaunchedRun(config, view, tensorboard)

        def on_line(line: str) -> None:
            view.progress.console.print(line, highlight=False, markup=False)

        try:
            result = run_launch(command, on_event=watcher.on_event, on_line=on_line, grace_s=STOP_GRACE_S)
        finally:
            watcher.close()
    summary, code = watcher.summary, result.returncode
    if summary is not None:
        print_summary(console, summary)
        status = finish_status(summary["interrupted"], summary["steps"], summary["total_steps"])
        _finish(run, status, step=summary["steps"], total_steps=summary["total_steps"])
        if status == "cancelled" or code == 0:
            return _ending(console, config, status, summary["steps"], summary["total_steps"])
    if watcher.errors:
        first = watcher.errors[0]
        console.print(f"[red]error:[/] rank {first.get('rank')}: {first.get('message')}", highlight=False,
                      soft_wrap=True)
        _finish(run, "failed", reason=str(first.get("message")), step=_saved_step(config))
        return {"oom": EXIT_OOM, "usage": EXIT_USAGE}.get(str(first.get("kind")), 1)
    if code != 0 or result.stopped:
        console.print(f"[red]error:[/] torchrun exited with code {code}; see the worker messages above",
                      highlight=False)
        _finish(run, "cancelled" if result.stopped else "failed", step=_saved_step(config))
        return EXIT_INTERRUPTED if result.stopped else (code if 0 < code < 128 else 1)
    return 0


def check_logs(configs: list[TrainConfig], tensorboard: bool) -> None:
    """Before anything is written: every stage folder can take metrics.jsonl (and tensorboard/)."""
    for stage in configs:
        folder = Path(stage.output_dir)
        check_log_paths(folder / METRICS_FILE, folder / TENSORBOARD_DIR if tensorboard else None)


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        preset: Annotated[Optional[str], typer.Option("--preset", help="Workload from a preset (kronos-tune presets).")] = None,
        config: Annotated[Optional[Path], typer.Option("--config", help="TOML file of TrainConfig keys (kronos-tune config keys).", dir_okay=False)] = None,
        data: Annotated[Optional[list[str]], typer.Option("--data", help="CSV/Parquet file or folder (repeatable), or 'synthetic'.")] = None,
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
        symbol_column: Annotated[Optional[str], typer.Option("--symbol-column", help="--data files are panels (one long table); this column names each series.")] = None,
        train_until: Annotated[Optional[str], typer.Option("--train-until", help="Train on bars up to this date (2010-05-14: that whole day) or this fraction of the data's timeline (0.75); recorded in data_span.json for backtest's leakage check.")] = None,
    ) -> None:
        """Fine-tune the Kronos tokenizer and/or predictor (Ctrl-C stops at a step boundary and saves).

        Prints the plan first (optimizer steps, epochs, effective batch) and writes into a new folder per run;
        a cancelled run is continued by the next start with the same config."""
        if what is not None and what not in STAGES:
            raise KronosTuneError(f"train: --what {what!r}; use one of {', '.join(STAGES)}")
        if what == "both" and resume is not None:
            raise KronosTuneError("train: --resume continues one stage; use --what tokenizer or --what predictor "
                                  "with --resume OUT/tokenizer or OUT/predictor")
        if resume is not None and out is not None:
            raise KronosTuneError(f"train: --resume {resume} continues in its own folder; leave out --out {out}")
        if resume is not None:
            check_resume_folder(resume)
        base, source = build_config(preset, config, resume, data, what, device)
        data_options = {key: value for key, value in (("symbol_column", symbol_column), ("train_until", train_until))
                        if value is not None}
        if data_options:
            base = base.replace(**data_options)
        if base.train_until is not None:
            load_training_data(base)  # reads the data: a cut outside it is one line before any folder is made
        if resume is not None and (preset or config):
            theirs = ((read_run_file(resume) or {}).get("identity") or {}).get("source")
            if theirs is not None and theirs != source:
                raise KronosTuneError(f"--resume {resume}: that run was started from {theirs}, not {source}; leave "
                                      f"out --preset/--config to continue it as it was")
        board = want_tensorboard(tensorboard)
        console = Console()
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
        spec = LaunchSpec(nproc, nnodes, node_rank, rdzv_endpoint, rdzv_id or "kronos-tune", rdzv_backend)
        multi_node, launched = spec.multi_node, spec.launched
        if launched:
            torchrun_command(spec, "kronos_core.train", [])  # a missing rendezvous flag: one line, before any folder
        processes = world_size(nproc, nnodes) if launched else 1
        start_step = run_step(resume) if resume is not None else 0
        base, plan = plan_training(base, processes, steps, start_step, resume, keep_batch)
        if multi_node:  # every node must write to the same shared folder: no per-node fresh names
            folder = out or Path(base.output_dir)
            begin = Start(folder, resume, "--out", overwrite, f"output: {folder} (shared by all nodes)")
        else:
            label = run_label(preset, config) if resume is None else resume.name
            begin = choose_folder(label, base, processes, steps, resume, out, overwrite, new_run)
            if begin.resume is not None and resume is None:  # a cancelled run found: plan from its step
                start_step = run_step(begin.resume)
                base, plan = plan_training(base, processes, steps, start_step, begin.resume, False)
        base = base.replace(output_dir=str(begin.folder))
        if begin.resume is not None:  # the only folder kept as it is: its logs must take more lines
            check_logs(stages(base, what), board)
        run: RunDir | None = None
        if not multi_node:
            if begin.resume is not None:
                adopt_legacy_run(begin.folder, base, source)
            run = claim_train_dir(begin.folder, base, source, resume=begin.resume is not None,
                                  overwrite=begin.overwrite, flag=begin.flag, processes=processes, what=what)
        if what == "both":
            plan.what = "tokenizer, then predictor,"
        console.print(begin.why, highlight=False, soft_wrap=True)
        for line in plan.lines():
            console.print(line, highlight=False, soft_wrap=True)
        for stage in stages(base, what):
            stage_run = run if what != "both" else claim_train_dir(
                Path(stage.output_dir), stage, source, resume=False, overwrite=False, processes=processes)
            if launched:
                config_file = Path(stage.output_dir) / "config.toml"
                stage.to_toml(config_file)
                command = torchrun_command(spec, "kronos_core.train", worker_args(config_file, steps, begin.resume))
                code = run_torchrun(stage, command, plan.end_step, console, stage_run, tensorboard=board)
            else:
                code = run_in_process(stage, steps, begin.resume, console, run=stage_run, tensorboard=board)
            if code != 0:
                if what == "both" and run is not None:
                    run.mark("cancelled" if code == EXIT_INTERRUPTED else "failed", stage=stage.what)
                raise typer.Exit(code)
        if what == "both" and run is not None:
            run.mark("complete" if steps is None else "partial", stages=["tokenizer", "predictor"])
