"""The backtest picture: cumulative curves on top, the IC / RankIC series below (matplotlib, the `plot` extra)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kronos_tune.backtest.portfolio import equity_curve
from kronos_tune.backtest.scoring import BacktestResult, SettingScores
from kronos_tune.figures import new_figure, save_figure

MISSING_NOTE = "no picture: matplotlib is not installed (pip install 'kronos-tune[plot]'); the other files are written"


def plot_backtest(result: BacktestResult, path: Path, note: Callable[[str, str], None]) -> Path | None:
    """Write the picture to `path` and return it; without matplotlib say so in one note and return None."""
    figure = new_figure(figsize=(10, 7))
    if figure is None:
        note("note", MISSING_NOTE)
        return None
    # Origins evenly spaced (nights and weekends would otherwise squeeze the intraday ones together).
    times = list(range(len(result.plan.origins)))
    curves, ics = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    main = result.scores[0]
    mode = "long-only" if result.config.long_only else "long-short"
    for scores in result.scores:
        label = f"{mode} top {result.config.top_k}, {result.config.cost_bps:g} bps ({scores.setting.label()})"
        curves.plot(times, scores.net_equity.to_numpy() - 1.0, marker=".", label=label)
    curves.plot(times, _benchmark(main), color="grey", linestyle="--",
                label="equal-weight universe")
    curves.axhline(0.0, color="black", linewidth=0.6)
    curves.set_ylabel("cumulative return")
    curves.legend(loc="best", fontsize=8)
    title = f"backtest: {len(result.plan.used_symbols)} symbols x {len(result.plan.origins)} origins"
    if result.config.checkpoint is None:
        title += " (random weights)"
    curves.set_title(title)
    for scores, style in zip(result.scores, ("-", ":")):
        suffix = f" ({scores.setting.label()})" if len(result.scores) > 1 else ""
        ics.plot(times, [q.ic for q in scores.quality], style, marker="o", markersize=3, label="IC" + suffix)
        ics.plot(times, [q.rank_ic for q in scores.quality], style, marker="s", markersize=3,
                 label="RankIC" + suffix)
    ics.axhline(0.0, color="black", linewidth=0.6)
    ics.set_ylabel("correlation")
    ics.set_xlabel("origin")
    ics.legend(loc="best", fontsize=8)
    ticks = times[::max(1, len(times) // 8)]
    ics.set_xticks(ticks, [result.plan.origins[i].timestamp.strftime("%Y-%m-%d %H:%M") for i in ticks])
    figure.autofmt_xdate()
    figure.tight_layout()
    return save_figure(figure, path)


def _benchmark(scores: SettingScores) -> list[float]:
    return list(equity_curve([p.benchmark_return for p in scores.periods]).to_numpy() - 1.0)
