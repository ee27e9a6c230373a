"""Run one trial's process through the shared launcher (kronos_core.launch) under a watchdog.

A trial is a child process in a session of its own (torchrun and its ranks,
DataLoader workers, compile workers: the whole tree), started by
``run_launch`` like every other launch. ``run_watched`` adds what only the
benchmark needs:

- past the deadline, every trial-worker process of the tree is asked (SIGUSR1)
  to write the stack of each of its threads into ``stack_file`` (faulthandler,
  registered by the worker and inherited by the loader workers it forks), then
  the launcher kills the whole tree: the trial is a ``timeout``;
- on cancel (Ctrl-C, SIGTERM, the dashboard's stop) the launcher's stop:
  SIGTERM to the group, which the workers take as "stop after this step";
  after ``grace_s`` the tree is killed, whatever it is doing.

Children that ignore SIGTERM (a hung NCCL or CUDA call, a deadlocked loader)
are killed with SIGKILL: nothing here waits on the child's cooperation.
"""

from __future__ import annotations

import datetime
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from kronos_core.launch import LaunchSpec, launch_command, process_tree, run_launch

WORKER_MODULE = "kronos_tune.benchmark.run.trial_worker"
LAUNCHER_MARK = "torch.distributed.run"
STACK_WAIT_S = 2.0


@dataclass
class Outcome:
    code: int | None
    timed_out: bool = False
    cancelled: bool = False
    elapsed_s: float = 0.0


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def dump_stacks(pid: int, stack_file: Path, why: str) -> list[int]:
    """Ask every trial-worker process under `pid` for its threads' stacks (written to stack_file)."""
    processes = process_tree(pid)
    with open(stack_file, "a", encoding="utf-8") as handle:
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        handle.write(f"=== {stamp} {why}\n=== process tree:\n")
        for process in processes:
            handle.write(f"===   pid {process.pid}: {_cmdline(process)[:300]}\n")
        handle.write("=== the stacks of every thread of each trial worker (and its loader workers) follow; "
                     "faulthandler does not print the pid, so blocks come in signal order\n")
    signalled = []
    for process in processes:
        line = _cmdline(process)
        if WORKER_MODULE in line and LAUNCHER_MARK not in line:
            try:
                process.send_signal(signal.SIGUSR1)
                signalled.append(process.pid)
            except psutil.NoSuchProcess:
                pass
    return signalled


def run_watched(command: list[str], stderr_path: Path, on_event: Callable[[dict[str, Any]], None],
                cancel: threading.Event, timeout_s: float, stack_file: Path, grace_s: float = 3.0,
                poll_s: float = 0.1, deadline: Callable[[], float | None] | None = None) -> Outcome:
    """Run `command` through the launcher until it exits, passes `timeout_s`, or `cancel` is set. With
    `deadline` (a long-lived worker of the paired design) the limit is the monotonic time it returns instead,
    which the caller moves for each unit of work (warm-up, every block)."""

    def stacks_then_kill(pid: int) -> None:
        dump_stacks(pid, stack_file, f"watchdog: the trial passed its {timeout_s:g} s limit")
        time.sleep(STACK_WAIT_S)

    result = run_launch(command, on_event=on_event, should_stop=cancel.is_set, grace_s=grace_s, poll_s=poll_s,
                        stderr_file=stderr_path, timeout_s=None if deadline is not None else timeout_s,
                        before_kill=stacks_then_kill, catch_signals=False,  # the runner's own handlers set `cancel`
                        deadline=deadline)
    return Outcome(code=result.returncode, timed_out=result.timed_out, cancelled=result.stopped,
                   elapsed_s=result.elapsed_s)


def launch_trial(trial: str, processes: int, work: Path, job: dict[str, Any],
                 on_event: Callable[[dict[str, Any]], None], cancel: threading.Event, timeout_s: float,
                 stack_file: Path, deadline: Callable[[], float | None] | None = None) -> Outcome:
    """Write `job` to work/job.json and run it in trial_worker processes (torchrun for 2+) under the watchdog;
    the stack file is removed again when nothing was dumped into it."""
    job_file = work / "job.json"
    job_file.write_text(json.dumps({**job, "trial": trial, "stack_file": str(stack_file)}), encoding="utf-8")
    command = launch_command(LaunchSpec(nproc=processes), WORKER_MODULE, ["--job", str(job_file)])
    outcome = run_watched(command, work / "stderr.txt", on_event, cancel, timeout_s, stack_file, deadline=deadline)
    if not outcome.timed_out and stack_file.is_file() and stack_file.stat().st_size == 0:
        stack_file.unlink()  # nothing was dumped: the trial ended on its own
    return outcome


def timeout_reason(timeout_s: float, stack_file: Path) -> str:
    return (f"no result after {timeout_s:g} s (the watchdog); its processes were killed and the stacks "
            f"of every thread saved in {stack_file}")


def stderr_tail(work: Path) -> str:
    """The last error line a trial process wrote to work/stderr.txt (its last line when none says error)."""
    path = work / "stderr.txt"
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    errors = [line for line in text.splitlines() if line.strip()]
    last = next((line for line in reversed(errors) if "Error" in line or "error" in line),
                errors[-1] if errors else "")
    return last.strip()[:300]


def raise_for_exit(outcome: Outcome, work: Path) -> None:
    """A trial process that left no result: cancelled (KeyboardInterrupt) or crashed (its last error line)."""
    if outcome.cancelled:
        raise KeyboardInterrupt
    raise RuntimeError(f"the trial's process exited with code {outcome.code}: {stderr_tail(work)}")
