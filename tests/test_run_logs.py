"""What a training run leaves to watch: metrics.jsonl and TensorBoard files from real runs of `kronos-tune train`
on the tiny model, the one-line errors when TensorBoard is missing or cannot write, and the benchmark's curves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kronos_core.optional import install_command
from kronos_core.train import StepRecord, TrainConfig
from kronos_tune.cli import main
from kronos_tune.benchmark.events import TrialCurves
from kronos_tune.run_logs import METRICS_FILE, TENSORBOARD_DIR, read_metrics
from tiny_preset import tiny_train_toml

STEP_KEYS = {"kind", "step", "epoch", "loss", "lr", "tokens_per_s", "samples_per_s", "grad_norm", "step_time_s",
             "time"}

pytestmark = pytest.mark.usefixtures("one_thread")


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return info.value.code or 0


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_train_toml(eval_every=2))
    return path


def metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / METRICS_FILE).read_text().splitlines()]


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_run_writes_metrics_lines_and_tensorboard_scalars(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert run_cli(["train", "--config", str(write_config(tmp_path)), "--steps", "5", "--out", str(out),
                    "--tensorboard"]) == 0
    lines = metrics(out)
    train = [line for line in lines if line["kind"] == "train"]
    evals = [line for line in lines if line["kind"] == "eval"]
    assert [line["step"] for line in train] == [1, 2, 3, 4, 5]
    assert all(STEP_KEYS <= set(line) for line in train)
    assert all(line["loss"] > 0 and line["lr"] > 0 and line["tokens_per_s"] > 0 for line in train)
    # eval_every 2: steps 2 and 4, then the closing evaluation at step 5
    assert [line["step"] for line in evals] == [2, 4, 5]
    assert all({"val_loss", "s1_accuracy", "epoch", "time"} <= set(line) for line in evals)
    assert [line["time"] for line in lines] == sorted(line["time"] for line in lines)  # in the order it happened

    board = scalars(out / TENSORBOARD_DIR)
    assert {"train/loss", "train/lr", "train/tokens_per_s", "val/loss"} <= set(board)
    assert [step for step, _ in board["train/loss"]] == [1, 2, 3, 4, 5]
    assert [value for _, value in board["train/loss"]] == pytest.approx([line["loss"] for line in train])
    assert [(step, pytest.approx(value)) for step, value in board["val/loss"]] == \
        [(line["step"], line["val_loss"]) for line in evals]

    # An interrupted run that logged step 6 after its last checkpoint (step 5), in both logs.
    stale = {"kind": "train", "step": 6, "loss": 999.0, "time": lines[-1]["time"]}
    with (out / METRICS_FILE).open("a") as file:
        file.write(json.dumps(stale) + "\n")
    from torch.utils.tensorboard import SummaryWriter
    with SummaryWriter(str(out / TENSORBOARD_DIR)) as writer:
        writer.add_scalar("train/loss", 999.0, 6)
    before = (out / METRICS_FILE).read_text().splitlines()

    # The resumed run appends (nothing earlier is rewritten): a resume line at step 5, then steps 6 and 7 again;
    # read_metrics and TensorBoard (purge_step) both keep the resumed run's step 6, not the stale one.
    assert run_cli(["train", "--resume", str(out), "--steps", "7", "--tensorboard"]) == 0
    after = (out / METRICS_FILE).read_text().splitlines()
    assert after[:len(before)] == before
    appended = [json.loads(line) for line in after[len(before):]]
    assert appended[0]["kind"] == "resume" and appended[0]["step"] == 5
    assert [line["step"] for line in appended if line["kind"] == "train"] == [6, 7]
    kept = read_metrics(out / METRICS_FILE)
    assert kept[:len(lines)] == lines
    assert [line["step"] for line in kept if line["kind"] == "train"] == [1, 2, 3, 4, 5, 6, 7]
    assert all(line["loss"] != 999.0 for line in kept if line["kind"] == "train")
    assert len(list((out / TENSORBOARD_DIR).glob("events.out.tfevents.*"))) == 3
    losses = scalars(out / TENSORBOARD_DIR)["train/loss"]
    assert [step for step, _ in losses] == [1, 2, 3, 4, 5, 6, 7]
    assert 999.0 not in [value for _, value in losses]


def test_read_metrics_skips_a_line_cut_short_by_a_crash(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text('{"kind": "train", "step": 1, "loss": 2.5}\n{"kind": "train", "step": 2, "lo')
    assert read_metrics(path) == [{"kind": "train", "step": 1, "loss": 2.5}]


def test_no_tensorboard_still_writes_the_metrics_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert run_cli(["train", "--config", str(write_config(tmp_path)), "--steps", "2", "--out", str(out),
                    "--no-tensorboard"]) == 0
    assert not (out / TENSORBOARD_DIR).exists()
    assert [line["step"] for line in metrics(out) if line["kind"] == "train"] == [1, 2]


BLOCKED = ("import sys; sys.modules['tensorboard'] = None; sys.modules['torch.utils.tensorboard'] = None; "
           "from kronos_tune.cli import main; main(sys.argv[1:])")


def run_without_tensorboard(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_without_the_package_tensorboard_asked_for_is_one_line_and_the_default_is_off(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    asked = run_without_tensorboard(["train", "--config", str(config), "--steps", "1", "--out",
                                     str(tmp_path / "asked"), "--tensorboard"])
    assert asked.returncode == 2, asked.stdout + asked.stderr
    assert asked.stderr.count("\n") == 1 and install_command("tensorboard") in asked.stderr and "Traceback" not in asked.stderr
    assert not (tmp_path / "asked").exists()
    default = run_without_tensorboard(["train", "--config", str(config), "--steps", "1", "--out",
                                       str(tmp_path / "default")])
    assert default.returncode == 0, default.stdout + default.stderr
    assert (tmp_path / "default" / METRICS_FILE).is_file() and not (tmp_path / "default" / TENSORBOARD_DIR).exists()


def test_a_tensorboard_folder_that_cannot_be_written_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert run_cli(["train", "--config", str(write_config(tmp_path)), "--steps", "2", "--out", str(out),
                    "--no-tensorboard"]) == 0
    (out / TENSORBOARD_DIR).write_text("a file where the TensorBoard folder should go\n")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run_cli(["train", "--resume", str(out), "--steps", "4", "--tensorboard"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out / TENSORBOARD_DIR) in err and "--no-tensorboard" in err
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing lost: checkpoint, metrics and run.json as they were


def record(step: int, loss: float) -> StepRecord:
    return StepRecord(step=step, epoch=0, micro_steps=1, samples=8, tokens=160, loss=loss, lr=1e-4, grad_norm=0.5,
                      data_time_s=0.01, forward_time_s=0.02, backward_time_s=0.03, optimizer_time_s=0.01,
                      step_time_s=0.1)


def test_benchmark_curves_per_trial_in_jsonl_and_tensorboard(tmp_path: Path) -> None:
    from kronos_tune.benchmark.events import TrialFinished, TrialStarted, TrialStep
    from kronos_tune.benchmark.results import TrialResult, TrialSpec

    curves = TrialCurves(tmp_path, tensorboard=True)
    for name, losses in (("baseline", [3.0, 2.5, 2.0]), ("fused-adamw", [3.0, 2.4])):
        spec = TrialSpec(name=name, stage="single", changes={}, config=TrainConfig(model_size="tiny"))
        curves.on_event(TrialStarted(spec, 0, 2))
        for step, loss in enumerate(losses, start=1):
            curves.on_event(TrialStep(name, record(step, loss)))
        curves.on_event(TrialFinished(TrialResult(name, "single", "ok", {}, val_loss=1.5,
                                                  val_loss_step=len(losses))))
    lines = [json.loads(line) for line in (tmp_path / "curves" / "baseline.jsonl").read_text().splitlines()]
    assert [(line["kind"], line["step"]) for line in lines] == [("train", 1), ("train", 2), ("train", 3), ("eval", 3)]
    assert [line["loss"] for line in lines[:3]] == [3.0, 2.5, 2.0] and lines[3]["val_loss"] == 1.5
    assert lines[0]["step_time_s"] == pytest.approx(0.1) and lines[0]["tokens_per_s"] == pytest.approx(1600)
    board = scalars(tmp_path / "tensorboard" / "fused-adamw")
    assert [step for step, _ in board["train/loss"]] == [1, 2] and board["val/loss"] == [(2, 1.5)]
    assert [step for step, _ in board["train/step_time_s"]] == [1, 2]
