"""kronos_tune.predict.job: bar grids, holdout split, scores, output checks and the job itself (tiny model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_core.data.synthetic import synthetic_kline
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.times import future_timestamps, infer_interval, session_grid
from kronos_tune.predict.inputs import load_inputs
from kronos_tune.predict.job import RANDOM_WEIGHTS_NOTE, PredictConfig, run_predict, score
from kronos_tune.predict.output import check_output_path, write_table


def _stamps(*values: str) -> list[pd.Timestamp]:
    return [pd.Timestamp(v) for v in values]


def _ignore(level: str, message: str) -> None:
    pass


# Bar interval and future timestamps ----------------------------------------------------------


def test_interval_is_the_most_common_step_in_any_unit() -> None:
    # Microsecond-unit stamps (what read_kline returns from CSV): the step must still be 5 minutes.
    stamps = pd.DatetimeIndex(pd.to_datetime(["2024-01-02 09:35", "2024-01-02 09:40", "2024-01-02 09:45",
                                              "2024-01-02 13:05", "2024-01-02 13:10"])).as_unit("us")
    assert infer_interval(stamps) == pd.Timedelta(minutes=5)
    # A tie between 1 and 2 hours picks the smaller step.
    tie = pd.DatetimeIndex(["2024-01-01 00:00", "2024-01-01 01:00", "2024-01-01 03:00"])
    assert infer_interval(tie) == pd.Timedelta(hours=1)
    with pytest.raises(KronosTuneError, match="f.csv: 1 row"):
        infer_interval(pd.DatetimeIndex(["2024-01-01"]), "f.csv")


def test_close_stamped_session_bars_skip_lunch_night_and_weekend() -> None:
    history = synthetic_kline(190, seed=1)["timestamps"]  # ends Friday 2024-01-05 14:50
    assert history.iloc[-1] == pd.Timestamp("2024-01-05 14:50")
    assert session_grid(pd.DatetimeIndex(history), pd.Timedelta(minutes=5)) == "close"
    assert list(future_timestamps(history, 4)) == _stamps(
        "2024-01-05 14:55", "2024-01-05 15:00", "2024-01-08 09:35", "2024-01-08 09:40")
    morning = synthetic_kline(120, seed=1)["timestamps"]  # ends 11:30
    assert list(future_timestamps(morning, 2)) == _stamps("2024-01-04 13:05", "2024-01-04 13:10")


def test_open_stamped_and_hourly_session_bars() -> None:
    opens = synthetic_kline(60, seed=0)["timestamps"] - pd.Timedelta(minutes=5)  # 09:30 ... 11:25, 13:00 ...
    assert session_grid(pd.DatetimeIndex(opens), pd.Timedelta(minutes=5)) == "open"
    assert opens.iloc[9] == pd.Timestamp("2024-01-02 10:15")
    assert list(future_timestamps(opens.iloc[:10], 2)) == _stamps("2024-01-02 10:20", "2024-01-02 10:25")
    assert list(future_timestamps(opens.iloc[:24], 2)) == _stamps("2024-01-02 13:00", "2024-01-02 13:05")
    assert list(future_timestamps(opens.iloc[:48], 2)) == _stamps("2024-01-03 09:30", "2024-01-03 09:35")
    hourly = synthetic_kline(7, seed=0, freq_minutes=60)["timestamps"]  # 10:30 11:30 14:00 15:00, then 3 more
    assert hourly.iloc[-1] == pd.Timestamp("2024-01-03 14:00")
    assert list(future_timestamps(hourly, 3)) == _stamps("2024-01-03 15:00", "2024-01-04 10:30",
                                                         "2024-01-04 11:30")


def test_non_session_data_adds_the_interval() -> None:
    crypto = pd.Series(pd.date_range("2024-01-06 22:00", periods=5, freq="h"))  # a Saturday night
    assert session_grid(pd.DatetimeIndex(crypto), pd.Timedelta(hours=1)) is None
    assert list(future_timestamps(crypto, 3)) == _stamps("2024-01-07 03:00", "2024-01-07 04:00",
                                                         "2024-01-07 05:00")
    weekdays = pd.Series(pd.bdate_range("2024-01-01", periods=5))  # Mon..Fri
    assert list(future_timestamps(weekdays, 2)) == _stamps("2024-01-08", "2024-01-09")
    every_day = pd.Series(pd.date_range("2024-01-01", periods=8, freq="D"))  # includes a weekend
    assert list(future_timestamps(every_day, 1)) == _stamps("2024-01-09")


def test_time_zone_is_kept_and_session_uses_wall_time() -> None:
    local = synthetic_kline(24, seed=0)["timestamps"].dt.tz_localize("Asia/Shanghai")  # morning of day one
    future = future_timestamps(local, 2)
    assert str(future.tz) == "Asia/Shanghai"
    assert list(future) == [pd.Timestamp("2024-01-02 13:05", tz="Asia/Shanghai"),
                            pd.Timestamp("2024-01-02 13:10", tz="Asia/Shanghai")]


# Loading, holdout and scores -----------------------------------------------------------------


def test_holdout_takes_lookback_rows_before_the_last_pred_len(tmp_path: Path) -> None:
    frame = synthetic_kline(50, seed=5)
    frame.to_csv(tmp_path / "s.csv", index=False)
    stamps = frame["timestamps"].to_numpy(dtype="datetime64[ns]").view(np.int64)
    features = frame[list(FEATURE_COLUMNS)].to_numpy(dtype=np.float32)
    config = PredictConfig(lookback=20, pred_len=6, size="tiny", data=(tmp_path / "s.csv",), holdout=True)
    inputs = load_inputs(config, _ignore)
    assert list(inputs.names) == ["s"]
    np.testing.assert_array_equal(inputs.x[0], features[24:44])
    assert inputs.last_ns[0] == stamps[43]
    np.testing.assert_array_equal(inputs.future_ns[0], stamps[44:])
    np.testing.assert_allclose(inputs.actual_close[0], frame["close"].iloc[44:].to_numpy(), rtol=1e-12)

    plain = PredictConfig(lookback=20, pred_len=6, size="tiny", data=(tmp_path / "s.csv",))
    inputs = load_inputs(plain, _ignore)
    np.testing.assert_array_equal(inputs.x[0], features[30:])
    assert inputs.actual_close is None and inputs.last_ns[0] == stamps[-1] and inputs.future_ns[0, 0] > stamps[-1]


def test_same_stem_in_two_folders_gets_distinct_names(tmp_path: Path) -> None:
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        synthetic_kline(10, seed=0).to_csv(tmp_path / folder / "s.csv", index=False)
    config = PredictConfig(lookback=5, pred_len=1, size="tiny", data=(tmp_path / "x", tmp_path / "y"))
    names = list(load_inputs(config, _ignore).names)
    assert len(set(names)) == 2 and all(name.endswith("s") for name in names)


def test_score_is_mae_and_mape_in_percent() -> None:
    result = score("s", np.array([11.0, 18.0]), np.array([10.0, 20.0]))
    assert result.mae == pytest.approx(1.5)
    assert result.mape == pytest.approx((0.1 + 0.1) / 2 * 100)


# Output checks -------------------------------------------------------------------------------


def test_output_path_checks(tmp_path: Path) -> None:
    assert check_output_path(tmp_path / "a.CSV") == "csv"
    assert check_output_path(tmp_path / "a.parquet") == "parquet"
    assert list(tmp_path.iterdir()) == []  # the write probe leaves nothing behind
    with pytest.raises(KronosTuneError, match=r"unknown suffix '\.json'"):
        check_output_path(tmp_path / "a.json")
    with pytest.raises(KronosTuneError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "a.csv")
    (tmp_path / "file.csv").write_text("x\n")
    with pytest.raises(KronosTuneError, match="is not a folder"):
        check_output_path(tmp_path / "file.csv" / "a.csv")
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(KronosTuneError, match="is a folder"):
        check_output_path(tmp_path / "dir.csv")


def test_write_table_replaces_atomically(tmp_path: Path) -> None:
    out = tmp_path / "o.csv"
    out.write_text("old\n")
    table = pd.DataFrame({"series": ["a"], "timestamps": [pd.Timestamp("2024-01-02 09:35")], "open": [1.0]})
    write_table(table, out)
    assert pd.read_csv(out).to_dict("list") == {"series": ["a"], "timestamps": ["2024-01-02 09:35:00"],
                                                "open": [1.0]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.csv"]


# The job -------------------------------------------------------------------------------------


def test_failed_job_keeps_the_previous_output(tmp_path: Path) -> None:
    out = tmp_path / "o.csv"
    out.write_text("previous results\n")
    short = tmp_path / "short.csv"
    synthetic_kline(10, seed=0).to_csv(short, index=False)
    config = PredictConfig(lookback=30, pred_len=2, size="tiny", data=(short,), out=out, device="cpu")
    with pytest.raises(KronosTuneError, match=r"short\.csv has 10 rows, fewer than --lookback 30"):
        run_predict(config)
    assert out.read_text() == "previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.csv", "short.csv"]


def test_synthetic_holdout_job_and_notes(tmp_path: Path) -> None:
    notes: list[tuple[str, str]] = []
    config = PredictConfig(lookback=24, pred_len=5, size="tiny", synthetic=2, holdout=True, device="cpu",
                           max_context=20, out=tmp_path / "o.parquet")
    result = run_predict(config, on_note=lambda level, message: notes.append((level, message)))
    assert notes == result.notes
    assert ("warning", RANDOM_WEIGHTS_NOTE) in notes
    assert any("longer than max_context 20" in message for _, message in notes)
    assert result.series_names == ["synthetic_0", "synthetic_1"]
    assert [s.series for s in result.scores] == result.series_names
    assert result.mean_mae == pytest.approx(np.mean([s.mae for s in result.scores]))
    assert all(s.mae > 0 and s.mape > 0 for s in result.scores)
    report = result.to_json_dict()
    assert report["series"] == 2 and report["device"] == "cpu" and report["peak_rss_bytes"] > 0
    assert report["mape"] == pytest.approx(np.mean([s.mape for s in result.scores]))
    written = pd.read_parquet(tmp_path / "o.parquet")
    assert list(written.columns) == ["series", "timestamps", *FEATURE_COLUMNS]
    assert len(written) == 10


def test_sliding_window_note_and_seeded_sampling() -> None:
    def run(seed: int) -> tuple[np.ndarray, list[tuple[str, str]]]:
        config = PredictConfig(lookback=12, pred_len=6, size="tiny", synthetic=1, device="cpu", max_context=16,
                               seed=seed)
        result = run_predict(config)
        return result.frames[0].to_numpy(), result.notes

    first, notes = run(1)
    assert any("window slides after 4 steps" in message for _, message in notes)
    again, _ = run(1)
    np.testing.assert_array_equal(first, again)
    other, _ = run(2)
    assert not np.array_equal(first, other)
