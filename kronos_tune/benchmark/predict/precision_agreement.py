"""How far a reduced-precision predict trial (bf16 autocast, bf16 weights) lands from float32, in a quant's terms.

Greedy (top-k 1): the share of generated tokens (s1, s2 pairs) identical to float32's, and the forecast's largest
relative difference on the price columns (volume and amount can be 0). Sampled (predict's decoding, per-series
streams): the mean absolute difference of the predicted return (last predicted close over last history close)
from float32's on the same seed, against the same figure between two float32 runs on different seeds, the
sampling noise; a ratio at most 1 is "within sampling noise", measured on these series.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PRICE_COLUMNS = ("open", "high", "low", "close")


def identical_token_share(tokens: np.ndarray, reference: np.ndarray) -> float | None:
    """Share of generated positions whose (s1, s2) pair equals the reference's; arrays [rows, pred_len, 2]."""
    rows = min(len(tokens), len(reference))
    if rows == 0 or tokens.shape[1:] != reference.shape[1:]:
        return None
    return float(np.all(tokens[:rows] == reference[:rows], axis=-1).mean())


def max_relative_difference(outputs: list[pd.DataFrame], reference: list[pd.DataFrame]) -> float | None:
    """Largest |forecast - reference| / |reference| over every series, step and price column."""
    if not outputs or len(outputs) != len(reference):
        return None
    worst = 0.0
    for mine, theirs in zip(outputs, reference):
        a, b = mine[list(PRICE_COLUMNS)].to_numpy(), theirs[list(PRICE_COLUMNS)].to_numpy()
        worst = max(worst, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12))))
    return worst


def mean_return_difference(a: list[pd.DataFrame], b: list[pd.DataFrame], histories: list[pd.DataFrame]) -> float:
    """Mean over the series of |predicted return of a - that of b|."""
    from kronos_tune.backtest.agreement import returns_from_frames

    return float(np.mean(np.abs(returns_from_frames(a, histories) - returns_from_frames(b, histories))))


def sampled_agreement(outputs: list[pd.DataFrame], reference: list[pd.DataFrame], other_seed: list[pd.DataFrame],
                      histories: list[pd.DataFrame]) -> dict[str, float] | None:
    """The trial's sampled forecast against float32's and the float32 seed-to-seed spread, over the series all
    three predicted; None without all three."""
    shared = min(len(outputs), len(reference), len(other_seed), len(histories))
    if shared == 0:
        return None
    shown = histories[:shared]
    difference = mean_return_difference(outputs[:shared], reference[:shared], shown)
    noise = mean_return_difference(other_seed[:shared], reference[:shared], shown)
    return {"return_diff": difference, "seed_spread": noise,
            "noise_ratio": difference / noise if noise > 0 else float("inf") if difference > 0 else 0.0,
            "sampled_series": shared}


def agreement_text(quality: dict) -> str:
    """The statement a recommendation carries: '99.2% identical greedy tokens, forecast max relative difference
    0.31%; sampled: predicted return differs by 0.021% from float32's, within sampling noise (two float32 seeds
    differ by 0.034%, ratio 0.62)'. Empty when nothing was measured."""
    parts = []
    share, relative = quality.get("identical_tokens"), quality.get("forecast_max_rel_diff")
    if share is not None:
        parts.append(f"{100 * share:.1f}% identical greedy tokens")
    if relative is not None:
        parts.append(f"forecast max relative difference {100 * relative:.2g}%")
    sampled = quality.get("sampled_vs_float32")
    if sampled:
        ratio = sampled["noise_ratio"]
        relation = "within sampling noise" if ratio <= 1 else "beyond sampling noise"
        parts.append(f"sampled: predicted return differs by {100 * sampled['return_diff']:.3g}% from float32's, "
                     f"{relation} (two float32 seeds differ by {100 * sampled['seed_spread']:.3g}%, ratio "
                     f"{ratio:.2f}, {sampled['sampled_series']} series)")
    return "; ".join(parts)


__all__ = ["agreement_text", "identical_token_share", "max_relative_difference", "sampled_agreement"]
