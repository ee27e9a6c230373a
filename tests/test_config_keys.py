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


def test_every_key_is_described() -> None:
    from kronos_tune.commands.config import config_keys

    assert [key.name for key in config_keys() if not key.description] == []


def test_listing_at_80_columns_keeps_each_description_whole(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert run(["config", "keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    at = next(i for i, line in enumerate(lines) if line.startswith("train_until = "))
    described = " ".join(line.strip() for line in lines[at + 1:at + 5] if line.startswith("    "))
    assert "2010-05-14" in described and "fraction" in described  # wrapped at word ends, not squeezed


def test_redirected_listing_is_not_wrapped(capsys, monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert run(["config", "keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("tokenizer_dir = "))
    assert lines[at + 1].strip().endswith("a random-init tokenizer") and lines[at + 2].startswith("predictor_dir")
