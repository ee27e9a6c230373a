"""`kronos-tune train`: fine-tune the Kronos tokenizer and/or predictor with a live progress bar.

One process runs the trainer right here. `--nproc N` (or any multi-node flag)
launches `python -m torch.distributed.run ... -m kronos_core.train` instead and
draws the progress of its rank 0 from the JSON lines it prints.

Before the first step it prints the run's folder and plan (optimizer steps,
epochs, effective batch); every run gets its own folder (kronos_tune.runs), and
the next start of a cancelled run with the same config continues it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import torch
import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from kronos_core.train import TrainConfig, Trainer
from kronos_core.train.__main__ import EXIT_INTERRUPTED, EXIT_OOM, STEP_PREFIX, SUMMARY_PREFIX, oom_message
from kronos_core.train.config import WHAT
from kronos_core.train.records import PhaseMeter
from kronos_core.train.signals import StopForwarder, stop_on_signals
from kronos_tune.errors import KronosTuneError
from kronos_tune.runs import RunDir, read_run_file
from kronos_tune.train_runs import (
    Start, adopt_legacy_run, check_resume_folder, checkpoint_step, choose_folder, claim_train_dir, finish_status,
    partial_config_note, plan_training, run_label, run_step, world_size,
)

STAGES = (*WHAT, "both")


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


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


class ProgressView:
    """A Rich progress bar fed with step-record dicts (in process or from rank 0's JSON lines)."""

    def __init__(self, console: Console, label: str, total: int | None) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[speed]} tok/s"),
            TextColumn("mem {task.fields[memory]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console, transient=False)
        self.task = self.progress.add_task(label, total=total, loss="-", speed="-", memory="-")

    def __enter__(self) -> ProgressView:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, record: dict[str, Any]) -> None:
        peaks = record.get("peak_bytes_by_phase") or {}
        memory = max(peaks.values()) if peaks else record.get("peak_memory_bytes")
        self.progress.update(self.task, completed=record["step"], loss=f"{record['loss']:.4f}",
                             speed=f"{record.get('tokens_per_s', 0.0):,.0f}", memory=_gib(memory))


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
        table.add_row("peak memory", ", ".join(f"{k} {_gib(v)}" for k, v in peaks.items()))
    table.add_row("checkpoint", str(summary.get("checkpoint_path")))
    table.add_row("best weights", str(summary.get("best_dir") or "none yet"))
    console.print(table)


def _finish(run: RunDir | None, status: str, **extra: Any) -> None:
    if run is not None:
        run.mark(status, **extra)


def run_in_process(config: TrainConfig, steps: int | None, resume: Path | None, console: Console,
                   meter: PhaseMeter | None = None, run: RunDir | None = None) -> int:
    """Train here; returns the exit code (0 done, 130 stopped by Ctrl-C after saving, 1 out of memory).
    `run`: the claimed folder, whose run.json records how the run ended."""
    if meter is None and config.resolved_device() == "cuda":
        from kronos_tune.memory.meters import make_meter

        meter = make_meter(torch.device("cuda", torch.cuda.current_device()))
    stopper = StopForwarder()
    trainer: Trainer | None = None
    try:
        with stop_on_signals(stopper, second_interrupts=True):
            trainer = Trainer(config, meter=meter, resume=resume)
            stopper.attach(trainer)
            target = trainer.total_steps if steps is None else min(steps, trainer.total_steps)
            with ProgressView(console, config.what, target) as view:
                view.progress.update(view.task, completed=trainer.step)
                trainer.callback = lambda record: view.update(record.to_dict())
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
        _finish(run, "failed", reason=str(error).splitlines()[0] if str(error) else type(error).__name__,
                step=_saved_step(config))
        raise
    finally:
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


def torchrun_command(config_file: Path, nproc: int, steps: int | None, resume: Path | None,
                     nnodes: str | None, node_rank: int | None, rdzv_endpoint: str | None, rdzv_id: str | None,
                     rdzv_backend: str | None) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if nnodes is not None and nnodes != "1":
        if not rdzv_endpoint:
            raise KronosTuneError(f"train: --nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the same on every "
                                  f"node, e.g. the first node's address:29400)")
        command += ["--nnodes", nnodes, "--rdzv-endpoint", rdzv_endpoint,
                    "--rdzv-backend", rdzv_backend or "c10d", "--rdzv-id", rdzv_id or "kronos-tune"]
        if node_rank is not None:
            command += ["--node-rank", str(node_rank)]
    elif rdzv_endpoint:
        command += ["--rdzv-endpoint", rdzv_endpoint, "--rdzv-backend", rdzv_backend or "c10d",
                    "--rdzv-id", rdzv_id or "kronos-tune"]
    else:
        command += ["--standalone"]  # a free local port: runs side by side never collide
    command += ["-m", "kronos_core.train", "--config", str(config_file), "--jsonl"]
    if steps is not None:
        command += ["--steps", str(steps)]
    if resume is not None:
        command += ["--resume", str(resume)]
    return command


def run_torchrun(config: TrainConfig, command: list[str], total: int | None, console: Console,
                 run: RunDir | None = None) -> int:
    """Run torchrun in its own session (Ctrl-C here is forwarded once), draw rank 0's progress."""
    summary: dict[str, Any] | None = None
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1, start_new_session=True)
    forwarded: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        if not forwarded:
            forwarded.append(signum)
            proc.send_signal(signal.SIGINT)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with ProgressView(console, f"{config.what} (torchrun)", total) as view:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(STEP_PREFIX):
                    view.update(json.loads(line[len(STEP_PREFIX):]))
                elif line.startswith(SUMMARY_PREFIX):
                    summary = json.loads(line[len(SUMMARY_PREFIX):])
                else:
                    view.progress.console.print(line.rstrip("\n"), highlight=False, markup=False)
        code = proc.wait()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if summary is not None:
        print_summary(console, summary)
        status = finish_status(summary["interrupted"], summary["steps"], summary["total_steps"])
        _finish(run, status, step=summary["steps"], total_steps=summary["total_steps"])
        if status == "cancelled" or code == 0:
            return _ending(console, config, status, summary["steps"], summary["total_steps"])
    if code != 0:
        console.print(f"[red]error:[/] torchrun exited with code {code}; see the worker messages above",
                      highlight=False)
        _finish(run, "cancelled" if forwarded else "failed", step=_saved_step(config))
        return EXIT_INTERRUPTED if forwarded else (code if 0 < code < 128 else 1)
    return 0


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
        if resume is not None and (preset or config):
            theirs = ((read_run_file(resume) or {}).get("identity") or {}).get("source")
            if theirs is not None and theirs != source:
                raise KronosTuneError(f"--resume {resume}: that run was started from {theirs}, not {source}; leave "
                                      f"out --preset/--config to continue it as it was")
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
        multi_node = nnodes is not None and nnodes != "1"
        launched = nproc > 1 or any(v is not None for v in (nnodes, node_rank, rdzv_endpoint))
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
                command = torchrun_command(config_file, nproc, steps, begin.resume, nnodes, node_rank,
                                           rdzv_endpoint, rdzv_id, rdzv_backend)
                code = run_torchrun(stage, command, plan.end_step, console, stage_run)
            else:
                code = run_in_process(stage, steps, begin.resume, console, run=stage_run)
            if code != 0:
                if what == "both" and run is not None:
                    run.mark("cancelled" if code == EXIT_INTERRUPTED else "failed", stage=stage.what)
                raise typer.Exit(code)
        if what == "both" and run is not None:
            run.mark("complete" if steps is None else "partial", stages=["tokenizer", "predictor"])
