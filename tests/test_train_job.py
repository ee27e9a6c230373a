"""The headless training job (kronos_tune.train.job.run_training) called directly, with no CLI and no TUI; and
the CLI and the dashboard, which both call it, leaving the same files for the same config. Real runs of the tiny
model (8 steps an epoch)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from kronos_core.train import StepRecord, TrainConfig, load_checkpoint
from kronos_tune.cli import main
from kronos_tune.run_logs import METRICS_FILE, TENSORBOARD_DIR
from kronos_tune.train.job import StageResult, StageStart, TrainListener, TrainRequest, run_training
from kronos_tune.train.schedule import TrainSchedule
from tiny_preset import tiny_train_toml

pytestmark = pytest.mark.usefixtures("one_thread")

# measured, so they differ from run to run: time, speed, and the process's peak memory on a CPU (host memory)
MEASURED_KEYS = {"time", "step_time_s", "tokens_per_s", "samples_per_s", "peak_memory_bytes"}


class Recorder(TrainListener):
    """Everything the job reports, in order; optionally sets `cancel` after step `stop_at`."""

    def __init__(self, cancel: threading.Event | None = None, stop_at: int | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.cancel, self.stop_at = cancel, stop_at

    def announce(self, why: str, schedule: TrainSchedule) -> None:
        self.calls.append(("announce", (why, schedule)))

    def stage_ready(self, start: StageStart) -> None:
        self.calls.append(("ready", start))

    def step(self, record: StepRecord) -> None:
        self.calls.append(("step", record.step))
        if self.cancel is not None and record.step == self.stop_at:
            self.cancel.set()

    def evaluated(self, values: dict[str, Any]) -> None:
        self.calls.append(("eval", values["step"]))

    def stage_finished(self, result: StageResult) -> None:
        self.calls.append(("finished", result))


def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_train_toml())
    return path


def run_json(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "run.json").read_text())


def metrics(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / METRICS_FILE).read_text().splitlines()]


def test_the_job_plans_claims_trains_logs_and_marks_without_printing(tmp_path: Path, capsys) -> None:
    config_file = tiny_config(tmp_path)
    out = tmp_path / "run"
    listener = Recorder()
    result = run_training(TrainRequest(TrainConfig.from_toml(config_file), str(config_file), out=out, steps=3),
                          listener)
    assert capsys.readouterr() == ("", "")  # notes and progress went to the listener only

    assert (result.folder, result.status, result.exit_code, result.why) == (out, "partial", 0, f"output: {out}")
    assert (result.schedule.total_steps, result.schedule.end_step, result.schedule.start_step) == (8, 3, 0)
    (stage,) = result.stages
    assert (stage.status, stage.exit_code, stage.error) == ("partial", 0, None)
    assert stage.summary["steps"] == 3 and stage.summary["total_steps"] == 8 and not stage.summary["interrupted"]
    assert stage.config.output_dir == str(out)

    kinds = [kind for kind, _ in listener.calls]
    assert kinds == ["announce", "ready", "step", "step", "step", "eval", "finished"]
    ready = listener.calls[1][1]
    assert (ready.step, ready.total_steps, ready.target, ready.global_batch, ready.steps_per_epoch) == (0, 8, 3, 8, 8)
    assert [value for kind, value in listener.calls if kind == "step"] == [1, 2, 3]
    assert listener.calls[-1][1] is stage

    assert load_checkpoint(out)["step"] == 3 and (out / "config.toml").is_file() and (out / "best").is_dir()
    assert TrainConfig.from_toml(out / "config.toml").output_dir == str(out)
    status = run_json(out)
    assert (status["command"], status["status"], status["step"], status["total_steps"]) == ("train", "partial", 3, 8)
    assert status["identity"] == {"what": "predictor", "model_size": "tiny", "source": str(config_file)}
    assert [(line["kind"], line["step"]) for line in metrics(out)] == [("train", 1), ("train", 2), ("train", 3),
                                                                      ("eval", 3)]


def test_cancel_stops_at_a_step_boundary_and_the_next_start_continues_the_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # new folders land in runs/train/
    config_file = tiny_config(tmp_path)
    request = TrainRequest(TrainConfig.from_toml(config_file), str(config_file), label="tiny")
    cancel = threading.Event()
    stopped = run_training(request, Recorder(cancel, stop_at=2), cancel)
    folder = stopped.folder
    assert folder.parent == Path("runs") / "train" and folder.name.startswith("tiny-")
    assert (stopped.status, stopped.exit_code) == ("cancelled", 130)
    assert stopped.stages[0].summary["interrupted"] and stopped.stages[0].summary["steps"] == 2
    assert load_checkpoint(folder)["step"] == 2
    assert run_json(folder)["status"] == "cancelled" and run_json(folder)["step"] == 2

    listener = Recorder()
    continued = run_training(request, listener)
    assert continued.folder == folder and continued.why.startswith(f"continuing the cancelled run in {folder}")
    assert (continued.status, continued.exit_code, continued.schedule.start_step) == ("complete", 0, 2)
    assert [value for kind, value in listener.calls if kind == "step"] == [3, 4, 5, 6, 7, 8]
    assert load_checkpoint(folder)["step"] == 8 and run_json(folder)["status"] == "complete"
    lines = metrics(folder)
    assert {"kind": "resume", "step": 2} in [{k: v for k, v in line.items() if k != "time"} for line in lines]
    assert [line["step"] for line in lines if line["kind"] == "train"] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_cancel_after_the_last_step_leaves_a_run_both_the_folder_and_the_dashboard_call_complete(
        tmp_path: Path) -> None:
    from kronos_tune.tui import jobs
    from kronos_tune.tui.jobs import JobFinished, TrainingStep

    config_file, folder, cancel = tiny_config(tmp_path), tmp_path / "run", threading.Event()
    posted: list[Any] = []

    def post(message: Any) -> None:
        posted.append(message)
        if isinstance(message, TrainingStep) and message.record.step == 8:  # the last step
            cancel.set()

    jobs.train(post, config_file, folder, False, cancel)
    finished = posted[-1]
    assert cancel.is_set() and isinstance(finished, JobFinished)
    assert finished.phase == "done" and finished.outcome.startswith("8/8 steps, done"), finished.outcome
    assert run_json(folder)["status"] == "complete" and load_checkpoint(folder)["step"] == 8


def files_of(folder: Path) -> list[str]:
    """The folder's files relative to it; TensorBoard event files (host, pid and time in their names) as one."""
    names = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    return sorted({TENSORBOARD_DIR + "/<events>" if n.startswith(TENSORBOARD_DIR + "/") else n for n in names})


def without_measured(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in line.items() if k not in MEASURED_KEYS} for line in lines]


def test_the_cli_and_the_dashboard_leave_the_same_files_for_the_same_config(tmp_path: Path) -> None:
    from kronos_tune.tui import jobs
    from kronos_tune.tui.jobs import JobFinished, TrainingStep

    config_file = tiny_config(tmp_path)
    by_cli, by_tui = tmp_path / "cli", tmp_path / "tui"
    with pytest.raises(SystemExit) as info:
        main(["train", "--config", str(config_file), "--out", str(by_cli)])
    assert (info.value.code or 0) == 0

    posted: list[Any] = []  # the dashboard runs its jobs in a worker thread, and so does this test
    worker = threading.Thread(target=jobs.train, args=(posted.append, config_file, by_tui, False, threading.Event()))
    worker.start()
    worker.join(timeout=300)
    assert not worker.is_alive()
    finished = posted[-1]
    assert isinstance(finished, JobFinished) and finished.phase == "done", finished.outcome
    assert finished.outcome.startswith("8/8 steps, done, best val loss")
    assert [m.record.step for m in posted if isinstance(m, TrainingStep)] == list(range(1, 9))

    assert files_of(by_cli) == files_of(by_tui)
    assert {"config.toml", "run.json", METRICS_FILE, "checkpoints/last.pt", TENSORBOARD_DIR + "/<events>"} <= \
        set(files_of(by_cli))
    cli_config, tui_config = (TrainConfig.from_toml(f / "config.toml").to_dict() for f in (by_cli, by_tui))
    assert cli_config.pop("output_dir") == str(by_cli) and tui_config.pop("output_dir") == str(by_tui)
    assert cli_config == tui_config
    kept = ("command", "status", "step", "total_steps", "identity", "processes")
    assert {k: run_json(by_cli)[k] for k in kept} == {k: run_json(by_tui)[k] for k in kept}
    assert run_json(by_cli)["status"] == "complete"
    assert without_measured(metrics(by_cli)) == without_measured(metrics(by_tui))  # same steps, losses, evaluations
    for name in sorted(files_of(by_cli)):
        if name.startswith("best/"):  # the same weights, byte for byte
            assert (by_cli / name).read_bytes() == (by_tui / name).read_bytes(), name
