"""Calibration of the forecast band in the backtest: coverage, pinball loss and CRPS on hand-checked cases, and
through a whole backtest (a forecaster that returns known sample closes), into backtest.json, origins.csv
and the picture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_tune.backtest.calibration import (crps_from_samples, inside, pinball_loss, sample_quantiles,
                                              summarize_calibration)
from kronos_tune.backtest.config import BacktestConfig, PredictionSetting
from kronos_tune.backtest.forecast import Window
from kronos_tune.backtest.runner import run_backtest

TINY = dict(size="tiny", lookback=32, pred_len=4, device="cpu")


def _quiet(level: str, message: str) -> None:
    pass


def test_quantiles_coverage_pinball_and_crps_by_hand():
    samples = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]])
    realized = np.array([4.5])
    # Linear interpolation between order statistics: position (5 - 1) x level.
    assert sample_quantiles(samples).tolist() == [pytest.approx([1.4, 2.0, 3.0, 4.0, 4.6])]
    assert inside(np.array([1.4]), np.array([4.6]), realized).tolist() == [True]   # P10-P90
    assert inside(np.array([2.0]), np.array([4.0]), realized).tolist() == [False]  # P25-P75
    # (y - q) (t - 1[y < q]): above P10 by 3.1 -> 0.31; above P50 by 1.5 -> 0.75; below P90 by 0.1 -> 0.01.
    assert pinball_loss(np.array([1.4]), realized, 0.1)[0] == pytest.approx(0.31)
    assert pinball_loss(np.array([3.0]), realized, 0.5)[0] == pytest.approx(0.75)
    assert pinball_loss(np.array([4.6]), realized, 0.9)[0] == pytest.approx(0.01)
    # E|X - y| = 8.5 / 5 = 1.7; E|X - X'| = 40 / 25 = 1.6 -> CRPS 1.7 - 0.8 = 0.9, which is also the integral
    # of (F(x) - 1[x >= y])^2 of the empirical F: 0.04 + 0.16 + 0.36 + 0.64 x 0.5 + 0.04 x 0.5.
    assert crps_from_samples(samples, realized)[0] == pytest.approx(0.9)
    assert 0.04 + 0.16 + 0.36 + 0.64 * 0.5 + 0.04 * 0.5 == pytest.approx(0.9)


def test_crps_equals_the_pairwise_definition_and_is_zero_for_a_point_on_the_truth():
    rng = np.random.default_rng(3)
    samples, realized = rng.normal(size=(4, 9)), rng.normal(size=4)
    pairwise = (np.abs(samples - realized[:, None]).mean(axis=1)
                - 0.5 * np.abs(samples[:, :, None] - samples[:, None, :]).mean(axis=(1, 2)))
    np.testing.assert_allclose(crps_from_samples(samples, realized), pairwise, rtol=1e-12)
    assert crps_from_samples(np.full((1, 6), 2.5), np.array([2.5]))[0] == 0.0


def test_summary_is_in_return_units_pooled_over_rows():
    frame = pd.DataFrame({
        "last_close": [10.0, 100.0], "realized_close": [10.5, 90.0],
        "close_p10": [9.0, 95.0], "close_p25": [9.5, 97.0], "close_p50": [10.0, 100.0], "close_p75": [10.6, 103.0],
        "close_p90": [11.0, 105.0], "crps_close": [0.2, 4.0]})
    summary = summarize_calibration(frame)
    assert summary["rows"] == 2
    assert summary["coverage_p10_p90"] == 0.5 and summary["coverage_p25_p75"] == 0.5
    # P50: |0.5| x 0.5 / 10 = 0.025 and |-10| x 0.5 / 100 = 0.05 -> mean 0.0375.
    assert summary["pinball_p50"] == pytest.approx(0.0375)
    # P10: 1.5 x 0.1 / 10 = 0.015; y below q by 5: 5 x 0.9 / 100 = 0.045 -> 0.03.
    assert summary["pinball_p10"] == pytest.approx(0.03)
    assert summary["crps"] == pytest.approx((0.2 / 10 + 4.0 / 100) / 2)


OFFSETS_AROUND = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])  # the truth is the median
OFFSETS_ABOVE = np.array([3.0, 4.0, 5.0, 6.0, 7.0])     # the truth lies below every sample


def _band_factory(step: float):
    """Five sampled closes per window: centred on the realized close for even symbols, all above it for odd."""
    def make(setting, on_chunk):
        def forecast(windows: list[Window], pred_len: int) -> np.ndarray:
            rows = []
            for w in windows:
                odd = int(w.symbol[-1]) % 2
                rows.append(w.realized_close + step * (OFFSETS_ABOVE if odd else OFFSETS_AROUND))
            return np.array(rows)
        return forecast
    return make


def test_backtest_reports_the_band_calibration_per_origin_and_overall(tmp_path: Path):
    pytest.importorskip("matplotlib")
    step = 0.01
    config = BacktestConfig(**TINY, synthetic=6, origins=3, top_k=2, setting=PredictionSetting(sample_count=5),
                            out=tmp_path / "run")
    result = run_backtest(config, on_note=_quiet, forecaster_factory=_band_factory(step))
    report = json.loads((tmp_path / "run" / "backtest.json").read_text())
    band = report["calibration"]
    assert band["samples"] == 5 and band["rows"] == 18
    # Half the symbols (the even ones) have their close inside both intervals, the odd ones neither.
    assert band["coverage_p10_p90"] == 0.5 and band["coverage_p25_p75"] == 0.5
    assert band["conventions"]["expected"] == {"coverage_p10_p90": 0.8, "coverage_p25_p75": 0.5}
    assert [o["coverage_p10_p90"] for o in band["per_origin"]] == [0.5, 0.5, 0.5]

    frames = [pd.read_csv(p) for p in sorted((tmp_path / "run" / "predictions" / "a").glob("origin-*.csv"))]
    pooled = pd.concat(frames, ignore_index=True)
    odd = pooled["symbol"].str[-1].astype(int) % 2 == 1
    scale = pooled["last_close"]
    # Centred: the P50 is the truth, CRPS = 1.2 step - 0.5 x 1.6 step = 0.4 step. Above: P50 is 5 steps over
    # the truth -> pinball 0.5 x 5 step; CRPS = 5 step - 0.8 step = 4.2 step.
    expected_p50 = np.where(odd, 0.5 * 5 * step, 0.0) / scale
    expected_crps = np.where(odd, 4.2 * step, 0.4 * step) / scale
    assert band["pinball_p50"] == pytest.approx(expected_p50.mean(), rel=1e-9)
    assert band["crps"] == pytest.approx(expected_crps.mean(), rel=1e-9)
    # Above: P90 = 6.6 steps over the truth -> (1 - 0.9) x 6.6 step; centred: P90 = 1.6 steps over -> 0.1 x 1.6.
    expected_p90 = np.where(odd, 0.1 * 6.6 * step, 0.1 * 1.6 * step) / scale
    assert band["pinball_p90"] == pytest.approx(expected_p90.mean(), rel=1e-9)

    # The point forecast is the mean of the samples.
    np.testing.assert_allclose(pooled["predicted_close"],
                               pooled["realized_close"] + np.where(odd, 5.0, 0.0) * step, rtol=1e-12)
    table = pd.read_csv(tmp_path / "run" / "origins.csv")
    assert table["coverage_p25_p75"].tolist() == [0.5] * 3 and "crps" in table.columns
    assert result.scores[0].calibration is not None and result.plot is not None
    assert report["rows"][0]["calibration"]["crps"] == band["crps"]


def test_one_sample_has_no_band(tmp_path: Path):
    def point_factory(setting, on_chunk):
        return lambda windows, pred_len: np.array([w.realized_close for w in windows])

    config = BacktestConfig(**TINY, synthetic=6, origins=2, top_k=2, out=tmp_path / "run")
    run_backtest(config, on_note=_quiet, forecaster_factory=point_factory)
    report = json.loads((tmp_path / "run" / "backtest.json").read_text())
    assert "calibration" not in report and "calibration" not in report["rows"][0]
    assert "coverage_p10_p90" not in pd.read_csv(tmp_path / "run" / "origins.csv").columns
