"""`kronos-tune report`: rebuild a benchmark's report and recommendation from results.jsonl, on any machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from kronos_core.train import TrainConfig
from cli_errors import run_cli
from kronos_tune.benchmark import TrialResult

from test_decision import h200_like_results  # noqa: E402


def write_gpu_run(folder: Path, results: list[TrialResult] | None = None, preset: str = "rtx3080",
                  task: str = "train") -> Path:
    """A run folder as a CUDA machine leaves it: results.jsonl and run.json, no report files."""
    folder.mkdir(parents=True)
    trials = results if results is not None else h200_like_results(20)
    for trial in trials:
        trial.hardware = "1 x NVIDIA H200"
        trial.task = task
        trial.config = TrainConfig.from_dict({"model_size": "small", "batch_size": 50, "device": "cuda"},
                                             portable=True).to_dict()
        trial.config.update(trial.changes)
    (folder / "results.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trials))
    run = {"tool": "kronos-tune-run", "command": "benchmark", "status": "complete",
           "identity": {"preset": preset, "task": task, "measurement": {"steps": 8}},
           "device": "cuda", "device_line": "device: cuda:0 NVIDIA H200 (139.8 GiB); budget 11.5 GiB via memory "
                                            "fraction", "budget_bytes": round(11.5 * 2**30),
           "planned": [t.name for t in trials]}
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def test_report_rebuilds_a_gpu_run_on_this_cpu_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_gpu_run(tmp_path / "run")
    code, out, err = run_cli(["report", str(run)], capsys)
    assert code == 0, err
    for name in ("report.json", "report.md", "report.csv", "recommended.toml"):
        assert (run / name).is_file(), name
    data = json.loads((run / "report.json").read_text())
    rec = data["recommended"]
    assert rec["source"] in ("baseline", "compile")
    assert "activation_checkpointing" not in rec["changes"] and "accumulation_steps" not in rec["changes"]
    assert data["device"] == "cuda" and data["trials"][0]["hardware"] == "1 x NVIDIA H200"
    by_name = {t["name"]: t for t in data["trials"]}
    assert by_name["checkpointing"]["comparison"]["verdict"] == "slower"
    assert "recommended" in out and "kronos-tune benchmark: preset rtx3080" in out
    assert f"kronos-tune train --config {run}/recommended.toml" in out
    text = (run / "recommended.toml").read_text()  # the GPU machine's config, written on this CPU machine
    values = tomllib.loads(text)
    config = TrainConfig.from_dict(values, portable=True)
    assert config.device == "cuda" and config.activation_checkpointing == "none" and config.accumulation_steps == 1
    assert (run / "results.jsonl").read_text().count("\n") == len(by_name)  # the run's own results untouched


def test_a_bare_results_file_in_a_read_only_folder_prints_and_writes_only_with_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_gpu_run(tmp_path / "h200")
    results = run / "rtx3080-train-results.jsonl"
    (run / "results.jsonl").rename(results)
    (run / "run.json").rename(run / "rtx3080-train-run.json")
    os.chmod(run, 0o555)
    try:
        code, out, err = run_cli(["report", str(results)], capsys)
        assert code == 0, err
        assert "not written" in out and "recommended" in out and "rtx3080" in out
        assert f"next: kronos-tune report {results} --out DIR, then kronos-tune train --config DIR/recommended.toml" \
            in out
        code, out, err = run_cli(["report", str(results), "--out", str(tmp_path / "rebuilt")], capsys)
        assert code == 0, err
        assert (tmp_path / "rebuilt" / "report.md").is_file() and (tmp_path / "rebuilt" / "results.jsonl").is_file()
    finally:
        os.chmod(run, 0o755)


def test_a_truncated_last_line_is_dropped_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_gpu_run(tmp_path / "run")
    with open(run / "results.jsonl", "a") as handle:
        handle.write('{"name": "fused-adamw", "stage": "sing')  # a crash while writing
    code, out, err = run_cli(["report", str(run), "--json"], capsys)
    assert code == 0, err
    assert "dropped results.jsonl the last line, cut short" in err
    assert "fused-adamw" not in [t["name"] for t in json.loads(out)["trials"]]


def test_two_runs_of_one_preset_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = write_gpu_run(tmp_path / "a")
    second = write_gpu_run(tmp_path / "b", h200_like_results(20, outlier=False))
    code, out, err = run_cli(["report", str(first), str(second)], capsys)
    assert code == 0, err
    assert "[1] time/step" in out and "[2] time/step" in out and "checkpointing" in out
    assert "slower" in out and out.count("recommended") >= 2


@pytest.mark.parametrize("case, text", [
    ("empty", "no results.jsonl in that folder"),
    ("nothing-valid", "no trial results in results.jsonl (1 unreadable line(s))"),
    ("mixed-tasks", "the results mix tasks predict, train"),
    ("mixed-presets", "the runs mix presets/tasks"),
    ("missing", "no such file or folder"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
                                          text: str) -> None:
    argv = ["report"]
    if case == "empty":
        (tmp_path / "run").mkdir()
        argv.append(str(tmp_path / "run"))
    elif case == "nothing-valid":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "results.jsonl").write_text("{not json\n")
        argv.append(str(tmp_path / "run"))
    elif case == "mixed-tasks":
        run = write_gpu_run(tmp_path / "run")
        trial = TrialResult("kv-cache", "single", "ok", task="predict")
        with open(run / "results.jsonl", "a") as handle:
            handle.write(json.dumps(trial.to_dict()) + "\n")
        argv.append(str(run))
    elif case == "mixed-presets":
        argv += [str(write_gpu_run(tmp_path / "a")), str(write_gpu_run(tmp_path / "b", preset="h200"))]
    else:
        argv.append(str(tmp_path / "nope"))
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    line = err.strip()
    assert text in line and "\n" not in line and "Traceback" not in line
