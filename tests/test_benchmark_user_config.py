"""`kronos-tune benchmark --config FILE`: the user's own finetune measured on their data, an upstream finetune_csv
YAML included, and recommended.toml as their config with the chosen changes under a header naming each.

One real benchmark run (the CLI in this process, trial workers in their own) on a CSV the test writes; no timing
is asserted, only what was measured and written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.synthetic import synthetic_series
from kronos_tune.benchmark.predict.pipeline import benchmark_series
from kronos_tune.benchmark.report.rebuild import load_run
from kronos_tune.benchmark.results import PredictSettings
from kronos_tune.benchmark.train.text import user_recommended_toml
from kronos_tune.benchmark.user_job import save_predict_series, user_preset
from kronos_tune.presets import resolve_preset

from test_upstream_config import run_cli, tiny_weights, upstream_yaml, write_csv  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--steps", "2", "--max-steps", "2", "--warmup", "2", "--trial-budget", "0.3", "--block", "0.02"]


@pytest.fixture(scope="module")
def yaml_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    """The upstream YAML (tokenizer then predictor) benchmarked with one change besides the baseline."""
    root = tmp_path_factory.mktemp("user-config")
    predictor, tokenizer = tiny_weights(root)
    data = write_csv(root)
    source = upstream_yaml(root, data, predictor, tokenizer)
    out = root / "out"
    done = subprocess.run([sys.executable, "-m", "kronos_tune.cli", "benchmark", "--config", str(source), "--only",
                           "accumulation", "--out", str(out), *FAST], capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    return source, data, out, done.stdout


def test_report_json_names_the_users_file_its_data_and_windows(yaml_run) -> None:
    source, data, out, printed = yaml_run
    report = json.loads((out / "report.json").read_text())
    job = report["job"]
    assert job["source"] == str(source) and job["phase"] == "predictor" and job["upstream"]
    assert job["data"] == [str(data.absolute())]
    # 96 training rows hold 76 windows of 21 rows, the 24 validation rows 4: every trial evaluates those 4
    assert job["windows"] == {"train": 76, "val": 4, "rows": 21, "evaluated": 4}
    assert (job["lookback_window"], job["predict_window"]) == (16, 4)
    assert report["quality"]["eval_windows"] == 4
    trials = {trial["name"]: trial for trial in report["trials"] if trial["status"] == "ok"}
    assert {"baseline", "accumulation"} <= set(trials)
    for trial in trials.values():  # every trial read the run's saved copy of the user's series
        assert trial["config"]["data"] == [str(out / "data")] and trial["config"]["model_size"] == "tiny"
        assert trial["config"]["lookback_window"] == 16 and trial["config"]["what"] == "predictor"
        assert len(trial["val_windows"]) == 4
    assert (out / "data" / "series-0000.csv").is_file()
    assert "plan: workload: " in printed and "the predictor phase of tokenizer then predictor" in printed
    assert "plan: epoch: one pass over the 76 training windows" in printed
    assert "plan: warning: 4 validation windows" in printed
    assert "plan: memory: projected peak" in printed and "autobatch would pick batch_size = " in printed
    assert f"your job: {source} (predictor phase) on {data.absolute()}" in printed


def test_recommended_toml_is_the_users_config_and_trains(yaml_run, tmp_path: Path) -> None:
    source, data, out, _ = yaml_run
    text = (out / "recommended.toml").read_text()
    assert text.startswith(f"# kronos-tune benchmark of {source} (predictor phase")
    parsed = tomllib.loads(text)  # TOML, though the input was YAML
    assert parsed["data"] == [str(data.absolute())] and parsed["model_size"] == "tiny"
    assert (parsed["lookback_window"], parsed["predict_window"], parsed["seed"]) == (16, 4, 11)
    assert parsed["tokenizer"]["lr"] == 0.0003 and parsed["predictor"]["epochs"] == 2
    assert run_cli(["train", "--config", str(out / "recommended.toml"), "--steps", "1", "--out",
                    str(tmp_path / "train")]) == 0
    for phase in ("tokenizer", "predictor"):
        assert (tmp_path / "train" / phase / "checkpoints" / "last.pt").is_file()


def test_a_chosen_change_lands_in_its_phase_under_a_header_with_its_measured_effect(yaml_run) -> None:
    _, _, out, _ = yaml_run
    report = load_run(out).report
    report.recommended = replace(report.recommended, source="accumulation")
    text = user_recommended_toml(report)
    assert "# change: batch_size = 4 (was 8)" in text and "# change: accumulation_steps = 2 (was 1)" in text
    assert "#   measured, accumulation: time/step x" in text and "val loss" in text
    parsed = tomllib.loads(text)
    assert parsed["predictor"]["batch_size"] == 4 and parsed["predictor"]["accumulation_steps"] == 2
    assert parsed["batch_size"] == 8 and "batch_size" not in parsed["tokenizer"]  # the tokenizer phase as it was


def test_a_toml_job_is_checked_and_a_preset_is_the_hardware_budget(tmp_path: Path) -> None:
    data = write_csv(tmp_path, rows=200)
    path = tmp_path / "user.toml"
    path.write_text(f'model_size = "tiny"\ndata = ["{data}"]\nlookback_window = 16\npredict_window = 4\n'
                    f'batch_size = 8\nepochs = 20\nsamples_per_epoch = 100000\nval_fraction = 0.2\n')
    preset, lines = user_preset(path, None, resolve_preset("cpu"))
    assert preset.job["data"] == [str(data)] and preset.workload.epochs == 20
    assert preset.hardware == resolve_preset("cpu").hardware and preset.workload.lookback_window == 16
    assert lines[0].startswith("hardware: preset cpu's budget") and f"the workload is {path}'s" in lines[0]
    # 160 training rows: 140 windows; 20 epochs x 12,500 steps of 8 = 2,000,000 / 140 = 14,286 each
    assert any("20 epochs = 250,000 steps over 140 windows: each seen 14,286 times" in line for line in lines)
    assert any(line.startswith("warning: 20 validation windows") for line in lines)
    assert any(line.startswith("memory: projected peak") and " fits the " in line for line in lines)


def test_a_missing_data_path_is_one_line_before_anything_is_written(tmp_path: Path, capsys) -> None:
    path = tmp_path / "user.toml"
    path.write_text(f'model_size = "tiny"\ndata = ["{tmp_path / "gone.csv"}"]\n')
    for command in (["benchmark", "--config", str(path), "--out", str(tmp_path / "out")],
                    ["dashboard", "--config", str(path)]):
        assert run_cli(command) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "gone.csv" in err
    assert not (tmp_path / "out").exists()


def test_a_yaml_that_is_no_finetune_config_is_one_line_naming_its_first_unknown_section(tmp_path: Path,
                                                                                        capsys) -> None:
    path = tmp_path / "other.yaml"
    path.write_text("data:\n  data_path: x.csv\nscheduler:\n  warmup: 3\noptimizer:\n  lr: 1\n")
    assert run_cli(["benchmark", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "section 'scheduler'" in err and "optimizer" not in err
    assert not (tmp_path / "out").exists()


def test_a_predict_config_is_benchmarked_on_its_series_and_recommended_as_itself(tmp_path: Path) -> None:
    folder = tmp_path / "series"
    folder.mkdir()
    for index, frame in enumerate(synthetic_series(4, n_rows=80, seed=5)):
        frame.to_csv(folder / f"s{index}.csv", index=False)
    path = tmp_path / "pred.toml"
    path.write_text(f'[predict]\nsize = "tiny"\ndata = ["{folder}"]\nlookback = 32\npred_len = 4\n')
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "kronos_tune.cli", "benchmark", "--task", "predict", "--config",
                           str(path), "--steps", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=400, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert f"plan: workload: {path}: 4 series of {folder}, lookback 32, pred_len 4" in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["job"]["data"] == [str(folder)] and report["job"]["series"] == 4
    ran = [trial for trial in report["trials"] if trial["status"] == "ok"]
    assert len(ran) >= 2
    saved = out / "data" / "series.npz"  # the user's series read once; every trial opened this copy
    assert report["job"]["saved_data"] == str(saved) and saved.is_file()
    for trial in ran:  # every trial predicted the user's series with the file's windows
        assert trial["config"]["inputs"]["data"] == [str(folder)]
        assert trial["config"]["inputs"]["saved"] == str(saved)
        assert (trial["config"]["lookback"], trial["config"]["pred_len"]) == (32, 4)
    assert f"the same 4 series of {folder} (your job: {path})" in (out / "report.md").read_text()
    text = (out / "recommended.toml").read_text()
    assert text.startswith(f"# kronos-tune benchmark --task predict of {path}")
    table = tomllib.loads(text)["predict"]
    assert table["data"] == [str(folder)] and table["size"] == "tiny" and (table["lookback"], table["pred_len"]) == (
        32, 4)
    assert run_cli(["predict", "--config", str(out / "recommended.toml"), "--out", str(tmp_path / "p.csv")]) == 0
    assert set(pd.read_csv(tmp_path / "p.csv")["series"]) == {"s0", "s1", "s2", "s3"}


def test_predict_trials_open_the_saved_series_not_the_users_files(tmp_path: Path) -> None:
    folder = tmp_path / "series"
    folder.mkdir()
    for index, frame in enumerate(synthetic_series(3, n_rows=50, seed=2)):
        frame.to_csv(folder / f"s{index}.csv", index=False)
    settings = PredictSettings("tiny", 32, 4, 1, 3, 3, inputs={"data": [str(folder)]})
    read = benchmark_series(settings, "cpu")
    saved = save_predict_series(settings, "cpu", tmp_path / "run")
    shutil.rmtree(folder)  # the trials never read them again
    opened = benchmark_series(replace(settings, inputs={**settings.inputs, "saved": str(saved)}), "cpu", 2)
    assert list(opened.names) == ["s0", "s1"] == list(read.names[:2])
    for field in ("x", "x_stamp", "y_stamp", "future_ns", "last_ns", "no_volume"):
        np.testing.assert_array_equal(getattr(opened, field), getattr(read, field)[:2])
    assert opened.precision == read.precision
