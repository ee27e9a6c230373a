"""TrainConfig: TOML round trip, defaults from the reference, one-line validation errors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kronos_core.errors import KronosError
from kronos_core.train import TrainConfig
from kronos_core.files import dumps_toml


def test_defaults_follow_the_reference() -> None:
    config = TrainConfig()
    assert (config.lookback_window, config.predict_window, config.batch_size) == (90, 10, 50)
    assert config.betas == (0.9, 0.95) and config.weight_decay == 0.1 and config.seed == 100
    assert config.effective_lr == 4e-5 and config.effective_grad_clip == 3.0
    tokenizer = TrainConfig(what="tokenizer")
    assert tokenizer.effective_lr == 2e-4 and tokenizer.effective_grad_clip == 2.0
    assert TrainConfig(lr=1e-3).effective_lr == 1e-3
    assert config.window_length == 101


def test_toml_round_trip(tmp_path: Path) -> None:
    config = TrainConfig(what="tokenizer", model_size="tiny", data=[str(tmp_path / "a b.csv"), "folder/with\"quote"],
                         lookback_window=30, predict_window=5, batch_size=7, accumulation_steps=3, amp="bf16",
                         activation_checkpointing="every_n", activation_checkpointing_every_n=3, lr=1e-3,
                         betas=(0.8, 0.99), grad_clip=1.5, pin_memory=True, teacher_forcing=False,
                         samples_per_epoch=210, tokenizer_dir=str(tmp_path / "tok"), output_dir=str(tmp_path / "out"), div_factor=25)
    path = tmp_path / "run.toml"
    text = config.to_toml(path)
    assert path.read_text() == text
    again = TrainConfig.from_toml(path)
    assert again == config
    # Plain TOML: any reader gives the same keys, and TrainConfig(**fields) accepts them.
    assert TrainConfig(**tomllib.loads(text)) == config
    # None fields are left out and come back as None.
    assert "predictor_dir" not in tomllib.loads(text) and again.predictor_dir is None


def test_flat_writer_values() -> None:
    text = dumps_toml({"a": 1, "b": 0.5, "c": 1e-5, "d": True, "e": "x\ty", "f": [1.0, 2], "g": None, "h": 3.0})
    assert tomllib.loads(text) == {"a": 1, "b": 0.5, "c": 1e-5, "d": True, "e": "x\ty", "f": [1.0, 2], "h": 3.0}


def test_unknown_key_names_the_closest(tmp_path: Path) -> None:
    with pytest.raises(KronosError, match=r"unknown config key 'bach_size' \(did you mean 'batch_size'\?\)"):
        TrainConfig(bach_size=4)
    path = tmp_path / "bad.toml"
    path.write_text('model_size = "tiny"\nlearning_rate = 0.1\n')
    with pytest.raises(KronosError) as info:
        TrainConfig.from_toml(path)
    message = str(info.value)
    assert str(path) in message and "'learning_rate'" in message and "\n" not in message


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"batch_size": 0}, "batch_size=0 must be >= 1"),
        ({"lr": -1e-4}, "lr=-0.0001 must be > 0"),
        ({"accumulation_steps": 0}, "accumulation_steps=0 must be >= 1"),
        ({"samples_per_epoch": 100, "batch_size": 50, "accumulation_steps": 3}, "less than one optimizer step"),
        ({"lookback_window": 500, "predict_window": 20}, "exceeds the 512-token context"),
        ({"amp": "fp16", "device": "cpu"}, "needs a CUDA device"),
        ({"amp": "fp8"}, "use one of none, bf16, fp16"),
        ({"model_size": "huge"}, "not a valid choice"),
        ({"batch_size": "8"}, "batch_size must be an integer (got string '8'); write a whole number"),
        ({"teacher_forcing": 1}, "teacher_forcing must be true or false (got integer 1)"),
        ({"tokenizer_dir": 3}, "tokenizer_dir must be a string or left out (got integer 3)"),
        ({"seed": True}, "seed must be an integer (got boolean True)"),
        ({"data": ["a.csv", 2]}, "data must be a list of strings (got array ['a.csv', 2])"),
        ({"betas": [0.9]}, "two numbers"),
        ({"data": []}, "data=[] is empty"),
        ({"data": ["synthetic", "x.csv"]}, "mixes"),
        ({"pct_start": 1.5}, "between 0 and 1"),
    ],
)
def test_impossible_values(fields: dict, fragment: str) -> None:
    with pytest.raises(KronosError) as info:
        TrainConfig(**fields)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_mini_has_a_longer_context_and_data_string_becomes_a_list() -> None:
    assert TrainConfig(model_size="mini", lookback_window=1500, predict_window=100, synthetic_rows=4000).window_length == 1601
    assert TrainConfig(data="prices.csv").data == ["prices.csv"]


def test_replace_and_toml_table_rejected(tmp_path: Path) -> None:
    assert TrainConfig().replace(batch_size=8).batch_size == 8
    path = tmp_path / "nested.toml"
    path.write_text("[train]\nbatch_size = 4\n")
    with pytest.raises(KronosError, match="is a table"):
        TrainConfig.from_toml(path)
    with pytest.raises(KronosError, match="not found"):
        TrainConfig.from_toml(tmp_path / "missing.toml")
