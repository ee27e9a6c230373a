"""Output that is not a terminal (`... | tee log`): plain progress lines on stderr every
KRONOS_TUNE_PROGRESS_EVERY seconds; and a closed terminal (SIGHUP) stops a job as SIGTERM does, run.json saying
which signal ended it. Real runs of the tiny model in their own session, real pipes, real signals."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress

from kronos_tune.commands.progress_lines import PROGRESS_EVERY_ENV, ProgressLines, progress_every_s, task_line
from tiny_preset import tiny_train_toml


def test_a_task_line_says_done_rate_and_time_left() -> None:
    progress = Progress(console=Console(file=io.StringIO()))
    task = progress.add_task("[bold]exact fp32[/]", total=480)
    progress.update(task, completed=120)
    time.sleep(0.05)  # some elapsed time to take a rate from
    line = task_line("backtest", progress.tasks[0], "symbol-origins")
    assert re.fullmatch(r"backtest exact fp32: 120/480 symbol-origins \(25%\), [\d.,]+/s, [\d.]+ (s|min|h) left, "
                        r"[\d.]+ s elapsed", line), line


def test_the_lines_come_on_their_own_clock_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROGRESS_EVERY_ENV, "0.05")
    assert progress_every_s() == 0.05
    progress = Progress(console=Console(file=io.StringIO()))
    task = progress.add_task("steps", total=10)
    stream = io.StringIO()
    lines = ProgressLines(progress, "train", every=progress_every_s(), stream=stream)
    lines.start()
    for done in range(1, 4):
        progress.update(task, completed=done)
        deadline = time.monotonic() + 10
        while f"{done}/10" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    lines.stop()
    written = stream.getvalue()
    assert all(f"train steps: {done}/10 ({10 * done}%)" in written for done in (1, 2, 3)), written
    time.sleep(0.2)
    assert stream.getvalue() == written  # stopped: nothing more
    monkeypatch.setenv(PROGRESS_EVERY_ENV, "0")
    assert progress_every_s() is None


class PipedRun:
    """`kronos-tune ARGS` in a session of its own (as a terminal's job), stdout and stderr pipes read by threads."""

    def __init__(self, argv: list[str], cwd: Path, every_s: float = 0.3) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", **{PROGRESS_EVERY_ENV: str(every_s)})
        self.proc = subprocess.Popen([sys.executable, "-m", "kronos_tune.cli", *argv], cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=(pipe, into), daemon=True)
                        for pipe, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(pipe, into: list[str]) -> None:
        for line in pipe:
            into.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, count: int, timeout_s: float = 120) -> list[re.Match]:
        """The first `count` stderr lines matching `pattern`, waiting for them while the run goes on."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            found = [m for m in (re.fullmatch(pattern, line) for line in list(self.err)) if m]
            if len(found) >= count:
                return found[:count]
            time.sleep(0.05)
        raise AssertionError(f"no {count} lines like {pattern!r}; stderr:\n" + "\n".join(self.err[-20:]))

    def hang_up(self) -> int:
        os.killpg(self.proc.pid, signal.SIGHUP)  # the terminal closed: its job's whole process group
        try:
            code = self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for reader in self.readers:
            reader.join(timeout=10)
        return code


def test_piped_train_prints_progress_lines_and_a_hang_up_stops_it_cleanly(tmp_path: Path) -> None:
    config = tmp_path / "long.toml"
    config.write_text(tiny_train_toml(epochs=500))
    run = PipedRun(["train", "--config", str(config), "--out", str(tmp_path / "run")], tmp_path)
    pattern = r"train predictor: ([\d,]+)/4,000 steps \(\d+%\), [\d.,]+/s, .* left, [\d.]+ s elapsed"
    seen = [int(m.group(1).replace(",", "")) for m in run.wait_for(pattern, 3)]
    assert seen == sorted(seen) and seen[-1] > seen[0]  # a training run that moves, said while it runs
    code = run.hang_up()
    stderr = "\n".join(run.err)
    assert code == 130 and "Traceback" not in stderr, stderr[-3000:]
    state = json.loads((tmp_path / "run" / "run.json").read_text())
    assert state["status"] == "cancelled" and state["stopped_by"] == "SIGHUP"
    assert seen[-1] <= state["step"] < 4000 and (tmp_path / "run" / "checkpoints" / "last.pt").is_file()


def test_piped_backtest_prints_progress_lines_and_a_hang_up_keeps_its_chunks(tmp_path: Path) -> None:
    out = tmp_path / "bt"
    run = PipedRun(["backtest", "--size", "tiny", "--synthetic", "60", "--lookback", "64", "--pred-len", "4",
                    "--origins", "1500", "--top-k", "3", "--chunk-series", "200", "--out", str(out)], tmp_path)
    run.wait_for(r"backtest float32: [\d,]+/90,000 symbol-origins \(\d+%\), .*", 2)
    code = run.hang_up()
    assert code == 128 + signal.SIGHUP, "\n".join(run.err[-20:])
    said = [line for line in run.out + run.err if line.startswith(f"stopped by SIGHUP: the finished chunks are "
                                                                  f"kept in {out}; resume with: kronos-tune backtest")]
    assert said and said[0].endswith(f"--chunk-series 200 --resume --out {out}"), run.out[-5:]
    state = json.loads((out / "run.json").read_text())
    assert state["status"] == "cancelled" and state["stopped_by"] == "SIGHUP"
