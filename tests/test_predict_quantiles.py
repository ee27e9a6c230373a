"""`kronos-tune predict --quantiles`: the quantile math on known sample paths, the flag's errors, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_core.data.synthetic import synthetic_kline
from kronos_tune.cli import main
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.quantiles import (base_column, parse_quantiles, quantile_column, quantile_columns,
                                           sample_quantiles)

pytestmark = pytest.mark.usefixtures("one_thread")

LEVELS = (0.1, 0.5, 0.9)
BANDS = quantile_columns(FEATURE_COLUMNS, LEVELS)


def test_quantiles_of_known_sample_paths() -> None:
    # 5 samples of one bar: sorted 1..5, so level q sits at position 4q (linear interpolation).
    one = np.array([3.0, 1.0, 5.0, 2.0, 4.0]).reshape(1, 5, 1, 1)
    assert sample_quantiles(one, LEVELS).ravel().tolist() == pytest.approx([1.4, 3.0, 4.6], abs=1e-12)
    # 4 samples: position 3q; q50 is the mean of the middle two.
    four = np.array([10.0, 0.0, 30.0, 20.0]).reshape(1, 4, 1, 1)
    assert sample_quantiles(four, (0.25, 0.5, 0.9)).ravel().tolist() == pytest.approx([7.5, 15.0, 27.0], abs=1e-12)
    # [N, S, P, C] -> [N, Q, P, C], each series, bar and column on its own; float32 stays float32.
    rng = np.random.default_rng(0)
    samples = rng.normal(size=(3, 7, 4, 6)).astype(np.float32)
    got = sample_quantiles(samples, LEVELS)
    assert got.shape == (3, 3, 4, 6) and got.dtype == np.float32
    expected = np.quantile(samples[2, :, 1, 4].astype(np.float64), 0.9)
    assert got[2, 2, 1, 4] == np.float32(expected)
    assert (np.diff(got, axis=1) >= 0).all()
    with pytest.raises(ValueError, match="at least 2 samples"):
        sample_quantiles(samples[:, :1], LEVELS)


def test_column_names() -> None:
    assert [quantile_column("close", q) for q in (0.1, 0.5, 0.9, 0.05, 0.025, 0.999)] == [
        "close_q10", "close_q50", "close_q90", "close_q05", "close_q2.5", "close_q99.9"]
    assert quantile_columns(["open", "close"], (0.1, 0.9)) == ["open_q10", "open_q90", "close_q10", "close_q90"]
    assert [base_column(c) for c in ("close_q10", "volume_q2.5", "close", "my_quirk")] == [
        "close", "volume", "close", "my_quirk"]


@pytest.mark.parametrize("text, message", [
    ("0.1,0.5,0.9", None),
    ("0.05, 0.95", None),
    ("0,0.5", "0 is outside (0, 1)"),
    ("0.5,1", "1 is outside (0, 1)"),
    ("1.5", "1.5 is outside (0, 1)"),
    ("-0.1,0.5", "-0.1 is outside (0, 1)"),
    ("nan", "nan is outside (0, 1)"),
    ("0.9,0.1", "not in increasing order (0.1 after 0.9)"),
    ("0.1,0.5,0.5", "0.5 is given twice"),
    ("0.1,ten", "'ten' is not a number"),
    ("", "no level given"),
])
def test_parse_quantiles(text: str, message: str | None) -> None:
    if message is None:
        assert parse_quantiles(text) == tuple(float(part) for part in text.split(","))
        return
    with pytest.raises(KronosTuneError) as caught:
        parse_quantiles(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("--quantiles ")


def _predict(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main(["predict", "--device", "cpu", "--size", "tiny", "--lookback", 24, "--pred-len", 3, *map(str, args)])
    captured = capsys.readouterr()
    return caught.value.code, captured.out, captured.err


@pytest.mark.parametrize("args, message", [
    (["--quantiles", "0.1,0.9"], "--quantiles 0.1,0.9 needs --sample-count 2 or more (got 1)"),
    (["--quantiles", "0.9,0.1", "--sample-count", 4], "not in increasing order"),
    (["--quantiles", "0,0.5", "--sample-count", 4], "0 is outside (0, 1)"),
    (["--quantiles", "0.1,0.9", "--sample-count", 4, "--resume"], "--resume: no work folder"),
])
def test_flag_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list,
                                         message: str) -> None:
    out = tmp_path / "kept.csv"
    out.write_text("kept\n")
    code, _, err = _predict(capsys, "--synthetic", 2, "--out", out, *args)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out.read_text() == "kept\n"


def _panel(path: Path) -> Path:
    parts = []
    for number, symbol in enumerate(("AAA", "BBB", "CCC")):
        frame = synthetic_kline(40, seed=number)
        frame.insert(0, "symbol", symbol)
        parts.append(frame)
    pd.concat(parts).to_csv(path, index=False)
    return path


def test_quantile_columns_end_to_end_csv_parquet_and_panel(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    common = ("--synthetic", 3, "--sample-count", 4, "--seed", 5)
    code, _, err = _predict(capsys, *common, "--out", tmp_path / "mean.parquet")
    assert code == 0, err
    code, _, err = _predict(capsys, *common, "--quantiles", "0.1,0.5,0.9", "--out", tmp_path / "bands.parquet")
    assert code == 0, err
    mean = pd.read_parquet(tmp_path / "mean.parquet")
    bands = pd.read_parquet(tmp_path / "bands.parquet")
    assert list(bands.columns) == ["series", "timestamps", *FEATURE_COLUMNS, *BANDS]
    pd.testing.assert_frame_equal(bands[list(mean.columns)], mean)  # the mean path is the same as without bands
    for column in FEATURE_COLUMNS:
        low, mid, high = (bands[quantile_column(column, q)].to_numpy() for q in LEVELS)
        assert np.isfinite(low).all() and (low <= mid).all() and (mid <= high).all(), column
    assert (bands["close_q90"] > bands["close_q10"]).any()  # sampled paths differ

    code, _, err = _predict(capsys, *common, "--quantiles", "0.1,0.5,0.9", "--out", tmp_path / "bands.csv")
    assert code == 0, err
    text = pd.read_csv(tmp_path / "bands.csv")
    assert list(text.columns) == list(bands.columns)
    np.testing.assert_allclose(text[BANDS[:12]], bands[BANDS[:12]], rtol=0, atol=5e-7)  # prices, 6 decimals

    code, out, err = _predict(capsys, "--data", _panel(tmp_path / "panel.csv"), "--symbol-column", "symbol",
                              "--sample-count", 4, "--quantiles", "0.25,0.75", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert [item["series"] for item in report["predictions"]] == ["AAA", "BBB", "CCC"]
    for item in report["predictions"]:
        assert len(item["close_q25"]) == 3 and all(a <= b for a, b in zip(item["close_q25"], item["close_q75"]))


def test_greedy_paths_make_every_quantile_its_column(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # With top-k 1 all samples are the same path: each band column must equal the column it is named after.
    code, _, err = _predict(capsys, "--synthetic", 2, "--sample-count", 3, "--top-k", 1, "--quantiles", "0.1,0.9",
                            "--out", tmp_path / "greedy.parquet")
    assert code == 0, err
    table = pd.read_parquet(tmp_path / "greedy.parquet")
    for column in FEATURE_COLUMNS:
        for level in (0.1, 0.9):
            np.testing.assert_allclose(table[quantile_column(column, level)], table[column], rtol=1e-5, atol=1e-3)
