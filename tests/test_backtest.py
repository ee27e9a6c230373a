"""Backtest scoring without a model: IC/RankIC against pandas, the portfolio and its costs, ranking agreement,
origin schedules, universes from files, and the synthetic universe generator."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import FEATURE_COLUMNS, TIME_COLUMN, validate_kline
from kronos_core.data.synthetic import synthetic_kline
from kronos_core.data.tables import symbol_column
from kronos_tune.backtest.agreement import ranking_agreement, returns_from_frames
from kronos_tune.backtest.config import PredictionSetting, parse_setting
from kronos_tune.backtest.metrics import PREDICTED, REALIZED, origin_quality, summarize
from kronos_tune.backtest.origins import EVERY_DAY, load_universe, schedule_origins
from kronos_tune.backtest.portfolio import FEW_PERIODS, curve_stats, run_portfolio, target_weights
from kronos_core.data.series import KlineSeries
from kronos_tune.errors import KronosTuneError
from synthetic_panel import SECTOR_COLUMN, SYMBOL_COLUMN, synthetic_universe, universe_of


def _cross_section(seed: int, n: int = 9) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    realized = rng.normal(0, 0.02, n)
    predicted = 0.5 * realized + rng.normal(0, 0.02, n)
    predicted[2] = predicted[5]  # a tie, so the Spearman path has to average ranks
    return pd.DataFrame({"symbol": [f"s{i}" for i in range(n)], PREDICTED: predicted, REALIZED: realized})


def test_ic_and_rank_ic_equal_pandas_corr():
    frame = _cross_section(0)
    quality = origin_quality(frame)
    assert quality.ic == pytest.approx(frame[PREDICTED].corr(frame[REALIZED], method="pearson"), abs=1e-12)
    # Spearman = Pearson of the average ranks (pandas' rank), computed independently of the module's path.
    ranks = frame[[PREDICTED, REALIZED]].rank()
    assert quality.rank_ic == pytest.approx(ranks[PREDICTED].corr(ranks[REALIZED]), abs=1e-12)
    assert quality.ic != pytest.approx(quality.rank_ic)
    hits = np.mean(np.sign(frame[PREDICTED]) == np.sign(frame[REALIZED]))
    assert quality.hit_rate == pytest.approx(hits)
    assert quality.mae_return == pytest.approx(np.mean(np.abs(frame[PREDICTED] - frame[REALIZED])))


def test_summary_t_statistic():
    values = [0.1, 0.05, -0.02, 0.08, math.nan]
    summary = summarize(values)
    series = pd.Series(values).dropna()
    assert summary.n == 4
    assert summary.mean == pytest.approx(series.mean())
    assert summary.std == pytest.approx(series.std())
    assert summary.t == pytest.approx(series.mean() / series.std() * 2.0)


def test_long_short_weights_and_turnover_costs():
    first, second = _cross_section(1, 6), _cross_section(2, 6)
    weights = target_weights(first, top_k=2, long_only=False)
    order = first.sort_values(PREDICTED, ascending=False)["symbol"].tolist()
    assert weights[order[:2]].tolist() == [0.5, 0.5]
    assert weights[order[-2:]].tolist() == [-0.5, -0.5]
    assert weights[order[2:4]].abs().sum() == 0

    free = run_portfolio([first, second], top_k=2, long_only=False, cost_bps=0.0)
    costly = run_portfolio([first, second], top_k=2, long_only=False, cost_bps=25.0)
    assert free[0].turnover == pytest.approx(2.0)  # building the book from cash
    for a, b in zip(free, costly):
        assert b.turnover == a.turnover
        assert a.net_return - b.net_return == pytest.approx(a.turnover * 25.0 / 10_000)
    second_weights = target_weights(second, 2, False)
    symbols = weights.index.union(second_weights.index)
    expected = (second_weights.reindex(symbols, fill_value=0) - weights.reindex(symbols, fill_value=0)).abs().sum()
    assert free[1].turnover == pytest.approx(expected)


def test_long_only_against_equal_weight_universe():
    frame = _cross_section(3, 8)
    period = run_portfolio([frame], top_k=3, long_only=True, cost_bps=0.0)[0]
    top = frame.sort_values(PREDICTED, ascending=False)[REALIZED].iloc[:3]
    assert period.gross_return == pytest.approx(top.mean())
    assert period.benchmark_return == pytest.approx(frame[REALIZED].mean())
    assert period.turnover == pytest.approx(1.0)
    assert math.isnan(period.short_return)


def test_curve_stats():
    returns = [0.1, -0.2, 0.05, 0.1]
    stats = curve_stats(returns, [2.0, 1.0, 1.0, 0.0], periods_per_year=4)
    equity = np.cumprod(1 + np.array(returns))
    assert stats.cumulative_return == pytest.approx(equity[-1] - 1)
    assert stats.annualized_return == pytest.approx(equity[-1] - 1)  # four periods = one year
    assert stats.annualized_volatility == pytest.approx(np.std(returns, ddof=1) * 2)
    assert stats.sharpe == pytest.approx(np.mean(returns) / np.std(returns, ddof=1) * 2)
    assert stats.max_drawdown == pytest.approx(1 - equity[1] / equity[0])
    assert stats.turnover == pytest.approx(1.0)
    losing = curve_stats([-0.1, -0.1], [2.0, 0.0], periods_per_year=2)
    assert losing.max_drawdown == pytest.approx(1 - 0.81)  # counted from the starting capital
    # the Sharpe ratio's interval (Lo 2002): per period SR +- 1.96 sqrt((1 + SR^2 / 2) / n), annualized by 2
    per_period = np.mean(returns) / np.std(returns, ddof=1)
    half = 1.959964 * math.sqrt((1 + per_period**2 / 2) / 4)
    assert (stats.sharpe_low, stats.sharpe_high) == pytest.approx(((per_period - half) * 2, (per_period + half) * 2))
    assert stats.periods == 4 < FEW_PERIODS
    assert curve_stats([0.01, -0.01] * 15, [1.0] * 30, periods_per_year=252).periods == 30 == FEW_PERIODS


def test_ranking_agreement():
    a = np.array([0.03, -0.01, 0.02, 0.0, -0.04])
    assert ranking_agreement(a, a).spearman.mean == pytest.approx(1.0)
    assert ranking_agreement(a, -a).spearman.mean == pytest.approx(-1.0)
    assert ranking_agreement(a, 2 * a + 0.5).per_origin == [pytest.approx(1.0)]
    frame_a = pd.DataFrame([a, a[::-1]], columns=list("vwxyz"))
    frame_b = frame_a.copy()
    frame_b.iloc[1] = frame_b.iloc[1].to_numpy()[[1, 0, 2, 3, 4]]
    realized = frame_a * 0.5 + 0.001
    agreement = ranking_agreement(frame_a, frame_b, realized)
    assert agreement.per_origin[0] == pytest.approx(1.0)
    assert agreement.per_origin[1] == pytest.approx(frame_a.iloc[1].rank().corr(frame_b.iloc[1].rank()))
    assert agreement.spearman.n == 2 and agreement.spearman_min < agreement.spearman_max == pytest.approx(1.0)
    assert agreement.ic_diff is not None and agreement.ic_diff.n == 2
    assert agreement.to_dict()["spearman_mean"] == pytest.approx(agreement.spearman.mean)

    histories = [pd.DataFrame({"close": [10.0, 11.0]}), pd.DataFrame({"close": [5.0, 4.0]})]
    predicted = [pd.DataFrame({"close": [12.0, 12.1]}), pd.DataFrame({"close": [4.4, 4.2]})]
    assert returns_from_frames(predicted, histories) == pytest.approx([12.1 / 11 - 1, 4.2 / 4 - 1])


def test_parse_setting():
    base = PredictionSetting()
    assert parse_setting("shift", base).window_mode == "shift"
    both = parse_setting("bf16, sample-count=10,max-context=128", base)
    assert (both.amp, both.sample_count, both.max_context) == ("bf16", 10, 128)
    assert both.label() == "bf16 autocast sample_count=10 max_context=128"
    with pytest.raises(KronosTuneError, match="not a setting"):
        parse_setting("warp=9", base)
    with pytest.raises(KronosTuneError, match="not a int"):
        parse_setting("sample-count=many", base)


def test_synthetic_universe_factors_and_validity():
    panel = synthetic_universe(40, n_rows=600, seed=3, n_sectors=4)
    assert panel.equals(synthetic_universe(40, n_rows=600, seed=3, n_sectors=4))
    assert not panel.equals(synthetic_universe(40, n_rows=600, seed=4, n_sectors=4))
    assert list(panel.columns) == [SYMBOL_COLUMN, SECTOR_COLUMN, TIME_COLUMN, *FEATURE_COLUMNS]
    assert panel[SYMBOL_COLUMN].nunique() == 40 and panel[SECTOR_COLUMN].nunique() == 4
    for _, group in panel.groupby(SYMBOL_COLUMN):
        assert validate_kline(group.drop(columns=[SYMBOL_COLUMN, SECTOR_COLUMN]).reset_index(drop=True)) == []
    returns = np.log(panel.pivot(index=TIME_COLUMN, columns=SYMBOL_COLUMN, values="close")).diff().dropna()
    corr = returns.corr().to_numpy()
    sectors = panel.groupby(SYMBOL_COLUMN)[SECTOR_COLUMN].first().to_numpy()
    same = sectors[:, None] == sectors[None, :]
    off_diagonal = ~np.eye(40, dtype=bool)
    across, within = corr[off_diagonal & ~same].mean(), corr[off_diagonal & same].mean()
    assert across > 0.1  # the market factor
    assert within > across + 0.1  # the sector factors
    # Without any factor the symbols are independent.
    flat = synthetic_universe(20, n_rows=600, seed=3, market_volatility=0, sector_volatility=0, trend_strength=0)
    flat_returns = np.log(flat.pivot(index=TIME_COLUMN, columns=SYMBOL_COLUMN, values="close")).diff().dropna()
    assert abs(flat_returns.corr().to_numpy()[~np.eye(20, dtype=bool)].mean()) < 0.03


def _notes() -> tuple[list[tuple[str, str]], object]:
    notes: list[tuple[str, str]] = []
    return notes, lambda level, message: notes.append((level, message))


def test_folder_and_panel_files_give_the_same_universe(tmp_path: Path):
    folder = tmp_path / "folder"
    folder.mkdir()
    frames = {name: synthetic_kline(80 + 10 * i, seed=i) for i, name in enumerate(["aaa", "bbb", "ccc"])}
    for name, frame in frames.items():
        frame.to_csv(folder / f"{name}.csv", index=False)
    panel = pd.concat([frame.assign(Ticker=name) for name, frame in frames.items()])
    panel.to_csv(tmp_path / "panel.csv", index=False)
    panel.to_parquet(tmp_path / "panel.parquet", index=False)
    # row groups of 50 rows: the sorted Parquet panel streams in batches that cut symbols (80-100 rows)
    panel.to_parquet(tmp_path / "panel.parquet", index=False, row_group_size=50)
    panel.iloc[::-1].to_parquet(tmp_path / "unsorted.parquet", index=False)
    notes, note = _notes()
    from_folder = load_universe((folder,), None, 0, 0, note)
    assert notes == []
    for path in (tmp_path / "panel.csv", tmp_path / "panel.parquet", tmp_path / "unsorted.parquet"):
        from_panel = load_universe((path,), None, 0, 0, note)
        assert [s.name for s in from_panel.symbols] == [s.name for s in from_folder.symbols] == list(frames)
        for a, b in zip(from_panel.symbols, from_folder.symbols):
            np.testing.assert_array_equal(a.stamps, b.stamps)
            np.testing.assert_allclose(a.features, b.features, rtol=1e-12)
    read_whole = [m for level, m in notes if "the panel is read whole" in m]
    assert len(read_whole) == 2 and "CSV" in read_whole[0] and "not sorted by Ticker" in read_whole[1]
    assert all("read whole" in m or "newest first" in m for _, m in notes)  # the reversed file: read backwards


def test_one_symbol_column_rule():
    assert symbol_column(["Date", " Ticker ", "Code", "close"]) == " Ticker "  # the file's order, as spelled
    assert symbol_column(["timestamps", "open", "close"]) is None


def test_schedule_origins_every_bars_and_days():
    universe = load_universe((), 5, 48 * 6, 0, lambda level, message: None)
    # A short symbol with no room for any origin is skipped, and said so.
    first = universe.symbols[0]
    universe.symbols.append(KlineSeries("SHORT", first.stamps[:30], first.features[:30]))
    schedule = schedule_origins(universe, lookback=60, pred_len=6, every=12, count=5)
    assert [o.index for o in schedule.origins] == list(range(5))
    positions = [int(np.searchsorted(universe.symbols[0].stamps, o.timestamp.to_datetime64()))
                 for o in schedule.origins]
    assert np.diff(positions).tolist() == [12] * 4
    assert positions[-1] == 48 * 6 - 1 - 6  # the latest possible origin
    assert all(len(o.members) == 5 for o in schedule.origins)
    assert schedule.skipped_symbols == ["SHORT"]
    assert schedule.bars_per_day == 48 and schedule.periods_per_year == pytest.approx(252 * 48 / 12)

    daily = schedule_origins(universe, lookback=60, pred_len=6, every=EVERY_DAY, count=None)
    assert [o.timestamp.date() for o in daily.origins] == sorted({o.timestamp.date() for o in daily.origins})
    assert daily.origins[0].timestamp.strftime("%H:%M") == "15:00" and daily.periods_per_year == 252

    with pytest.raises(KronosTuneError, match="--origins 500: the data holds only"):
        schedule_origins(universe, lookback=60, pred_len=6, every=12, count=500)
    with pytest.raises(KronosTuneError, match="no origin has 2 symbols"):
        schedule_origins(universe, lookback=400, pred_len=6, every=12, count=None)
