"""Tests for kronos_core.data.kline and kronos_core.data.synthetic."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import (
    FEATURE_COLUMNS,
    PRICE_COLUMNS,
    TIME_FEATURES,
    KlineDataWarning,
    calendar_features,
    fill_volume_amount,
    find_data_files,
    normalize_window,
    read_kline,
    validate_kline,
)
from kronos_core.errors import KronosError
from kronos_core.data.synthetic import synthetic_kline, synthetic_series


def small_frame(n: int = 6) -> pd.DataFrame:
    ts = pd.date_range("2024-03-04 09:35", periods=n, freq="5min")
    close = 10.0 + np.arange(n) * 0.1
    return pd.DataFrame(
        {
            "timestamps": ts,
            "open": close - 0.05,
            "high": close + 0.1,
            "low": close - 0.1,
            "close": close,
            "volume": 1000.0 + np.arange(n),
            "amount": (1000.0 + np.arange(n)) * close,
        }
    )


# --- constants and calendar features -------------------------------------------------


def test_constants() -> None:
    assert PRICE_COLUMNS == ("open", "high", "low", "close")
    assert FEATURE_COLUMNS == PRICE_COLUMNS + ("volume", "amount")
    assert TIME_FEATURES == ("minute", "hour", "weekday", "day", "month")


def test_calendar_features_known_values() -> None:
    stamps = ["2024-01-02 09:35", "2024-03-09 15:00", "2023-12-31 23:59"]
    expected = np.array(
        [
            [35, 9, 1, 2, 1],  # Tuesday
            [0, 15, 5, 9, 3],  # Saturday
            [59, 23, 6, 31, 12],  # Sunday
        ],
        dtype=np.float32,
    )
    for given in (stamps, pd.Series(pd.to_datetime(stamps)), pd.DatetimeIndex(stamps)):
        out = calendar_features(given)
        assert out.dtype == np.float32 and out.shape == (3, 5)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.filterwarnings("ignore:.*weekday is deprecated")
def test_calendar_features_match_reference_dt_accessors() -> None:
    ts = pd.Series(pd.date_range("2024-02-27 22:10", periods=400, freq="37min"))
    # The reference's exact expression (pandas 3 deprecates .dt.weekday).
    reference = np.stack(
        [ts.dt.minute, ts.dt.hour, ts.dt.weekday, ts.dt.day, ts.dt.month], axis=1
    ).astype(np.float32)
    np.testing.assert_array_equal(calendar_features(ts), reference)


def test_calendar_features_keep_local_time_of_tz_aware_stamps() -> None:
    ts = pd.Series(pd.date_range("2024-06-03 09:30", periods=3, freq="h", tz="Asia/Shanghai"))
    assert calendar_features(ts)[:, 1].tolist() == [9.0, 10.0, 11.0]


# --- fill rules and normalization ----------------------------------------------------------


def test_fill_missing_volume_sets_both_zero() -> None:
    df = small_frame().drop(columns=["volume", "amount"])
    out = fill_volume_amount(df)
    assert (out["volume"] == 0.0).all() and (out["amount"] == 0.0).all()
    assert "volume" not in df.columns  # input untouched


def test_fill_missing_amount_uses_mean_price() -> None:
    df = small_frame().drop(columns=["amount"])
    out = fill_volume_amount(df)
    row = df.iloc[2]
    expected = row["volume"] * (row["open"] + row["high"] + row["low"] + row["close"]) / 4
    assert out["amount"].iloc[2] == pytest.approx(expected)
    assert "amount" not in df.columns


def test_fill_keeps_existing_columns() -> None:
    df = small_frame()
    pd.testing.assert_frame_equal(fill_volume_amount(df), df)


def test_normalize_window_numbers() -> None:
    x = np.array([[1.0, 10.0], [2.0, 10.0], [3.0, 10.0], [100.0, 10.0]])
    x_norm, mean, std = normalize_window(x, clip=5.0)
    assert x_norm.dtype == np.float32 and mean.dtype == np.float32
    np.testing.assert_allclose(mean, [26.5, 10.0], rtol=1e-6)
    np.testing.assert_allclose(std, [np.std([1, 2, 3, 100]), 0.0], rtol=1e-6)
    np.testing.assert_allclose(x_norm[:, 0], (x[:, 0] - 26.5) / (std[0] + 1e-5), rtol=1e-5)
    assert (x_norm[:, 1] == 0.0).all()  # constant column -> 0, thanks to the epsilon


def test_normalize_window_clips_and_uses_stats_rows() -> None:
    x = np.array([[0.0], [2.0], [1000.0]])
    x_norm, mean, std = normalize_window(x, clip=3.0, stats_rows=2)
    assert mean[0] == pytest.approx(1.0) and std[0] == pytest.approx(1.0)
    np.testing.assert_allclose(x_norm[:, 0], [-1.0 / (1 + 1e-5), 1.0 / (1 + 1e-5), 3.0], rtol=1e-6)


# --- reading files -----------------------------------------------------------------------------


def test_read_csv_shuffled_uppercase_columns(tmp_path) -> None:
    df = small_frame()
    messy = df.rename(columns={c: f" {c.upper()} " for c in df.columns})
    messy = messy[[" CLOSE ", " VOLUME ", " TIMESTAMPS ", " LOW ", " AMOUNT ", " OPEN ", " HIGH "]]
    messy["Extra"] = "x"
    path = tmp_path / "k.csv"
    messy.to_csv(path, index=False)
    out = read_kline(path)
    assert list(out.columns) == ["timestamps", *FEATURE_COLUMNS]
    assert pd.api.types.is_datetime64_any_dtype(out["timestamps"])
    assert list(out.index) == list(range(len(df)))
    np.testing.assert_allclose(out[list(FEATURE_COLUMNS)].to_numpy(), df[list(FEATURE_COLUMNS)].to_numpy())
    assert (out["timestamps"].to_numpy() == df["timestamps"].to_numpy()).all()
    assert out.attrs["source"] == str(path) and out.attrs["warnings"] == []


@pytest.mark.parametrize("alias", ["timestamp", "Date", "DATETIME", "time"])
def test_read_accepts_time_column_aliases(tmp_path, alias) -> None:
    path = tmp_path / "k.csv"
    small_frame().rename(columns={"timestamps": alias}).to_csv(path, index=False)
    assert read_kline(path)["timestamps"].iloc[1] == pd.Timestamp("2024-03-04 09:40")


def test_read_combines_separate_date_and_time_columns(tmp_path) -> None:
    df = small_frame(3)
    df.insert(0, "date", df.pop("timestamps").dt.strftime("%Y-%m-%d"))
    df.insert(1, "time", ["09:35", "09:40", "09:45"])
    path = tmp_path / "k.csv"
    df.to_csv(path, index=False)
    assert read_kline(path)["timestamps"].iloc[2] == pd.Timestamp("2024-03-04 09:45")


def test_read_fills_missing_volume_and_amount(tmp_path) -> None:
    path = tmp_path / "k.csv"
    small_frame().drop(columns=["amount"]).to_csv(path, index=False)
    out = read_kline(path)
    row = out.iloc[0]
    assert row["amount"] == pytest.approx(row["volume"] * row[list(PRICE_COLUMNS)].mean())


def test_parquet_round_trip(tmp_path) -> None:
    df = synthetic_kline(200, seed=3)
    path = tmp_path / "k.parquet"
    df.to_parquet(path, index=False)
    out = read_kline(path)
    np.testing.assert_array_equal(out[list(FEATURE_COLUMNS)].to_numpy(), df[list(FEATURE_COLUMNS)].to_numpy())
    assert (out["timestamps"].to_numpy() == df["timestamps"].to_numpy()).all()


def test_parquet_with_datetime_index(tmp_path) -> None:
    df = small_frame().set_index("timestamps")
    path = tmp_path / "k.parquet"
    df.to_parquet(path)
    assert read_kline(path)["timestamps"].iloc[0] == pd.Timestamp("2024-03-04 09:35")


def write_csv(tmp_path, df: pd.DataFrame, name: str = "bad.csv"):
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path


def test_missing_price_column_names_it_and_lists_found(tmp_path) -> None:
    path = write_csv(tmp_path, small_frame().drop(columns=["low"]))
    with pytest.raises(KronosError, match=r"bad\.csv.*'low'.*found: timestamps, open, high, close"):
        read_kline(path)


def test_nan_names_column_row_and_timestamp(tmp_path) -> None:
    df = small_frame()
    df.loc[3, "high"] = np.nan
    with pytest.raises(KronosError, match=r"bad\.csv.*'high'.*NaN.*line 5 \(2024-03-04 09:50:00\)"):
        read_kline(write_csv(tmp_path, df))


def test_inf_names_column(tmp_path) -> None:
    df = small_frame()
    df.loc[2, "volume"] = np.inf
    with pytest.raises(KronosError, match=r"bad\.csv.*'volume'.*infinite.*line 4"):
        read_kline(write_csv(tmp_path, df))


def test_non_numeric_names_column_and_row(tmp_path) -> None:
    df = small_frame().astype({"close": object})
    df.loc[4, "close"] = "n/a?"
    with pytest.raises(KronosError, match=r"bad\.csv.*'close'.*non-numeric.*'n/a\?'.*line 6"):
        read_kline(write_csv(tmp_path, df))


def test_frames_name_rows_and_csv_files_name_lines(tmp_path) -> None:
    df = small_frame()
    df.loc[3, "high"] = np.nan
    with pytest.raises(KronosError, match=r"mem: column 'high' has NaN/empty at row 3 \("):
        validate_kline(df, source="mem")
    path = write_csv(tmp_path, df)
    with pytest.raises(KronosError, match=r"line 5 \("):
        read_kline(path)
    assert path.read_text().splitlines()[4].split(",")[0] == "2024-03-04 09:50:00"  # line 5 of the file


def test_missing_volume_and_amount_are_reported_as_filled(tmp_path) -> None:
    path = write_csv(tmp_path, small_frame().drop(columns=["volume", "amount"]))
    out = read_kline(path)
    assert out.attrs["filled_columns"] == ["volume", "amount"]
    assert (out["volume"] == 0).all() and (out["amount"] == 0).all()
    assert read_kline(write_csv(tmp_path, small_frame())).attrs["filled_columns"] == []


def test_true_false_values_are_not_numbers() -> None:
    df = small_frame()
    df["volume"] = True
    with pytest.raises(KronosError, match=r"mem: column 'volume' holds true/false"):
        validate_kline(df, source="mem")


def test_unsorted_timestamps(tmp_path) -> None:
    df = small_frame()
    df = df.iloc[[0, 1, 3, 2, 4, 5]]
    with pytest.raises(KronosError, match=r"bad\.csv.*not increasing at line 5 \(2024-03-04 09:45:00.*sort"):
        read_kline(write_csv(tmp_path, df))


def test_duplicate_timestamps(tmp_path) -> None:
    df = small_frame()
    df.loc[4, "timestamps"] = df.loc[3, "timestamps"]
    expected = r"bad\.csv.*duplicate timestamp 2024-03-04 09:50:00 at lines 5 and 6"
    with pytest.raises(KronosError, match=expected):
        read_kline(write_csv(tmp_path, df))


@pytest.mark.parametrize("value", [0.0, -1.5])
def test_non_positive_price(tmp_path, value) -> None:
    df = small_frame()
    df.loc[1, "open"] = value
    with pytest.raises(KronosError, match=r"bad\.csv.*'open'.*non-positive.*line 3"):
        read_kline(write_csv(tmp_path, df))


def test_unparseable_timestamp_names_file_and_row(tmp_path) -> None:
    df = small_frame().astype({"timestamps": object})
    df.loc[2, "timestamps"] = "not a date"
    with pytest.raises(KronosError, match=r"bad\.csv.*timestamps.*'not a date'.*line 4"):
        read_kline(write_csv(tmp_path, df))


def test_no_time_column(tmp_path) -> None:
    path = write_csv(tmp_path, small_frame().drop(columns=["timestamps"]))
    with pytest.raises(KronosError, match=r"bad\.csv.*no time column"):
        read_kline(path)


def test_missing_file_and_bad_suffix(tmp_path) -> None:
    with pytest.raises(KronosError, match=r"nope\.csv.*not found"):
        read_kline(tmp_path / "nope.csv")
    other = tmp_path / "k.xlsx"
    other.write_text("x")
    with pytest.raises(KronosError, match=r"k\.xlsx.*unsupported"):
        read_kline(other)


def test_empty_and_garbage_files(tmp_path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(KronosError, match=r"empty\.csv"):
        read_kline(empty)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"definitely not parquet")
    with pytest.raises(KronosError, match=r"junk\.parquet"):
        read_kline(junk)


def test_high_low_inconsistency_is_a_warning(tmp_path) -> None:
    df = small_frame()
    df.loc[2, "high"] = df.loc[2, "close"] - 0.01
    df.loc[4, "low"] = df.loc[4, "open"] + 0.01
    messages = validate_kline(df, source="mem")
    assert len(messages) == 1
    assert "2 rows" in messages[0] and "2024-03-04 09:45:00" in messages[0]
    with pytest.warns(KlineDataWarning, match="high below"):
        out = read_kline(write_csv(tmp_path, df))
    assert len(out) == len(df) and len(out.attrs["warnings"]) == 1


def test_negative_volume_is_a_warning() -> None:
    df = small_frame()
    df.loc[0, "amount"] = -5.0
    messages = validate_kline(df, source="mem")
    assert len(messages) == 1 and "negative amount" in messages[0]


def test_validate_clean_frame_and_non_frame() -> None:
    assert validate_kline(small_frame(), source="mem") == []
    with pytest.raises(KronosError, match="DataFrame"):
        validate_kline([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(KronosError, match=r"mem: no data rows"):
        validate_kline(small_frame().iloc[:0], source="mem")


# --- finding files -----------------------------------------------------------------------------------


def test_find_data_files(tmp_path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("b.csv", "a.parquet", "c.CSV", "notes.txt"):
        (folder / name).write_text("x")
    (folder / "sub").mkdir()
    (folder / "sub" / "d.csv").write_text("x")
    single = tmp_path / "z.csv"
    single.write_text("x")
    found = find_data_files(folder)
    assert [p.name for p in found] == ["a.parquet", "b.csv", "c.CSV"]
    both = find_data_files([str(single), folder, folder / "b.csv"])
    assert [p.name for p in both] == ["z.csv", "a.parquet", "b.csv", "c.CSV"]


def test_find_data_files_errors(tmp_path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.md").write_text("x")
    with pytest.raises(KronosError, match=r"empty.*no \.csv or \.parquet"):
        find_data_files(empty)
    with pytest.raises(KronosError, match=r"missing.*no such file"):
        find_data_files([tmp_path / "missing"])
    with pytest.raises(KronosError, match="no data paths"):
        find_data_files([])


# --- synthetic data ----------------------------------------------------------------------------------


def test_synthetic_deterministic_and_seed_dependent() -> None:
    a = synthetic_kline(500, seed=7)
    pd.testing.assert_frame_equal(a, synthetic_kline(500, seed=7))
    assert not np.allclose(a["close"], synthetic_kline(500, seed=8)["close"])


def test_synthetic_is_valid_and_consistent() -> None:
    df = synthetic_kline(1000, seed=1, volatility=0.05)
    assert list(df.columns) == ["timestamps", *FEATURE_COLUMNS] and len(df) == 1000
    assert validate_kline(df, source="synthetic") == []
    assert (df["high"] >= df[["open", "close"]].max(axis=1)).all()
    assert (df["low"] <= df[["open", "close"]].min(axis=1)).all()
    assert (df["volume"] > 0).all()
    typical = df[list(PRICE_COLUMNS)].mean(axis=1)
    np.testing.assert_allclose(df["amount"], df["volume"] * typical)
    assert df["open"].iloc[0] == pytest.approx(10.0)


def test_synthetic_session_times() -> None:
    df = synthetic_kline(48 * 3 + 5, seed=0)  # starts Tue 2024-01-02
    ts = df["timestamps"]
    day = ts[ts.dt.date == pd.Timestamp("2024-01-02").date()]
    times = day.dt.strftime("%H:%M").tolist()
    assert len(times) == 48
    assert times[0] == "09:35" and times[23] == "11:30" and times[24] == "13:05" and times[-1] == "15:00"
    assert (ts.dt.day_of_week < 5).all()
    minutes = ts.dt.hour * 60 + ts.dt.minute
    in_session = ((minutes > 570) & (minutes <= 690)) | ((minutes > 780) & (minutes <= 900))
    assert in_session.all()
    # 5 days after Tuesday-start: Friday then Monday, no weekend bars.
    week = synthetic_kline(48 * 5, seed=0)["timestamps"]
    assert sorted(set(week.dt.date.astype(str))) == [
        "2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05", "2024-01-08"
    ]


def test_synthetic_volume_higher_near_open_and_close() -> None:
    df = synthetic_kline(48 * 40, seed=2)
    hhmm = df["timestamps"].dt.strftime("%H:%M")
    edges = df["volume"][hhmm.isin(["09:35", "15:00"])].mean()
    middle = df["volume"][hhmm.isin(["10:30", "14:00"])].mean()
    assert edges > 1.5 * middle


def test_synthetic_other_frequency_and_bad_frequency() -> None:
    df = synthetic_kline(10, freq_minutes=30, start="2024-01-06 10:00")  # a Saturday
    assert df["timestamps"].iloc[0] == pd.Timestamp("2024-01-08 10:00")
    assert df["timestamps"].dt.strftime("%H:%M").tolist()[:5] == ["10:00", "10:30", "11:00", "11:30", "13:30"]
    with pytest.raises(KronosError, match="freq_minutes=7"):
        synthetic_kline(10, freq_minutes=7)


def test_synthetic_series_distinct_and_reproducible() -> None:
    frames = synthetic_series(3, n_rows=100, seed=5)
    again = synthetic_series(3, n_rows=100, seed=5)
    assert len(frames) == 3
    for a, b in zip(frames, again):
        pd.testing.assert_frame_equal(a, b)
    starts = [f["open"].iloc[0] for f in frames]
    assert len(set(starts)) == 3
    assert not np.allclose(frames[0]["close"] / starts[0], frames[1]["close"] / starts[1])
    assert all(validate_kline(f) == [] for f in frames)
