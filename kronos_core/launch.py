"""Start a module on N processes (and nodes) with torchrun, stream its events, stop every rank together.

    spec = LaunchSpec(nproc=2)
    command = torchrun_command(spec, "kronos_core.predict_sharded", ["job.json"])
    result = run_launch(command, on_event=print, stop_file=Path("STOP"))

- `torchrun_command` builds `python -m torch.distributed.run` for one node
  (`--standalone`: a free port, so runs side by side never collide) or for
  several (`--nnodes`, `--node-rank`, `--rdzv-endpoint/-id/-backend`), always
  with `--max-restarts 0`: a rank that dies makes torchrun's agent stop the
  others and exit non-zero instead of restarting the job.
- `run_launch` runs it in its own session (process group), reads its merged
  stdout/stderr line by line, hands lines that start with EVENT_PREFIX to
  `on_event` as dicts (workers print them with `emit_event`) and the rest to
  `on_line`. It stops the whole group (SIGTERM, then SIGKILL after a grace
  period) on SIGINT/SIGTERM to this process, when `stop_file` appears, or
  when `should_stop()` says so; and whatever happened, no worker outlives it.

Used by `kronos-tune predict --nproc` and the predict protocol's sharding
trial; `kronos-tune train --nproc` and the DDP trial can adopt it the same way
(their workers print their JSON lines through `emit_event`).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_core.errors import KronosError

EVENT_PREFIX = "@kronos-event "
TAIL_LINES = 20


@dataclass(frozen=True)
class LaunchSpec:
    """Processes on this node and, for several nodes, torchrun's rendezvous."""

    nproc: int = 1
    nnodes: str | None = None          # "2" or "MIN:MAX"
    node_rank: int | None = None
    rdzv_endpoint: str | None = None   # HOST:PORT, the same on every node
    rdzv_id: str | None = None
    rdzv_backend: str | None = None    # default c10d

    @property
    def multi_node(self) -> bool:
        return self.nnodes is not None and self.nnodes != "1"

    @property
    def launched(self) -> bool:
        """Whether this asks for torchrun at all (more than one process, or any multi-node flag)."""
        return self.nproc > 1 or self.multi_node or self.rdzv_endpoint is not None or self.node_rank is not None


def torchrun_command(spec: LaunchSpec, module: str, args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The torchrun command line that runs `python -m module *args` on every rank."""
    if spec.nproc < 1:
        raise KronosError(f"--nproc {spec.nproc}: must be at least 1")
    command = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(spec.nproc), "--max-restarts", "0"]
    rendezvous = ["--rdzv-backend", spec.rdzv_backend or "c10d", "--rdzv-id", spec.rdzv_id or "kronos"]
    if spec.multi_node:
        if not spec.rdzv_endpoint:
            raise KronosError(f"--nnodes {spec.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node, "
                              f"e.g. the first node's address:29400)")
        command += ["--nnodes", spec.nnodes, "--rdzv-endpoint", spec.rdzv_endpoint, *rendezvous]
        if spec.node_rank is not None:
            command += ["--node-rank", str(spec.node_rank)]
    elif spec.rdzv_endpoint:
        command += ["--rdzv-endpoint", spec.rdzv_endpoint, *rendezvous]
    else:
        command += ["--standalone"]
    return command + ["-m", module, *args]


def emit_event(kind: str, **fields: Any) -> None:
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

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.stopped

    def error_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "error"]


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def run_launch(command: Sequence[str], on_event: Callable[[dict[str, Any]], None] | None = None,
               on_line: Callable[[str], None] | None = None, stop_file: Path | None = None,
               should_stop: Callable[[], bool] | None = None, env: dict[str, str] | None = None,
               grace_s: float = 10.0, poll_s: float = 0.2, cwd: Path | None = None) -> LaunchResult:
    """Run `command` in its own session and stream it (see the module doc)."""
    environment = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               bufsize=1, start_new_session=True, env=environment, cwd=cwd)
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

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, request) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop_sent_at: float | None = None
    exited_at: float | None = None
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
            wants_stop = bool(requested) or (stop_file is not None and stop_file.exists()) or \
                (should_stop is not None and should_stop())
            if wants_stop and stop_sent_at is None and process.poll() is None:
                result.stopped = True
                stop_sent_at = time.monotonic()
                _signal_group(process, signal.SIGTERM)
            if stop_sent_at is not None and time.monotonic() - stop_sent_at > grace_s:
                _signal_group(process, signal.SIGKILL)
            if process.poll() is not None and not finished:
                # torchrun is gone but something still holds the pipe open: a stray worker.
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > grace_s:
                    _signal_group(process, signal.SIGKILL)
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
        _signal_group(process, signal.SIGKILL)  # no worker outlives the launch, whatever happened
        process.wait()
    return result
