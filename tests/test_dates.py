"""Date flags keep the forms they take (ISO, YYYYMMDD, fractions for --train-until) and refuse day/month
first forms, which pandas reads day-first or month-first depending on the numbers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kronos_core.errors import KronosError
from kronos_core.train.data_span import parse_train_until
from kronos_tune.cli import main
from tiny_preset import tiny_train_toml


@pytest.mark.parametrize("text, expected", [
    ("2010-05-14", ("date", pd.Timestamp("2010-05-14"))),
    ("20100514", ("date", pd.Timestamp("2010-05-14"))),
    ("2010/05/14", ("date", pd.Timestamp("2010-05-14"))),
    ("2010-05-14 15:00", ("date", pd.Timestamp("2010-05-14 15:00"))),
    ("14 May 2010", ("date", pd.Timestamp("2010-05-14"))),
    ("0.75", ("fraction", 0.75)),
])
def test_the_forms_it_takes(text: str, expected: tuple) -> None:
    assert parse_train_until(text) == expected


@pytest.mark.parametrize("text, readings", [
    ("05/06/2010", "2010-06-05 or 2010-05-06"),
    ("18/05/2010", "2010-05-18"),
    ("05.06.2010", "2010-06-05 or 2010-05-06"),
    ("06-05-10 09:30", "2010-05-06 or 2010-06-05"),
])
def test_day_and_month_first_is_refused_with_how_to_write_it(text: str, readings: str) -> None:
    with pytest.raises(KronosError) as caught:
        parse_train_until(text)
    message = str(caught.value)
    assert f"train_until {text!r} (--train-until)" in message and "ambiguous" in message
    assert f"write the year first: {readings} (YYYY-MM-DD, or YYYYMMDD)" in message


def test_the_cli_refuses_it_in_one_line_before_any_folder(tmp_path: Path, capsys) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_train_toml())
    with pytest.raises(SystemExit) as caught:
        main(["train", "--config", str(config), "--train-until", "05/06/2010", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and len(err.strip().splitlines()) == 1 and "2010-06-05 or 2010-05-06" in err
    assert not (tmp_path / "run").exists()


def test_a_bad_date_in_the_flag_is_not_blamed_on_the_config_file(tmp_path: Path, capsys) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_train_toml())
    with pytest.raises(SystemExit) as caught:
        main(["train", "--config", str(config), "--train-until", "2010-13-45", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert caught.value.code == 2 and err.startswith("error: train_until '2010-13-45' (--train-until) is neither")
    assert str(config) not in err
    # the same value written in the file names the file
    config.write_text(tiny_train_toml(train_until="2010-13-45"))
    with pytest.raises(SystemExit):
        main(["train", "--config", str(config), "--out", str(tmp_path / "run")])
    assert capsys.readouterr().err.startswith(f"error: {config}: train_until '2010-13-45'")
