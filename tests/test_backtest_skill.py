"""Skill against naive forecasts and its significance: hand-checked naive forecasts, the HAC t and the
Diebold-Mariano p-value on constructed series, the noise forecaster's rejection rate, the --compare verdict,
older backtest.json keys, too few origins and a missing [stats] extra."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.skill import ic_outcome, overlapping_origins
from kronos_tune.backtest.config import BacktestConfig, PredictionSetting
from kronos_tune.backtest.forecast import Window
from kronos_tune.backtest.metrics import PREDICTED, REALIZED, origin_quality, summarize
from kronos_tune.backtest.skill import DRIFT, PERSISTENCE, RANDOM_WALK, naive_frames, setting_skill
from kronos_tune.backtest.origins import Origin, Universe
from kronos_tune.backtest.plot import _from_zero, _stamp_labels, picture_title
from kronos_tune.backtest.runner import run_backtest
from kronos_tune.backtest.significance import critical_t, hac_lag, hac_mean_test, min_origins, origins_needed
from kronos_core.data.series import KlineSeries

ROOT = Path(__file__).resolve().parents[1]


def _quiet(level: str, message: str) -> None:
    pass


def _series(name: str, closes: list[float]) -> KlineSeries:
    stamps = pd.date_range("2024-01-01", periods=len(closes), freq="D").to_numpy(dtype="datetime64[ns]")
    features = np.column_stack([closes] * 4 + [np.ones(len(closes))] * 2).astype(np.float64)
    return KlineSeries(name, stamps, features)


def test_persistence_drift_and_random_walk_band_on_a_hand_checked_panel():
    # A doubles every bar; B goes 10, 11, 10, 11, 10, 12. Origin at row 3, lookback 4, pred_len 2.
    universe = Universe([_series("A", [1, 2, 4, 8, 16, 32]), _series("B", [10, 11, 10, 11, 10, 12])], "hand")
    origin = Origin(0, pd.Timestamp("2024-01-04"), [(0, 3), (1, 3)])
    saved = pd.DataFrame({"origin": 0, "timestamp": origin.timestamp, "symbol": ["A", "B"],
                          "last_close": [8.0, 11.0], "predicted_close": [9.0, 11.5], "realized_close": [32.0, 12.0],
                          PREDICTED: [9 / 8 - 1, 11.5 / 11 - 1], REALIZED: [3.0, 12 / 11 - 1]})
    naive = naive_frames(universe, origin, saved, lookback=4, pred_len=2)
    assert naive[PERSISTENCE][PREDICTED].tolist() == [0.0, 0.0]
    # drift: mean one-bar log return x 2, as a simple return. A: 2 x log 2 -> 3; B: (log 1.1) / 3 x 2.
    assert naive[DRIFT][PREDICTED].tolist() == pytest.approx([3.0, 1.1 ** (2 / 3) - 1])
    # the band: A's two 2-bar returns are 3 and 3 (every close 32, on the truth: CRPS 0); B's are 0 and 0
    # (every close 11, one below the realized 12: CRPS 1).
    band = naive[RANDOM_WALK]
    assert band["close_p10"].tolist() == pytest.approx([32.0, 11.0])
    assert band["close_p90"].tolist() == pytest.approx([32.0, 11.0])
    assert band["crps_close"].tolist() == pytest.approx([0.0, 1.0])
    persistence_error = np.abs(naive[PERSISTENCE][PREDICTED] - naive[PERSISTENCE][REALIZED])
    assert persistence_error.mean() == pytest.approx((3.0 + 1 / 11) / 2)


def test_a_lookback_too_short_for_the_band_says_so():
    universe = Universe([_series("A", [1, 2, 4, 8, 16]), _series("B", [10, 11, 10, 11, 12])], "hand")
    origin = Origin(0, pd.Timestamp("2024-01-03"), [(0, 2), (1, 2)])
    saved = pd.DataFrame({"origin": 0, "timestamp": origin.timestamp, "symbol": ["A", "B"], "last_close": [4.0, 10.0],
                          "predicted_close": [4.0, 10.0], "realized_close": [16.0, 12.0], PREDICTED: [0.0, 0.0],
                          REALIZED: [3.0, 0.2]})
    assert RANDOM_WALK not in naive_frames(universe, origin, saved, lookback=3, pred_len=2)


def test_hac_t_against_a_hand_computed_case():
    x = np.array([0.02, -0.01, 0.03, 0.00, 0.05, -0.02, 0.04, 0.01, 0.02, -0.03, 0.06, 0.01])
    # Newey-West at lag 1 by hand: gamma_0 = sum(d^2) / n, gamma_1 = sum(d_t d_t-1) / n (d = x - mean),
    # S = gamma_0 + 2 x (1 - 1/2) x gamma_1, t = mean / sqrt(S / n).
    # mean 0.015, gamma_0 = 0.0083 / 12, gamma_1 = -0.005975 / 12, S = 0.002325 / 12, t = 0.015 / sqrt(S / 12).
    expected_t = 0.015 / math.sqrt(0.002325 / 12 / 12)
    test = hac_mean_test(x, lag=1)
    assert expected_t == pytest.approx(3.7330261, rel=1e-7)
    assert test.t == pytest.approx(expected_t, rel=1e-12)
    assert test.mean == pytest.approx(0.015)
    # p from Student t with floor(12 / 3) - 1 = 3 degrees of freedom (scipy: 2 * t.sf(3.7330, 3)).
    assert test.p == pytest.approx(0.0335049, rel=1e-5) and test.significant
    assert test.low < 0.015 < test.high


def test_diebold_mariano_p_value_on_a_constructed_loss_series():
    # Every realized return 0, so persistence's error is 0 and the loss differential of an origin is the
    # model's |predicted return|: 0.02, 0, 0.02, 0, 0.02, 0. At lag 0 the HAC variance is the plain one with
    # 1 / n: mean 0.01, variance 0.0001, t = 0.01 / sqrt(0.0001 / 6) = sqrt(6); Student t with 5 df:
    # p = 2 x t.sf(sqrt(6), 5) = 0.05797.
    frames = [pd.DataFrame({"origin": k, "symbol": ["A", "B", "C"], PREDICTED: 0.02 * (k % 2 == 0),
                            REALIZED: 0.0}) for k in range(6)]
    persistence = [f.assign(**{PREDICTED: 0.0}) for f in frames]
    quality = [origin_quality(f) for f in frames]
    skill = setting_skill(frames, quality, persistence, lag=0, crps=None, band_crps=None, band_reason=None)
    dm = skill.mae_vs_persistence
    assert dm.mean == pytest.approx(0.01) and dm.t == pytest.approx(math.sqrt(6))
    assert dm.p == pytest.approx(0.0579728, rel=1e-5) and not dm.significant
    assert dm.origins_needed == 7  # sqrt(7) = 2.646 > t(0.975, 6) = 2.447; sqrt(6) < t(0.975, 5) = 2.571
    assert "not distinguishable from no change; about 7 origins would be needed" in skill.verdict("model")
    assert "MAE ratio not available (persistence's MAE is 0)" in skill.verdict("model")


def test_origins_needed_is_the_first_count_that_reaches_significance():
    needed = origins_needed(0.02, 0.1, n=20, lag=2)
    assert needed > 20
    assert 0.02 * math.sqrt(needed) / 0.1 >= critical_t(needed, 2)
    assert 0.02 * math.sqrt(needed - 1) / 0.1 < critical_t(needed - 1, 2)
    assert needed >= (1.96 * 0.1 / 0.02) ** 2  # the corrected critical t is above the normal one


def test_lag_follows_the_overlap_of_the_horizons():
    assert [hac_lag(5, every) for every in (1, 2, 3, 5, 10)] == [4, 2, 1, 0, 0]
    assert hac_lag(12, 48.0) == 0  # --every day on five-minute bars
    assert min_origins(0) == 4 and min_origins(2) == 20


def test_pure_noise_forecaster_rejects_rarely_and_a_real_signal_is_found():
    # pred_len 4, every 2: neighbouring forecasts and realized returns share two of their four bars (lag 1).
    null = [ic_outcome(overlapping_origins(seed, 30, 12, 2, 4), lag=1) for seed in range(20)]
    rejected = sum(o.corrected_p < 0.05 for o in null)
    assert rejected <= 4  # 5 % expected: 1 of 20; the wide band leaves room for chance
    power = [ic_outcome(overlapping_origins(500 + seed, 30, 12, 2, 4, true_ic=0.4), lag=1) for seed in range(6)]
    assert sum(o.corrected_p < 0.05 for o in power) >= 5


def _noisy_factory(setting: PredictionSetting, on_chunk):
    """A forecaster whose error grows with the setting's temperature (so two settings differ)."""
    rng = np.random.default_rng(int(setting.temperature * 100))

    def forecast(windows: list[Window], pred_len: int) -> np.ndarray:
        realized = np.array([w.realized_close / w.last_close - 1 for w in windows])
        noise = rng.normal(0.0, 0.004 * setting.temperature, len(windows))
        return np.array([w.last_close for w in windows]) * (1 + 0.5 * realized + noise)

    return forecast


COMPARE = dict(size="tiny", lookback=32, pred_len=4, every=2, device="cpu", synthetic=12, origins=14, top_k=3)


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory):
    """One backtest of two settings (the second noisier), shared by the tests that read it."""
    run = tmp_path_factory.mktemp("compare") / "run"
    config = BacktestConfig(**COMPARE, setting=PredictionSetting(temperature=1.0),
                            compare=PredictionSetting(temperature=3.0), out=run)
    return run_backtest(config, on_note=_quiet, forecaster_factory=_noisy_factory), run


def test_compare_verdict_and_its_tests(compared):
    result, run = compared
    report = json.loads((run / "backtest.json").read_text())
    verdict = report["compare"]["verdict"]
    # both settings predict with random weights (the run has no checkpoint): the verdict says so first
    assert verdict.startswith("random weights: not a finding: float32 temperature=3 vs float32: MAE +")
    assert report["compare"]["test"]["verdict"] == verdict
    test = report["compare"]["test"]
    for key in ("mae_dm", "ic_diff", "rank_ic_diff"):
        assert 0.0 <= test[key]["p"] <= 1.0 and test[key]["lag"] == 1 and test[key]["n"] == 14
    # the noisier setting's MAE is larger in every origin: the DM test finds it
    assert test["mae_change"] > 0 and test["mae_dm"]["p"] < 0.05 and "worse on MAE" in verdict
    # each setting against persistence, in the file and the table's verdict lines
    for row in report["rows"]:
        assert row["skill"]["verdict"].startswith(f"random weights: not a finding: {row['title']} vs persistence: "
                                                  f"MAE ")
    saved = pd.concat([pd.read_csv(p) for p in sorted((run / "predictions" / "a").glob("*.csv"))])
    assert report["skill"]["persistence_mae_return"] == pytest.approx(saved[REALIZED].abs().mean(), rel=1e-12)
    assert report["conventions"]["significance"]["lag"].endswith("= 1 (every in bars): origins whose horizons "
                                                                  "overlap")
    # the picture's pieces: from 0 at the first origin, dates only for daily origins, the models by name
    assert _from_zero(result.scores[0].net_equity)[0] == 0.0
    assert len(_from_zero(result.scores[0].net_equity)) == len(result.schedule.origins) + 1
    assert picture_title(result) == "backtest: 168 symbol-origins predicted (12 symbols, 14 origins); random tiny"
    table = pd.read_csv(run / "origins.csv")
    for column in ("persistence_mae_return", "drift_ic", "drift_mae_return", "random_walk_crps"):
        assert table[column].notna().all()


def _rendered(result) -> tuple[str, list[str]]:
    from rich.console import Console

    from kronos_tune.commands.backtest import results_table, verdict_lines

    console = Console(record=True, width=400)
    console.print(results_table(result))
    return console.export_text(), verdict_lines(result)


def test_random_weights_and_few_periods_say_so_in_every_view(compared):
    result, run = compared
    text, verdicts = _rendered(result)
    lines = text.splitlines()
    # the header counts what was predicted; each model column says random weights under its title
    assert lines[0].strip() == "backtest: 168 symbol-origins predicted (12 symbols, 14 origins)"
    assert text.count("random weights: not a finding") >= 3  # two columns and the caption
    assert "drift" in text and "synthetic: planted trends" in text
    assert verdicts and all(line.startswith("random weights: not a finding: ") for line in verdicts)
    # 14 rebalances: annualized rows say they extrapolate, the Sharpe ratio has its interval
    assert "annualized return (14 periods: extrapolated)" in text
    sharpe = next(line for line in lines if line.startswith(" Sharpe [95 %] (14 periods: extrapolated)"))
    curve = result.scores[0].curve
    assert f"{curve.sharpe:.2f} [{curve.sharpe_low:.1f}, {curve.sharpe_high:.1f}]" in sharpe
    assert curve.sharpe_low < curve.sharpe < curve.sharpe_high
    report = json.loads((run / "backtest.json").read_text())
    assert report["periods"] == 14 and report["sharpe_low"] == pytest.approx(curve.sharpe_low)
    assert any(c.startswith("float32, float32 temperature=3: random weights: not a finding")
               for c in report["caveats"])
    assert any("14 rebalances (fewer than 30)" in c for c in report["caveats"])
    # no sample paths: the random-walk band's figures are still shown, as backtest.json holds them
    band = report["naive"]["random_walk_band"]
    coverage = next(line for line in lines if line.startswith(" coverage P10-P90"))
    assert f"{100 * band['coverage_p10_p90']:.2f} %" in coverage
    assert "needs --sample-count 2+" in next(line for line in lines if line.startswith(" CRPS skill"))


def test_a_checkpoint_carries_no_random_caveat_and_gaps_are_counted(compared):
    result, _ = compared
    trained = replace(result, config=replace(result.config, checkpoint="runs/train/mini-1/best"))
    text, verdicts = _rendered(trained)
    assert "random weights" not in text and not any("random weights" in line for line in verdicts)
    origins = [replace(o, members=o.members[:6]) if o.index == 0 else o for o in result.schedule.origins]
    gapped = replace(result, schedule=replace(result.schedule, origins=origins))
    assert gapped.counted() == ("162 symbol-origins predicted (12 symbols, 14 origins; not every symbol at every "
                                "origin)")


def test_picture_labels_are_dates_for_daily_origins(compared):
    result = compared[0]
    intraday = _stamp_labels(result, [0, 1])
    assert all(":" in label for label in intraday[:2])  # synthetic five-minute bars keep their times
    daily_schedule = replace(result.schedule, origins=[replace(o, timestamp=o.timestamp.normalize())
                                                       for o in result.schedule.origins])
    daily = _stamp_labels(replace(result, schedule=daily_schedule), [0, 1])
    assert daily[:2] == [str(o.timestamp.date()) for o in daily_schedule.origins[:2]]
    assert daily[-1].endswith("(end)") and "00:00" not in daily[0]


OLD_KEYS = ("ic_mean", "ic_std", "ic_t", "icir", "rank_ic_mean", "rank_ic_std", "rank_ic_t", "rank_icir", "hit_rate",
            "mae_return", "cumulative_return", "annualized_return", "annualized_volatility", "sharpe",
            "max_drawdown", "turnover", "benchmark_cumulative_return", "benchmark_annualized_return", "origins",
            "symbols", "symbols_skipped", "predictions", "first_origin", "last_origin", "setting", "portfolio",
            "universe", "synthetic", "model", "random_weights", "lookback", "pred_len", "every", "seed", "rows",
            "training_span", "conventions")


def test_too_few_origins_are_not_available_with_the_reason_and_older_keys_stay(tmp_path: Path):
    notes: list[tuple[str, str]] = []
    config = BacktestConfig(**{**COMPARE, "origins": 6}, out=tmp_path / "run")
    run_backtest(config, on_note=lambda level, message: notes.append((level, message)),
                 forecaster_factory=_noisy_factory)
    text = (tmp_path / "run" / "backtest.json").read_text()
    report = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in backtest.json"))
    assert ("warning", "6 origins: the significance tests at HAC lag 1 (--pred-len 4, --every 2) need at least "
                       "12; they are reported as not available (more --origins, or a larger --every)") in notes
    for key in ("ic", "rank_ic", "mae_vs_persistence_dm", "hit_rate_vs_half"):
        test = report["skill"][key]
        assert test["p"] is None and test["t"] is None
        assert test["not_available"] == "6 origins with a finite value; a HAC estimate at lag 1 needs at least 12 " \
                                        "(more --origins, or a larger --every)"
    assert "tests not available: 6 origins" in report["skill"]["verdict"]
    # Every key an older backtest.json had is still there, with its meaning: ic_t the plain t over origins.
    assert set(OLD_KEYS) <= set(report)
    ic = pd.read_csv(tmp_path / "run" / "origins.csv")["ic"]
    assert report["ic_t"] == pytest.approx(summarize(ic.tolist()).t)


@pytest.mark.slow  # a fresh interpreter loads torch and the model
def test_without_statsmodels_one_line_says_how_to_install_and_the_rest_runs(tmp_path: Path):
    script = ("import sys; sys.modules['statsmodels'] = None\n"
              "from kronos_tune.cli import main\n"
              f"main(['backtest', '--size', 'tiny', '--device', 'cpu', '--synthetic', '6', '--origins', '4', "
              f"'--lookback', '32', '--pred-len', '4', '--top-k', '2', '--out', {str(tmp_path / 'run')!r}])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if 'pip install "kronos-tune[stats]"' in line]
    assert len(lines) == 1 and lines[0].startswith("warning: statsmodels is not installed")
    assert "Traceback" not in done.stderr
    report = json.loads((tmp_path / "run" / "backtest.json").read_text())
    assert report["skill"]["ic"]["not_available"] == 'statsmodels is not installed (pip install "kronos-tune[stats]")'
    assert report["skill"]["mae_ratio_to_persistence"] > 0 and report["ic_mean"] is not None


def test_without_statsmodels_the_tests_say_why(monkeypatch: pytest.MonkeyPatch):
    for name in ("statsmodels", "statsmodels.regression", "statsmodels.regression.linear_model"):
        monkeypatch.setitem(sys.modules, name, None)
    test = hac_mean_test(np.arange(12.0), lag=1)
    assert test.t is None and test.p is None and test.mean == 5.5
    assert test.reason == 'statsmodels is not installed (pip install "kronos-tune[stats]")'
