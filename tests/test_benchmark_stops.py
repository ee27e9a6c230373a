"""How a benchmark stops: cancel and resume, a crashing trial, SIGINT/SIGTERM, the watchdog. Real trials on the
tiny model in their own processes (a file of its own so that the test workers share the benchmark tests).
"""

from __future__ import annotations

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

from kronos_tune.presets import resolve_preset
from kronos_tune.benchmark import BenchmarkOptions, TrialStep, load_results, run_benchmark
from kronos_tune.benchmark.events import TrialFinished
from kronos_tune.benchmark.run.runner import BenchmarkRun

from test_benchmark_run import FAST, Events, write_preset  # noqa: E402

# Signals, a watchdog and cancels over whole benchmark runs (15-60 s each): the slow pass runs them.
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def test_cancel_mid_trial_leaves_a_valid_report_and_resume_runs_only_the_rest(tmp_path: Path) -> None:
    preset = resolve_preset(write_preset(tmp_path / "presets"))
    cancel = threading.Event()
    first = Events()

    def on_event(event: object) -> None:
        first(event)
        if isinstance(event, TrialStep) and event.trial_name == "noise-probe" and event.record.step == 3:
            cancel.set()  # the noise probe stops after this step

    # 20 measured steps a trial: the cancel lands while the noise probe still has steps to go; the baseline-repeat
    # (a timing re-measurement, one more trial process) adds nothing to what cancel and resume do
    options = BenchmarkOptions(**{**FAST, "steps": 20, "max_steps": 20, "only": ("accumulation",),
                                 "skip": (*FAST["skip"], "baseline-repeat")})
    report = run_benchmark(preset, options=options, out_dir=tmp_path / "out", on_event=on_event, cancel=cancel)
    assert report.cancelled and [t.name for t in report.trials] == ["baseline", "noise-probe"]
    assert report.trial("noise-probe").status == "cancelled" and report.trial("baseline").status == "ok"
    assert "accumulation" in report.not_run and "combined" in report.not_run
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["cancelled"] is True and [t["name"] for t in data["trials"]] == ["baseline", "noise-probe"]
    assert [r.name for r in load_results(tmp_path / "out")] == ["baseline", "noise-probe"]

    second = Events()
    resumed = run_benchmark(preset, options=options, out_dir=tmp_path / "out", resume=True, on_event=second)
    assert "baseline" not in second.started()  # finished before: not trained again
    assert second.started()[0] == "noise-probe" and "accumulation" in second.started()
    assert not resumed.cancelled and resumed.trial("baseline").resumed
    assert resumed.trial("noise-probe").status == "ok" and resumed.trial("combined") is not None


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_run_and_its_children_reports_and_exits(tmp_path: Path, signum: int, code: int) -> None:
    folder = tmp_path / "presets"
    write_preset(folder)
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "kronos_tune.cli", "benchmark", "--preset", "tiny-bench", "--preset-dir",
               str(folder), "--out", str(out), "--steps", "40", "--max-steps", "40", "--skip", "compile",
               "--only", "bf16"]
    # A non-interactive shell starts background jobs with SIGINT ignored; the child must not inherit that.
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240  # a guard against a hang, not a timing assertion
        while not ((out / "results.jsonl").is_file() and (out / "results.jsonl").read_text().strip()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the baseline never finished"
            time.sleep(0.2)
        while not _trial_processes(proc.pid):  # the noise probe's process has started
            assert proc.poll() is None and time.monotonic() < deadline, "no trial process"
            time.sleep(0.1)
        time.sleep(1.0)
        children = _trial_processes(proc.pid)
        proc.send_signal(signum)  # during the noise probe (its start-up and 40 steps), in its own process
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr[-2000:]
    data = json.loads((out / "report.json").read_text())
    assert data["cancelled"] is True and data["partial"] is True and "bf16" in data["not_run"]
    assert [(t["name"], t["status"]) for t in data["trials"]] == [("baseline", "ok"), ("noise-probe", "cancelled")]
    assert "cancelled" in stdout and "Traceback" not in stderr
    assert (out / "recommended.toml").read_text().startswith("# partial")
    assert json.loads((out / "run.json").read_text())["status"] == "cancelled"
    assert children and not [p for p in children if p.is_running() and p.status() != "zombie"]


def _trial_processes(pid: int) -> list:
    import psutil

    try:
        return [p for p in psutil.Process(pid).children(recursive=True)
                if "trial_worker" in " ".join(p.cmdline())]
    except psutil.Error:
        return []


def rounds_before_block_3(reason: str) -> int:
    """How many full rounds came before the worker's block 3, from the unit its reason names."""
    found = re.search(r"block 3 \((?:round (\d+)|untimed, after round (\d+))\)", reason)
    assert found, reason
    return int(found[1]) - 1 if found[1] else int(found[2])


# Each case waits out a 30 s watchdog: the default run keeps the paired-block case (which also has a worker die
# mid-block), the first-step case runs with the slow tests (.ci/run runs both).
@pytest.mark.parametrize("fault, frame", [pytest.param("hang", "in hang_forever", marks=pytest.mark.slow),
                                          ("hang-block", "in serve")],
                         ids=["in-its-first-step", "in-a-paired-block"])
def test_a_crashing_trial_is_failed_a_hung_one_killed_by_the_watchdog_and_the_benchmark_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted_trials, fault: str, frame: str) -> None:
    """The failures in one run (every trial is a process of its own; one more baseline would add nothing):
    checkpointing blocks ignoring SIGTERM (in its first step, or in its second paired round) and passes its
    watchdog, accumulation crashes at its start; with a hung block, fused-adamw's worker also dies in its second
    round; the trial after them still runs."""
    preset = resolve_preset(write_preset(tmp_path / "presets"))
    # the watchdog's deadline runs for each unit of work of a live worker: its start-up and warm-up, every block
    faults = f"{fault}:checkpointing" + (",die-block:fused-adamw" if fault == "hang-block" else "")
    monkeypatch.setenv(planted_trials.FAULT_ENV, faults)
    last = "dataloader" if fault == "hang-block" else "fused-adamw"
    options = BenchmarkOptions(**{**FAST, "skip": ("compile", "noise-probe", "baseline-repeat"),
                                 "only": ("checkpointing", "accumulation", "fused-adamw", last),
                                 "trial_timeout_s": 30.0})
    run = BenchmarkRun(preset, "train", options, tmp_path / "out", False, None, None)
    broken = next(s for s in run.specs if s.name == "accumulation")
    broken.config = broken.config.replace(predictor_dir=str(tmp_path / "no-weights-here"))  # a real crash
    report = run.run()
    kept = {r.name: r for r in load_results(tmp_path / "out")}

    failed = report.trial("accumulation")  # the crash
    assert failed.status == "failed" and failed.reason and "\n" not in failed.reason
    assert report.trial("combined") is not None and not report.cancelled
    assert kept["accumulation"].status == "failed"

    hung = report.trial("checkpointing")  # the watchdog
    assert hung.status == "timeout" and "watchdog" in hung.reason and "30 s" in hung.reason
    stacks = (tmp_path / "out" / "stacks" / "checkpointing.txt").read_text()
    assert "watchdog" in stacks and "trial_worker" in stacks  # the process tree
    assert 'File "' in stacks and frame in stacks  # faulthandler's frames of the blocked thread
    assert kept["checkpointing"].status == "timeout" and "checkpointing" not in report.decision.eligible
    if fault == "hang-block":  # the rounds measured before the hang are kept
        # block 3 is a round's or, where the evaluation ran in an earlier block, an untimed one after it
        assert rounds_before_block_3(hung.reason) == len(kept["checkpointing"].blocks)
        died = report.trial("fused-adamw")  # a worker that dies mid-block: failed with its last error line
        assert died.status == "failed" and "\n" not in died.reason
        assert "died during block 3 (" in died.reason and "injected fault" in died.reason
        assert kept["fused-adamw"].status == "failed"
        assert rounds_before_block_3(died.reason) == len(kept["fused-adamw"].blocks)
        assert kept["fused-adamw"].peak_memory_bytes and kept["fused-adamw"].warmup_times_s
    assert report.trial(last).status == "ok" and report.trial(last).design == "paired"  # the run went on
    import psutil

    assert not [p for p in psutil.process_iter(["cmdline"]) if "trial_worker" in " ".join(p.info["cmdline"] or [])
                and str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_a_cancel_after_the_last_trial_leaves_a_complete_run(tmp_path: Path) -> None:
    preset = resolve_preset(write_preset(tmp_path / "presets"))
    cancel = threading.Event()

    def on_event(event: object) -> None:
        if isinstance(event, TrialFinished) and event.result.name == "combined":  # always the last one planned
            cancel.set()  # too late: nothing is left to stop

    options = BenchmarkOptions(**{**FAST, "only": ("accumulation",), "skip": (*FAST["skip"], "baseline-repeat")})
    report = run_benchmark(preset, options=options, out_dir=tmp_path / "out", on_event=on_event, cancel=cancel)
    assert cancel.is_set() and report.planned[-1] == "combined"
    assert not report.cancelled and not report.not_run and not report.partial
    assert {t.name for t in report.trials if t.status == "ok"} == {"baseline", "noise-probe", "accumulation"}
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "complete"
