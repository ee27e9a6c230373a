"""A training start's run folder: which one it takes, and what run.json says of it.

- `choose_folder`: --resume DIR, --out DIR, the newest cancelled run with the same config (continued), or a
  fresh `runs/train/<label>-<time>/`; `find_resumable` finds that cancelled run (`resumable` means exactly
  that).
- `claim_train_dir` takes the folder through `kronos_tune.runs` (never a folder holding another run) and marks
  it running; `finish_status` is the status it ends with.
- `check_resume_folder` names what is wrong with a --resume folder before anything is built.

What the start will do (steps, epochs, effective batch) is kronos_tune.train.schedule.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_core.train import TrainConfig
from kronos_tune.errors import KronosTuneError
from kronos_tune.runs import RunDir, claim_run_dir, default_run_dir, read_run_file

if TYPE_CHECKING:
    from kronos_core.train.train_file import TrainFile

COMMAND = "train"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PARTIAL_MARK = "# partial"
RUNS_ROOT = Path("runs")  # relative: run folders land under the current directory


def run_label(preset: str | None, config_file: Path | None, job: TrainFile | None = None) -> str:
    """The folder label: the preset's name, else an upstream file's experiment name, else the config file's name
    without its suffix."""
    if preset:
        return preset
    if job is not None and job.label and _NAME.fullmatch(str(job.label)):
        return str(job.label)
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
    if (folder / "phases.toml").is_file():  # a two-phase run: each phase folder is judged when it is reached
        return
    if not (folder / "config.toml").is_file():
        raise KronosTuneError(f"--resume {folder}: no config.toml there, so it is not a training run's folder; give "
                              f"the folder `kronos-tune train` printed")
    if not checkpoint_path(folder).is_file():
        raise KronosTuneError(f"--resume {folder}: no checkpoint yet ({CHECKPOINT_DIR}/{LAST_NAME}): the run "
                              f"stopped before its first save; start it again with --out {folder} --overwrite")


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
