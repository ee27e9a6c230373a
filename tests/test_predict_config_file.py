"""Prediction config files (`kronos-tune predict --config`): the keys, flags winning over the file, and the wrong
kind of config refused in one line by both commands (no prediction or training runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_tune.cli import main
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.config_file import merge_predict_file, predict_file_toml, read_predict_file
from tiny_preset import tiny_train_toml

SETTINGS = {"size": "tiny", "lookback": 32, "pred_len": 4, "max_batch_size": 8, "window_mode": "refill",
            "amp": "none", "cuda_graphs": False, "kv_cache": True, "nproc": 1}


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _error(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_written_config_reads_back_with_paths_and_types(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.toml", predict_file_toml({**SETTINGS, "data": ["a.csv", "b.csv"]}, ["made here"]))
    values = read_predict_file(path)
    assert values == {**SETTINGS, "data": (Path("a.csv"), Path("b.csv"))}
    assert path.read_text(encoding="utf-8").startswith("# made here\n[predict]\n")


def test_flags_given_win_and_exclude_the_files_alternatives() -> None:
    command = {"lookback": 64, "size": None, "checkpoint": Path("ckpt"), "tokenizer": Path("tok"), "amp": "none",
               "synthetic": None, "data": ()}
    from_file = {"lookback": 32, "pred_len": 4, "size": "tiny", "amp": "bf16", "synthetic": 10}
    merged = merge_predict_file(command, {"lookback", "checkpoint", "tokenizer"}, from_file)
    assert merged["lookback"] == 64 and merged["pred_len"] == 4 and merged["amp"] == "bf16"
    assert merged["size"] is None and merged["checkpoint"] == Path("ckpt")  # --checkpoint drops the file's size
    assert merged["synthetic"] == 10
    assert merge_predict_file(command, {"data"}, from_file)["synthetic"] is None  # --data drops its synthetic


@pytest.mark.parametrize(("text", "expected"), [
    ("[predict]\nmax_bach_size = 8\n", "p.toml: unknown key 'predict.max_bach_size' (did you mean "
                                       "'predict.max_batch_size'?)"),
    ("[predict]\nlookback = \"32\"\n", "p.toml: predict.lookback must be an integer or left out (got string '32')"),
    ("[predict]\namp = \"fp8\"\n", "p.toml: predict.amp must be one of 'none', 'bf16', 'fp16' or left out"),
    ("[predict]\nlookback = 32\n[extra]\nx = 1\n", "p.toml: unknown table or key 'extra'"),
    ("lookback = 32\n", "p.toml: no [predict] table"),
])
def test_bad_keys_are_one_line_naming_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(KronosTuneError) as error:
        read_predict_file(_write(tmp_path / "p.toml", text))
    assert str(error.value).startswith(str(tmp_path / expected.split(":")[0]) + ":" + expected.split(":", 1)[1])
    assert "\n" not in str(error.value)


def test_predict_refuses_a_training_config_and_train_a_prediction_config(tmp_path: Path, capsys) -> None:
    training = _write(tmp_path / "train.toml", tiny_train_toml())
    err = _error(["predict", "--config", str(training)], capsys)
    assert err.startswith(f"error: {training}: a training config (TrainConfig keys such as ")
    assert f"train with `kronos-tune train --config {training}`" in err
    prediction = _write(tmp_path / "predict.toml", predict_file_toml(SETTINGS, []))
    err = _error(["train", "--config", str(prediction)], capsys)
    assert err.startswith(f"error: {prediction}: a prediction config (a [predict] table), not a training config; "
                          f"predict with `kronos-tune predict --config {prediction}`")
    err = _error(["predict", "--config", str(_write(tmp_path / "bad.toml", "[predict]\nbatch = 8\n"))], capsys)
    assert err.startswith(f"error: {tmp_path / 'bad.toml'}: unknown key 'predict.batch'")


def test_lookback_is_still_required_without_a_config(capsys) -> None:
    err = _error(["predict", "--size", "tiny", "--pred-len", "4"], capsys)
    assert err.startswith("error: kronos-tune predict: Missing option '--lookback'; see `kronos-tune predict --help`")


def test_settings_this_machine_cannot_run_are_one_line(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path / "p.toml", predict_file_toml({**SETTINGS, "kv_cache": False, "nproc": 2}, []))
    err = _error(["predict", "--config", str(path), "--device", "cpu"], capsys)
    assert "--no-kv-cache with --nproc 2: the full-recompute reference runs in one process" in err
    err = _error(["predict", "--config", str(path), "--device", "cpu", "--nproc", "1", "--cuda-graphs"], capsys)
    assert "--cuda-graphs needs a CUDA device" in err
