"""The command that continues an interrupted run, printed by every command that can be resumed.

It is the run's own command line (kept in run.json as ``argv`` by ``claim_run_dir``, or this process's) with
the flags that chose or replaced the folder taken out and each command's resume flags put in:

    benchmark, backtest:  ... --resume --out FOLDER
    predict:              ... --resume            (the same --out FILE: its work folder sits beside it)
    train:                ... --resume FOLDER     (the run's config.toml holds the workload; --steps goes
                                                   too, or the stop it made would be made again)
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

PROGRAM = "kronos-tune"

# flags that take a value, and bare flags, a resumed run must not be given again
_VALUED = {"benchmark": ("--out",), "backtest": ("--out",), "predict": (),
           "train": ("--out", "--resume", "--preset", "--config", "--steps")}
_BARE = {"benchmark": ("--resume", "--overwrite"), "backtest": ("--resume", "--overwrite"),
         "predict": ("--resume", "--overwrite"), "train": ("--overwrite", "--new-run")}


def _without(args: Sequence[str], valued: tuple[str, ...], bare: tuple[str, ...]) -> list[str]:
    kept: list[str] = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        name = arg.split("=", 1)[0]
        if arg in valued:
            skip_next = True
        elif name in valued or arg in bare:
            continue
        else:
            kept.append(arg)
    return kept


def resume_argv(command: str, argv: Sequence[str], folder: str | Path) -> list[str]:
    """`argv` (the program name, the command, its flags) as the command line that continues the run in
    `folder`. A train run of both stages continues the stage in `folder`, so its --what goes too."""
    if command not in _VALUED:
        raise ValueError(f"{command}: not a command that resumes")
    args = list(argv[2:]) if len(argv) >= 2 and argv[1] == command else []
    valued = _VALUED[command] + (("--what",) if command == "train" else ())
    kept = _without(args, valued, _BARE[command])
    tail = {"benchmark": ["--resume", "--out", str(folder)], "backtest": ["--resume", "--out", str(folder)],
            "predict": ["--resume"], "train": ["--resume", str(folder)]}[command]
    return [PROGRAM, command, *kept, *tail]


def resume_command(command: str, argv: Sequence[str], folder: str | Path) -> str:
    """resume_argv as one line a shell reads back the same (paths with spaces quoted)."""
    return shlex.join(resume_argv(command, argv, folder))


def resume_line(command: str, folder: str | Path, fallback: Sequence[str] | None = None) -> str | None:
    """The command that continues the run in `folder`, from the command line its run.json keeps, else this
    process's, else `fallback` (a Python caller: the flags that name the job; None: no command is known)."""
    from kronos_tune.runs import recorded_command_line

    argv = recorded_command_line(folder)
    if argv is None or argv[1:2] != [command]:
        if fallback is None:
            return None
        argv = [PROGRAM, command, *fallback]
    return resume_command(command, argv, folder)
