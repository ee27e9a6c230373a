"""The shared launcher's watchdog and plumbing on real processes (torchrun itself: test_train_ddp.py,
test_predict_sharded.py; the benchmark's stack dumps: test_benchmark_stops.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kronos_core.launch import EVENT_PREFIX, LaunchSpec, launch_command, run_launch
from machine import process_gone


def test_past_the_deadline_the_hook_runs_then_every_process_dies_even_one_in_its_own_session(tmp_path: Path):
    pid_file = tmp_path / "escaped.pid"
    script = (  # ignores SIGTERM, and starts a grandchild in a session of its own (out of the group's reach)
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "import os; print('rank', os.environ.get('RANK'), flush=True)\n"
        f"print({EVENT_PREFIX!r} + '{{\"event\": \"step\", \"step\": 1}}', flush=True)\n"
        "print('to stderr', file=sys.stderr, flush=True)\n"
        "time.sleep(120)\n"
    )
    hooked: list[int] = []
    lines: list[str] = []
    os.environ["RANK"] = "3"  # a stale rank variable must not reach a plain worker
    try:
        result = run_launch([sys.executable, "-c", script], on_line=lines.append, stderr_file=tmp_path / "err.txt",
                            timeout_s=4.0, before_kill=hooked.append, grace_s=2, poll_s=0.05)
    finally:
        del os.environ["RANK"]
    assert result.timed_out and not result.stopped and not result.ok
    assert len(hooked) == 1 and result.events == [{"event": "step", "step": 1}]
    assert lines == ["rank None"] and (tmp_path / "err.txt").read_text() == "to stderr\n"
    assert process_gone(int(pid_file.read_text()))


def test_one_process_needs_no_torchrun():
    plain = launch_command(LaunchSpec(nproc=1), "kronos_tune.benchmark.run.trial_worker", ["--job", "j.json"])
    assert plain == [sys.executable, "-m", "kronos_tune.benchmark.run.trial_worker", "--job", "j.json"]
    ranks = launch_command(LaunchSpec(nproc=2), "kronos_core.train", ["--events"])
    assert ranks[1:3] == ["-m", "torch.distributed.run"] and "--standalone" in ranks and "--max-restarts" in ranks
    assert ranks[-3:] == ["-m", "kronos_core.train", "--events"]


def test_a_worker_error_reaches_the_launcher_as_an_error_event_with_its_kind(tmp_path: Path):
    # The error event carries a field named "kind" (usage | oom): it must not collide with emit_event's own
    # first parameter, or every error under the launcher becomes a TypeError traceback.
    missing = tmp_path / "no-such-run.toml"
    result = run_launch(launch_command(LaunchSpec(), "kronos_core.train", ["--events", "--config", str(missing)]),
                        timeout_s=120)
    assert result.returncode == 2, result.tail
    errors = result.error_events()
    assert [(e["kind"], e["rank"]) for e in errors] == [("usage", 0)], result.tail
    assert str(missing) in errors[0]["message"]
    assert not any("Traceback" in line for line in result.tail)
