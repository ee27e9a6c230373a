"""Is the backtest's skill test itself right? Three checks, none timed.

    python -m benchmarks.skill panel    # (a) the S&P 500 panel through the real backtest, every figure checked
    python -m benchmarks.skill size     # (b) the test of the test: rejection rates of a pure-noise forecaster
    python -m benchmarks.skill compare --checkpoint runs/train/<run>   # (c) finetuned vs pretrained verdict
    python -m benchmarks.skill          # (a) then (b)

(a) runs `kronos-tune backtest` (Kronos-mini, random weights; the last 40 trading days every 2 days, pred-len 5,
so neighbouring horizons overlap) and checks: every figure of the skill report is there (or not available with a
reason), persistence's MAE equals the mean |realized return| over the same (symbol, origin) pairs of the saved
predictions, the IC's HAC t equals statsmodels' on the per-origin IC series of origins.csv, and the verdict
against persistence is stated.

(b) feeds forecasts through the backtest's own scoring (metrics.origin_quality, skill.setting_skill): a panel of
one-bar log returns, the realized return of an origin the sum over its next pred_len bars, and a forecaster of
pure noise built the same way from its own one-bar noise, so forecasts at neighbouring origins share terms as the
realized returns do. Over many seeds the IC test's rejection rate at 5 % should be 3-8 %; beside it the same t
with the normal distribution (statsmodels' default), with Student t at n - 1 degrees of freedom, and the plain
t that ignores overlap. A forecaster = realized return + noise with a true IC of 0.1 measures the power.

(c) backtests a finetuned checkpoint against the random-init weights it started from (`--compare
checkpoint=DIR`, the origins after the finetune's --train-until) and prints the verdict line.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_tune.backtest.metrics import PREDICTED, REALIZED, origin_quality, summarize
from kronos_tune.backtest.significance import LEVEL, hac_lag
from kronos_tune.backtest.skill import correlation_test

SP500 = Path("/work/shared/data/sp500_daily.csv")
BAR_SIGMA = 0.01  # one-bar log return (and noise) standard deviation


# (b) the test of the test -------------------------------------------------------------------------------------


def overlapping_origins(seed: int, symbols: int, origins: int, every: int, pred_len: int,
                        true_ic: float = 0.0) -> list[pd.DataFrame]:
    """One frame per origin (symbol, predicted and realized return): realized = the next pred_len one-bar log
    returns summed; predicted = the same sum over an independent noise series (true_ic 0) or, for a true IC,
    realized + that noise scaled so that corr(predicted, realized) = true_ic. Both as simple returns."""
    rng = np.random.default_rng(seed)
    bars = (origins - 1) * every + pred_len + 1
    walk = np.cumsum(rng.normal(0.0, BAR_SIGMA, (symbols, bars)), axis=1)
    noise = np.cumsum(rng.normal(0.0, BAR_SIGMA, (symbols, bars)), axis=1)
    names = [f"S{k:03d}" for k in range(symbols)]
    frames = []
    for index in range(origins):
        start = index * every
        realized = walk[:, start + pred_len] - walk[:, start]
        forecast = noise[:, start + pred_len] - noise[:, start]
        if true_ic:
            forecast = realized + forecast * math.sqrt(1.0 / true_ic ** 2 - 1.0)
        frames.append(pd.DataFrame({"origin": index, "symbol": names, PREDICTED: np.expm1(forecast),
                                    REALIZED: np.expm1(realized)}))
    return frames


@dataclass
class TestOutcome:
    """One seed's IC test, each way of reading the same statistic."""

    corrected_p: float | None  # the backtest's p (HAC t, small-sample corrected)
    hac_t: float | None        # statsmodels' HAC t
    plain_t: float             # mean / (std / sqrt(n)), the backtest's ic_t
    n: int
    lag: int


def ic_outcome(frames: list[pd.DataFrame], lag: int) -> TestOutcome:
    """The backtest's own scoring of `frames`: per-origin quality, then the skill's IC test."""
    quality = [origin_quality(frame) for frame in frames]
    test = correlation_test(quality, lag, "ic")
    return TestOutcome(test.p, test.t, summarize([q.ic for q in quality]).t, test.n, lag)


def rejection_rates(outcomes: list[TestOutcome]) -> dict[str, float]:
    """Share of seeds whose IC test rejects at 5 %, each way."""
    from scipy import stats

    def share(flags: list[bool]) -> float:
        return float(np.mean(flags)) if flags else math.nan

    n = outcomes[0].n
    return {
        "corrected": share([o.corrected_p is not None and o.corrected_p < LEVEL for o in outcomes]),
        "hac_normal": share([o.hac_t is not None and 2 * stats.norm.sf(abs(o.hac_t)) < LEVEL for o in outcomes]),
        "hac_t_n-1": share([o.hac_t is not None and 2 * stats.t.sf(abs(o.hac_t), n - 1) < LEVEL for o in outcomes]),
        "plain_t_n-1": share([2 * stats.t.sf(abs(o.plain_t), n - 1) < LEVEL for o in outcomes]),
    }


def size_row(seeds: int, symbols: int, origins: int, pred_len: int, every: int,
             true_ic: float | None) -> dict[str, object]:
    """Rejection rates under the null for one layout and, given `true_ic`, the corrected test's power."""
    lag = hac_lag(pred_len, every)
    null = [ic_outcome(overlapping_origins(seed, symbols, origins, every, pred_len), lag) for seed in range(seeds)]
    power = math.nan
    if true_ic is not None:
        power = rejection_rates([ic_outcome(overlapping_origins(10_000 + seed, symbols, origins, every, pred_len,
                                                                true_ic), lag)
                                 for seed in range(seeds)])["corrected"]
    return {"pred_len": pred_len, "every": every, "lag": lag, **rejection_rates(null), "power": power}


def print_size_table(rows: list[dict[str, object]], seeds: int, symbols: int, origins: int, true_ic: float) -> None:
    print(f"(b) IC test on a pure-noise forecaster with overlapping horizons: {seeds} seeds, {symbols} symbols, "
          f"{origins} origins; share of seeds rejecting at 5 % (target 3-8 % for the backtest's test)")
    header = list(rows[0])
    print("  ".join(f"{h:>13}" for h in header))
    for row in rows:
        print("  ".join(f"{v:>13.3f}" if isinstance(v, float) else f"{v!s:>13}" for v in row.values()))
    print(_LEGEND.format(true_ic=true_ic))


_LEGEND = ("corrected: the backtest's p (statsmodels' HAC t, Student t with floor(n / (2 lag + 1)) - 1 df); "
           "hac_normal: the same t, normal p (statsmodels' default); hac_t_n-1: Student t, n - 1 df; "
           "plain_t_n-1: the t that ignores overlap (ic_t); power (first layout): the corrected test on realized "
           "+ noise with a true IC of {true_ic:g}")


# (a) the S&P 500 panel ------------------------------------------------------------------------------------------


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kronos_tune.cli", *args], capture_output=True, text=True)


def check_panel(out: Path, size: str, lookback: int, data: Path) -> list[str]:
    """Run the panel target and return the failed checks (empty: all passed); prints the verdict lines."""
    from statsmodels.regression.linear_model import OLS

    args = ["backtest", "--size", size, "--data", str(data), "--symbol-column", "Symbol", "--lookback",
            str(lookback), "--pred-len", "5", "--every", "2", "--origins", "20", "--out", str(out), "--json"]
    done = run_cli(args)
    if done.returncode != 0:
        return [f"backtest failed ({done.returncode}): {done.stderr.strip()[-500:]}"]
    report = json.loads(done.stdout)
    failed = []
    skill = report.get("skill") or {}
    for key in ("persistence_mae_return", "mae_ratio_to_persistence", "mae_vs_persistence_dm", "ic", "rank_ic",
                "hit_rate_vs_half", "crps_skill_vs_random_walk", "verdict"):
        if key not in skill:
            failed.append(f"skill.{key} missing")
    for key in ("mae_vs_persistence_dm", "ic", "rank_ic", "hit_rate_vs_half"):
        test = skill.get(key) or {}
        if test.get("p") is None and not test.get("not_available"):
            failed.append(f"skill.{key}: no p-value and no reason")
    if skill.get("crps_skill_vs_random_walk") is None and not skill.get("crps_skill_not_available"):
        failed.append("skill.crps_skill_vs_random_walk: null without a reason")
    for key in ("persistence", "drift", "random_walk_band"):
        if key not in report.get("naive", {}):
            failed.append(f"naive.{key} missing")
    saved = pd.concat([pd.read_csv(p) for p in sorted((out / "predictions" / "a").glob("origin-*.csv"))])
    realized_mae = float(saved[REALIZED].abs().mean())
    if not math.isclose(skill.get("persistence_mae_return", math.nan), realized_mae, rel_tol=1e-12):
        failed.append(f"persistence MAE {skill.get('persistence_mae_return')} != mean |realized| {realized_mae}")
    origins = pd.read_csv(out / "origins.csv")
    ic = origins["ic"].dropna().to_numpy()
    lag = skill["ic"]["lag"]
    expected_t = float(OLS(ic, np.ones(len(ic))).fit(cov_type="HAC", cov_kwds={"maxlags": lag}).tvalues[0])
    if skill["ic"].get("t") is None or not math.isclose(skill["ic"]["t"], expected_t, rel_tol=1e-9):
        failed.append(f"IC HAC t {skill['ic'].get('t')} != statsmodels' {expected_t}")
    if lag != math.ceil(5 / 2) - 1:
        failed.append(f"lag {lag}, expected ceil(5 / 2) - 1 = 2")
    print(f"(a) {report['symbols']} symbols x {report['origins']} origins, lag {lag}: persistence MAE "
          f"{skill['persistence_mae_return']:.6f} = mean |realized| {realized_mae:.6f}; IC HAC t "
          f"{skill['ic']['t']:.4f} vs statsmodels {expected_t:.4f}")
    print(f"    verdict: {skill.get('verdict')}")
    print(f"    MAE {report['mae_return']:.5f}, drift MAE {report['naive']['drift']['mae_return']:.5f}, "
          f"CRPS skill {skill.get('crps_skill_vs_random_walk')} ({skill.get('crps_skill_not_available', '')})")
    return failed


# (c) finetuned against pretrained ------------------------------------------------------------------------------


def compare_verdict(checkpoint: str, size: str, seed: int, lookback: int, out: Path, data: Path) -> str:
    args = ["backtest", "--size", size, "--seed", str(seed), "--data", str(data), "--symbol-column", "Symbol",
            "--lookback", str(lookback), "--pred-len", "5", "--every", "5", "--compare", f"checkpoint={checkpoint}",
            "--out", str(out), "--json"]
    done = run_cli(args)
    if done.returncode != 0:
        raise SystemExit(f"backtest failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout)["compare"]["verdict"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=("all", "panel", "size", "compare"), default="all")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--symbols", type=int, default=100)
    parser.add_argument("--origins", type=int, default=40)
    parser.add_argument("--true-ic", type=float, default=0.1)
    parser.add_argument("--layouts", default="5/2,5/1,10/3,5/5",
                        help="(b): pred_len/every pairs, the first is the target (its power is measured too)")
    parser.add_argument("--size", default="mini", help="model size of (a) and (c)")
    parser.add_argument("--lookback", type=int, default=64)
    parser.add_argument("--data", type=Path, default=SP500)
    parser.add_argument("--checkpoint", help="(c): the finetuned checkpoint or training run folder")
    parser.add_argument("--seed", type=int, default=100, help="(c): the seed the finetune started from")
    parser.add_argument("--out", type=Path, help="run folders (default: a temporary folder)")
    args = parser.parse_args(argv)
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        base = args.out or Path(scratch)
        if args.what in ("all", "panel"):
            failed += check_panel(base / "panel", args.size, args.lookback, args.data)
        if args.what in ("all", "size"):
            layouts = [tuple(int(v) for v in pair.split("/")) for pair in args.layouts.split(",")]
            rows = []
            for k, (pred_len, every) in enumerate(layouts):  # a row at a time: a long run shows what it has
                rows.append(size_row(args.seeds, args.symbols, args.origins, pred_len, every,
                                     args.true_ic if k == 0 else None))
                print(f"layout {k + 1}/{len(layouts)} done: {rows[-1]}", flush=True)
            print_size_table(rows, args.seeds, args.symbols, args.origins, args.true_ic)
            target = rows[0]
            if not 0.03 <= target["corrected"] <= 0.08:
                failed.append(f"rejection rate {target['corrected']:.3f} at pred-len 5, every 2 is outside 3-8 %")
        if args.what == "compare":
            if not args.checkpoint:
                raise SystemExit("compare: give --checkpoint (a finetuned run folder)")
            print(compare_verdict(args.checkpoint, args.size, args.seed, args.lookback, base / "compare", args.data))
    for line in failed:
        print(f"FAILED: {line}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
