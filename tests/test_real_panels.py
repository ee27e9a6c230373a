"""Real files we do not own, through the real commands: a daily panel as public S&P 500 data comes (YYYYMMDD
integer dates, a `Symbol` column, symbols of uneven length), exchange-local stamps across a daylight-saving
change, a written index, extra columns, repeated and backwards rows, a missing symbol column.

Each test writes its own small file in the shape it checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import FEATURE_COLUMNS, read_kline
from kronos_core.data.panels import read_panel
from kronos_core.errors import KronosError
from kronos_core.predict.panel import panel_inputs
from kronos_tune.cli import main
from tiny_preset import tiny_train_toml

pytestmark = pytest.mark.usefixtures("one_thread")

# NYSE holidays of 2010 on weekdays: a business-day grid crosses them, the XNYS calendar does not.
NYSE_HOLIDAYS_2010 = pd.to_datetime(["2010-01-01", "2010-01-18", "2010-02-15", "2010-04-02", "2010-05-31",
                                     "2010-07-05", "2010-09-06", "2010-11-25", "2010-12-24"])
COMMON = ("--size", "tiny", "--device", "cpu", "--top-k", "1")


def daily_bars(rows: int, end: str, seed: int) -> pd.DataFrame:
    """`rows` trading days ending at `end`, columns as public US daily data has them (Date is YYYYMMDD)."""
    days = pd.bdate_range(end=end, periods=rows + 40)
    days = days[~days.isin(NYSE_HOLIDAYS_2010)][-rows:]
    rng = np.random.default_rng(seed)
    close = 40.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, rows)))
    open_ = close * np.exp(rng.normal(0.0, 0.004, rows))
    high = np.maximum(open_, close) * (1 + np.abs(rng.normal(0.0, 0.004, rows)))
    low = np.minimum(open_, close) * (1 - np.abs(rng.normal(0.0, 0.004, rows)))
    return pd.DataFrame({"Date": days.strftime("%Y%m%d").astype(int), "Open": open_.round(2),
                         "High": high.round(2), "Low": low.round(2), "Close": close.round(2),
                         "Volume": rng.integers(10_000, 90_000, rows)})


def write_sp500_like(path: Path, shorts: int = 7,
                     full: tuple[tuple[str, int, str], ...] = (("AAA", 60, "2010-08-20"), ("BBB", 45, "2010-07-02")),
                     ) -> pd.DataFrame:
    """Symbols of uneven length (by default AAA ends Friday 2010-08-20, BBB Friday 2010-07-02, the Monday
    after which is a NYSE holiday) and `shorts` symbols of 20 rows; rows in date order, symbols interleaved."""
    parts = [daily_bars(rows, end, k).assign(Symbol=name) for k, (name, rows, end) in enumerate(full)]
    parts += [daily_bars(20, "2010-08-20", 10 + k).assign(Symbol=f"S{k}") for k in range(shorts)]
    panel = pd.concat(parts).sort_values(["Date", "Symbol"], kind="stable").reset_index(drop=True)
    panel = panel[["Date", "Symbol", "Open", "High", "Low", "Close", "Volume"]]
    panel.to_csv(path, index=False)
    return panel


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return caught.value.code or 0, captured.out, captured.err


def predict_json(capsys: pytest.CaptureFixture[str], *args: object) -> dict:
    code, out, err = run(capsys, "predict", *COMMON, *args, "--json")
    assert code == 0, err
    assert "Traceback" not in err
    return json.loads(out)


def refused(capsys: pytest.CaptureFixture[str], *args: object) -> str:
    """The one error line of a command that must stop with exit code 2."""
    code, out, err = run(capsys, *args)
    assert code == 2, (out + err)[-2000:]
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in out + err, err
    return lines[-1]


def stamps(report: dict, series: str) -> list[pd.Timestamp]:
    (item,) = [p for p in report["predictions"] if p["series"] == series]
    return list(pd.to_datetime(item["timestamps"]))


def values(report: dict) -> np.ndarray:
    return np.array([[p[c] for c in FEATURE_COLUMNS] for p in report["predictions"]], dtype=np.float64)


def test_yyyymmdd_panel_predicts_each_symbol_on_its_own_business_days(tmp_path: Path, capsys):
    path = tmp_path / "sp500_like.csv"
    write_sp500_like(path)
    report = predict_json(capsys, "--data", path, "--symbol-column", "Symbol", "--lookback", 30,
                          "--pred-len", 3)
    # in name order, as every job lists them (the file lists BBB first)
    assert [p["series"] for p in report["predictions"]] == ["AAA", "BBB"]
    assert stamps(report, "AAA") == list(pd.to_datetime(["2010-08-23", "2010-08-24", "2010-08-25"]))
    assert stamps(report, "BBB") == list(pd.to_datetime(["2010-07-05", "2010-07-06", "2010-07-07"]))
    assert np.isfinite(values(report)).all()
    skipped = [n for n in report["notes"] if "skipped" in n]
    assert skipped == ["warning: skipped 7 symbols with too few rows (20 rows, fewer than lookback 30 for S0): "
                       "S0, S1, S2, S3, S4 and 2 more"]

    pytest.importorskip("exchange_calendars")
    on_nyse = predict_json(capsys, "--data", path, "--symbol-column", "Symbol", "--lookback", 30,
                           "--pred-len", 3, "--calendar", "XNYS")
    assert stamps(on_nyse, "BBB") == list(pd.to_datetime(["2010-07-06", "2010-07-07", "2010-07-08"]))
    assert stamps(on_nyse, "AAA") == stamps(report, "AAA")


def test_yyyymmdd_integers_are_dates_in_the_python_api_too(tmp_path: Path):
    path = tmp_path / "sp500_like.csv"
    write_sp500_like(path, shorts=1)
    inputs = panel_inputs(pd.read_csv(path), lookback=30, future=None, symbol_col="Symbol", time_col="Date",
                          on_short="skip", holdout=3)
    assert inputs.symbols == ["BBB", "AAA"]
    held = pd.DatetimeIndex(inputs.future_ns[1].view("datetime64[ns]"))
    assert list(held) == list(pd.to_datetime(["2010-08-18", "2010-08-19", "2010-08-20"]))  # not 1970 nanoseconds
    panel = read_panel(path, "symbol")
    assert list(panel.columns) == ["symbol", "timestamps", "open", "high", "low", "close", "volume"]
    assert list(pd.unique(panel["symbol"])) == ["BBB", "AAA", "S0"]  # grouped by symbol, first appearance
    assert panel.attrs["notes"] == [] and panel["timestamps"].dt.year.unique().tolist() == [2010]


def hourly_new_york(days: int = 8) -> pd.DataFrame:
    """Hourly bars 09:30-15:30 New York time from Wednesday 2024-03-06, written with their UTC offset (-05:00
    before the 2024-03-10 daylight-saving change, -04:00 after), as exchange-local exports do."""
    sessions = pd.bdate_range("2024-03-06", periods=days)
    local = pd.DatetimeIndex([day + pd.Timedelta(hours=9, minutes=30) + pd.Timedelta(hours=h)
                              for day in sessions for h in range(7)]).tz_localize("America/New_York")
    rng = np.random.default_rng(3)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.002, len(local))))
    return pd.DataFrame({"Datetime": [t.isoformat() for t in local], "Open": close, "High": close * 1.002,
                         "Low": close * 0.998, "Close": close, "Volume": rng.integers(1000, 5000, len(local))})


def test_mixed_utc_offsets_become_utc_and_say_so(tmp_path: Path, capsys):
    frame = hourly_new_york()
    assert {s[-6:] for s in frame["Datetime"]} == {"-05:00", "-04:00"}
    path = tmp_path / "spy_hourly.csv"
    frame.to_csv(path, index=False)
    read = read_kline(path)
    assert str(read["timestamps"].dt.tz) == "UTC"
    assert read["timestamps"].iloc[0] == pd.Timestamp("2024-03-06 14:30", tz="UTC")
    assert read["timestamps"].iloc[-1] == pd.Timestamp("2024-03-15 19:30", tz="UTC")  # 15:30 EDT
    report = predict_json(capsys, "--data", path, "--lookback", 40, "--pred-len", 2)
    assert f"note: {path}: column 'Datetime' has mixed UTC offsets (-05:00, -04:00); converted the timestamps " \
           f"to UTC" in report["notes"]
    assert all(t.tzinfo is not None and t.utcoffset() == pd.Timedelta(0) for t in stamps(report, "spy_hourly"))

    frame.loc[5, "Datetime"] = frame.loc[5, "Datetime"][:-6]  # one stamp without its offset
    frame.to_csv(path, index=False)
    line = refused(capsys, "predict", *COMMON, "--data", path, "--lookback", 40, "--pred-len", 2)
    assert line == (f"error: {path}: column 'Datetime' mixes stamps with and without a UTC offset (line 7: "
                    f"'2024-03-06T14:30:00' has none); give every stamp an offset or none")
    frame.loc[5, "Datetime"] = "yesterday"
    frame.to_csv(path, index=False)
    line = refused(capsys, "predict", *COMMON, "--data", path, "--lookback", 40, "--pred-len", 2)
    assert f"{path}: column 'Datetime' has unparseable value 'yesterday' at line 7" in line  # the file's name


def test_a_written_index_is_the_time_column_or_an_ignored_column(tmp_path: Path, capsys):
    bars = daily_bars(50, "2010-08-20", 4)
    named = tmp_path / "named.csv"
    bars.to_csv(named, index=False)
    indexed = bars.set_index(pd.to_datetime(bars.pop("Date").astype(str)).rename(None))
    unnamed = tmp_path / "unnamed.csv"
    indexed.to_csv(unnamed)  # the first header cell is empty
    assert pd.read_csv(unnamed).columns[0] == "Unnamed: 0"
    expected = predict_json(capsys, "--data", named, "--lookback", 30, "--pred-len", 3)
    report = predict_json(capsys, "--data", unnamed, "--lookback", 30, "--pred-len", 3)
    assert f"note: {unnamed}: the first column has no name; read it as the time column (a written index)" \
           in report["notes"]
    np.testing.assert_array_equal(values(report), values(expected))
    assert stamps(report, "unnamed") == stamps(expected, "named")

    numbered = tmp_path / "numbered.csv"
    daily_bars(50, "2010-08-20", 4).to_csv(numbered)  # a RangeIndex written next to the Date column
    report = predict_json(capsys, "--data", numbered, "--lookback", 30, "--pred-len", 3)
    assert f"note: {numbered}: ignored columns: unnamed: 0" in report["notes"]
    np.testing.assert_array_equal(values(report), values(expected))


def test_extra_columns_are_ignored_and_named(tmp_path: Path, capsys):
    bars = daily_bars(50, "2010-08-20", 5)
    clean = tmp_path / "clean.csv"
    bars.to_csv(clean, index=False)
    adjusted = tmp_path / "adjusted.csv"
    bars.assign(**{"Adj Close": bars["Close"] * 0.97, "Dividends": 0.0}).to_csv(adjusted, index=False)
    report = predict_json(capsys, "--data", adjusted, "--lookback", 30, "--pred-len", 3)
    assert f"note: {adjusted}: ignored columns: adj close, dividends" in report["notes"]
    np.testing.assert_array_equal(values(report), values(predict_json(capsys, "--data", clean, "--lookback", 30,
                                                                      "--pred-len", 3)))


def test_repeated_and_backwards_rows(tmp_path: Path, capsys):
    bars = daily_bars(50, "2010-08-20", 6)
    clean = tmp_path / "clean.csv"
    bars.to_csv(clean, index=False)
    expected = values(predict_json(capsys, "--data", clean, "--lookback", 30, "--pred-len", 3))
    args = ("--lookback", 30, "--pred-len", 3)

    repeated = tmp_path / "repeated.csv"
    pd.concat([bars.iloc[:10], bars.iloc[9:10], bars.iloc[10:]]).to_csv(repeated, index=False)
    report = predict_json(capsys, "--data", repeated, *args)
    assert f"note: {repeated}: dropped 1 repeated rows (same time and values as another row, first at line 12)" \
           in report["notes"]
    np.testing.assert_array_equal(values(report), expected)

    newest_first = tmp_path / "newest_first.csv"
    bars.iloc[::-1].to_csv(newest_first, index=False)
    report = predict_json(capsys, "--data", newest_first, *args)
    assert f"note: {newest_first}: the rows run newest first; read them in time order" in report["notes"]
    np.testing.assert_array_equal(values(report), expected)

    conflicting = bars.copy()
    conflicting.loc[20, "Date"] = conflicting.loc[19, "Date"]  # same day, other prices
    conflicting.to_csv(tmp_path / "conflicting.csv", index=False)
    day = pd.Timestamp(str(bars.loc[19, "Date"]))
    assert refused(capsys, "predict", *COMMON, "--data", tmp_path / "conflicting.csv", *args) == \
        f"error: {tmp_path / 'conflicting.csv'}: duplicate timestamp {day} at lines 21 and 22; drop duplicates"

    stray = bars.iloc[[*range(10), 11, 10, *range(12, 50)]]
    stray.to_csv(tmp_path / "stray.csv", index=False)
    line = refused(capsys, "predict", *COMMON, "--data", tmp_path / "stray.csv", *args)
    assert f"{tmp_path / 'stray.csv'}: timestamps not increasing at line 13 (" in line and "sort the rows" in line

    panel_path = tmp_path / "panel.csv"
    panel = write_sp500_like(panel_path, shorts=0)
    bbb = panel.index[panel["Symbol"] == "BBB"]
    twice = pd.concat([panel, panel.loc[[bbb[3]]].assign(Close=1.0)])  # a second BBB row for one day
    twice.to_csv(panel_path, index=False)
    line = refused(capsys, "predict", *COMMON, "--data", panel_path, "--symbol-column", "Symbol", *args)
    day = pd.Timestamp(str(panel.loc[bbb[3], "Date"]))
    first = int(np.flatnonzero(twice["Symbol"].to_numpy() == "BBB")[3]) + 2
    assert line == f"error: {panel_path}: symbol BBB: duplicate timestamp {day} at lines {first} and " \
                   f"{len(twice) + 1}; drop duplicates"

    panel.to_csv(panel_path, index=False)
    # one file with a Symbol column is a panel for every command, as for the backtest: a series per symbol
    code, out, err = run(capsys, "train", "--config", write_train_config(tmp_path), "--data", panel_path,
                         "--steps", 2, "--out", tmp_path / "as_panel")
    assert code == 0 and "Traceback" not in out + err, (out + err)[-2000:]
    assert (tmp_path / "as_panel" / "metrics.jsonl").exists()


def write_train_config(folder: Path) -> Path:
    path = folder / "tiny_train.toml"
    path.write_text(tiny_train_toml(lookback_window=16, predict_window=4, eval_samples=8))
    return path


def test_a_missing_symbol_column_is_one_line_in_every_command(tmp_path: Path, capsys):
    path = tmp_path / "sp500_like.csv"
    write_sp500_like(path, shorts=0)
    # the columns as the file spells them, not lower-cased
    expected = (f"error: {path}: no symbol column 'Ticker' (found: Date, Symbol, Open, High, Low, Close, Volume); "
                f"pass the column that names each series with --symbol-column")
    assert refused(capsys, "predict", *COMMON, "--data", path, "--symbol-column", "Ticker", "--lookback", 30,
                   "--pred-len", 3) == expected
    out = tmp_path / "backtest"
    assert refused(capsys, "backtest", "--size", "tiny", "--device", "cpu", "--data", path, "--symbol-column",
                   "Ticker", "--lookback", 30, "--pred-len", 3, "--out", out, "--json") == expected
    assert refused(capsys, "train", "--config", write_train_config(tmp_path), "--data", path, "--symbol-column",
                   "Ticker", "--out", tmp_path / "train") == expected
    assert refused(capsys, "backtest", "--size", "tiny", "--synthetic", 4, "--symbol-column", "Symbol",
                   "--lookback", 30, "--pred-len", 3) == \
        "error: --symbol-column reads panel files; give them with --data"


def test_backtest_runs_the_panel_as_it_is(tmp_path: Path, capsys):
    path = tmp_path / "sp500_like.csv"
    write_sp500_like(path, shorts=2, full=(("AAA", 60, "2010-08-20"), ("BBB", 45, "2010-08-13")))
    out = tmp_path / "backtest"
    code, printed, err = run(capsys, "backtest", "--size", "tiny", "--device", "cpu", "--data", path,
                             "--symbol-column", "Symbol", "--lookback", 30, "--pred-len", 3, "--origins", 2,
                             "--top-k", 1, "--out", out, "--json")
    assert code == 0, err
    result = json.loads(printed)
    assert (out / "backtest.json").is_file() and result["origins"] == 2
    assert result["symbols"] == 2 and result["symbols_skipped"] == 2
    assert "skipped 2 of 4 symbols with too little history" in err and "S0, S1" in err
    assert result["last_origin"].startswith("2010-")  # YYYYMMDD read as dates


def test_train_runs_the_panel_as_it_is(tmp_path: Path, capsys):
    path = tmp_path / "sp500_like.csv"
    write_sp500_like(path, shorts=2)
    train_out = tmp_path / "train"
    code, printed, err = run(capsys, "train", "--config", write_train_config(tmp_path), "--data", path,
                             "--symbol-column", "Symbol", "--steps", "1", "--out", train_out)
    assert code == 0, err
    assert ("2 of 4 symbols are too short for a training window and are left out (2 of the 4 read have fewer "
            "than 21 rows") in err and "S0, S1; 2 symbols train" in err
    assert (train_out / "checkpoints").is_dir()


def test_read_panel_refuses_in_one_line_naming_the_line(tmp_path: Path):
    path = tmp_path / "panel.csv"
    panel = write_sp500_like(path, shorts=0)
    broken = panel.copy()
    broken.iloc[7, broken.columns.get_loc("Close")] = np.nan
    broken.to_csv(path, index=False)
    with pytest.raises(KronosError, match=r"panel\.csv: column 'close' has NaN/empty at line 9 \(2010-"):
        read_panel(path, "Symbol")
    broken = panel.copy()
    broken.iloc[4, broken.columns.get_loc("Symbol")] = None
    broken.to_csv(path, index=False)
    with pytest.raises(KronosError, match=r"panel\.csv: empty Symbol at line 6; fill or drop that row"):
        read_panel(path, "Symbol")
    newest = panel.iloc[::-1]
    newest.to_csv(path, index=False)
    read = read_panel(path, "Symbol")
    assert read.attrs["notes"] == [f"{path}: the rows of 2 symbols run newest first (e.g. AAA); read them in "
                                   "time order"]
    assert read.groupby("symbol")["timestamps"].apply(lambda s: s.is_monotonic_increasing).all()
    shuffled = panel.sample(frac=1.0, random_state=0)
    shuffled.to_csv(path, index=False)
    read = read_panel(path, "Symbol")
    assert len(read.attrs["notes"]) == 1 and "symbols were out of time order (first " in read.attrs["notes"][0]
    assert read.attrs["notes"][0].endswith("); sorted them by time")
    for symbol, rows in read.groupby("symbol"):
        expected = panel[panel["Symbol"] == symbol]
        assert rows["timestamps"].dt.strftime("%Y%m%d").astype(int).tolist() == expected["Date"].tolist()
