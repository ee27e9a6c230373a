"""The predict task's decision rule: from the trials' results to the prediction settings to run, as pure functions.

The runner (at the end of a run) and ``kronos-tune report`` (afterwards, on any
machine) call ``decide_predict`` on the same results, so a results.jsonl always
yields the same recommendation.

The rule:

1. Speed. Each trial's per-repeat run times per series (every repeat of a
   trial predicts the same series; the recompute reference only the first
   of them, see plan.reference_series) are compared with those of its
   reference: the trial it adds one
   change to (kv-cache against the full recompute; bf16, the autobatch chunk
   and sharding against kv-cache) and, for those, the recompute baseline too.
   The comparison is a time ratio with a 95 % interval from a pluggable
   ``Estimator``: by default ``stats.ratio_ci`` (ratio of medians, bootstrap
   over each side's repeats). A trial measured *paired* (predict/trials.py:
   each timed run beside a run of its reference's settings, in one worker,
   the order counterbalanced per pair of rounds) is compared with that
   reference by the paired rule instead (``stats.paired_compare`` on the
   per-round ratios, as the train task does). Faster = the interval below 1 and the ratio at least
   the threshold below 1.
2. Quality, by the change's exactness class. *exact* (kv-cache, autobatch,
   sharding): the greedy output must be identical to the exact reference's
   (``output_max_abs_diff`` within ``EXACT_TOLERANCE`` history standard
   deviations, over every compared series), and so must the output of one
   untimed sampled run (T 1.0, top-p 0.9, per-series random streams: the same
   draws for a series however it is batched) where the trial made one. *approximate* (bf16, bf16-weights):
   the ranking agreement of the predicted returns with the exact reference's
   (backtest.agreement) must reach ``min_spearman``; the verdict carries the agreement with float32 stated
   (predict/precision_agreement.py: identical greedy tokens, the forecast's max relative difference, the
   sampled difference against two float32 seeds' spread). The exact reference is
   the recompute's output, or kv-cache's once it proved identical to it
   (predict/trials.py, exact_reference).
3. A trial is eligible when it ran, kept its quality and is faster than its
   reference and than the baseline. The recommendation is the eligible trial
   with the highest series/s; the baseline when none is eligible.
4. Findings: two trials of identical work (`same_work_gaps`) whose series/s
   differ by more than the threshold are named, with why (drift between their
   measurements, or this run's noise).

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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kronos_tune.benchmark.predict.precision_agreement import agreement_text
from kronos_tune.benchmark.predict.verdicts import (PredictDecision, PredictVerdict, QualityCheck, SameWork,
                                                    speedup_text)
from kronos_tune.benchmark.results import TrialResult
from kronos_tune.benchmark.stats import (CONFIDENCE, Comparison, block_ratios, paired_compare, rate_over_ratio,
                                        ratio_ci, verdict)

BASELINE = "recompute"
REFERENCE = {"kv-cache": BASELINE, "bf16": "kv-cache", "bf16-weights": "kv-cache", "autobatch": "kv-cache",
             "sharding": "kv-cache"}
EXACTNESS = {"kv-cache": "exact", "autobatch": "exact", "sharding": "exact", "bf16": "approximate",
             "bf16-weights": "approximate"}
EXACT_TOLERANCE = 1e-6  # history standard deviations: float error, never a different greedy token
DEFAULT_MIN_SPEARMAN = 0.95
MIN_AGREEMENT_SERIES = 3  # a Spearman correlation of fewer series means nothing

# (per-repeat times of a trial, of its reference) -> (time ratio trial / reference, low, high of its interval)
Estimator = Callable[[Sequence[float], Sequence[float]], tuple[float, float, float]]
BOOTSTRAP = f"ratio of median run times, {100 * CONFIDENCE:g}% bootstrap interval over the repeats"


def compare_times(trial: TrialResult | None, reference: TrialResult | None, threshold: float,
                  estimator: Estimator = ratio_ci, method: str = BOOTSTRAP) -> Comparison | None:
    """The trial's run times against the reference's (None unless both ran ok with timed repeats)."""
    if trial is None or reference is None or trial.status != "ok" or reference.status != "ok":
        return None
    if trial.design == "paired" and trial.blocks and (trial.timing or {}).get("paired_with") == reference.name:
        return paired_compare(block_ratios(trial.blocks), threshold, what="run")
    mine, theirs = per_series_times(trial), per_series_times(reference)
    if not mine or not theirs:
        return None
    ratio, low, high = estimator(mine, theirs)
    return Comparison(ratio, low, high, threshold, verdict(ratio, low, high, threshold), len(trial.step_times_s),
                      len(reference.step_times_s), method)


def per_series_times(result: TrialResult) -> list[float]:
    """Seconds per series of each timed repeat (its run time over the series it predicted)."""
    series = int((result.config or {}).get("measured_series") or 1)
    return [seconds / series for seconds in result.step_times_s]


def quality_check(trial: TrialResult, min_spearman: float) -> QualityCheck:
    """The exactness class's promise against the trial's outputs (what the trial measured: trial.quality)."""
    exactness = EXACTNESS.get(trial.name, "approximate")
    agreement = trial.quality if isinstance(trial.quality, dict) else {}
    series = agreement.get("series")
    whose = f"{agreement['reference']}'s" if agreement.get("reference") else "the reference's"
    if exactness == "exact":
        diff = trial.output_max_abs_diff
        if diff is None:
            return QualityCheck(exactness, False, "no reference output to compare with")
        over = f" over {series} series" if series else ""
        sampled = agreement.get("sampled_max_abs_diff")  # None: no sampled run (results of earlier versions)
        if diff > EXACT_TOLERANCE:
            return QualityCheck(exactness, False, f"not identical to {whose} output (max difference {diff:.3g} "
                                f"σ{over}), though it promises to be: a defect", diff, sampled)
        if sampled is not None and sampled > EXACT_TOLERANCE:
            return QualityCheck(exactness, False, f"identical greedy output, but its sampled output (per-series "
                                f"streams) differs from {whose} (max difference {sampled:.3g} σ{over}), though it "
                                f"promises to be: a defect", diff, sampled)
        what = "greedy" if sampled is None else "greedy and sampled"
        return QualityCheck(exactness, True, f"identical {what} output to {whose}{over}", diff, sampled)
    spearman = agreement.get("spearman")
    if spearman is None or not series or series < MIN_AGREEMENT_SERIES:
        return QualityCheck(exactness, False, f"ranking agreement not measured (needs {MIN_AGREEMENT_SERIES}+ "
                            f"series)", threshold=min_spearman)
    passed = spearman >= min_spearman
    relation = ">=" if passed else "<"
    statement = agreement_text(agreement)
    return QualityCheck(exactness, passed, f"ranking agreement Spearman {spearman:.3f} {relation} "
                        f"{min_spearman:g} over {series} series" + (f"; {statement}" if statement else ""),
                        spearman=spearman, series=series, threshold=min_spearman)


def _compared_ratio(verdict: PredictVerdict) -> float:
    """Time per series against the baseline's (an eligible verdict always has one): the estimate every view
    shows (report/shown.py), so the recommendation is the trial the table and the picture put first."""
    return verdict.vs_baseline.ratio if verdict.vs_baseline is not None else float("inf")


def _verdict(trial: TrialResult, by_name: dict[str, TrialResult], threshold: float, min_spearman: float,
             estimator: Estimator, method: str) -> PredictVerdict:
    base = by_name.get(BASELINE)
    parent_name = REFERENCE.get(trial.name, BASELINE)
    parent = by_name.get(parent_name)
    if parent is None or parent.status != "ok":  # its own reference did not run: the baseline is the reference
        parent_name, parent = BASELINE, base
    vs_reference = compare_times(trial, parent, threshold, estimator, method)
    vs_baseline = vs_reference if parent_name == BASELINE else compare_times(trial, base, threshold, estimator,
                                                                             method)
    quality = (quality_check(trial, min_spearman) if trial.status == "ok" else
               QualityCheck(EXACTNESS.get(trial.name, "approximate"), False, "not measured"))
    why = ""
    if trial.status != "ok":
        why = f"{trial.status}" + (f": {trial.reason}" if trial.reason else "")
    elif vs_reference is None:
        why = f"no timed runs to compare with {parent_name}'s"
    elif not quality.passed:
        why = quality.text
    elif vs_reference.verdict != "faster":
        relation = {"same": "as fast as", "slower": "slower than"}.get(vs_reference.verdict, "not resolved against")
        why = f"{relation} {parent_name} ({speedup_text(vs_reference)})"
    elif vs_baseline is None or vs_baseline.verdict != "faster":
        why = f"not faster than {BASELINE} ({speedup_text(vs_baseline)})"
    return PredictVerdict(trial.name, parent_name, EXACTNESS.get(trial.name, "approximate"), vs_reference,
                          vs_baseline, quality, not why, why)


def decide_predict(trials: list[TrialResult], threshold: float, min_spearman: float = DEFAULT_MIN_SPEARMAN,
                   estimator: Estimator = ratio_ci, method: str = BOOTSTRAP) -> PredictDecision:
    """The rule of the module docstring on the predict trials' results."""
    by_name = {t.name: t for t in trials}
    base = by_name.get(BASELINE)
    if base is None or base.status != "ok" or not base.step_times_s:
        status = ("did not run" if base is None else "has no timed runs" if base.status == "ok" else
                  f"{base.status}" + (f": {base.reason}" if base.reason else ""))
        return PredictDecision(None, f"the reference ({BASELINE}) {status}: nothing to compare the settings with",
                               threshold, min_spearman, method)
    verdicts = {trial.name: _verdict(trial, by_name, threshold, min_spearman, estimator, method)
                for trial in trials if trial.name != BASELINE and trial.status != "skipped"}
    eligible = [by_name[name] for name, v in verdicts.items() if v.eligible]
    left_out = [f"{name}: {v.why}" for name, v in verdicts.items() if not v.eligible]
    if not eligible:
        source = BASELINE
        reason = (f"no setting was faster than its reference beyond the noise (threshold "
                  f"{100 * threshold:.1f}%) with the quality its class promises; kept the reference")
    else:
        best = min(eligible, key=lambda t: _compared_ratio(verdicts[t.name]))
        chosen = verdicts[best.name]
        source = best.name
        reason = (f"{speedup_text(chosen.vs_baseline)} the series/s of {BASELINE}"
                  + (f", {speedup_text(chosen.vs_reference)} that of {chosen.reference}"
                     if chosen.reference != BASELINE else "")
                  + f"; {chosen.quality.text}")
        others = [t.name for t in eligible if t is not best]
        if others:
            reason += f"; also eligible but slower: {', '.join(others)}"
    if left_out:
        reason += "; left out: " + "; ".join(left_out)
    return PredictDecision(source, reason, threshold, min_spearman, method, verdicts,
                           same_work_gaps(trials, verdicts, base, threshold))


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


def _rate_from_verdict(trial: TrialResult, verdict: PredictVerdict | None, baseline: TrialResult) -> float | None:
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
            rates = (_rate_from_verdict(first, verdicts.get(first.name), baseline),
                     _rate_from_verdict(second, verdicts.get(second.name), baseline))
            if batch is None or rates[0] is None or rates[1] is None or min(rates) <= 0:
                continue
            pair = SameWork(first.name, second.name, rates[0], rates[1], resolution, batch,
                            _direct(first.name, second.name, verdicts))
            if pair.gap > resolution:
                found.append(pair)
    return found
