"""Start a module on N processes (and nodes) with torchrun, stream its events, stop every rank together.

    spec = LaunchSpec(nproc=2)
    command = torchrun_command(spec, "kronos_tune.predict.ranks", ["job.json"])
    result = run_launch(command, on_event=print, stop_file=Path("STOP"))

- `torchrun_command` builds `python -m torch.distributed.run` for one node
  (`--standalone`: a free port, so runs side by side never collide) or for
  several (`--nnodes`, `--node-rank`, `--rdzv-endpoint/-id/-backend`), always
  with `--max-restarts 0` unless the spec asks for restarts: a rank that dies
  makes torchrun's agent stop the others and exit non-zero (or, with restarts
  left, start the whole group again).
- `torchrun_env(spec)` is what torchrun's environment needs besides ours:
  with restarts, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1. Since torch 2.4 the
  c10d rendezvous hands every attempt's workers the same TCPStore (the
  agent's) with no per-attempt prefix, so a restarted group's
  init_process_group can read the failed attempt's keys (gloo's addresses:
  "Connection refused" or a wait that lasts the group's timeout;
  pytorch/pytorch#135712). With that switch, torch's own, each rendezvous
  round publishes a fresh port and rank 0 hosts a store for its attempt
  only; the round is the same on every node, unlike
  TORCHELASTIC_RESTART_COUNT, which each node's agent counts for itself.
- `launch_command` is torchrun_command when the spec asks for torchrun, else
  a plain `python -m module *args` (one process, the same events and stops).
- `run_launch` runs it in its own session (process group), reads its
  stdout (and stderr, unless `stderr_file` takes it) line by line, hands
  lines that start with EVENT_PREFIX to `on_event` as dicts (workers print
  them with `emit_event`) and the rest to `on_line`. It stops the whole group
  (SIGTERM, then SIGKILL after a grace period) on SIGINT/SIGTERM to this
  process, when `stop_file` appears, or when `should_stop()` says so. Past
  `timeout_s` (a watchdog), or past the monotonic time `deadline()` returns
  (read at every poll, so a caller can move it for each unit of work it hands
  a long-lived worker), it calls `before_kill(pid)` (e.g. to ask for stack
  dumps) and kills the tree outright. Whatever happened, no process of the
  tree outlives it (its session and every descendant, even one that left it).
  Workers treat SIGTERM as "stop at the next step boundary" (stop_on_signals).

Used by `kronos-tune train --nproc`, `kronos-tune predict --nproc` and every
benchmark trial (train, DDP, predict).
"""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from kronos_core.errors import KronosError
from kronos_core.signals import STOP_SIGNALS, record_stop_signal

EVENT_PREFIX = "@kronos-event "
TAIL_LINES = 80  # enough for torchrun's failure summary of a few ranks (7 lines each, 9 around them)
TREE_SCAN_S = 1.0  # how often the process tree is listed (psutil reads /proc)
# torchrun sets these for its workers; inherited from a parent that is itself a rank, they would make a plain
# worker join a process group that is not its own
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


@dataclass(frozen=True)
class LaunchSpec:
    """Processes on this node and, for several nodes, torchrun's rendezvous."""

    nproc: int = 1
    nnodes: str | None = None          # "2" or "MIN:MAX"
    node_rank: int | None = None
    rdzv_endpoint: str | None = None   # HOST:PORT, the same on every node
    rdzv_id: str | None = None
    rdzv_backend: str | None = None    # default c10d
    max_restarts: int = 0              # torchrun restarts the whole group this many times after a failure

    @property
    def multi_node(self) -> bool:
        return self.nnodes is not None and self.nnodes != "1"

    @property
    def launched(self) -> bool:
        """Whether this asks for torchrun at all (more than one process, or any multi-node flag)."""
        return self.nproc > 1 or self.multi_node or self.rdzv_endpoint is not None or self.node_rank is not None


def check_launch(spec: LaunchSpec) -> None:
    """The launch flags torchrun cannot run with, in one line (a command checks them before it writes anything)."""
    if spec.nproc < 1:
        raise KronosError(f"--nproc {spec.nproc}: must be at least 1")
    if spec.multi_node and not spec.rdzv_endpoint:
        raise KronosError(f"--nnodes {spec.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node, "
                          f"e.g. the first node's address:29400)")


def torchrun_command(spec: LaunchSpec, module: str, args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The torchrun command line that runs `python -m module *args` on every rank."""
    check_launch(spec)
    command = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(spec.nproc), "--max-restarts",
               str(spec.max_restarts)]
    rendezvous = ["--rdzv-backend", spec.rdzv_backend or "c10d", "--rdzv-id", spec.rdzv_id or "kronos"]
    if spec.multi_node:
        command += ["--nnodes", spec.nnodes, "--rdzv-endpoint", spec.rdzv_endpoint, *rendezvous]
        if spec.node_rank is not None:
            command += ["--node-rank", str(spec.node_rank)]
    elif spec.rdzv_endpoint:
        command += ["--rdzv-endpoint", spec.rdzv_endpoint, *rendezvous]
    else:
        command += ["--standalone"]
    return command + ["-m", module, *args]


def torchrun_env(spec: LaunchSpec) -> dict[str, str]:
    """Environment for the torchrun of `spec` (for run_launch's `env`): a store of its own for each attempt of
    a group that torchrun may restart (see the module doc)."""
    return {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if spec.max_restarts > 0 else {}


def launch_command(spec: LaunchSpec, module: str, args: Sequence[str], python: str = sys.executable) -> list[str]:
    """torchrun when `spec` asks for it, else one plain process running `python -m module *args`."""
    if spec.launched:
        return torchrun_command(spec, module, args, python)
    return [python, "-m", module, *args]


def emit_event(kind: str, /, **fields: Any) -> None:
    """Print one event line for the launcher (one write, so ranks' lines do not interleave mid-line)."""
    sys.stdout.write(EVENT_PREFIX + json.dumps({"event": kind, **fields}, default=str) + "\n")
    sys.stdout.flush()


def parse_event(line: str) -> dict[str, Any] | None:
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        event = json.loads(line[len(EVENT_PREFIX):])
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


@dataclass
class LaunchResult:
    returncode: int
    stopped: bool                     # we stopped it (signal, stop file, should_stop)
    events: list[dict[str, Any]] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)  # last plain lines, for error messages
    timed_out: bool = False           # killed past timeout_s
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.stopped and not self.timed_out

    def error_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "error"]


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (empty when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_tree(pid: int, processes: list[psutil.Process] | None = None) -> None:
    """SIGKILL the session led by `pid` and every descendant, also one that started a session of its own."""
    processes = process_tree(pid) if processes is None else processes
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


def run_launch(command: Sequence[str], on_event: Callable[[dict[str, Any]], None] | None = None,
               on_line: Callable[[str], None] | None = None, stop_file: Path | None = None,
               should_stop: Callable[[], bool] | None = None, env: dict[str, str] | None = None,
               grace_s: float = 10.0, poll_s: float = 0.2, cwd: Path | None = None, *,
               stderr_file: Path | None = None, timeout_s: float | None = None,
               before_kill: Callable[[int], None] | None = None, catch_signals: bool = True,
               deadline: Callable[[], float | None] | None = None) -> LaunchResult:
    """Run `command` in its own session and stream it (see the module doc). `catch_signals=False` leaves
    SIGINT/SIGTERM to the caller's own handlers (which then stop the launch through `should_stop`)."""
    inherited = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    environment = {**inherited, **(env or {}), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    if stderr_file is not None:
        with open(stderr_file, "w", encoding="utf-8") as stderr:
            process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                       text=True, bufsize=1, start_new_session=True, env=environment, cwd=cwd)
    else:
        process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, text=True, bufsize=1, start_new_session=True,
                                   env=environment, cwd=cwd)
    tree: list[psutil.Process] = []  # every process seen in the tree, so that none escapes the final kill
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    result = LaunchResult(returncode=0, stopped=False)
    requested: list[int] = []

    def request(signum: int, frame: Any) -> None:
        requested.append(signum)
        record_stop_signal(signum)

    handlers = {}
    if catch_signals and threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, request) for sig in STOP_SIGNALS}
    stop_sent_at: float | None = None
    exited_at: float | None = None
    scanned_at = -math.inf
    killed = False

    def remember_tree() -> None:
        seen = {p.pid for p in tree}
        tree.extend(p for p in process_tree(process.pid) if p.pid not in seen)

    def kill_all() -> None:
        nonlocal killed
        if process.poll() is None:
            remember_tree()
        kill_tree(process.pid, tree)
        killed = True
    try:
        finished = False
        while not finished:
            try:
                line = lines.get(timeout=poll_s)
            except queue.Empty:
                line = ""
            if line is None:
                finished = True
            elif line:
                event = parse_event(line)
                if event is not None:
                    result.events.append(event)
                    if on_event is not None:
                        on_event(event)
                else:
                    result.tail = (result.tail + [line])[-TAIL_LINES:]
                    if on_line is not None:
                        on_line(line)
            if process.poll() is None and time.monotonic() - scanned_at > TREE_SCAN_S:
                scanned_at = time.monotonic()
                remember_tree()
            late = timeout_s is not None and time.monotonic() - started > timeout_s
            if deadline is not None and not late:
                limit = deadline()
                late = limit is not None and time.monotonic() > limit
            if late and not result.timed_out and process.poll() is None:
                result.timed_out = True
                if before_kill is not None:
                    before_kill(process.pid)
                kill_all()
            wants_stop = bool(requested) or (stop_file is not None and stop_file.exists()) or \
                (should_stop is not None and should_stop())
            if wants_stop and stop_sent_at is None and process.poll() is None and not result.timed_out:
                result.stopped = True
                stop_sent_at = time.monotonic()
                _signal_group(process, signal.SIGTERM)
            if stop_sent_at is not None and time.monotonic() - stop_sent_at > grace_s and not killed:
                kill_all()
            if process.poll() is not None and not finished:
                # torchrun is gone but something still holds the pipe open: a stray worker.
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > grace_s and not killed:
                    kill_all()
        result.returncode = process.wait()
    finally:
        for sig, previous in handlers.items():
            signal.signal(sig, previous)
        if process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        kill_tree(process.pid, tree)  # no worker outlives the launch, whatever happened
        process.wait()
        reader.join(timeout=5)
        result.elapsed_s = time.monotonic() - started
    return result


def reported(rank: int, work: Callable[[], None]) -> int:
    """Run a rank's work; an error becomes one `error` event (torchrun stops the other ranks) and the exit
    code: 2 for a KronosError (a user's problem, its own message), 1 for anything else."""
    try:
        work()
        return 0
    except KronosError as error:
        emit_event("error", rank=rank, message=str(error))
        return 2
    except BaseException as error:  # noqa: BLE001 - reported as one line; torchrun stops the other ranks
        lines = traceback.format_exception_only(type(error), error)
        emit_event("error", rank=rank, message=" ".join(lines[-1].split())[:300])
        return 1


def rank_main(module: str, run: Callable[[Path], int], argv: list[str] | None = None) -> int:
    """`python -m module WORK/job.json` as torchrun starts it on every rank."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {module} WORK/job.json (started by torchrun)", file=sys.stderr)
        return 2
    return run(Path(args[0]))
