"""Run one trial's process under a watchdog, and stop it for good when asked.

A trial is a child process in a session of its own (torchrun and its ranks,
DataLoader workers, compile workers: the whole tree). ``run_watched`` reads its
stdout lines on a thread and hands them to the caller on the calling thread,
polls a cancel event, and enforces a deadline:

- past the deadline, every trial-worker process of the tree is asked (SIGUSR1)
  to write the stack of each of its threads into ``stack_file`` (faulthandler,
  registered by the worker and inherited by the loader workers it forks), then
  the whole tree is killed: the trial is a ``timeout``;
- on cancel (Ctrl-C, SIGTERM, the dashboard's stop) the stop file asks the
  ranks to stop at the next step boundary; after ``grace_s`` the tree is
  killed, whatever it is doing.

Children that ignore SIGTERM (a hung NCCL or CUDA call, a deadlocked loader)
are killed with SIGKILL: nothing here waits on the child's cooperation.
"""

from __future__ import annotations

import datetime
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

WORKER_MARK = "kronos_tune.protocol.trial_worker"
LAUNCHER_MARK = "torch.distributed.run"
STACK_WAIT_S = 2.0


@dataclass
class Outcome:
    code: int | None
    timed_out: bool = False
    cancelled: bool = False
    elapsed_s: float = 0.0


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def dump_stacks(pid: int, stack_file: Path, why: str) -> list[int]:
    """Ask every trial-worker process under `pid` for its threads' stacks (written to stack_file)."""
    processes = _tree(pid)
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
        if WORKER_MARK in line and LAUNCHER_MARK not in line:
            try:
                process.send_signal(signal.SIGUSR1)
                signalled.append(process.pid)
            except psutil.NoSuchProcess:
                pass
    return signalled


def kill_tree(pid: int) -> None:
    """SIGKILL the process, its session and every descendant (whatever they ignore)."""
    processes = _tree(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=5)


def run_watched(command: list[str], env: dict[str, str], stderr_path: Path, on_line: Callable[[str], None],
                cancel: threading.Event, timeout_s: float, stack_file: Path, stop_file: Path,
                grace_s: float = 3.0, poll_s: float = 0.1) -> Outcome:
    """Run `command` in its own session until it exits, passes `timeout_s`, or `cancel` is set."""
    started = time.perf_counter()
    lines: queue.Queue[str | None] = queue.Queue()
    with open(stderr_path, "w", encoding="utf-8") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, text=True,
                                env=env, start_new_session=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True, name="trial-stdout")
    reader.start()
    outcome = Outcome(code=None)
    cancel_at: float | None = None

    def drain() -> None:
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                on_line(line)

    try:
        while proc.poll() is None:
            drain()
            now = time.perf_counter()
            if cancel.is_set() and cancel_at is None:
                stop_file.touch()
                cancel_at = now
            if cancel_at is not None and now - cancel_at >= grace_s:
                outcome.cancelled = True
                kill_tree(proc.pid)
                break
            if now - started > timeout_s:
                outcome.timed_out = True
                dump_stacks(proc.pid, stack_file, f"watchdog: the trial passed its {timeout_s:g} s limit")
                time.sleep(STACK_WAIT_S)
                kill_tree(proc.pid)
                break
            time.sleep(poll_s)
    finally:
        if proc.poll() is None:  # an exception (a second Ctrl-C) on our side: never leave the tree behind
            kill_tree(proc.pid)
        outcome.code = proc.wait()
        reader.join(timeout=5)
        drain()
        outcome.cancelled = outcome.cancelled or (cancel_at is not None and not outcome.timed_out)
        outcome.elapsed_s = time.perf_counter() - started
    return outcome
