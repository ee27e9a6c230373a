"""`kronos-tune config keys`: every TrainConfig key with its type and default, as a table and as JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kronos_core.train import TrainConfig
from kronos_tune.cli import main


def run(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return info.value.code or 0


def test_json_lists_every_key_with_a_default_the_config_accepts(capsys) -> None:
    assert run(["config", "keys", "--json"]) == 0
    listed = {key["name"]: key for key in json.loads(capsys.readouterr().out)}
    fields = {spec.name for spec in dataclasses.fields(TrainConfig)}
    assert set(listed) == fields
    assert listed["batch_size"]["type"] == "int" and listed["batch_size"]["default"] == 50
    assert listed["amp"]["choices"] == ["none", "bf16", "fp16"]
    assert "finetune" in listed["predictor_dir"]["description"]
    assert "tokenizer" in listed["tokenizer_dir"]["description"]
    defaults = {name: key["default"] for name, key in listed.items() if key["default"] is not None}
    assert TrainConfig.from_dict(defaults) == TrainConfig()  # the listed defaults are the real ones


def test_table_shows_types_and_defaults(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert run(["config", "keys"]) == 0
    text = capsys.readouterr().out
    line = next(row for row in text.splitlines() if row.strip().startswith("data "))
    assert "list[str]" in line and '["synthetic"]' in line
    assert any(row.strip().startswith("predictor_dir") and "(left out)" in row for row in text.splitlines())


def test_unknown_key_error_points_to_the_list(tmp_path, capsys) -> None:
    config = tmp_path / "run.toml"
    config.write_text("bach_size = 4\n")
    assert run(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'batch_size'" in err and "kronos-tune config keys" in err and err.count("\n") == 1
