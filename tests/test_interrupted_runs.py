"""A newcomer's first runs: the benchmark says what it will do before the first trial (a preset for a CUDA card
this machine lacks at once), estimates come from this invocation's measured rate, and a run stopped by Ctrl-C or
SIGTERM names its folder and a resume command that works pasted. Real subprocesses on the tiny model."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from kronos_tune.backtest.config import BacktestConfig, PredictionSetting
from kronos_tune.backtest.forecast import OracleForecaster
from kronos_tune.backtest.runner import run_backtest
from kronos_tune.benchmark import BenchmarkOptions, run_benchmark
from kronos_tune.benchmark.events import BenchmarkStarting
from kronos_tune.commands.benchmark import render, starting_lines
from kronos_tune.presets import resolve_preset
from kronos_tune.resume_command import resume_command
from kronos_tune.runs import read_run_file
from kronos_tune.time_left import TimeLeft, seconds_left, seconds_left_by_budget

from tiny_preset import write_tiny_preset

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_time_left_is_this_invocations_rate_and_keeps_its_first_estimate() -> None:
    clock = FakeClock()
    estimate = TimeLeft(clock)
    assert estimate.update(0, 10) is None  # nothing measured yet: no figure
    clock.now = 110.0
    assert estimate.update(2, 8) == pytest.approx(40.0)  # 2 units in 10 s: 8 more take 40 s
    clock.now = 130.0
    assert estimate.update(4, 6) == pytest.approx(45.0)
    assert estimate.first_total_s == pytest.approx(50.0)  # 10 s measured + 40 s left, kept from the first
    clock.now = 160.0
    assert estimate.first_vs_actual() == "first estimate 50.0 s, actual 60.0 s (+20%)"
    estimate.start()  # a resume: its clock starts again, the units done before are not passed as measured
    clock.now = 170.0
    assert estimate.update(1, 3) == pytest.approx(30.0)


def test_trials_of_unequal_budgets_are_estimated_by_budget_plus_the_overhead_measured() -> None:
    # the cpu preset's order: a 5 s baseline that took 10 s, then the A/A (40 s) and three changes (10 s each)
    left = [40.0, 10.0, 10.0, 10.0]
    assert seconds_left_by_budget(1, 10.0, 5.0, left) == pytest.approx(70.0 + 4 * 5.0)
    assert seconds_left(1, 10.0, len(left)) == pytest.approx(40.0)  # a mean per trial: less than half of it
    assert seconds_left_by_budget(2, 30.0, 0.0, [0.0] * 3) == pytest.approx(seconds_left(2, 30.0, 3))  # by count
    assert seconds_left_by_budget(1, 4.0, 5.0, [10.0]) == pytest.approx(10.0)  # faster than its budget: no credit
    assert seconds_left_by_budget(0, 0.0, 0.0, left) is None


def test_the_resume_command_is_the_run_s_own_with_the_folder_flags_replaced() -> None:
    argv = ["kronos-tune", "benchmark", "--preset", "ali5min", "--preset-dir", "my presets", "--out", "old",
            "--overwrite", "--only", "bf16"]
    assert resume_command("benchmark", argv, "runs/b 1") == (
        "kronos-tune benchmark --preset ali5min --preset-dir 'my presets' --only bf16 --resume --out 'runs/b 1'")
    assert resume_command("backtest", ["kronos-tune", "backtest", "--size", "tiny", "--out=x"], "runs/bt") == \
        "kronos-tune backtest --size tiny --resume --out runs/bt"
    assert resume_command("predict", ["kronos-tune", "predict", "--out", "p.csv", "--size", "tiny"], "p.csv.work") \
        == "kronos-tune predict --out p.csv --size tiny --resume"
    train = ["kronos-tune", "train", "--config", "t.toml", "--steps", "10", "--what", "predictor", "--device", "cpu"]
    assert resume_command("train", train, "runs/train/t") == "kronos-tune train --device cpu --resume runs/train/t"


def _gpu_preset(folder: Path) -> Path:
    write_tiny_preset(folder, "tiny-gpu", bf16_supported=True)
    path = folder / "tiny-gpu.toml"
    path.write_text(path.read_text().replace('device = "cpu"', 'device = "cuda"'))
    return path


def test_an_absent_cuda_device_is_said_before_the_first_trial_and_the_time_cap_holds(tmp_path: Path) -> None:
    preset = resolve_preset(_gpu_preset(tmp_path / "presets"))
    events: list[object] = []
    report = run_benchmark(preset, options=BenchmarkOptions(only=("bf16",), time_cap_s=1e-6),
                           out_dir=tmp_path / "out", on_event=events.append)
    starting = events[0]
    assert isinstance(starting, BenchmarkStarting)  # the first event, before any trial's
    lines = starting_lines(starting)
    assert "describes a CUDA device but this machine has none" in lines[2]
    assert f"kronos-tune plan --preset {tmp_path / 'presets' / 'tiny-gpu.toml'}" in lines[2]
    assert "time cap 0.0 s" in lines[3] and "baseline" in lines[0]
    assert not [t for t in report.trials if t.status != "skipped"]  # the cap: no trial started after it
    assert any(note.startswith("time cap of") and "kronos-tune plan --preset" in note for note in report.notes)


def test_an_interrupted_report_claims_nothing_unmeasured_and_uses_the_terminal_s_width(tmp_path: Path) -> None:
    preset = resolve_preset(_gpu_preset(tmp_path / "presets"))
    cancel = threading.Event()

    def on_event(event: object) -> None:
        if isinstance(event, BenchmarkStarting):
            cancel.set()  # Ctrl-C before the first trial

    report = run_benchmark(preset, options=BenchmarkOptions(only=("bf16",)), out_dir=tmp_path / "out",
                           on_event=on_event, cancel=cancel)
    console = Console(width=200, record=True, force_terminal=False)
    render(console, report)
    text = console.export_text()
    lines = text.splitlines()
    assert lines[0] == f"interrupted after 0 of {len(report.planned)} planned trials"
    for claim in ("changes under", "val loss after", "None", "nothing ran within the budget", "threshold", "next:"):
        assert claim not in text, claim
    assert any(report.device_line in line for line in lines)  # whole, not folded to a narrow table's width
    assert lines[-1].endswith(f"resume with: kronos-tune benchmark --preset {preset.source_path} --task train "
                              f"--resume --out {tmp_path / 'out'}")


def test_a_resumed_backtest_estimates_from_its_own_chunks_and_compare_adds_both(tmp_path: Path, one_thread) -> None:
    options = dict(size="tiny", lookback=32, pred_len=4, device="cpu", synthetic=6, origins=5, top_k=2,
                   chunk_series=6, setting=PredictionSetting(),
                   compare=PredictionSetting(window_mode="shift"))

    def oracle(setting, on_chunk):
        return OracleForecaster()

    def stop_after_two_chunks(state) -> None:
        if state.predicted >= 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as stopped:
        run_backtest(BacktestConfig(**options, out=tmp_path / "bt"), on_progress=stop_after_two_chunks,
                     forecaster_factory=oracle)
    assert getattr(stopped.value, "folder", None) == tmp_path / "bt"  # the command names it
    notes: list[str] = []
    states = []
    run_backtest(BacktestConfig(**options, out=tmp_path / "bt", resume=True), on_progress=states.append,
                 on_note=lambda level, message: notes.append(message), forecaster_factory=oracle)
    first = states[0]
    assert (first.resumed, first.predicted, first.total) == (12, 18, 30)
    assert first.symbols_per_s == pytest.approx(6 / first.predict_seconds)  # this invocation's 6 only
    said = next(note for note in notes if note.startswith("[float32]") and "on the first chunk" in note)
    from kronos_core.units import format_duration

    assert f"about {format_duration(first.seconds_left)} for the 12 left" in said  # the bar and the note agree
    assert "shift float32 next, 30 more at this rate: about" in said and "in all" in said
    assert any(note.startswith("prediction time: first estimate ") for note in notes)


def _interrupt(argv: list[str], ready, signum: int, cwd: Path, timeout_s: float = 240) -> tuple[int, str, str]:
    """Start `kronos-tune ARGV`, send `signum` once `ready()` holds, and return its code, stdout and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "kronos_tune.cli", *argv], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + timeout_s  # a guard against a hang, not a timing assertion
        while not ready():
            assert proc.poll() is None, (proc.returncode, *proc.communicate())
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.05)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stdout, stderr


def _pasted(line: str) -> list[str]:
    """A printed `kronos-tune ...` command line as this interpreter runs it."""
    argv = shlex.split(line)
    assert argv[0] == "kronos-tune"
    return argv[1:]


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_benchmark_names_its_folder_and_its_resume_command_runs(tmp_path: Path, signum: int,
                                                                         code: int) -> None:
    _gpu_preset(tmp_path / "presets")
    out = tmp_path / "out"
    argv = ["benchmark", "--preset", "tiny-gpu", "--preset-dir", str(tmp_path / "presets"), "--out", str(out),
            "--only", "bf16"]
    returned, stdout, stderr = _interrupt(argv, lambda: (out / "run.json").is_file(), signum, tmp_path)
    assert returned == code and "Traceback" not in stderr, stderr[-2000:]
    lines = stdout.splitlines()
    assert lines[0].startswith("benchmark tiny-gpu (train): ") and "describes a CUDA device" in lines[2]
    assert read_run_file(out)["status"] == "cancelled"
    assert read_run_file(out)["argv"] == ["kronos-tune", *argv]
    resume = lines[-1].split("resume with: ", 1)[1]
    assert resume == (f"kronos-tune benchmark --preset tiny-gpu --preset-dir {tmp_path / 'presets'} --only bf16 "
                      f"--resume --out {out}")
    # pasted, it continues the same run (stopped again at once: what matters is that it is accepted)
    returned, stdout, stderr = _interrupt(_pasted(resume), lambda: read_run_file(out)["status"] == "running",
                                          signal.SIGINT, tmp_path)
    assert returned == 130 and "Traceback" not in stderr, stderr[-2000:]
    assert f"run folder {out}" in stdout.splitlines()[0]


@pytest.mark.slow  # two runs of a 500-chunk job: about 20 s here
def test_a_stopped_predict_job_prints_a_resume_command_that_continues_it(tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    argv = ["predict", "--size", "tiny", "--synthetic", "2000", "--lookback", "32", "--pred-len", "4", "--out",
            str(out), "--chunk-series", "4"]  # 500 chunks: each run is stopped long before the end
    done = tmp_path / "p.csv.work" / "done"

    def finished() -> int:
        return len(list(done.iterdir())) if done.is_dir() else 0

    returned, stdout, stderr = _interrupt(argv, lambda: finished() >= 1, signal.SIGTERM, tmp_path)
    assert "Traceback" not in stderr, stderr[-2000:]
    message = stderr.strip().splitlines()[-1]
    assert message.startswith("error: predict: interrupted after ") and f"kept in {out}.work" in message
    resume = message.split("resume with: ", 1)[1]
    assert resume == f"kronos-tune {' '.join(argv)} --resume"
    kept = finished()
    # pasted, it goes on from the kept chunks (and, stopped again, says the same)
    returned, stdout, stderr = _interrupt(_pasted(resume), lambda: finished() > kept, signal.SIGINT, tmp_path)
    assert "Traceback" not in stderr, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].endswith(f"resume with: {resume}") and not out.exists()
    assert finished() > kept


def test_a_stopped_training_names_its_folder_and_the_command_that_continues_it(tmp_path: Path) -> None:
    from tiny_preset import tiny_train_toml

    config = tmp_path / "long.toml"
    config.write_text(tiny_train_toml(epochs=500))  # far more steps than the test waits for
    out = tmp_path / "run"
    returned, stdout, stderr = _interrupt(["train", "--config", str(config), "--out", str(out)],
                                          lambda: (out / "checkpoints" / "last.pt").is_file()
                                          or (out / "config.toml").is_file(), signal.SIGTERM, tmp_path)
    assert "Traceback" not in stderr, stderr[-2000:]
    assert read_run_file(out)["status"] == "cancelled" and read_run_file(out)["stopped_by"] == "SIGTERM"
    said = [line for line in stdout.splitlines() if line.startswith("interrupted after ")]
    assert said and f"the checkpoint kept in {out}" in said[0], stdout[-2000:]
    assert said[0].endswith(f"resume with: kronos-tune train --resume {out}")


def test_a_predict_bar_stopped_between_its_start_and_its_lines_closes_cleanly() -> None:
    """A stop (CI caught one) can land after the job's bar started and before its piped lines did: closing it then
    stops what started instead of raising an AttributeError over the one-line error."""
    import io

    from rich.progress import Progress

    from kronos_tune.commands.predict import _JobBar

    bar = _JobBar(Console(file=io.StringIO()))
    bar.progress = Progress(console=bar.console, transient=True)
    bar.progress.start()
    bar.close()
    assert bar.lines is None and not bar.progress.live.is_started
