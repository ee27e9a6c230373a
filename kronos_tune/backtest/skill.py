"""Is it skill? The model against naive forecasts on the same pairs, and two models against each other.

Against persistence (no change): the ratio of the MAEs of returns (below 1 is skill) with a Diebold-Mariano
test on the loss differentials |model error| - |persistence error|, averaged over the symbols of each origin
and tested over origins; IC and RankIC with their HAC tests; the hit rate against 50 % (per-origin hit rates,
HAC interval); with sample paths the CRPS skill against the random-walk band, 1 - CRPS(model) / CRPS(band).
Between two settings (--compare): the paired per-origin differences of IC, RankIC and the loss, same tests.
Every test is kronos_tune.backtest.significance.hac_mean_test.

The naive forecasts on the same (symbol, origin) pairs as the model, what "doing nothing" scores, are each a
function of the symbol's own closes up to the origin (the lookback the model sees):

- persistence: no change, the last close; a predicted return of exactly 0;
- drift: the symbol's mean one-bar log return over its lookback (lookback - 1 returns), times the horizon,
  as a simple return: exp(pred_len * mean) - 1;
- random-walk band: the symbol's empirical pred_len-bar returns over its lookback (lookback - pred_len
  overlapping windows) as a forecast distribution of the return; it gives the band's quantiles, coverage
  and CRPS (kronos_tune.backtest.calibration) that the model's sample band is held against.

They are computed when scoring, from the universe, so runs saved before they existed score them too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kronos_core.optional import install_command
from kronos_tune.backtest.calibration import (CALIBRATION_COLUMNS, CRPS_COLUMN, QUANTILE_COLUMNS, crps_from_samples,
                                              sample_quantiles)
from kronos_tune.backtest.metrics import PREDICTED, REALIZED, OriginQuality
from kronos_tune.backtest.origins import Origin, Universe
from kronos_tune.backtest.significance import MeanTest, hac_mean_test, needed_text, p_text

NO_SAMPLES = "needs sample paths: --sample-count 2 or more"

PERSISTENCE, DRIFT, RANDOM_WALK = "persistence", "drift", "random_walk_band"
MIN_BAND_RETURNS = 2  # a distribution needs two returns


def band_unavailable(lookback: int, pred_len: int) -> str | None:
    """Why the random-walk band cannot be built from a lookback, or None when it can."""
    count = lookback - pred_len
    if count >= MIN_BAND_RETURNS:
        return None
    return (f"--lookback {lookback} holds {max(count, 0)} returns of --pred-len {pred_len} bars; the random-walk "
            f"band needs {MIN_BAND_RETURNS} (--lookback {pred_len + MIN_BAND_RETURNS} or more)")


def _history_closes(universe: Universe, origin: Origin, lookback: int) -> np.ndarray:
    """[members, lookback] closes up to the origin, in the order of its members (the saved rows' order)."""
    return np.stack([universe.symbols[s].close[row + 1 - lookback:row + 1] for s, row in origin.members])


def naive_frames(universe: Universe, origin: Origin, predictions: pd.DataFrame, lookback: int,
                 pred_len: int) -> dict[str, pd.DataFrame]:
    """The naive forecasts of one origin's saved predictions (same symbols, same realized returns).

    Returns {persistence, drift} frames with the columns of a saved origin that scoring reads (symbol,
    last_close, realized_close, predicted and realized return), and when the lookback allows, the random-walk
    band's frame with the calibration columns in price units as a sample band's (quantiles of the close, CRPS)."""
    history = _history_closes(universe, origin, lookback)
    base = predictions[["origin", "timestamp", "symbol", "last_close", "realized_close", REALIZED]].copy()
    last = base["last_close"].to_numpy(dtype=np.float64)
    out = {}
    persistence = base.assign(predicted_close=last, **{PREDICTED: 0.0})
    out[PERSISTENCE] = persistence
    one_bar = np.diff(np.log(history), axis=1)
    drift_return = np.expm1(pred_len * one_bar.mean(axis=1)) if one_bar.shape[1] else np.zeros(len(base))
    out[DRIFT] = base.assign(predicted_close=last * (1 + drift_return), **{PREDICTED: drift_return})
    if band_unavailable(lookback, pred_len) is None:
        samples = history[:, pred_len:] / history[:, :-pred_len] * last[:, None]  # closes: last x (1 + r)
        band = base.assign(predicted_close=samples.mean(axis=1))
        band[PREDICTED] = band["predicted_close"] / last - 1.0
        quantiles = sample_quantiles(samples)
        for k, name in enumerate(QUANTILE_COLUMNS):
            band[name] = quantiles[:, k]
        band[CRPS_COLUMN] = crps_from_samples(samples, base["realized_close"].to_numpy(dtype=np.float64))
        out[RANDOM_WALK] = band[[*band.columns.difference(CALIBRATION_COLUMNS, sort=False), *CALIBRATION_COLUMNS]]
    return out


def absolute_errors(frame: pd.DataFrame) -> np.ndarray:
    return np.abs(frame[PREDICTED].to_numpy(dtype=np.float64) - frame[REALIZED].to_numpy(dtype=np.float64))


def loss_differentials(model: list[pd.DataFrame], reference: list[pd.DataFrame]) -> list[float]:
    """Per origin: the mean over its symbols of |model error| - |reference error| (returns; same rows)."""
    out = []
    for ours, theirs in zip(model, reference):
        if not np.array_equal(ours["symbol"].astype(str).to_numpy(), theirs["symbol"].astype(str).to_numpy()):
            raise ValueError(f"origin {ours['origin'].iloc[0]}: the two forecasts cover different symbols")
        out.append(float((absolute_errors(ours) - absolute_errors(theirs)).mean()))
    return out


def pooled_mae(frames: list[pd.DataFrame]) -> float:
    return float(np.concatenate([absolute_errors(f) for f in frames]).mean()) if frames else math.nan


@dataclass(frozen=True)
class SettingSkill:
    """One forecast against the naive ones (see the module doc)."""

    persistence_mae: float
    mae_ratio: float         # MAE / persistence's MAE; below 1 is skill
    mae_vs_persistence: MeanTest  # Diebold-Mariano: per-origin mean loss differential, HAC over origins
    ic: MeanTest
    rank_ic: MeanTest
    hit_rate: MeanTest       # per-origin hit rates against 0.5
    crps_skill: float | None  # 1 - CRPS / the random-walk band's CRPS
    crps_reason: str | None = None  # why crps_skill is not available

    def verdict(self, title: str) -> str:
        """One line: better, worse or not distinguishable from no change, and whether the IC is more than noise."""
        dm = self.mae_vs_persistence
        head = (f"{title} vs persistence: MAE {self.mae_ratio:.3g} x persistence's" if math.isfinite(self.mae_ratio)
                else f"{title} vs persistence: MAE ratio not available (persistence's MAE is 0)")
        shared = _shared_reason(dm, self.ic, self.hit_rate)
        if shared is not None:
            return f"{head}, IC {self.ic.mean:+.4f}, hit rate {self.hit_rate.mean:.3f}; tests not available: {shared}"
        if dm.reason is not None:
            judged = f"DM test not available: {dm.reason}"
        elif dm.significant:
            judged = f"DM {p_text(dm.p)}: {'better' if self.mae_ratio < 1 else 'worse'} than no change"
        else:
            judged = f"DM {p_text(dm.p)}: not distinguishable from no change; {needed_text(dm.origins_needed)}"
        return f"{head} ({judged}); IC {self.ic.mean:+.4f} ({self.ic.brief()}); hit rate {_interval(self.hit_rate)}"

    def to_dict(self) -> dict[str, Any]:
        out = {"persistence_mae_return": self.persistence_mae, "mae_ratio_to_persistence": self.mae_ratio,
               "mae_vs_persistence_dm": self.mae_vs_persistence.to_dict(), "ic": self.ic.to_dict(),
               "rank_ic": self.rank_ic.to_dict(), "hit_rate_vs_half": self.hit_rate.to_dict(),
               "crps_skill_vs_random_walk": self.crps_skill}
        if self.crps_reason is not None:
            out["crps_skill_not_available"] = self.crps_reason
        return out


def _shared_reason(*tests: MeanTest) -> str | None:
    """The one reason every test is not available for (too few origins, no statsmodels), else None."""
    reasons = {test.reason for test in tests}
    if len(reasons) != 1 or None in reasons:
        return None
    # the backtest's one warning line already gives the install command; the verdict names the cause only
    return reasons.pop().replace(f" ({install_command('stats')})", "")


def _interval(test: MeanTest) -> str:
    if test.low is None:
        return f"{test.mean:.3f} (interval not available: {test.reason})"
    against = f"{p_text(test.p)} against {test.null:g}"
    return f"{test.mean:.3f} (95 % {test.low:.3f} to {test.high:.3f}, {against})"


def correlation_test(quality: list[OriginQuality], lag: int, which: str) -> MeanTest:
    """The HAC test of the per-origin IC ('ic') or RankIC ('rank_ic')."""
    return hac_mean_test([getattr(q, which) for q in quality], lag)


def setting_skill(predictions: list[pd.DataFrame], quality: list[OriginQuality], persistence: list[pd.DataFrame],
                  lag: int, crps: float | None, band_crps: float | None, band_reason: str | None) -> SettingSkill:
    """The skill of one forecast (`crps`: its pooled CRPS / last close, None without sample paths; `band_crps`:
    the random-walk band's, None with `band_reason` when the lookback cannot hold one)."""
    persistence_mae = pooled_mae(persistence)
    mae = pooled_mae(predictions)
    if crps is None:
        crps_skill, reason = None, NO_SAMPLES
    elif band_crps is None:
        crps_skill, reason = None, band_reason
    else:
        crps_skill, reason = (1.0 - crps / band_crps, None) if band_crps > 0 else (None, "the band's CRPS is 0")
    return SettingSkill(
        persistence_mae=persistence_mae, mae_ratio=mae / persistence_mae if persistence_mae > 0 else math.nan,
        mae_vs_persistence=hac_mean_test(loss_differentials(predictions, persistence), lag),
        ic=correlation_test(quality, lag, "ic"), rank_ic=correlation_test(quality, lag, "rank_ic"),
        hit_rate=hac_mean_test([q.hit_rate for q in quality], lag, null=0.5, bounds=(0.0, 1.0)),
        crps_skill=crps_skill, crps_reason=reason)


@dataclass(frozen=True)
class SettingComparison:
    """Setting B against setting A on the same pairs: paired per-origin differences (B - A), HAC tests."""

    title_a: str
    title_b: str
    mae_change: float  # MAE_B / MAE_A - 1
    mae: MeanTest      # Diebold-Mariano on |B error| - |A error|
    ic: MeanTest       # IC_B - IC_A per origin
    rank_ic: MeanTest

    def verdict(self) -> str:
        """'finetuned vs pretrained: MAE -3.1% (DM p = 0.02), IC +0.011 (t = 1.20, p = 0.23; about 70 origins
        would be needed), RankIC ...'."""
        pair = f"{self.title_b} vs {self.title_a}: "
        shared = _shared_reason(self.mae, self.ic, self.rank_ic)
        if shared is not None:
            return (f"{pair}MAE {100 * self.mae_change:+.1f}%, IC {self.ic.mean:+.4f}, RankIC "
                    f"{self.rank_ic.mean:+.4f}; tests not available: {shared}")
        mae = (f"MAE {100 * self.mae_change:+.1f}% (DM {p_text(self.mae.p)})" if self.mae.reason is None
               else f"MAE {100 * self.mae_change:+.1f}% (DM test not available: {self.mae.reason})")
        found = [name for name, test in (("MAE", self.mae), ("IC", self.ic), ("RankIC", self.rank_ic))
                 if test.significant]
        answer = ("no difference shown at 5 %" if not found else f"{self.title_b} " + ", ".join(
            f"{'better' if self._b_better(name) else 'worse'} on {name}" for name in found) + " (p < 0.05)")
        return (f"{pair}{mae}, IC {self.ic.mean:+.4f} ({self.ic.brief()}), "
                f"RankIC {self.rank_ic.mean:+.4f} ({self.rank_ic.brief()}): {answer}")

    def _b_better(self, name: str) -> bool:
        return self.mae.mean < 0 if name == "MAE" else (self.ic if name == "IC" else self.rank_ic).mean > 0

    def to_dict(self) -> dict[str, Any]:
        return {"of": f"{self.title_b} - {self.title_a}, per origin", "mae_change": self.mae_change,
                "mae_dm": self.mae.to_dict(), "ic_diff": self.ic.to_dict(), "rank_ic_diff": self.rank_ic.to_dict(),
                "verdict": self.verdict()}


def compare(title_a: str, a_predictions: list[pd.DataFrame], a_quality: list[OriginQuality], title_b: str,
            b_predictions: list[pd.DataFrame], b_quality: list[OriginQuality], lag: int) -> SettingComparison:
    a_mae, b_mae = pooled_mae(a_predictions), pooled_mae(b_predictions)
    return SettingComparison(
        title_a, title_b, mae_change=b_mae / a_mae - 1.0 if a_mae > 0 else math.nan,
        mae=hac_mean_test(loss_differentials(b_predictions, a_predictions), lag),
        ic=hac_mean_test([b.ic - a.ic for a, b in zip(a_quality, b_quality)], lag),
        rank_ic=hac_mean_test([b.rank_ic - a.rank_ic for a, b in zip(a_quality, b_quality)], lag))


CONVENTIONS = {
    "persistence": "no change: the last close, a predicted return of 0",
    "drift": "each symbol's mean one-bar log return over its lookback x pred_len, as a simple return "
             "exp(pred_len x mean) - 1",
    "random_walk_band": "each symbol's pred_len-bar returns over its lookback (lookback - pred_len overlapping "
                        "windows) as the forecast distribution; quantiles, coverage, pinball and CRPS as the "
                        "model's band",
    "mae_ratio_to_persistence": "MAE of returns / persistence's MAE over the same (symbol, origin) pairs; "
                                "below 1 is skill; persistence's MAE is the mean |realized return|",
    "mae_vs_persistence_dm": "Diebold-Mariano: per origin the mean over symbols of |model error| - |persistence "
                             "error| (returns), its mean tested over origins (negative: the model is better)",
    "hit_rate_vs_half": "per-origin hit rate, its mean tested against 0.5 with its 95 % interval",
    "crps_skill_vs_random_walk": "1 - CRPS / the random-walk band's CRPS (both / last close, over all pairs); "
                                 "above 0 is skill",
    "compare": "paired per-origin differences B - A of IC, RankIC and the absolute-error loss, each tested; "
               "mae_change = MAE_B / MAE_A - 1",
}
