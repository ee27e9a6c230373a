"""Training runs as the CLI and the dashboard start them: the plan announced first, one folder per run.

- `plan_training` says what a run will do before it starts: optimizer steps,
  epochs, the effective batch per process and in total; it raises the epochs
  when `--steps` goes past the schedule of a new run, and refuses what a resumed
  run cannot do (a step it already passed, a schedule it cannot extend).
- `claim_train_dir` takes the run's folder through `kronos_tune.runs`: a fresh
  `runs/train/<label>-<time>/` by default, never a folder holding another run.
- `find_resumable` finds the latest cancelled run with the same config, which
  the next start continues (`resumable` means exactly that).
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_core.train import TrainConfig
from kronos_tune.errors import KronosTuneError
from kronos_tune.runs import RunDir, claim_run_dir, default_run_dir, read_run_file

COMMAND = "train"
PARTIAL_MARK = "# partial"
RUNS_ROOT = Path("runs")  # relative: run folders land under the current directory


@dataclass
class TrainPlan:
    """What a training run will do, in optimizer steps and windows (samples)."""

    what: str
    model_size: str
    processes: int | None  # None: elastic (torchrun --nnodes MIN:MAX)
    batch_size: int
    accumulation_steps: int
    samples_per_epoch: int
    epochs: int
    start_step: int
    stop_step: int | None  # --steps, or None for the end of the schedule
    notes: list[str] = field(default_factory=list)

    @property
    def per_process_batch(self) -> int:
        return self.batch_size * self.accumulation_steps

    @property
    def global_batch(self) -> int | None:
        return None if self.processes is None else self.per_process_batch * self.processes

    @property
    def steps_per_epoch(self) -> int | None:
        return None if self.global_batch is None else self.samples_per_epoch // self.global_batch

    @property
    def total_steps(self) -> int | None:
        """The schedule's length: epochs x steps per epoch."""
        return None if self.steps_per_epoch is None else self.steps_per_epoch * self.epochs

    @property
    def end_step(self) -> int | None:
        """Where this start stops: --steps or the end of the schedule."""
        total = self.total_steps
        if total is None:
            return self.stop_step
        return total if self.stop_step is None else min(self.stop_step, total)

    def lines(self) -> list[str]:
        """The announcement printed before the first step."""
        batch = (f"batch_size {self.batch_size} x accumulation_steps {self.accumulation_steps} = "
                 f"{self.per_process_batch} windows")
        if self.processes is None:
            return [f"plan: {self.what} (Kronos-{self.model_size}), {batch} per process and optimizer step; the "
                    f"process count is elastic, so steps per epoch are known only once torchrun starts", *self.notes]
        if self.processes == 1:
            effective = f"effective batch {self.global_batch} windows per optimizer step ({batch})"
        else:
            effective = (f"effective batch {self.global_batch} windows per optimizer step = {self.per_process_batch} "
                         f"per process ({batch}) x {self.processes} processes")
        span = (f"{self.total_steps} optimizer steps = {self.epochs} epoch{'s' if self.epochs != 1 else ''} x "
                f"{self.steps_per_epoch} steps (samples_per_epoch {self.samples_per_epoch} / {self.global_batch})")
        where = f"from step {self.start_step}" + (f", stopping at step {self.end_step}"
                                                  if self.end_step != self.total_steps else "")
        return [f"plan: {self.what} (Kronos-{self.model_size}), {span}, {where}", effective, *self.notes]


def world_size(nproc: int, nnodes: str | None) -> int | None:
    """Processes in total; None when the node count is a range (elastic)."""
    try:
        return nproc * int(nnodes or "1")
    except ValueError:
        return None


def keep_effective_batch(config: TrainConfig, processes: int) -> tuple[TrainConfig, str]:
    """Split the config's effective batch over `processes`: accumulation steps first (same memory per process),
    else the micro-batch; a one-line error when neither divides."""
    if processes == 1:
        return config, ""
    batch, accumulation = config.batch_size, config.accumulation_steps
    if accumulation % processes == 0:
        changed = config.replace(accumulation_steps=accumulation // processes)
        how = f"accumulation_steps {accumulation} -> {accumulation // processes}"
    elif batch % processes == 0:
        changed = config.replace(batch_size=batch // processes)
        how = f"batch_size {batch} -> {batch // processes}"
    else:
        raise KronosTuneError(f"--keep-effective-batch: batch_size {batch} x accumulation_steps {accumulation} "
                              f"does not split evenly over {processes} processes; use an --nproc that divides "
                              f"{batch} or {accumulation}, or leave the flag out")
    return changed, f"--keep-effective-batch: {how}, so {processes} processes keep {batch * accumulation} windows " \
                    f"per optimizer step"


def plan_training(config: TrainConfig, processes: int | None, steps: int | None, start_step: int = 0,
                  resumed: Path | None = None, keep_batch: bool = False) -> tuple[TrainConfig, TrainPlan]:
    """The config this start runs (epochs raised for a --steps past one schedule) and its plan.

    A resumed run keeps its schedule (its optimizer and scheduler state are tied to it), so there --steps
    must lie between the run's step and the end of its schedule."""
    notes: list[str] = []
    if keep_batch and processes is not None:
        config, note = keep_effective_batch(config, processes)
        notes.append(note)
    elif processes is not None and processes > 1:
        notes.append(f"--nproc gives every process the config's batch, so the effective batch is {processes}x the "
                     f"config's {config.batch_size * config.accumulation_steps}; add --keep-effective-batch to "
                     f"keep it")

    def plan_for(current: TrainConfig) -> TrainPlan:
        return TrainPlan(current.what, current.model_size, processes, current.batch_size,
                         current.accumulation_steps, current.samples_per_epoch, current.epochs, start_step, steps,
                         notes)

    plan = plan_for(config)
    per_epoch = plan.steps_per_epoch
    if per_epoch is not None and per_epoch < 1:
        raise KronosTuneError(f"samples_per_epoch {config.samples_per_epoch} is less than one optimizer step of "
                              f"{plan.global_batch} windows on {processes} processes; raise samples_per_epoch or "
                              f"lower the batch (--keep-effective-batch splits it over the processes)")
    total = plan.total_steps
    if resumed is not None and total is not None:
        if start_step >= total:
            raise KronosTuneError(f"--resume {resumed}: that run is complete ({start_step}/{total} steps); there is "
                                  f"nothing to continue, start a new run instead")
        if steps is not None and steps <= start_step:
            raise KronosTuneError(f"--steps {steps}: the run in {resumed} is already at step {start_step} of "
                                  f"{total}; give --steps between {start_step + 1} and {total}, or leave it out to "
                                  f"finish the schedule")
        if steps is not None and steps > total:
            raise KronosTuneError(f"--steps {steps}: the run in {resumed} has a schedule of {total} steps "
                                  f"({config.epochs} epoch{'s' if config.epochs != 1 else ''} x {per_epoch}), which a resumed run cannot extend; "
                                  f"leave --steps out to finish it, or start a new run with --steps {steps}")
    elif steps is not None and total is not None and per_epoch and steps > total:
        epochs = math.ceil(steps / per_epoch)
        notes.append(f"--steps {steps} is past the schedule of {total} steps ({config.epochs} epoch"
                     f"{'s' if config.epochs != 1 else ''} x {per_epoch}): epochs raised to {epochs}, so the "
                     f"learning-rate schedule spans {epochs * per_epoch} steps and this start stops at step {steps} "
                     f"(resumable to the end)")
        config = config.replace(epochs=epochs)
        plan = plan_for(config)
    return config, plan


# Run folders --------------------------------------------------------------------------------------------------

def run_label(preset: str | None, config_file: Path | None) -> str:
    """The folder label: the preset's name, else the config file's name without .toml."""
    if preset:
        return preset
    return Path(config_file).stem if config_file is not None else "run"


def identity(config: TrainConfig, source: str) -> dict[str, Any]:
    return {"what": config.what, "model_size": config.model_size, "source": source}


def comparable(config: TrainConfig) -> dict[str, Any]:
    """The config without where it writes: two starts with equal values train the same run."""
    values = config.to_dict()
    values.pop("output_dir", None)
    return values


def checkpoint_step(folder: Path) -> int:
    """The optimizer step of the run's last checkpoint (0 when it has none)."""
    from kronos_core.train.train_state import checkpoint_path, load_checkpoint

    if not checkpoint_path(folder).is_file():
        return 0
    return int(load_checkpoint(folder)["step"])


def run_step(folder: Path) -> int:
    """Where a resume of `folder` continues: the step run.json recorded when the run ended, else the checkpoint's
    (a run killed outright never recorded its end)."""
    stored = read_run_file(folder) or {}
    if stored.get("status") != "running" and isinstance(stored.get("step"), int):
        return stored["step"]
    return checkpoint_step(folder)


def check_resume_folder(folder: Path) -> None:
    """A one-line error naming what is wrong with a --resume folder (before anything is built)."""
    if not folder.exists():
        raise KronosTuneError(f"--resume {folder}: no such folder; give the output folder a training run printed "
                              f"(e.g. runs/train/<name>-<time>)")
    from kronos_core.train.train_state import CHECKPOINT_DIR, LAST_NAME, checkpoint_path  # torch: once it exists

    if not folder.is_dir():
        raise KronosTuneError(f"--resume {folder}: that is a file; give the run's folder (it holds config.toml and "
                              f"{CHECKPOINT_DIR}/{LAST_NAME})")
    stored = read_run_file(folder)
    if stored is not None and stored.get("command") != COMMAND:
        raise KronosTuneError(f"--resume {folder}: that folder holds a '{stored.get('command')}' run, not a training "
                              f"run; give the folder `kronos-tune train` printed")
    running = still_running(stored or {})
    if running is not None:
        raise KronosTuneError(f"--resume {folder}: that run is still training (process {running}); stop it first "
                              f"(Ctrl-C saves a checkpoint) or wait for it to end")
    if not (folder / "config.toml").is_file():
        raise KronosTuneError(f"--resume {folder}: no config.toml there, so it is not a training run's folder; give "
                              f"the folder `kronos-tune train` printed")
    if not checkpoint_path(folder).is_file():
        raise KronosTuneError(f"--resume {folder}: no checkpoint yet ({CHECKPOINT_DIR}/{LAST_NAME}): the run "
                              f"stopped before its first save; start it again with --out {folder} --overwrite")


def adopt_legacy_run(folder: Path, config: TrainConfig, source: str) -> None:
    """A run written before run folders had a run.json: record it as a (cancelled) training run."""
    if read_run_file(folder) is None and (folder / "config.toml").is_file():
        RunDir(folder, COMMAND, identity(config, source), "new").mark("cancelled", adopted=True)


def claim_train_dir(folder: Path, config: TrainConfig, source: str, *, resume: bool, overwrite: bool,
                    flag: str = "--out", processes: int | None = 1, what: str | None = None) -> RunDir:
    """Claim `folder` for this run (new, resumed or overwritten) and mark it running. `what`: "both" for the
    folder holding a tokenizer and a predictor stage."""
    wanted = identity(config, source)
    if what is not None:
        wanted["what"] = what
    run = claim_run_dir(folder, COMMAND, wanted, resume=resume, overwrite=overwrite, flag=flag, same=("what",))
    run.mark("running", processes=processes, pid=os.getpid(), host=socket.gethostname())
    return run


def still_running(stored: dict[str, Any]) -> int | None:
    """The pid of the process that is still training this run on this machine, else None."""
    pid = stored.get("pid")
    if stored.get("status") != "running" or not isinstance(pid, int) or stored.get("host") != socket.gethostname():
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def find_resumable(root: Path | str, label: str, config: TrainConfig, processes: int | None) -> Path | None:
    """The newest cancelled run in root/train/<label>-*/ with the same config and process count."""
    parent = Path(root) / COMMAND
    if not parent.is_dir():
        return None
    wanted = comparable(config)
    candidates = sorted((p for p in parent.glob(f"{label}-*") if p.is_dir()), key=os.path.getmtime, reverse=True)
    for folder in candidates:
        stored = read_run_file(folder)
        if not stored or stored.get("command") != COMMAND or stored.get("status") != "cancelled":
            continue
        if stored.get("processes", 1) != processes or not (folder / "config.toml").is_file():
            continue
        try:
            theirs = TrainConfig.from_toml(folder / "config.toml")
        except Exception:  # noqa: BLE001 - an unreadable config is simply not a match
            continue
        if comparable(theirs) == wanted:
            from kronos_core.train.train_state import checkpoint_path

            if checkpoint_path(folder).is_file():
                return folder
    return None


@dataclass
class Start:
    """Where this start writes and how: a new folder, a resumed run, or an overwritten one."""

    folder: Path
    resume: Path | None  # the folder the Trainer resumes from
    flag: str  # which option named the folder (for errors)
    overwrite: bool
    why: str  # the line that announces the folder


def choose_folder(label: str, config: TrainConfig, processes: int | None, steps: int | None,
                  resume: Path | None, out: Path | None, overwrite: bool, new_run: bool) -> Start:
    """--resume DIR, --out DIR, the newest cancelled run with the same config (continued), or a fresh folder."""
    if resume is not None:
        return Start(resume, resume, "--resume", False, f"resuming {resume}")
    if out is not None:
        return Start(out, None, "--out", overwrite, f"output: {out}" + (" (replacing the run there)"
                                                                         if overwrite and out.exists() else ""))
    if not new_run and not overwrite:
        found = find_resumable(RUNS_ROOT, label, config, processes)
        if found is not None and (steps is None or steps > run_step(found)):
            return Start(found, found, "--resume", False, f"continuing the cancelled run in {found} (add "
                                                            f"--new-run to start over in a new folder)")
    folder = default_run_dir(COMMAND, label, root=RUNS_ROOT)
    return Start(folder, None, "--out", False, f"output: {folder}")


def partial_config_note(config_file: Path) -> str | None:
    """The first line of a recommended.toml written by a partial (cancelled) benchmark, or None."""
    try:
        with open(config_file, encoding="utf-8") as handle:
            first = handle.readline().strip()
    except OSError:
        return None
    return first if first.startswith(PARTIAL_MARK) else None


def finish_status(interrupted: bool, step: int, total_steps: int) -> str:
    """run.json status at the end: cancelled (Ctrl-C/cancel), complete, or partial (stopped at --steps)."""
    if interrupted:
        return "cancelled"
    return "complete" if step >= total_steps else "partial"
