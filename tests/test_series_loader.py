"""The one loader (kronos_core.data.series): every layout gives the same series; one rule for a symbol's file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import FEATURE_COLUMNS, TIME_COLUMN
from kronos_core.data.series import load_series
from kronos_core.data.synthetic import synthetic_kline
from kronos_core.errors import KronosError


def _frames() -> dict[str, pd.DataFrame]:
    frames = {}
    for i, name in enumerate(["aaa", "bbb"]):
        frame = synthetic_kline(40 + 5 * i, seed=i)
        frame[TIME_COLUMN] = frame[TIME_COLUMN].dt.tz_localize("Asia/Shanghai")
        frames[name] = frame.drop(columns=["amount"])
    return frames


def test_files_and_panels_give_the_same_series_with_their_time_zone(tmp_path: Path) -> None:
    frames = _frames()
    folder = tmp_path / "folder"
    folder.mkdir()
    for name, frame in frames.items():
        frame.to_parquet(folder / f"{name}.parquet", index=False)
    panel = pd.concat([frame.assign(code=name) for name, frame in frames.items()], ignore_index=True)
    panel.to_csv(tmp_path / "panel.csv", index=False)
    panel.to_parquet(tmp_path / "panel.parquet", index=False, row_group_size=30)  # batches cut the symbols
    notes: list[str] = []
    from_files = load_series([folder], lambda level, message: notes.append(message)).all()
    assert notes == [] and [s.name for s in from_files] == list(frames) and str(from_files[0].tz) == "Asia/Shanghai"
    for path, streamed in ((tmp_path / "panel.csv", False), (tmp_path / "panel.parquet", True)):
        source = load_series([path], symbol_column="code")
        assert source.streamed is streamed and source.name_column == "code" and source.count == 2
        for a, b in zip(source.all(), from_files, strict=True):
            assert a.name == b.name and a.lacked == b.lacked == ("amount",) and a.tz is not None
            np.testing.assert_array_equal(a.stamps, b.stamps)
            np.testing.assert_array_equal(a.features, b.features)
    series = from_files[0]
    original = frames["aaa"]
    assert list(series.index()) == list(original[TIME_COLUMN])
    np.testing.assert_array_equal(series.wall_clock_ns(),
                                  original[TIME_COLUMN].dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
                                  .view(np.int64))
    mean_price = original[["open", "high", "low", "close"]].mean(axis=1).to_numpy()
    np.testing.assert_allclose(series.features[:, FEATURE_COLUMNS.index("amount")],
                               original["volume"].to_numpy() * mean_price, rtol=1e-12)


def test_a_symbol_in_two_panel_files_is_refused_in_one_line(tmp_path: Path) -> None:
    frame = synthetic_kline(30, seed=0).assign(symbol="aaa")
    frame.iloc[:15].to_csv(tmp_path / "a.csv", index=False)
    frame.iloc[15:].to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(KronosError, match=r"b\.csv: symbol aaa is also in .*a\.csv; give each symbol.s rows in one"):
        load_series([tmp_path / "a.csv", tmp_path / "b.csv"], symbol_column="symbol")


def test_synthetic_series_and_universe_are_named_apart() -> None:
    series = load_series(synthetic=3, rows=50, seed=1)
    assert series.synthetic and [s.name for s in series.all()] == ["synthetic_0", "synthetic_1", "synthetic_2"]
    universe = load_series(synthetic=3, rows=50, seed=1, universe=True).all()
    assert [s.name for s in universe] == ["SYN0000", "SYN0001", "SYN0002"] and universe[0].features.shape == (50, 6)
