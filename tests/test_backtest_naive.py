"""Naive forecasts (kronos_tune.backtest.skill): persistence and drift on a hand-checked tiny panel, the
random-walk band, and the persistence MAE that `predict --holdout` reports beside the model's (kronos_tune.predict.job)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import read_kline
from kronos_core.data.synthetic import synthetic_kline
from kronos_tune.predict.job import persistence_mae
from kronos_tune.cli import main


def test_persistence_mae_is_the_mean_absolute_change_from_the_last_close():
    assert persistence_mae(10.0, np.array([11.0, 9.0, 13.0])) == pytest.approx((1 + 1 + 3) / 3)
    np.testing.assert_allclose(persistence_mae(np.array([1.0, 2.0]), np.array([[1.5, 0.5], [2.0, 4.0]])), [0.5, 1.0])


def test_predict_holdout_reports_the_persistence_mae_per_series_and_overall(tmp_path: Path, capsys):
    paths = [tmp_path / "a.csv", tmp_path / "b.csv"]
    synthetic_kline(80, seed=1).to_csv(paths[0], index=False)
    synthetic_kline(70, seed=2).to_csv(paths[1], index=False)
    with pytest.raises(SystemExit) as caught:
        main(["predict", "--size", "tiny", "--data", str(paths[0]), "--data", str(paths[1]), "--lookback", "32",
              "--pred-len", "4", "--holdout", "--device", "cpu", "--json"])
    assert caught.value.code == 0
    report = json.loads(capsys.readouterr().out)
    per_series = {item["series"]: item for item in report["per_series"]}
    for name, path in (("a", paths[0]), ("b", paths[1])):
        close = read_kline(path)["close"].to_numpy()
        expected = np.abs(close[-4:] - close[-5]).mean()
        # the last close as the model sees it (float32): within its rounding of the price
        assert per_series[name]["persistence_mae"] == pytest.approx(expected, abs=2e-7 * close[-5])
        assert per_series[name]["mae"] != pytest.approx(expected, rel=1e-6)
    assert report["persistence_mae"] == pytest.approx(np.mean([s["persistence_mae"] for s in per_series.values()]))
