"""The backtest picture: cumulative curves on top (from 0 at the first origin; the point at origin i holds the
periods before it, the last point the end of the last holding period), the IC / RankIC series, the MAE of
returns per origin against persistence and drift, and with sample paths the band's coverage per origin against
its nominal level and the random-walk band's (matplotlib, the `plot` extra). In-sample origins are shaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kronos_core.optional import missing
from kronos_tune.backtest.calibration import INTERVALS, interval_name
from kronos_tune.backtest.portfolio import equity_curve
from kronos_tune.backtest.scoring import BacktestResult, SettingScores
from kronos_tune.figures import new_figure, save_figure


def plot_backtest(result: BacktestResult, path: Path, note: Callable[[str, str], None]) -> Path | None:
    """Write the picture to `path` and return it; without matplotlib say so in one note and return None."""
    banded = [s for s in result.scores if s.calibration is not None]
    heights = (3, 2, 2, 2) if banded else (3, 2, 2)
    figure = new_figure(figsize=(10, 2.4 * len(heights) + 2))
    if figure is None:
        note("note", f"no picture: {missing('plot')}; the other files are written")
        return None
    # Origins evenly spaced (nights and weekends would otherwise squeeze the intraday ones together).
    times = list(range(len(result.schedule.origins)))
    steps = times + [len(times)]  # the curves' points: each origin, then the end of the last holding period
    panels = figure.subplots(len(heights), 1, sharex=True, height_ratios=heights)
    curves, ics, errors = panels[0], panels[1], panels[2]
    main = result.scores[0]
    mode = "long-only" if result.config.long_only else "long-short"
    titles = dict(zip((s.slot for s in result.scores), result.config.titles([s.setting for s in result.scores])))
    for scores in result.scores:
        label = f"{mode} top {result.config.top_k}, {result.config.cost_bps:g} bps ({titles[scores.slot]})"
        curves.plot(steps, _from_zero(scores.net_equity), marker=".", label=label)
    if result.naive is not None:
        curves.plot(steps, _from_zero(result.naive.drift.net_equity), color="C4", linestyle=":",
                    label=f"{mode} top {result.config.top_k} by drift (naive)")
    curves.plot(steps, _from_zero(equity_curve([p.benchmark_return for p in main.periods])), color="grey",
                linestyle="--", label="equal-weight universe")
    curves.axhline(0.0, color="black", linewidth=0.6)
    curves.set_ylabel("cumulative return")
    curves.legend(loc="best", fontsize=8)
    title = picture_title(result)
    if result.overlap.origins_in_span:
        title += f"; {result.overlap.origins_in_span} origins IN-SAMPLE (--allow-overlap)"
        cut = sum(o.timestamp < result.overlap.cut for o in result.schedule.origins) - 0.5
        for axis in panels:
            axis.axvspan(-0.5, cut, color="red", alpha=0.08, label=None)
    curves.set_title(title)
    for scores, style in zip(result.scores, ("-", ":")):
        suffix = f" ({titles[scores.slot]})" if len(result.scores) > 1 else ""
        ics.plot(times, [q.ic for q in scores.quality], style, marker="o", markersize=3, label="IC" + suffix)
        ics.plot(times, [q.rank_ic for q in scores.quality], style, marker="s", markersize=3,
                 label="RankIC" + suffix)
    if result.naive is not None:
        ics.plot(times, [q.ic for q in result.naive.drift.quality], color="C4", linestyle=":", marker="^",
                 markersize=3, label="IC (drift, naive)")
    ics.axhline(0.0, color="black", linewidth=0.6)
    ics.set_ylabel("correlation")
    ics.legend(loc="best", fontsize=8)
    _plot_errors(errors, times, result, titles)
    if banded:
        _plot_coverage(panels[3], times, banded, titles, len(result.scores) > 1, result)
    panels[-1].set_xlabel("origin")
    ticks = times[::max(1, len(times) // 8)]
    panels[-1].set_xticks(ticks + [len(times)], _stamp_labels(result, ticks))
    figure.autofmt_xdate()
    figure.tight_layout()
    return save_figure(figure, path)


def picture_title(result: BacktestResult) -> str:
    """Universe, origins and the models compared ('random mini vs mini-2026/best')."""
    models = dict.fromkeys(result.config.model_name(s.setting) for s in result.scores)
    return f"backtest: {result.counted()}; " + " vs ".join(models)


def _from_zero(equity) -> list[float]:
    """Cumulative return at each origin (0 at the first) and after the last period."""
    return [0.0, *(equity.to_numpy() - 1.0)]


def _stamp_labels(result: BacktestResult, ticks: list[int]) -> list[str]:
    """The origins' times at `ticks`, then the end of the last horizon: dates only, unless some has a time of day."""
    stamps = [o.timestamp for o in result.schedule.origins]
    daily = all(t == t.normalize() for t in stamps)
    shown = "%Y-%m-%d" if daily else "%Y-%m-%d %H:%M"
    end = "end" if result.horizon_end is None else f"{result.horizon_end.strftime(shown)} (end)"
    return [*(stamps[i].strftime(shown) for i in ticks), end]


def _plot_errors(axis, times: list[int], result: BacktestResult, titles: dict[str, str]) -> None:
    """MAE of returns per origin: each setting against persistence (no change) and drift."""
    for scores, style in zip(result.scores, ("-", ":")):
        axis.plot(times, [q.mae_return for q in scores.quality], style, marker="o", markersize=3,
                  label=f"MAE ({titles[scores.slot]})")
    if result.naive is not None:
        axis.plot(times, result.naive.persistence_mae, color="black", linestyle="--", label="persistence (no change)")
        axis.plot(times, [q.mae_return for q in result.naive.drift.quality], color="C4", linestyle=":",
                  label="drift (naive)")
    axis.set_ylabel("MAE of returns")
    axis.legend(loc="best", fontsize=8)


def _plot_coverage(axis, times: list[int], banded: list[SettingScores], titles: dict[str, str],
                   several: bool, result: BacktestResult) -> None:
    """Per-origin coverage of each central interval against its nominal level, and the CRPS on a second axis."""
    crps_axis = axis.twinx()
    for scores, style in zip(banded, ("-", ":")):
        suffix = f" ({titles[scores.slot]})" if several else ""
        per_origin = scores.calibration.per_origin  # type: ignore[union-attr]
        for (low, high), marker in zip(INTERVALS, ("o", "s")):
            name = interval_name(low, high)
            axis.plot(times, [v[name] for v in per_origin], style, marker=marker, markersize=3,
                      label=f"P{low * 100:.0f}-P{high * 100:.0f} coverage{suffix}")
        crps_axis.plot(times, [v["crps"] for v in per_origin], style, color="grey", marker="x", markersize=3,
                       label=f"CRPS / last close{suffix}")
    if result.naive is not None and result.naive.band is not None:
        axis.plot(times, [v[interval_name(*INTERVALS[0])] for v in result.naive.band.per_origin], color="grey",
                  linestyle="-.", label="P10-P90 coverage (random-walk band)")
    for (low, high), color in zip(INTERVALS, ("C0", "C1")):
        axis.axhline(high - low, color=color, linestyle="--", linewidth=0.8)
    axis.set_ylim(-0.05, 1.05)
    axis.set_ylabel("coverage (dashed: nominal)")
    crps_axis.set_ylabel("CRPS / last close")
    lines, labels = axis.get_legend_handles_labels()
    more, more_labels = crps_axis.get_legend_handles_labels()
    axis.legend(lines + more, labels + more_labels, loc="best", fontsize=8)
