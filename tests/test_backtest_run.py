"""`kronos-tune backtest` end to end: the tiny model on small synthetic panels, an oracle forecaster, resume,
--compare, the picture, and bad input through the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.synthetic import synthetic_kline
from kronos_tune.backtest.config import BacktestConfig, PredictionSetting
from kronos_tune.backtest.forecast import OracleForecaster, Window
from kronos_tune.backtest.metrics import PREDICTED, REALIZED
from kronos_tune.backtest.runner import run_backtest
from kronos_tune.cli import main
from synthetic_panel import synthetic_universe
from kronos_tune.runs import read_run_file

TINY = dict(size="tiny", lookback=32, pred_len=4, device="cpu")


def _quiet(level: str, message: str) -> None:
    pass


def _oracle_factory(setting, on_chunk):
    return OracleForecaster()


def _saved_predictions(run: Path, slot: str = "a") -> list[pd.DataFrame]:
    return [pd.read_csv(path) for path in sorted((run / "predictions" / slot).glob("origin-*.csv"))]


def test_oracle_rank_ic_one_and_portfolio_is_realized_top_k_minus_costs(tmp_path: Path):
    config = BacktestConfig(**TINY, synthetic=12, origins=4, top_k=3, cost_bps=20.0, out=tmp_path / "run")
    result = run_backtest(config, on_note=_quiet, forecaster_factory=_oracle_factory)
    report = json.loads((tmp_path / "run" / "backtest.json").read_text())
    assert report["rank_ic_mean"] == pytest.approx(1.0) and report["ic_mean"] == pytest.approx(1.0)
    assert report["hit_rate"] == 1.0 and report["mae_return"] == 0.0
    assert report["origins"] == 4 and report["symbols"] == 12

    # The expected period returns, from the synthetic panel itself (not from the saved files).
    panel = synthetic_universe(12, n_rows=32 + 4 + 3 * 4, seed=0)
    close = panel.pivot(index="timestamps", columns="symbol", values="close")
    previous: pd.Series | None = None
    table = pd.read_csv(tmp_path / "run" / "origins.csv")
    for origin in result.schedule.origins:
        row = close.index.get_loc(origin.timestamp)
        realized = (close.iloc[row + 4] / close.iloc[row] - 1).sort_values(ascending=False)
        weights = pd.Series(0.0, index=realized.index)
        weights.iloc[:3], weights.iloc[-3:] = 1 / 3, -1 / 3
        turnover = 2.0 if previous is None else float((weights - previous.reindex(weights.index)).abs().sum())
        expected = realized.iloc[:3].mean() - realized.iloc[-3:].mean() - turnover * 20 / 10_000
        assert table.loc[origin.index, "net_return"] == pytest.approx(expected, abs=1e-12)
        assert table.loc[origin.index, "turnover"] == pytest.approx(turnover)
        previous = weights
    assert table["rank_ic"].tolist() == pytest.approx([1.0] * 4)


def test_costs_reduce_returns_by_turnover_times_bps(tmp_path: Path):
    tables = {}
    for bps in (0.0, 35.0):
        config = BacktestConfig(**TINY, synthetic=10, origins=3, top_k=2, cost_bps=bps, out=tmp_path / f"c{bps}")
        run_backtest(config, on_note=_quiet, forecaster_factory=_oracle_factory)
        tables[bps] = pd.read_csv(tmp_path / f"c{bps}" / "origins.csv")
    free, costly = tables[0.0], tables[35.0]
    np.testing.assert_allclose(free["net_return"] - costly["net_return"], free["turnover"] * 35 / 10_000, atol=1e-15)
    assert (free["turnover"] > 0).all()


def test_ic_per_origin_equals_pandas_corr_of_the_saved_predictions(tmp_path: Path):
    def noisy_factory(setting, on_chunk):
        rng = np.random.default_rng(5)

        def forecast(windows: list[Window], pred_len: int) -> np.ndarray:
            return np.array([w.last_close * (1 + 0.5 * (w.realized_close / w.last_close - 1) + rng.normal(0, 0.003))
                             for w in windows])
        return forecast

    config = BacktestConfig(**TINY, synthetic=15, origins=3, top_k=2, out=tmp_path / "run")
    result = run_backtest(config, on_note=_quiet, forecaster_factory=noisy_factory)
    table = pd.read_csv(tmp_path / "run" / "origins.csv")
    for frame, (_, row) in zip(_saved_predictions(tmp_path / "run"), table.iterrows()):
        assert row["ic"] == pytest.approx(frame[PREDICTED].corr(frame[REALIZED]), abs=1e-12)
        ranks = frame[[PREDICTED, REALIZED]].rank()
        assert row["rank_ic"] == pytest.approx(ranks[PREDICTED].corr(ranks[REALIZED]), abs=1e-12)
    assert 0 < result.scores[0].ic.mean < 1
    assert result.scores[0].ic.mean == pytest.approx(table["ic"].mean())


def test_resume_after_interruption_gives_the_same_backtest_json(tmp_path: Path, one_thread):
    # Sampling on (T=1), several predict calls per run: the per-unit seeds must make the runs agree.
    options = dict(**TINY, synthetic=6, origins=5, top_k=2, chunk_series=12, setting=PredictionSetting())
    whole = run_backtest(BacktestConfig(**options, out=tmp_path / "whole"), on_note=_quiet)
    assert whole.session_predicted == 30

    calls = []

    def interrupt_after_two_units(state) -> None:
        calls.append(state.origins_done)
        if state.origins_done >= 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_backtest(BacktestConfig(**options, out=tmp_path / "cut"), on_note=_quiet,
                     on_progress=interrupt_after_two_units)
    assert read_run_file(tmp_path / "cut")["status"] == "cancelled"
    # 12 symbol-origins a chunk: two chunks (origins 0-3) finished and kept in the work folder, no origin file yet
    assert sorted(p.name for p in (tmp_path / "cut" / "predictions" / "a.work" / "done").iterdir()) == \
        ["chunk-000000.json", "chunk-000001.json"]
    assert _saved_predictions(tmp_path / "cut") == []
    assert not (tmp_path / "cut" / "backtest.json").exists()

    notes: list[str] = []
    resumed = run_backtest(BacktestConfig(**options, out=tmp_path / "cut", resume=True),
                           on_note=lambda level, message: notes.append(message))
    assert resumed.session_predicted == 6  # only the missing chunk (origin 4)
    assert any("resumed: 2 of 3 chunks (24 of 30 symbol-origins)" in note for note in notes)
    assert not (tmp_path / "cut" / "predictions" / "a.work").exists()
    assert read_run_file(tmp_path / "cut")["status"] == "complete"
    assert (tmp_path / "cut" / "backtest.json").read_bytes() == (tmp_path / "whole" / "backtest.json").read_bytes()
    assert (tmp_path / "cut" / "origins.csv").read_bytes() == (tmp_path / "whole" / "origins.csv").read_bytes()


def test_compare_a_setting_with_itself_agrees_perfectly(tmp_path: Path, one_thread):
    config = BacktestConfig(**TINY, synthetic=8, origins=3, top_k=2, compare=PredictionSetting(),
                            out=tmp_path / "run")
    result = run_backtest(config, on_note=_quiet)
    report = json.loads((tmp_path / "run" / "backtest.json").read_text())
    agreement = report["compare"]["agreement"]
    assert agreement["spearman_mean"] == pytest.approx(1.0) and agreement["spearman_min"] == pytest.approx(1.0)
    assert report["compare"]["ic_mean_diff"] == 0.0 and report["compare"]["curve_max_abs_diff"] == 0.0
    assert result.agreement is not None and result.agreement.per_origin == [pytest.approx(1.0)] * 3
    table = pd.read_csv(tmp_path / "run" / "origins.csv")
    assert "compare_ic" in table.columns and table["agreement_spearman"].tolist() == pytest.approx([1.0] * 3)


def test_compare_shift_with_a_sliding_window(tmp_path: Path, one_thread):
    base = PredictionSetting(max_context=24, sample_top_k=1)  # greedy; lookback 32 > 24: the window slides
    config = BacktestConfig(**TINY, synthetic=8, origins=2, top_k=2, setting=base,
                            compare=PredictionSetting(window_mode="shift", max_context=24, sample_top_k=1),
                            out=tmp_path / "run")
    notes: list[str] = []
    result = run_backtest(config, on_note=lambda level, message: notes.append(message))
    assert result.agreement is not None and result.agreement.spearman.n == 2
    assert all(-1.0 <= value <= 1.0 for value in result.agreement.per_origin)
    a, b = (_saved_predictions(tmp_path / "run", slot) for slot in "ab")
    assert not all(np.array_equal(x[PREDICTED], y[PREDICTED]) for x, y in zip(a, b))  # shift is approximate here
    assert any("longer than max_context 24" in message for message in notes)


def test_picture_written_and_missing_matplotlib_is_one_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("matplotlib")
    config = BacktestConfig(**TINY, synthetic=6, origins=2, top_k=1, out=tmp_path / "with")
    assert run_backtest(config, on_note=_quiet, forecaster_factory=_oracle_factory).plot == tmp_path / "with" / \
        "backtest.png"
    assert (tmp_path / "with" / "backtest.png").read_bytes()[:4] == b"\x89PNG"

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without the extra looks like
    notes: list[str] = []
    config = BacktestConfig(**TINY, synthetic=6, origins=2, top_k=1, out=tmp_path / "without")
    result = run_backtest(config, on_note=lambda level, message: notes.append(message),
                          forecaster_factory=_oracle_factory)
    assert result.plot is None and not (tmp_path / "without" / "backtest.png").exists()
    assert [m for m in notes if "matplotlib" in m] == [
        'no picture: matplotlib is not installed (pip install "kronos-tune[plot]"); the other files are written']
    assert (tmp_path / "without" / "backtest.json").exists() and (tmp_path / "without" / "origins.csv").exists()


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main(["backtest", "--device", "cpu", "--size", "tiny", *map(str, args)])
    captured = capsys.readouterr()
    return caught.value.code, captured.out, captured.err


def test_cli_json_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], one_thread):
    code, out, err = _cli(capsys, "--synthetic", 6, "--origins", 2, "--lookback", 32, "--pred-len", 4,
                          "--top-k", 2, "--out", tmp_path / "run", "--json")
    assert code == 0, err
    report = json.loads(out)
    for key in ("ic_mean", "rank_ic_mean", "ic_t", "hit_rate", "sharpe", "max_drawdown", "turnover", "origins",
                "symbols"):
        assert key in report
    assert report["origins"] == 2 and report["symbols"] == 6 and report["random_weights"] is True
    assert "random weights" in err
    # The same folder again is refused, --resume finishes at once with the same file.
    code, _, err = _cli(capsys, "--synthetic", 6, "--origins", 2, "--lookback", 32, "--pred-len", 4,
                        "--top-k", 2, "--out", tmp_path / "run")
    assert code == 2 and "--resume" in err and len(err.strip().splitlines()) == 1
    code, out, err = _cli(capsys, "--synthetic", 6, "--origins", 2, "--lookback", 32, "--pred-len", 4,
                          "--top-k", 2, "--out", tmp_path / "run", "--resume")
    assert code == 0, err
    assert "predicted 0 symbol-origins" in out and "symbols x origins" not in out


def test_compare_bf16_ends_with_one_verdict_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], one_thread):
    from kronos_core.cpu_features import NO_NATIVE_BF16, detect_cpu_features

    code, out, err = _cli(capsys, "--synthetic", 6, "--origins", 3, "--lookback", 32, "--pred-len", 4,
                          "--top-k", 2, "--compare", "bf16", "--out", tmp_path / "run")
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("bf16 autocast vs float32: RankIC diff ") and "both predicted in this run" in last
    assert "symbol-origins/s" in last and "exact" not in out
    report = json.loads((tmp_path / "run" / "backtest.json").read_text())
    assert report["compare"]["precision_verdict"] == last
    assert report["compare"]["setting"]["label"] == "bf16 autocast"
    emulated = [line for line in out.splitlines() if NO_NATIVE_BF16 in line]
    assert len(emulated) == (0 if detect_cpu_features().native_bf16 else 1)
    # read back from saved origins, nothing is timed: the speed is not compared
    code, out, err = _cli(capsys, "--synthetic", 6, "--origins", 3, "--lookback", 32, "--pred-len", 4,
                          "--top-k", 2, "--compare", "bf16", "--out", tmp_path / "run", "--resume")
    assert code == 0, err
    assert out.strip().splitlines()[-1].endswith("speed not compared: a setting was read back from saved origins, "
                                                 "not predicted in this run")


@pytest.mark.parametrize("args, message", [
    (["--synthetic", 6, "--cost-bps", -1], "--cost-bps -1.0: a transaction cost must be >= 0"),
    (["--synthetic", 6, "--top-k", 4], "--top-k 4: a long-short book needs 2 x top-k = 8 symbols"),
    (["--synthetic", 6, "--top-k", 7, "--long-only"], "--top-k 7 is larger than the universe (6 symbols)"),
    (["--synthetic", 6, "--origins", 0], "--origins 0: ask for at least 1 origin"),
    (["--synthetic", 6, "--every", "often"], "--every often: give a number of bars"),
    (["--synthetic", 6, "--compare", "warp=9"], "'warp=9' is not a setting"),
    ([], "no universe"),
])
def test_cli_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str], args, message):
    top_k = [] if "--top-k" in args else ["--top-k", 2]
    code, out, err = _cli(capsys, "--lookback", 32, "--pred-len", 4, *top_k, *args, "--out", tmp_path / "run")
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_cli_data_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    folder = tmp_path / "data"
    folder.mkdir()
    for i, rows in enumerate([60, 60, 60, 20]):
        synthetic_kline(rows, seed=i).to_csv(folder / f"sym{i}.csv", index=False)
    base = ["--data", folder, "--pred-len", 4, "--top-k", 1]
    # Origins beyond the data: 60 bars hold 60 - 32 - 4 + 1 = 25 origins at most, 7 every 4 bars.
    code, _, err = _cli(capsys, *base, "--lookback", 32, "--origins", 8, "--out", tmp_path / "r1")
    assert code == 2 and "--origins 8: the data holds only 7 origins every 4 bars" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r1").exists()
    # Every symbol too short: nothing to backtest.
    code, _, err = _cli(capsys, *base, "--lookback", 200, "--out", tmp_path / "r2")
    assert code == 2 and "no origin has 2 symbols with --lookback 200" in err
    # An empty panel: no symbols at all.
    pd.DataFrame(columns=["symbol", "timestamps", "open", "high", "low", "close"]).to_csv(tmp_path / "empty.csv",
                                                                                         index=False)
    code, _, err = _cli(capsys, "--data", tmp_path / "empty.csv", "--lookback", 32, "--pred-len", 4, "--top-k", 1,
                        "--out", tmp_path / "r3")
    assert code == 2 and "the universe is empty" in err
    # A short symbol is skipped with a note, the rest runs.
    code, out, err = _cli(capsys, *base, "--lookback", 32, "--origins", 2, "--out", tmp_path / "r4", "--json")
    assert code == 0, err
    assert "skipped 1 of 4 symbols with too little history" in err and json.loads(out)["symbols"] == 3
