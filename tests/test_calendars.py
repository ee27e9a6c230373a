"""Future timestamps from exchange calendars (`--calendar`, on exchange-calendars): holidays, lunch breaks, half
days, bar-end and bar-start stamps, time zones, predict and backtest end to end, and every bad input as one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.synthetic import session_bar_minutes, synthetic_kline
from kronos_tune.backtest.config import BacktestConfig
from kronos_tune.backtest.forecast import OracleForecaster
from kronos_tune.backtest.runner import run_backtest
from kronos_tune.predict.times import exchange_calendar
from kronos_tune.cli import main
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.times import future_timestamps

# Consecutive XSHG sessions around the 2024 National Day holiday (closed 2024-10-01 to 10-07).
HOLIDAY_DAYS = ("2024-09-26", "2024-09-27", "2024-09-30", "2024-10-08", "2024-10-09")


def _five_minute_day(day: str, bar_end: bool = True) -> pd.DatetimeIndex:
    """A whole A-share day of 5-minute bars, written out by hand: 09:35..11:30 and 13:05..15:00 (bar ends)."""
    minutes = session_bar_minutes(5) - (0 if bar_end else 5)
    return pd.Timestamp(day) + pd.to_timedelta(minutes, unit="min")


def _days(*days: str, bar_end: bool = True) -> pd.DatetimeIndex:
    return pd.DatetimeIndex(np.concatenate([_five_minute_day(d, bar_end) for d in days]))


def _stamps(*values: str) -> list[pd.Timestamp]:
    return [pd.Timestamp(v) for v in values]


# The stamps themselves -----------------------------------------------------------------------


def test_five_minute_bars_skip_the_national_day_week():
    history = _days("2024-09-27", "2024-09-30")
    future = future_timestamps(history, 3, calendar="XSHG")
    assert list(future) == _stamps("2024-10-08 09:35", "2024-10-08 09:40", "2024-10-08 09:45")
    # Without a calendar the session grid knows no holidays: the fallback is unchanged and lands on 10-01.
    assert list(future_timestamps(history, 1)) == _stamps("2024-10-01 09:35")


def test_many_sessions_lunch_breaks_and_count():
    history = _days("2024-09-26", "2024-09-27", "2024-09-30")
    future = future_timestamps(history, 100, calendar="XSHG")
    assert len(future) == 100 and future.is_monotonic_increasing and future.is_unique
    # 48 bars per day: all of 10-08 and 10-09, then four on 10-10.
    assert list(future) == list(_days("2024-10-08", "2024-10-09")) + _stamps(
        "2024-10-10 09:35", "2024-10-10 09:40", "2024-10-10 09:45", "2024-10-10 09:50")
    minutes = future.hour * 60 + future.minute
    assert not ((minutes > 11 * 60 + 30) & (minutes < 13 * 60 + 5)).any()  # nothing stamped in the lunch break
    after_morning = future.get_loc(pd.Timestamp("2024-10-08 11:30")) + 1
    assert future[after_morning] == pd.Timestamp("2024-10-08 13:05")


def test_a_history_ending_at_lunch_continues_after_the_break():
    history = _days("2024-09-27").append(_five_minute_day("2024-09-30")[:24])  # ends 2024-09-30 11:30
    assert list(future_timestamps(history, 2, calendar="XSHG")) == _stamps("2024-09-30 13:05", "2024-09-30 13:10")


def test_bar_start_stamps_follow_the_data():
    history = _days("2024-09-27", "2024-09-30", bar_end=False)  # 09:30..11:25 and 13:00..14:55
    future = future_timestamps(history, 25, calendar="XSHG")
    assert future[0] == pd.Timestamp("2024-10-08 09:30")
    assert future[23] == pd.Timestamp("2024-10-08 11:25") and future[24] == pd.Timestamp("2024-10-08 13:00")


def test_daily_bars_continue_on_sessions_at_the_data_time_of_day():
    sessions = pd.DatetimeIndex(["2024-09-24", "2024-09-25", "2024-09-26", "2024-09-27", "2024-09-30"])
    assert list(future_timestamps(sessions, 3, calendar="XSHG")) == _stamps("2024-10-08", "2024-10-09",
                                                                            "2024-10-10")
    at_close = sessions + pd.Timedelta(hours=15)
    assert list(future_timestamps(at_close, 2, calendar="XSHG")) == _stamps("2024-10-08 15:00",
                                                                           "2024-10-09 15:00")


def test_a_half_day_and_christmas_on_the_hong_kong_calendar():
    # XHKG trades 09:30-12:00 and 13:00-16:00; 2024-12-24 closes at 12:00, 12-25 and 12-26 are holidays.
    day = pd.Timestamp("2024-12-23")
    morning = day + pd.to_timedelta(np.arange(10 * 60, 12 * 60 + 1, 30), unit="min")
    afternoon = day + pd.to_timedelta(np.arange(13 * 60 + 30, 16 * 60 + 1, 30), unit="min")
    future = future_timestamps(morning.append(afternoon), 7, calendar="XHKG")
    assert list(future) == _stamps("2024-12-24 10:00", "2024-12-24 10:30", "2024-12-24 11:00", "2024-12-24 11:30",
                                   "2024-12-24 12:00", "2024-12-27 10:00", "2024-12-27 10:30")


def test_tz_aware_data_keeps_its_zone():
    local = _days("2024-09-30")
    in_utc = local.tz_localize("Asia/Shanghai").tz_convert("UTC")
    future = future_timestamps(in_utc, 2, calendar="XSHG")
    assert str(future.tz) == "UTC"
    assert list(future) == [pd.Timestamp("2024-10-08 01:35", tz="UTC"), pd.Timestamp("2024-10-08 01:40", tz="UTC")]
    # The same bars on the New York calendar, in New York time: 2024-11-28 is Thanksgiving.
    ny = pd.date_range("2024-11-27 09:35", "2024-11-27 16:00", freq="5min", tz="America/New_York")
    assert list(future_timestamps(ny, 1, calendar="XNYS")) == [pd.Timestamp("2024-11-29 09:35",
                                                                            tz="America/New_York")]


def test_names_are_case_insensitive_and_cached():
    assert exchange_calendar("xshg") is exchange_calendar("XSHG")
    assert exchange_calendar("XSHG") is exchange_calendar("XSHG")


@pytest.mark.parametrize("stamps, calendar, expected", [
    (_days("2024-09-30"), "NOPE", "--calendar NOPE: no such exchange calendar; e.g. XSHG, XSHE"),
    (_days("2024-09-30").insert(24, pd.Timestamp("2024-09-30 12:00")), "XSHG",
     "the bar at 2024-09-30 12:00:00 is not on XSHG's 5-minute session grid"),
    (pd.date_range("2024-09-30 09:37", periods=20, freq="7min"), "XSHG",
     "the 7-minute bars do not divide XSHG's session 09:30-11:30"),
    (pd.DatetimeIndex(["2024-09-27", "2024-09-30", "2024-10-01", "2024-10-02"]), "XSHG",
     "the daily bar at 2024-10-01 00:00:00 is on 2024-10-01, not a session of XSHG"),
    (_days("2024-09-30") + pd.DateOffset(years=11), "XSHG", "is past the end of XSHG's calendar"),
    (pd.date_range("2024-09-02", periods=5, freq="7D"), "XSHG", "continues intraday or daily bars only"),
])
def test_bad_input_is_one_clear_error(stamps, calendar, expected):
    with pytest.raises(KronosTuneError, match="^series.csv: |^--calendar") as caught:
        future_timestamps(stamps, 3, "series.csv", calendar=calendar)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_a_horizon_past_the_calendar_end_is_an_error():
    calendar = exchange_calendar("XSHG")
    last_day = str(calendar.last_session.date())
    with pytest.raises(KronosTuneError, match=f"48 bars after {last_day} 15:00:00 run past the end"):
        future_timestamps(_days(last_day), 48, "series.csv", calendar="XSHG")
    assert len(future_timestamps(_days(last_day)[:-1], 1, calendar="XSHG")) == 1  # the last bar itself still fits


# Through the CLI -----------------------------------------------------------------------------


def _write(path: Path, stamps: pd.DatetimeIndex, seed: int = 0) -> Path:
    frame = synthetic_kline(len(stamps), seed=seed)
    frame["timestamps"] = stamps
    frame.to_csv(path, index=False)
    return path


def _predict(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main(["predict", "--size", "tiny", "--device", "cpu", "--lookback", "32", *map(str, args)])
    captured = capsys.readouterr()
    return caught.value.code, captured.out, captured.err


def test_predict_writes_calendar_stamps(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    data = _write(tmp_path / "sh.csv", _days("2024-09-27", "2024-09-30"))
    out = tmp_path / "out.csv"
    code, _, err = _predict(capsys, "--data", data, "--pred-len", 50, "--calendar", "XSHG", "--out", out)
    assert code == 0, err
    stamps = pd.to_datetime(pd.read_csv(out)["timestamps"])
    assert list(stamps) == list(_days("2024-10-08")) + _stamps("2024-10-09 09:35", "2024-10-09 09:40")


def test_panels_use_the_calendar_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    stamps = _days("2024-09-27", "2024-09-30")
    frames = []
    for k, symbol in enumerate(("AAA", "BBB")):
        frame = synthetic_kline(len(stamps), seed=k)
        frame["timestamps"], frame["symbol"] = stamps, symbol
        frames.append(frame)
    panel = tmp_path / "panel.csv"
    pd.concat(frames).to_csv(panel, index=False)
    out = tmp_path / "out.csv"
    code, _, err = _predict(capsys, "--data", panel, "--symbol-column", "symbol", "--pred-len", 2,
                            "--calendar", "XSHG", "--out", out)
    assert code == 0, err
    written = pd.read_csv(out)
    assert sorted(set(written["timestamps"])) == ["2024-10-08 09:35:00", "2024-10-08 09:40:00"]


@pytest.mark.parametrize("stamps, calendar, expected", [
    (_days("2024-09-30"), "NOPE", "error: --calendar NOPE: no such exchange calendar"),
    (_days("2024-09-30") + pd.Timedelta(minutes=1), "XSHG", "the bar at 2024-09-30 09:36:00 is not on XSHG's"),
    (_days("2024-09-30") + pd.DateOffset(years=11), "XSHG", "past the end of XSHG's calendar"),
])
def test_predict_bad_calendar_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          stamps, calendar, expected):
    data = _write(tmp_path / "series.csv", stamps)
    out = tmp_path / "out.csv"
    code, _, err = _predict(capsys, "--data", data, "--pred-len", 2, "--calendar", calendar, "--out", out)
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    if calendar == "XSHG":
        assert str(data) in err  # the series is named
    assert not out.exists()


def test_without_the_package_the_hint_names_the_extra(tmp_path: Path):
    data = _write(tmp_path / "series.csv", _days("2024-09-30"))
    blocker = ("import sys; sys.modules['exchange_calendars'] = None; "  # importing it now raises ImportError
               "from kronos_tune.cli import main; main(sys.argv[1:])")
    done = subprocess.run([sys.executable, "-c", blocker, "predict", "--size", "tiny", "--device", "cpu",
                           "--lookback", "8", "--pred-len", "2", "--data", str(data), "--calendar", "XSHG"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ('error: --calendar XSHG needs exchange-calendars, which is not installed: '
                                   'pip install "kronos-tune[calendars]"')


# Backtest ------------------------------------------------------------------------------------


class _Recorder:
    """An oracle that keeps every window it was given."""

    def __init__(self) -> None:
        self.windows: list = []

    def factory(self, setting, on_chunk):
        oracle = OracleForecaster()

        def forecast(windows, pred_len):
            self.windows.extend(windows)
            return oracle(windows, pred_len)

        return forecast


def _universe(folder: Path) -> Path:
    """Three symbols over the holiday; GAP was suspended on 2024-10-08 (no bars that day)."""
    folder.mkdir()
    full = _days(*HOLIDAY_DAYS)
    _write(folder / "AAA.csv", full, seed=1)
    _write(folder / "BBB.csv", full, seed=2)
    _write(folder / "GAP.csv", full[full.normalize() != pd.Timestamp("2024-10-08")], seed=3)
    return folder


def test_backtest_gives_the_model_calendar_stamps(tmp_path: Path):
    data = _universe(tmp_path / "universe")
    grid = _days(*HOLIDAY_DAYS)
    recorded = {}
    for calendar in (None, "XSHG"):
        recorder = _Recorder()
        config = BacktestConfig(lookback=32, pred_len=4, size="tiny", device="cpu", data=(data,), top_k=1,
                                out=tmp_path / f"run-{calendar}", calendar=calendar)
        run_backtest(config, on_note=lambda level, message: None, forecaster_factory=recorder.factory)
        recorded[calendar] = recorder.windows
    for window in recorded["XSHG"]:
        origin = grid[grid > pd.Timestamp(window.history_stamps[-1])][:4]
        assert list(pd.DatetimeIndex(window.future_stamps)) == list(origin)
    # Without the calendar, GAP is told its own next bars, which jump over its suspended day.
    own = [w for w in recorded[None] if w.symbol == "GAP"
           and pd.Timestamp(w.history_stamps[-1]) == pd.Timestamp("2024-09-30 15:00")]
    assert own and pd.Timestamp(own[0].future_stamps[0]) == pd.Timestamp("2024-10-09 09:35")
    with_calendar = [w for w in recorded["XSHG"] if w.symbol == "GAP"
                     and pd.Timestamp(w.history_stamps[-1]) == pd.Timestamp("2024-09-30 15:00")]
    assert pd.Timestamp(with_calendar[0].future_stamps[0]) == pd.Timestamp("2024-10-08 09:35")


def test_backtest_bad_calendar_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    data = _universe(tmp_path / "universe")
    for calendar, expected in (("NOPE", "no such exchange calendar"), ("XASX", "not on XASX's 5-minute")):
        with pytest.raises(SystemExit) as caught:
            main(["backtest", "--size", "tiny", "--device", "cpu", "--lookback", "32", "--pred-len", "4",
                  "--top-k", "1", "--data", str(data), "--calendar", calendar, "--out", str(tmp_path / calendar)])
        err = capsys.readouterr().err
        assert caught.value.code == 2 and expected in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert not (tmp_path / calendar).exists()
