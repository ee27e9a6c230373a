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
4. Findings: two trials of identical work (predict/same_work.py) whose series/s
   differ by more than the threshold are named, with why (drift between their
   measurements, or this run's noise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kronos_tune.benchmark.predict.precision_agreement import agreement_text
from kronos_tune.benchmark.predict.same_work import same_work_gaps
from kronos_tune.benchmark.predict.verdicts import PredictDecision, PredictVerdict, QualityCheck, speedup_text
from kronos_tune.benchmark.results import TrialResult
from kronos_tune.benchmark.stats import CONFIDENCE, Comparison, block_ratios, paired_compare, ratio_ci, verdict

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
