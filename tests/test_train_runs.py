"""`kronos-tune train` run folders and schedules: a new folder per run, resume that continues, errors that name the
problem, the announced schedule (steps, epochs, effective batch). Real runs of the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kronos_core.train import TrainConfig, load_checkpoint
from kronos_tune.cli import main
from kronos_tune.errors import KronosTuneError
from kronos_tune.train.schedule import keep_effective_batch, schedule_training
from machine import interrupt_when
from tiny_preset import tiny_train_toml

pytestmark = pytest.mark.usefixtures("one_thread")


def write_config(folder: Path, name: str = "tiny.toml", head: str = "", epochs: int = 1) -> Path:
    path = folder / name
    path.write_text(head + tiny_train_toml(epochs=epochs))
    return path


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return info.value.code or 0


def run_folders(root: Path) -> list[Path]:
    return sorted((root / "runs" / "train").iterdir())


def status(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


def test_two_starts_get_two_folders_and_say_what_they_will_do(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path)
    assert run_cli(["train", "--config", str(config)]) == 0
    first = capsys.readouterr().out
    assert "plan: predictor (Kronos-tiny), 8 optimizer steps = 1 epoch x 8 steps (samples_per_epoch 64 / 8)" in first
    assert "effective batch 8 windows per optimizer step (batch_size 8 x accumulation_steps 1" in first
    assert run_cli(["train", "--config", str(config)]) == 0
    folders = run_folders(tmp_path)
    assert len(folders) == 2 and all(f.name.startswith("tiny-") for f in folders)
    for folder in folders:  # both runs' files are there
        assert load_checkpoint(folder)["step"] == 8 and (folder / "best").is_dir()
        assert status(folder)["status"] == "complete" and status(folder)["identity"]["what"] == "predictor"
    assert f"output: {Path('runs') / 'train' / folders[0].name}" in first
    assert f"results in {Path('runs') / 'train' / folders[0].name}" in first


def test_steps_past_the_schedule_raise_the_epochs_and_resume_continues(tmp_path: Path, monkeypatch,
                                                                       capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(["train", "--config", str(write_config(tmp_path)), "--steps", "10"]) == 0
    printed = capsys.readouterr().out
    assert "--steps 10 is past the schedule of 8 steps (1 epoch x 8): epochs raised to 2" in printed
    assert "stopped at --steps (resumable)" in printed
    (folder,) = run_folders(tmp_path)
    assert load_checkpoint(folder)["step"] == 10 and TrainConfig.from_toml(folder / "config.toml").epochs == 2
    assert status(folder)["status"] == "partial" and status(folder)["step"] == 10
    assert f"continue with: kronos-tune train --resume {Path('runs') / 'train' / folder.name}" in printed

    relative = str(Path("runs") / "train" / folder.name)  # the command as printed works from here
    assert run_cli(["train", "--resume", relative, "--steps", "12"]) == 0
    assert load_checkpoint(folder)["step"] == 12 and len(run_folders(tmp_path)) == 1
    assert "from step 10, stopping at step 12" in capsys.readouterr().out


def test_resume_errors_name_the_real_problem(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(["train", "--config", str(write_config(tmp_path)), "--steps", "3"]) == 0
    (folder,) = run_folders(tmp_path)
    capsys.readouterr()
    cases = [
        (["--resume", "nope_dir"], "--resume nope_dir: no such folder"),
        (["--resume", str(folder), "--steps", "2"], "is already at step 3 of 8; give --steps between 4 and 8"),
        (["--resume", str(folder), "--steps", "20"], "has a schedule of 8 steps (1 epoch x 8), which a resumed run "
                                                     "cannot extend"),
    ]
    benchmark = tmp_path / "bench"
    benchmark.mkdir()
    (benchmark / "run.json").write_text(json.dumps({"tool": "kronos-tune-run", "command": "benchmark",
                                                    "identity": {"preset": "cpu", "task": "train"}}))
    (benchmark / "config.toml").write_text(tiny_train_toml())
    cases.append((["--resume", str(benchmark)], "holds a 'benchmark' run, not a training run"))
    empty = tmp_path / "empty"
    empty.mkdir()
    cases.append((["--resume", str(empty)], "no config.toml there"))
    cases.append((["--resume", str(folder), "--preset", "cpu"], "that run was started from "))
    for args, expected in cases:
        assert run_cli(["train", *args]) == 2, args
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, (args, err)
    assert load_checkpoint(folder)["step"] == 3  # nothing was touched
    assert run_cli(["train", "--resume", str(folder)]) == 0  # to the end of the schedule
    assert run_cli(["train", "--resume", str(folder)]) == 2
    assert "that run is complete (8/8 steps); there is nothing to continue" in capsys.readouterr().err


def test_out_refuses_a_run_overwrite_replaces_only_runs(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    out = tmp_path / "out"
    assert run_cli(["train", "--config", str(config), "--steps", "2", "--out", str(out)]) == 0
    first = (out / "checkpoints" / "last.pt").read_bytes()
    capsys.readouterr()
    assert run_cli(["train", "--config", str(config), "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds a 'train' run" in err and "--resume" in err and "--overwrite" in err
    assert (out / "checkpoints" / "last.pt").read_bytes() == first
    assert run_cli(["train", "--config", str(config), "--steps", "3", "--out", str(out), "--overwrite"]) == 0
    assert load_checkpoint(out)["step"] == 3

    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"jpeg")
    assert run_cli(["train", "--config", str(config), "--out", str(foreign), "--overwrite"]) == 2
    assert "not a kronos-tune run" in capsys.readouterr().err
    assert (foreign / "holiday.jpg").read_bytes() == b"jpeg"


def test_partial_recommended_config_warns_or_refuses_with_strict(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path, "recommended.toml", head="# partial: missing compile, combined\n")
    assert run_cli(["train", "--config", str(config), "--strict", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "partial benchmark" in err and "--strict" in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()
    assert run_cli(["train", "--config", str(config), "--steps", "1", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    warning = next(line for line in out.splitlines() if line.startswith("warning:"))
    assert "partial benchmark (partial: missing compile, combined)" in warning and "--strict" in warning
    assert load_checkpoint(tmp_path / "b")["step"] == 1


def test_plan_for_several_processes_and_keeping_the_effective_batch() -> None:
    config = TrainConfig(model_size="tiny", lookback_window=16, predict_window=4, batch_size=8,
                         accumulation_steps=2, samples_per_epoch=64, epochs=1)
    _, doubled = schedule_training(config, 2, None)
    assert doubled.global_batch == 32 and doubled.total_steps == 2
    text = "\n".join(doubled.lines())
    assert "effective batch 32 windows per optimizer step = 16 per process" in text and "x 2 processes" in text
    assert "--keep-effective-batch" in text
    kept, schedule = schedule_training(config, 2, None, keep_batch=True)
    assert kept.accumulation_steps == 1 and kept.batch_size == 8 and schedule.global_batch == 16
    assert schedule.total_steps == 4 and "accumulation_steps 2 -> 1" in "\n".join(schedule.lines())
    split, _ = keep_effective_batch(config.replace(accumulation_steps=1), 4)
    assert split.batch_size == 2
    with pytest.raises(KronosTuneError, match="does not split evenly over 3 processes"):
        keep_effective_batch(config, 3)


@pytest.mark.slow
def test_cancelled_run_is_continued_by_the_next_start(tmp_path: Path, monkeypatch) -> None:
    config = write_config(tmp_path, epochs=500)  # far more steps than the test waits for
    code, stdout, stderr = interrupt_when(["train", "--config", str(config)], cwd=tmp_path, then_wait_s=0.5,
                                          ready=lambda: bool(list(tmp_path.glob("runs/train/*/config.toml"))))
    assert code == 130, stdout + stderr
    (folder,) = run_folders(tmp_path)
    stopped = load_checkpoint(folder)["step"]
    assert status(folder)["status"] == "cancelled" and status(folder)["step"] == stopped
    assert "the next `kronos-tune train` with the same config continues it" in stdout

    monkeypatch.chdir(tmp_path)
    assert run_cli(["train", "--config", str(config), "--steps", str(stopped + 2)]) == 0
    assert run_folders(tmp_path) == [folder]  # continued in place, not restarted elsewhere
    assert load_checkpoint(folder)["step"] == stopped + 2
    assert run_cli(["train", "--config", str(config), "--steps", "1", "--new-run"]) == 0
    assert len(run_folders(tmp_path)) == 2


def test_resume_refuses_a_run_another_process_is_training(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert run_cli(["train", "--config", str(write_config(tmp_path)), "--steps", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stored = status(out)
        (out / "run.json").write_text(json.dumps({**stored, "status": "running", "pid": sleeper.pid}))
        assert run_cli(["train", "--resume", str(out)]) == 2
        assert f"that run is still training (process {sleeper.pid})" in capsys.readouterr().err
    finally:
        sleeper.kill()
        sleeper.wait()
    assert run_cli(["train", "--resume", str(out), "--steps", "3"]) == 0  # its process is gone: resumable
    assert load_checkpoint(out)["step"] == 3
