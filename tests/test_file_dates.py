"""Dates in files written day and month first (01/07/2024): read the one way every date allows, refused in one
line when they all read both ways, unless --date-format says how (kronos_core.data.day_month)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import read_kline
from kronos_core.data.panels import read_panel
from kronos_core.errors import KronosError
from cli_errors import run_cli
from tiny_preset import tiny_train_toml

# Five-minute bars from 1 to 12 July 2024 (every day <= 12): both readings are dates.
_EVERY_5MIN = pd.date_range("2024-07-01 09:35", "2024-07-12 15:00", freq="5min")
JULY = _EVERY_5MIN[_EVERY_5MIN.indexer_between_time("09:35", "15:00")]


def write_bars(path: Path, stamps: list[str], symbols: tuple[str, ...] = ()) -> Path:
    close = 10.0 + 0.01 * np.arange(len(stamps))
    frame = pd.DataFrame({"Date": stamps, "open": close, "high": close + 0.1, "low": close - 0.1, "close": close,
                          "volume": 100.0})
    if symbols:
        frame = pd.concat([frame.assign(symbol=s) for s in symbols], ignore_index=True)
    frame.to_csv(path, index=False)
    return path


def day_first(stamps: pd.DatetimeIndex, sep: str = "/") -> list[str]:
    return list(stamps.strftime(f"%d{sep}%m{sep}%Y %H:%M"))


@pytest.mark.parametrize("sep", ["/", ".", "-"])
def test_dates_that_read_both_ways_are_refused_naming_file_column_and_readings(tmp_path: Path, sep: str) -> None:
    path = write_bars(tmp_path / "bars.csv", day_first(JULY, sep))
    with pytest.raises(KronosError) as caught:
        read_kline(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: column 'Date' has dates that read both day first and month first")
    assert f"line 2 '01{sep}07{sep}2024 09:35' is 2024-07-01 or 2024-01-07" in message
    assert f"--date-format '%d{sep}%m{sep}%Y %H:%M' (day first) or '%m{sep}%d{sep}%Y %H:%M'" in message
    assert "\n" not in message


def test_the_given_format_reads_them(tmp_path: Path) -> None:
    path = write_bars(tmp_path / "bars.csv", day_first(JULY))
    frame = read_kline(path, date_format="%d/%m/%Y %H:%M")
    assert list(frame["timestamps"]) == list(JULY)
    month_first = read_kline(path, date_format="%m/%d/%Y %H:%M")
    assert month_first["timestamps"].iloc[0] == pd.Timestamp("2024-01-07 09:35")


def test_a_row_the_format_does_not_read_is_named(tmp_path: Path) -> None:
    stamps = day_first(JULY[:5])
    stamps[3] = "2024-07-01 09:50"
    path = write_bars(tmp_path / "bars.csv", stamps)
    with pytest.raises(KronosError, match=r"column 'Date' value '2024-07-01 09:50' at line 5 does not match "
                                          r"--date-format '%d/%m/%Y %H:%M'"):
        read_kline(path, date_format="%d/%m/%Y %H:%M")


def test_one_day_above_12_decides_the_reading_for_every_row(tmp_path: Path) -> None:
    """pandas alone reads 01/07 as 7 January from the first row's guess, and 13/07 as 13 July."""
    days = pd.date_range("2024-07-01 15:00", periods=20, freq="D")
    frame = read_kline(write_bars(tmp_path / "day_first.csv", day_first(days)))
    assert list(frame["timestamps"]) == list(days)
    month_first = list(days.strftime("%m/%d/%Y %H:%M"))
    frame = read_kline(write_bars(tmp_path / "month_first.csv", month_first))
    assert list(frame["timestamps"]) == list(days)


def test_day_first_and_month_first_in_one_file_are_refused(tmp_path: Path) -> None:
    path = write_bars(tmp_path / "bars.csv", ["13/07/2024 09:35", "07/14/2024 09:35"])
    with pytest.raises(KronosError, match=r"mixes day-first and month-first dates \(line 2 '13/07/2024 09:35' has "
                                          r"the day first, line 3 '07/14/2024 09:35' the month\)"):
        read_kline(path)


def test_dates_that_are_the_same_either_way_and_year_first_dates_are_read(tmp_path: Path) -> None:
    same = read_kline(write_bars(tmp_path / "same.csv", ["01/01/2024", "02/02/2024", "03/03/2024"]))
    assert list(same["timestamps"].dt.month) == [1, 2, 3]
    iso = read_kline(write_bars(tmp_path / "iso.csv", list(JULY[:4].strftime("%Y/%m/%d %H:%M"))))
    assert list(iso["timestamps"]) == list(JULY[:4])


def test_a_panel_is_judged_the_same_way(tmp_path: Path) -> None:
    path = write_bars(tmp_path / "panel.csv", day_first(JULY[:40]), symbols=("AAA", "BBB"))
    with pytest.raises(KronosError, match="column 'Date' has dates that read both day first and month first"):
        read_panel(path, "symbol")
    panel = read_panel(path, "symbol", date_format="%d/%m/%Y %H:%M")
    assert panel["timestamps"].max() == JULY[39]


# The commands: one line, exit 2, nothing written; --date-format reads the file ------------------------------

def test_predict_refuses_then_forecasts_after_the_last_bar_with_the_format(tmp_path: Path, capsys) -> None:
    data = write_bars(tmp_path / "bars.csv", day_first(JULY))
    out = tmp_path / "forecast.csv"
    args = ["predict", "--size", "tiny", "--data", str(data), "--lookback", "32", "--pred-len", "2", "--out", str(out)]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "2024-07-01 or 2024-01-07" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bars.csv"]  # nothing written
    code, _, err = run_cli(args + ["--date-format", "%d/%m/%Y %H:%M"], capsys)
    assert code == 0, err
    first = pd.Timestamp(pd.read_csv(out)["timestamps"].min())
    assert first > JULY[-1] and first.month == 7 and first.day == 12


def test_train_and_backtest_refuse_before_any_folder(tmp_path: Path, capsys) -> None:
    panel = write_bars(tmp_path / "panel.csv", day_first(JULY), symbols=("AAA", "BBB", "CCC"))
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_train_toml(data=[str(panel)], symbol_column="symbol"))
    for argv in (["train", "--config", str(config), "--out", str(tmp_path / "run")],
                 ["backtest", "--size", "tiny", "--data", str(panel), "--lookback", "32", "--pred-len", "2",
                  "--origins", "2", "--top-k", "1", "--out", str(tmp_path / "run")]):
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{panel}: column 'Date' has dates that read both" in err
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, expected", [
    (["predict", "--size", "tiny", "--synthetic", "2", "--lookback", "32", "--pred-len", "2", "--date-format",
      "%d/%m/%Y"], "--date-format '%d/%m/%Y' says how --data files write their dates"),
    (["predict", "--size", "tiny", "--data", "x.csv", "--lookback", "32", "--pred-len", "2", "--date-format",
      "%Q"], "--date-format '%Q': not a date format"),
    (["train", "--data", "x.csv", "--date-format", "dd/mm/yyyy"], "--date-format 'dd/mm/yyyy': not a date format"),
])
def test_a_bad_format_is_one_line(argv: list[str], expected: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.strip().startswith(f"error: {expected}") and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []

