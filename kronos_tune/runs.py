"""Run folders: where a command's results land, and the rule that no run overwrites another.

Every command that produces results writes them into one folder per run:

    runs/<command>/<label>-<YYYYmmdd-HHMMSS>/     (label: "<preset>-<task>", "<preset>", ...)

or into the folder the user names with ``--out``. The folder's ``run.json``
marks it as a kronos-tune run and says which command made it, with what
identity (preset, task, measurement options...) and how it ended
(``running`` | ``complete`` | ``partial`` | ``cancelled`` | ``failed``); a run stopped by a signal
(SIGTERM, or SIGHUP: its terminal closed) is ``cancelled`` with ``stopped_by`` naming it.

``claim_run_dir`` is the one gate every command passes before writing:

- a missing or empty folder is a new run;
- ``resume=True`` continues a run of the same command and identity (anything
  else is a one-line error naming both);
- a folder holding files is never written into otherwise: the error names
  ``--resume`` and ``--overwrite``; ``--overwrite`` replaces only a folder
  that is a kronos-tune run (its run.json says so), never a foreign folder.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_core.cpu_features import detect_cpu_features
from kronos_core.files import write_text_atomic
from kronos_core.signals import stop_signal_name
from kronos_tune.errors import KronosTuneError

RUN_FILE = "run.json"
_command_line: list[str] = []  # this process's `kronos-tune ...` command line, when the CLI started it
MARK = "kronos-tune-run"
RUN_FORMAT = 1  # run.json's layout; a folder written by a build before it (no "format") is not resumed
_OWN_KEYS = ("tool", "format", "command", "identity", "status", "cpu", "updated_at")
STATUSES = ("running", "complete", "partial", "cancelled", "failed")


@functools.cache
def this_cpu() -> str:
    """The CPU this process runs on, in one line (a resumed run records the machine of its latest session)."""
    return detect_cpu_features().summary()


def timestamp(now: datetime.datetime | None = None) -> str:
    return (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")


class RunInterrupted(KeyboardInterrupt):
    """A KeyboardInterrupt (Ctrl-C, or a stop signal made one) that stopped a command after it claimed
    `folder`: the command names the folder and the command line that continues it."""

    def __init__(self, folder: str | os.PathLike) -> None:
        super().__init__(str(folder))
        self.folder = Path(folder)


def remember_command_line(argv: list[str]) -> None:
    """Called by the CLI: each run folder this process claims keeps `argv` in run.json (a resume keeps the
    first), so that an interrupted run can print the command that continues it."""
    _command_line[:] = argv


def recorded_command_line(folder: str | os.PathLike) -> list[str] | None:
    """The command line kept in the folder's run.json, else this process's (None: neither, a Python caller)."""
    argv = (read_run_file(folder) or {}).get("argv")
    if isinstance(argv, list) and all(isinstance(arg, str) for arg in argv):
        return argv
    return list(_command_line) or None


def default_run_dir(command: str, label: str, root: str | os.PathLike = "runs",
                    now: datetime.datetime | None = None) -> Path:
    """A fresh folder name under root/command/ (never an existing one: -2, -3... on a clash)."""
    base = Path(root) / command / f"{label}-{timestamp(now)}"
    candidate, suffix = base, 2
    while candidate.exists():
        candidate = base.with_name(f"{base.name}-{suffix}")
        suffix += 1
    return candidate


def read_run_file(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The folder's run.json as a dict (None when there is none or it is unreadable)."""
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    return data if data.get("tool") == MARK else None


def _describe(data: dict[str, Any]) -> str:
    identity = ", ".join(f"{k} {v}" for k, v in (data.get("identity") or {}).items() if not isinstance(v, dict))
    return f"a '{data.get('command')}' run" + (f" ({identity})" if identity else "")


@dataclass
class RunDir:
    """A claimed run folder. ``mode``: new | resume | overwrite | join (another node's run, see claim_run_dir)."""

    path: Path
    command: str
    identity: dict[str, Any]
    mode: str
    previous: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def resumed(self) -> bool:
        return self.mode == "resume"

    def take_fields_of_other_nodes(self) -> None:
        """Add to this run's fields what other processes recorded in run.json since it was claimed (the ranks
        another node saw in a run of several nodes), keeping this process's own."""
        written = read_run_file(self.path) or {}
        for key, value in written.items():
            if key not in _OWN_KEYS:
                self.extra.setdefault(key, value)

    def mark(self, status: str, **extra: Any) -> None:
        """Record how the run stands now (status and any extra fields) in run.json, atomically."""
        if status not in STATUSES:
            raise ValueError(f"run status {status!r}: use one of {STATUSES}")
        self.extra.update(extra)
        if status == "cancelled" and stop_signal_name() is not None:
            self.extra.setdefault("stopped_by", stop_signal_name())
        data = {"tool": MARK, "format": RUN_FORMAT, "command": self.command, "identity": self.identity,
                "status": status, "cpu": this_cpu(),
                **self.extra, "updated_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        write_text_atomic(self.path / RUN_FILE, json.dumps(data, indent=2, default=str) + "\n")


def _check_writable(folder: Path, flag: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise KronosTuneError(f"{flag} {folder}: cannot write there ({error.strerror or error}); "
                              f"pick a folder you can write to") from None


def claim_run_dir(folder: str | os.PathLike, command: str, identity: dict[str, Any], *, resume: bool = False,
                  overwrite: bool = False, flag: str = "--out",
                  same: tuple[str, ...] | None = None, join: bool = False) -> RunDir:
    """Take `folder` for a run of `command` with `identity`, or raise a one-line KronosTuneError.

    `same`: the identity keys a resumed run must share (default: all of them). `join`: a run of several
    nodes, each started with the same folder: a folder that already holds a running run of this command and
    identity (another node came first) is joined, not refused."""
    path = Path(folder)
    if resume and overwrite:
        raise KronosTuneError("--resume and --overwrite: give one (continue the run, or replace it)")
    existing = read_run_file(path) if path.is_dir() else None
    run = _claim(path, command, identity, existing, resume=resume, overwrite=overwrite, flag=flag, same=same,
                 join=join)
    if _command_line[1:2] == [command]:
        run.extra.setdefault("argv", list(_command_line))
    return run


def _claim(path: Path, command: str, identity: dict[str, Any], existing: dict[str, Any] | None, *, resume: bool,
           overwrite: bool, flag: str, same: tuple[str, ...] | None, join: bool) -> RunDir:
    if (join and not overwrite and existing is not None and existing.get("command") == command
            and existing.get("identity") == identity and existing.get("status") == "running"):
        return RunDir(path, command, identity, "join", existing,
                      extra={k: v for k, v in existing.items() if k not in _OWN_KEYS})
    holds_files = path.is_dir() and any(path.iterdir())
    if path.exists() and not path.is_dir():
        raise KronosTuneError(f"{flag} {path}: that is a file, not a folder; give a folder for the run")
    if resume:
        if not path.is_dir():
            raise KronosTuneError(f"--resume {path}: no such folder; give the folder of the run to continue")
        if existing is None:
            raise KronosTuneError(f"--resume {path}: not a kronos-tune run (no {RUN_FILE}); give the folder a "
                                  f"'{command}' run printed when it started")
        keys = same if same is not None else tuple(identity)
        theirs = existing.get("identity") or {}
        if existing.get("command") != command:
            mine = _describe({"command": command, "identity": {k: identity.get(k) for k in keys}})
            raise KronosTuneError(f"--resume {path}: that folder holds {_describe(existing)}, not {mine}; give "
                                  f"the folder of a matching run or start a new one")
        if existing.get("format") != RUN_FORMAT:
            raise KronosTuneError(f"--resume {path}: an earlier build of kronos-tune wrote that run (run.json has no "
                                  f"format {RUN_FORMAT}), so it is not continued; run it again with --overwrite "
                                  f"or another {flag}")
        differ = [k for k in keys if theirs.get(k) != identity.get(k)]
        if differ:  # only what differs: the whole identity runs to a dozen fields
            changes = "; ".join(f"{k}: {theirs.get(k)!r} there, {identity.get(k)!r} now" for k in differ)
            raise KronosTuneError(f"--resume {path}: that '{command}' run was started with other settings "
                                  f"({changes}); resume with its settings, or start a new run with another {flag}")
        _check_writable(path, flag)
        return RunDir(path, command, identity, "resume", existing,
                      extra={k: v for k, v in existing.items() if k not in _OWN_KEYS})
    if holds_files:
        if not overwrite:
            what = _describe(existing) + f", {existing.get('status', 'status unknown')}" if existing else "files"
            raise KronosTuneError(f"{flag} {path}: the folder already holds {what}; use --resume to continue it, "
                                  f"--overwrite to replace it, or another {flag}")
        if existing is None:
            raise KronosTuneError(f"--overwrite {path}: that folder is not a kronos-tune run (no {RUN_FILE}); "
                                  f"refusing to delete it, give another {flag}")
        shutil.rmtree(path)
    _check_writable(path, flag)
    return RunDir(path, command, identity, "overwrite" if holds_files else "new", existing)
