"""The run folder's result files: backtest.json, origins.csv and backtest.png.

backtest.json holds only what the data, the model and the flags determine
(no timings, no dates of the run), so a resumed run writes the same file as an
uninterrupted one; the throughput of each session goes to run.json.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from kronos_core.files import write_text_atomic
from kronos_tune.backtest.calibration import conventions
from kronos_tune.backtest.config import PredictionSetting
from kronos_tune.backtest.portfolio import FEW_PERIODS, LONG_ONLY, LONG_SHORT
from kronos_tune.backtest.scoring import (SYNTHETIC_NOTE, BacktestResult, SettingScores, curve_difference,
                                         every_in_bars, with_caveat)
from kronos_tune.backtest.significance import conventions as significance_conventions
from kronos_tune.backtest.skill import CONVENTIONS as SKILL_CONVENTIONS

JSON_NAME, ORIGINS_NAME, PLOT_NAME = "backtest.json", "origins.csv", "backtest.png"


def _setting(setting: PredictionSetting) -> dict[str, Any]:
    """A setting as backtest.json shows it: its label and fields, a model only where the setting names one."""
    shown = {key: value for key, value in setting.to_dict().items()
             if value is not None or key not in ("checkpoint", "tokenizer")}
    return {"label": setting.label(), **shown}


def _finite(value: Any) -> Any:
    """NaN/inf become null so the file stays valid JSON; containers are cleaned recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


CONVENTIONS = {
    "ic": "cross-sectional Pearson correlation of predicted and realized returns, per origin (Qlib calc_ic: ic)",
    "rank_ic": "cross-sectional Spearman correlation per origin (Qlib calc_ic: ric; alphalens "
               "factor_information_coefficient)",
    "icir": "mean / std (ddof 1) of the per-origin IC over origins; rank_icir the same of RankIC",
    "ic_t": "mean / (std / sqrt(origins)) of the per-origin IC, ignoring overlapping horizons; skill.ic holds "
            "the HAC test (significance)",
    "hit_rate": "share of (symbol, origin) whose predicted return has the realized return's sign",
    "returns": "predicted close (mean of the sample paths) / last close - 1 at the end of the horizon",
    "portfolio": "after costs: cost_bps per unit of turnover subtracted at every rebalance",
    "sharpe_low/high": "95 % interval of the Sharpe ratio: the per-period ratio +- 1.96 x sqrt((1 + SR^2 / 2) / "
                       "periods) (Lo 2002, independent returns), annualized",
    "periods": f"rebalances the portfolio figures rest on; below {FEW_PERIODS} an annualized figure is an "
               f"extrapolation (caveats)",
    "agreement": "per-origin Spearman correlation of the two settings' predicted returns",
}


def _ratio(mean: float, std: float) -> float:
    return mean / std if math.isfinite(mean) and math.isfinite(std) and std > 0 else math.nan


def headline(scores: SettingScores) -> dict[str, Any]:
    """The named scores of one setting."""
    return {
        "ic_mean": scores.ic.mean, "ic_std": scores.ic.std, "ic_t": scores.ic.t,
        "icir": _ratio(scores.ic.mean, scores.ic.std),
        "rank_ic_mean": scores.rank_ic.mean, "rank_ic_std": scores.rank_ic.std, "rank_ic_t": scores.rank_ic.t,
        "rank_icir": _ratio(scores.rank_ic.mean, scores.rank_ic.std),
        "hit_rate": scores.hit_rate, "mae_return": scores.mae_return,
        "cumulative_return": scores.curve.cumulative_return, "annualized_return": scores.curve.annualized_return,
        "annualized_volatility": scores.curve.annualized_volatility, "sharpe": scores.curve.sharpe,
        "sharpe_low": scores.curve.sharpe_low, "sharpe_high": scores.curve.sharpe_high,
        "periods": scores.curve.periods,
        "max_drawdown": scores.curve.max_drawdown, "turnover": scores.curve.turnover,
        "benchmark_cumulative_return": scores.benchmark.cumulative_return,
        "benchmark_annualized_return": scores.benchmark.annualized_return,
    }


def naive_dict(result: BacktestResult) -> dict[str, Any]:
    """The naive forecasts' figures on the model's pairs: persistence's MAE, drift's scores, the band's calibration."""
    naive = result.naive
    assert naive is not None
    drift = naive.drift
    band: dict[str, Any] = ({"not_available": naive.band_reason} if naive.band is None else
                            {"returns_per_symbol": naive.band.samples, **naive.band.overall})
    return {
        "persistence": {"mae_return": naive.drift_skill.persistence_mae},
        "drift": {"ic_mean": drift.ic.mean, "rank_ic_mean": drift.rank_ic.mean, "hit_rate": drift.hit_rate,
                  "mae_return": drift.mae_return, "cumulative_return": drift.curve.cumulative_return,
                  "sharpe": drift.curve.sharpe, "skill": naive.drift_skill.to_dict()},
        "random_walk_band": band,
    }


def skill_dict(scores: SettingScores, title: str, caveat: str | None = None) -> dict[str, Any] | None:
    if scores.skill is None:
        return None
    return {**scores.skill.to_dict(), "verdict": with_caveat(scores.skill.verdict(title), caveat)}


def caveats(result: BacktestResult) -> list[str]:
    """What the figures are not, one line each: random weights, annualizing few periods, planted structure."""
    out = []
    randoms = [title for scores, title in zip(result.scores, result.config.titles([s.setting for s in result.scores]))
               if result.random_weights(scores.setting)]
    if randoms:
        out.append(f"{', '.join(randoms)}: random weights: not a finding: their IC, tests and portfolio measure "
                   f"nothing about forecasting skill")
    periods = result.scores[0].curve.periods if result.scores else 0
    if 0 < periods < FEW_PERIODS:
        out.append(f"annualized figures rest on {periods} rebalances (fewer than {FEW_PERIODS}): an extrapolation, "
                   f"not a yearly rate; the Sharpe ratio's 95 % interval says how little it pins down")
    if result.synthetic:
        out.append(SYNTHETIC_NOTE)
    return out


def calibration_dict(scores: SettingScores, result: BacktestResult) -> dict[str, Any] | None:
    """The band's calibration of one setting: overall, per origin, and how each figure is defined."""
    band = scores.calibration
    if band is None:
        return None
    per_origin = [{"origin": o.index, "timestamp": str(o.timestamp), **values}
                  for o, values in zip(result.schedule.origins, band.per_origin)]
    return {"samples": band.samples, **band.overall, "per_origin": per_origin, "conventions": conventions()}


def row(scores: SettingScores, result: BacktestResult, title: str) -> dict[str, Any]:
    """One setting's line of the side-by-side table."""
    band = scores.calibration
    skill = skill_dict(scores, title, result.caveat(scores.setting))
    return {"title": title, "label": scores.setting.label(), "model": result.config.model_name(scores.setting),
            **headline(scores), **({} if band is None else {"calibration": band.overall}),
            **({} if skill is None else {"skill": skill})}


def to_json_dict(result: BacktestResult) -> dict[str, Any]:
    config, schedule, main = result.config, result.schedule, result.scores[0]
    titles = config.titles([s.setting for s in result.scores])
    report: dict[str, Any] = {
        **headline(main),
        "origins": len(schedule.origins),
        "symbols": len(schedule.used_symbols),
        "symbols_skipped": len(schedule.skipped_symbols),
        "predictions": schedule.predictions,
        "first_origin": str(schedule.origins[0].timestamp),
        "last_origin": str(schedule.origins[-1].timestamp),
        "setting": _setting(main.setting),
        "portfolio": {
            "mode": LONG_ONLY if config.long_only else LONG_SHORT, "top_k": config.top_k,
            "cost_bps": config.cost_bps, "periods_per_year": config.periods_per_year or schedule.periods_per_year,
            "holding": f"{config.pred_len} bars from each origin",
        },
        "universe": result.universe_source,
        "synthetic": result.synthetic,
        "model": str(config.checkpoint) if config.checkpoint is not None else config.size,
        "random_weights": config.checkpoint is None,
        "lookback": config.lookback,
        "pred_len": config.pred_len,
        "every": config.every_bars,
        "seed": config.seed,
        "rows": [row(scores, result, title) for scores, title in zip(result.scores, titles)],
        "training_span": result.overlap.to_dict(),
        "conventions": conventions_dict(result),
        "caveats": caveats(result),
    }
    if result.naive is not None:
        report["naive"] = naive_dict(result)
        report["skill"] = skill_dict(main, titles[0], result.caveat(main.setting))
    if result.overlap.origins_in_span:
        report["in_sample_origins"] = result.overlap.origins_in_span
    calibration = calibration_dict(main, result)
    if calibration is not None:
        report["calibration"] = calibration
    if result.agreement is not None:
        other = result.scores[1]
        report["compare"] = {
            "setting": _setting(other.setting),
            **headline(other),
            "agreement": result.agreement.to_dict(),
            "ic_mean_diff": other.ic.mean - main.ic.mean,
            "rank_ic_mean_diff": other.rank_ic.mean - main.rank_ic.mean,
            **curve_difference(main, other),
        }
        if result.comparison is not None:
            verdict = with_caveat(result.comparison.verdict(), result.comparison_caveat())
            report["compare"]["test"] = {**result.comparison.to_dict(), "verdict": verdict}
            report["compare"]["verdict"] = verdict
            precision = result.precision_verdict()
            if precision is not None:
                report["compare"]["precision_verdict"] = precision
        calibration = calibration_dict(other, result)
        if calibration is not None:
            report["compare"]["calibration"] = calibration
    return _finite(report)


def conventions_dict(result: BacktestResult) -> dict[str, Any]:
    if result.naive is None:
        return CONVENTIONS
    every = every_in_bars(result.config, result.schedule)
    return {**CONVENTIONS, **SKILL_CONVENTIONS,
            "significance": significance_conventions(result.naive.lag, result.config.pred_len, every)}


def origins_table(result: BacktestResult) -> pd.DataFrame:
    """One row per origin: cross-section size, IC, RankIC, hit rate, MAE, the portfolio period, the curve."""
    rows = []
    for origin in result.schedule.origins:
        rows.append({"origin": origin.index, "timestamp": origin.timestamp, "symbols": len(origin.members)})
    table = pd.DataFrame(rows)
    for scores, prefix in zip(result.scores, ("", "compare_")):
        part = pd.DataFrame({
            "ic": [q.ic for q in scores.quality], "rank_ic": [q.rank_ic for q in scores.quality],
            "hit_rate": [q.hit_rate for q in scores.quality], "mae_return": [q.mae_return for q in scores.quality],
            "gross_return": [p.gross_return for p in scores.periods], "turnover": [p.turnover for p in scores.periods],
            "cost": [p.cost for p in scores.periods], "net_return": [p.net_return for p in scores.periods],
            "long_return": [p.long_return for p in scores.periods],
            "short_return": [p.short_return for p in scores.periods],
            "benchmark_return": [p.benchmark_return for p in scores.periods],
            "cumulative_return": scores.net_equity.to_numpy() - 1.0,
        })
        if scores.calibration is not None:
            band = pd.DataFrame(scores.calibration.per_origin).drop(columns="rows")
            part = pd.concat([part, band], axis=1)
        table = pd.concat([table, part.add_prefix(prefix)], axis=1)
    if result.naive is not None:
        table = pd.concat([table, naive_columns(result)], axis=1)
    if result.agreement is not None:
        table["agreement_spearman"] = result.agreement.per_origin
    if result.overlap.cut is not None:
        table["in_sample"] = [o.timestamp < result.overlap.cut for o in result.schedule.origins]
    return table


def naive_columns(result: BacktestResult) -> pd.DataFrame:
    """Per origin: persistence's MAE, drift's scores and portfolio period, the random-walk band's calibration."""
    naive = result.naive
    assert naive is not None
    drift = naive.drift
    part = pd.DataFrame({
        "persistence_mae_return": naive.persistence_mae,
        "drift_ic": [q.ic for q in drift.quality], "drift_rank_ic": [q.rank_ic for q in drift.quality],
        "drift_hit_rate": [q.hit_rate for q in drift.quality],
        "drift_mae_return": [q.mae_return for q in drift.quality],
        "drift_net_return": [p.net_return for p in drift.periods],
    })
    if naive.band is not None:
        band = pd.DataFrame(naive.band.per_origin).drop(columns="rows").add_prefix("random_walk_")
        part = pd.concat([part, band], axis=1)
    return part


def write_outputs(result: BacktestResult, run_path: Path, note: Callable[[str, str], None]) -> Path | None:
    """Write backtest.json and origins.csv, and the picture when matplotlib is installed (its path, else None)."""
    write_text_atomic(run_path / JSON_NAME, json.dumps(to_json_dict(result), indent=2) + "\n")
    write_text_atomic(run_path / ORIGINS_NAME, origins_table(result).to_csv(index=False))
    from kronos_tune.backtest.plot import plot_backtest

    return plot_backtest(result, run_path / PLOT_NAME, note)
