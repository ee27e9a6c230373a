"""Predict trials that did identical work: their series/s should agree within the run's resolution.

Two trials do the same work when every setting that shapes the timed runs is
the same and their batches are too: the same chunk size, or chunks that both
hold every measured series (the predictor's default does, as the autobatch
trial's note says when its pick holds them all). When such a pair's figures,
the series/s every view shows, differ by more than the run's resolution, the
report has to say why: measured side by side and called the same, the gap
is drift between measurements taken at different times; otherwise it is a
finding: this run's noise is larger than its resolution claims.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kronos_tune.benchmark.predict.verdicts import PredictVerdict, SameWork
from kronos_tune.benchmark.results import TrialResult
from kronos_tune.benchmark.stats import Comparison, rate_over_ratio

# PredictSettings keys that shape the timed runs (the batch aside, compared below); agreement_series only
# sizes the quality check and series_count only the projection.
WORK_KEYS = ("model_size", "lookback", "pred_len", "sample_count", "measured_series", "use_cache", "amp",
             "devices", "seed")


def _holds_all(config: Mapping[str, Any]) -> bool:
    """The chunk holds every measured series (None: the predictor's default, which does)."""
    chunk = config.get("max_batch_size")
    return chunk is None or int(chunk) >= int(config["measured_series"]) * int(config["sample_count"])


def same_batch(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """Why two trials' settings make the same timed work, or None when they do not."""
    if any(a.get(key) != b.get(key) for key in WORK_KEYS):
        return None
    if a.get("max_batch_size") == b.get("max_batch_size"):
        return "the same settings and chunk size"
    if _holds_all(a) and _holds_all(b):
        return f"each chunk holds all {a['measured_series']} measured series, as the predictor's default does"
    return None


def shown_rate(trial: TrialResult, verdict: PredictVerdict | None, baseline: TrialResult) -> float | None:
    """The series/s every view shows (report/shown.shown_series_rate): the baseline's over the compared
    time ratio, else the trial's own median."""
    compared = verdict.vs_baseline if verdict is not None else None
    return rate_over_ratio(None if compared is None else compared.ratio,
                           None if baseline.series_per_s is None else float(baseline.series_per_s.median),
                           None if trial.series_per_s is None else float(trial.series_per_s.median))


def _direct(first: str, second: str, verdicts: Mapping[str, PredictVerdict]) -> Comparison | None:
    """`second` against `first` where `first` is its reference (the trials after kv-cache are measured against it,
    paired where they could be)."""
    verdict = verdicts.get(second)
    return verdict.vs_reference if verdict is not None and verdict.reference == first else None


def same_work_gaps(trials: Sequence[TrialResult], verdicts: Mapping[str, PredictVerdict], baseline: TrialResult,
                   resolution: float) -> list[SameWork]:
    """Every pair of trials that ran ok on identical work whose shown series/s differ beyond `resolution`."""
    done = [t for t in trials if t.status == "ok" and t.config and t is not baseline]
    found = []
    for index, first in enumerate(done):
        for second in done[index + 1:]:
            batch = same_batch(first.config or {}, second.config or {})
            rates = (shown_rate(first, verdicts.get(first.name), baseline),
                     shown_rate(second, verdicts.get(second.name), baseline))
            if batch is None or rates[0] is None or rates[1] is None or min(rates) <= 0:
                continue
            pair = SameWork(first.name, second.name, rates[0], rates[1], resolution, batch,
                            _direct(first.name, second.name, verdicts))
            if pair.gap > resolution:
                found.append(pair)
    return found
