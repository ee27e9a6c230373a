"""Upstream Kronos finetune_csv YAML: mapped to training keys, converted to TOML, trained in two phases in one
run folder (resumable phase by phase), and the job checked against its data before it runs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from kronos_core.data.synthetic import synthetic_series
from kronos_core.train import TrainConfig, load_checkpoint
from kronos_core.train.builders import build_models
from kronos_core.train.train_file import load_train_file
from kronos_tune.cli import main
from kronos_tune.train.checks import job_checks

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS = 120  # tiny's window is 21 rows: 76 training windows (9 steps of 8), 4 validation windows at val 0.2


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return info.value.code or 0


def write_csv(folder: Path, rows: int = ROWS) -> Path:
    path = folder / "klines.csv"
    synthetic_series(1, n_rows=rows, seed=5)[0].to_csv(path, index=False)
    return path


def tiny_weights(folder: Path) -> tuple[Path, Path]:
    """A random-init tiny predictor and tokenizer saved under names that say their size, as hub ids do."""
    model, tokenizer = build_models(TrainConfig(model_size="tiny", seed=3))
    model.save_pretrained(folder / "Kronos-tiny")
    tokenizer.save_pretrained(folder / "Kronos-Tokenizer-tiny")
    return folder / "Kronos-tiny", folder / "Kronos-Tokenizer-tiny"


def upstream_yaml(folder: Path, data: Path, predictor: Path | str = "", tokenizer: Path | str = "",
                  extra: str = "") -> Path:
    path = folder / "up.yaml"
    path.write_text(f"""data:
  data_path: "{data}"
  lookback_window: 16
  predict_window: 4
  max_context: 512
  clip: 4.0
  train_ratio: 0.8
  val_ratio: 0.2
  test_ratio: 0.0
training:
  tokenizer_epochs: 1
  basemodel_epochs: 2
  batch_size: 8
  log_interval: 50
  num_workers: 0
  seed: 11
  tokenizer_learning_rate: 0.0003
  predictor_learning_rate: 0.00005
  adam_beta1: 0.85
  adam_beta2: 0.97
  adam_weight_decay: 0.05
  accumulation_steps: 1
  shiny_new_knob: 3
model_paths:
  exp_name: ali_5min
  pretrained_tokenizer: "{tokenizer}"
  pretrained_predictor: "{predictor}"
  base_save_path: /somewhere/else
  tokenizer_save_name: tokenizer
  basemodel_save_name: basemodel
experiment:
  name: ali_5min
  use_comet: false
  train_tokenizer: true
  train_basemodel: true
device:
  use_cuda: false
distributed:
  use_ddp: false
  backend: gloo
{extra}""", encoding="utf-8")
    return path


def test_every_upstream_key_maps_and_the_unused_ones_are_named_in_one_note(tmp_path: Path) -> None:
    data = write_csv(tmp_path)
    job = load_train_file(upstream_yaml(tmp_path, data))
    shared = job.shared
    assert shared["data"] == [str(data)] and (shared["lookback_window"], shared["predict_window"]) == (16, 4)
    assert shared["clip"] == 4.0 and shared["seed"] == 11 and shared["batch_size"] == 8
    assert shared["betas"] == [0.85, 0.97] and shared["weight_decay"] == 0.05 and shared["device"] == "cpu"
    assert shared["val_fraction"] == pytest.approx(0.2) and "train_until" not in shared  # no test part
    assert job.phases == {"tokenizer": {"epochs": 1, "lr": 0.0003}, "predictor": {"epochs": 2, "lr": 0.00005}}
    assert job.what == "both" and job.label == "ali_5min"
    # upstream's epoch is one pass over the training windows: 96 training rows hold 96 - 21 + 1 = 76
    assert job.windows == (76, 4) and shared["samples_per_epoch"] == 76 and shared["eval_samples"] == 4
    assert job.config("predictor").effective_lr == 0.00005 and job.config("tokenizer").epochs == 1
    (note,) = job.notes
    for key in ("data.max_context", "training.log_interval", "training.shiny_new_knob",
                "model_paths.base_save_path", "experiment.use_comet", "distributed.backend"):
        assert key in note


def test_a_test_ratio_stops_the_training_data_before_the_test_part(tmp_path: Path) -> None:
    path = upstream_yaml(tmp_path, write_csv(tmp_path, rows=200))
    path.write_text(path.read_text().replace("train_ratio: 0.8", "train_ratio: 0.6").replace(
        "test_ratio: 0.0", "test_ratio: 0.2"))
    shared = load_train_file(path).shared
    assert shared["train_until"] == "0.8" and shared["val_fraction"] == pytest.approx(0.25)


def test_a_yaml_with_a_section_upstream_does_not_have_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    path = tmp_path / "other.yaml"
    path.write_text("data:\n  data_path: x.csv\nscheduler:\n  warmup: 3\noptimizer:\n  lr: 1\n")
    assert run_cli(["train", "--config", str(path), "--steps", "1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "section 'scheduler'" in err and "optimizer" not in err
    assert not (tmp_path / "out").exists()


def test_a_missing_data_path_is_one_line_naming_it_before_anything_is_written(tmp_path: Path, capsys) -> None:
    path = upstream_yaml(tmp_path, tmp_path / "gone.csv")
    assert run_cli(["train", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gone.csv" in err
    assert not (tmp_path / "out").exists()


def _losses(folder: Path) -> list[float]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if record.get("kind") == "train"]


def test_convert_round_trips_the_yaml_to_a_toml_that_trains_the_same_steps_to_the_same_loss(
        tmp_path: Path, capsys) -> None:
    predictor, tokenizer = tiny_weights(tmp_path)
    source = upstream_yaml(tmp_path, write_csv(tmp_path), predictor, tokenizer)
    assert run_cli(["config", "convert", str(source)]) == 0
    converted = tmp_path / "up.toml"
    text = converted.read_text()
    assert "# from data.lookback_window" in text and "[tokenizer]" in text and "[predictor]" in text
    parsed = tomllib.loads(text)
    assert parsed["predictor"] == {"epochs": 2, "lr": 0.00005} and parsed["samples_per_epoch"] == 76
    assert run_cli(["config", "convert", str(source)]) == 2  # never replaces the TOML it wrote
    assert "exists" in capsys.readouterr().err
    runs = {}
    for name, config in (("yaml", source), ("toml", converted)):
        out = tmp_path / name
        assert run_cli(["train", "--config", str(config), "--steps", "2", "--out", str(out)]) == 0
        runs[name] = {phase: _losses(out / phase) for phase in ("tokenizer", "predictor")}
        for phase in ("tokenizer", "predictor"):
            assert load_checkpoint(out / phase)["step"] == 2
    assert len(runs["yaml"]["predictor"]) == 2 and runs["yaml"] == runs["toml"]
    printed = capsys.readouterr().out
    assert "epoch: one pass over the 76 training windows" in printed
    predictor_config = TrainConfig.from_toml(tmp_path / "yaml" / "predictor" / "config.toml")
    assert predictor_config.lr == 0.00005 and predictor_config.epochs == 2 and predictor_config.model_size == "tiny"


def test_two_phases_share_one_folder_and_resume_continues_the_unfinished_phase(tmp_path: Path, capsys) -> None:
    predictor, tokenizer = tiny_weights(tmp_path)
    source = upstream_yaml(tmp_path, write_csv(tmp_path), predictor, tokenizer)
    out = tmp_path / "run"
    assert run_cli(["train", "--config", str(source), "--steps", "2", "--out", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["status"] == "partial"
    assert run_cli(["train", "--resume", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"resuming {out}" in printed
    assert load_checkpoint(out / "tokenizer")["step"] == 9  # 1 epoch of 76 windows at 8
    assert load_checkpoint(out / "predictor")["step"] == 18  # 2 epochs
    assert TrainConfig.from_toml(out / "predictor" / "config.toml").tokenizer_dir == str(out / "tokenizer" / "best")
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert run_cli(["train", "--resume", str(out)]) == 2
    assert "both phases are complete" in capsys.readouterr().err


def test_the_plan_names_windows_seen_many_times_and_too_few_validation_windows(tmp_path: Path) -> None:
    data = write_csv(tmp_path)
    config = TrainConfig(model_size="tiny", data=[str(data)], lookback_window=16, predict_window=4, batch_size=8,
                         epochs=20, samples_per_epoch=100_000, val_fraction=0.2)
    lines = job_checks(config)
    # 20 epochs x 12,500 steps over the 76 training windows: each seen 20 x 100,000 / 76 = 26,316 times
    assert any("20 epochs = 250,000 steps over 76 windows: each seen 26,316 times" in line for line in lines)
    assert any(line.startswith("warning: 4 validation windows: a change in val loss under 100%") for line in lines)
    roomy = config.replace(samples_per_epoch=40, val_fraction=0.45)  # 46 training windows
    lines = job_checks(roomy)
    assert not any("each seen" in line for line in lines)
    assert any(line.startswith("validation: 34 windows") for line in lines)
