"""The decision rule: from trial results to a recommendation, as pure functions.

The runner (while the benchmark runs: which changes go into the combined
trial) and ``kronos-tune report`` (afterwards, on any machine) call the same
functions, so a results.jsonl always yields the same recommendation. What a
trial is (a speed change, a memory saver, an optimization change, the
baseline measured again) comes from the plan, carried in each result
(``TrialResult.kind``, ``group``, ``losses``, ``redraws_dropout``).

The rule, in order:

1. Timing. A comparison measured in the paired design (the trial and a live
   baseline in alternating blocks) is decided from its block ratios
   (``stats.paired_compare``), on one of two kinds of evidence (``EVIDENCE``),
   tried in this order:

   - the A/A's resolution: faster when the interval lies below 1 and the
     centre is at least ``max(PAIRED_FLOOR, resolution)`` below 1, the
     resolution being how far the A/A comparison's interval (the noise-probe
     against the baseline, interleaved the same way) reaches from 1: the
     smallest change this run can tell from noise. That interval is a trimmed
     one (``stats.aa_compare``), so one outlying A/A round cannot widen it.
     Not in a run too noisy to decide (below).
   - its own interval: faster when the whole interval lies at least
     ``max(PAIRED_FLOOR, pooled resolution)`` below 1, the pooled resolution
     being the A/A's interval at the run's pooled noise
     (``stats.pooled_resolution``: the A/A's spread is one variance estimate
     among the trials'). So one A/A whose rounds met a burst of load does not
     erase a change whose own rounds measured it beyond doubt. Not when the
     A/A itself came out different (a bias between workers shown: then only
     its resolution guards).

   Slower mirrored. A sequential comparison (the trial alone, against the
   baseline's own measurement) is decided from the ratio of medians with a
   bootstrap interval against ``max(FLOOR, drift)``, drift being how far the
   baseline's own re-measurements moved. A run whose resolution (or, with no
   paired A/A, whose drift threshold) is past ``NOISY_LIMIT`` is too noisy to
   decide on the A/A's resolution: only a change called on its own interval
   can be recommended there, and with none the baseline is kept.
2. Quality. A change must pass the validation-loss guard and its training
   losses must stay in the class its kind promises (equivalent, close,
   approximate: ``trajectory_check``); one that should be equivalent and is
   not is a defect and is left out.
3. Time to the answer. A faster change must earn back its one-time cost
   (warm-up beyond steady steps, e.g. compilation, and an autobatch search)
   over the preset's workload: the time it saves on the workload's steps has
   to exceed it (``one_time_costs``).
4. Speed and optimization changes enter the combination only when faster (and
   worth it). Memory savers only when memory binds: the baseline does not fit
   the budget with its margin, or the user asked for memory (``objective =
   "memory"``). One per group (the fastest).
5. The recommendation is the fastest measured configuration among the
   baseline, the eligible singles and the combined trial; the combined trial
   only when it is not slower than the best single; the baseline when
   nothing is faster beyond the noise.
6. With ``objective = "time-to-quality"`` the time to the baseline's validation
   loss decides instead (target.py: ``recommend_by_target``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from kronos_core.units import format_bytes, format_duration
from kronos_tune.benchmark.costs import one_time_costs
from kronos_tune.benchmark.results import NOISE_PROBE, TrialResult
from kronos_tune.benchmark.stats import (
    CONFIDENCE, EXTENDED_CONFIDENCE, Comparison, aa_compare, block_ratios, compare, paired_compare, pooled_resolution,
)
from kronos_tune.benchmark.train.target import recommend_by_target
from kronos_tune.benchmark.train.verdicts import PAIRED_FLOOR, Decision, OneTimeCost, Trajectory

DRIFT_STAGE = "drift"
OBJECTIVES = ("speed", "memory", "time-to-quality")
FLOOR = 0.03  # sequential design: relative step-time change below which nothing is called faster or slower
NOISY_LIMIT = 0.25  # a resolution (or drift threshold) above this: the machine is too noisy to decide
DEFAULT_MARGIN = 0.10
EQUIVALENT_TOLERANCE = 1e-4  # largest relative loss deviation that is float error
CLOSE_TOLERANCE = 2e-2
# What decided a verdict (Comparison.evidence): the paired rule's two kinds, the paired floor where the run
# measured no A/A, the sequential design's threshold.
OWN_INTERVAL, AA_RESOLUTION, PAIRED_FLOOR_ONLY, SEQUENTIAL_THRESHOLD = (
    "its own interval", "the A/A's resolution", "the paired floor", "the sequential threshold")
EVIDENCE = (OWN_INTERVAL, AA_RESOLUTION, PAIRED_FLOOR_ONLY, SEQUENTIAL_THRESHOLD)


@dataclass(frozen=True)
class DecisionContext:
    """What the rule needs besides the results: the memory budget and the user's objective."""

    budget_bytes: int | None = None
    margin: float = DEFAULT_MARGIN
    objective: str = "speed"
    floor: float = FLOOR
    model_has_dropout: bool = False
    paired_floor: float = PAIRED_FLOOR


def _kind(result: TrialResult) -> str:
    return result.trial_kind.kind


def reference(results: list[TrialResult]) -> TrialResult | None:
    """The baseline: the first trial of kind reference."""
    return next((r for r in results if _kind(r) == "reference"), None)


def _scale(result: TrialResult, reference: TrialResult | None) -> float:
    """Step times are compared per token: a trial with a bigger batch is timed per baseline-sized step."""
    if reference is None or not result.tokens_per_step or not reference.tokens_per_step:
        return 1.0
    return reference.tokens_per_step / result.tokens_per_step


def _times(result: TrialResult | None, reference: TrialResult | None = None) -> list[float]:
    if result is None or not result.step_times_s:
        return []
    factor = _scale(result, reference)
    return [t * factor for t in result.step_times_s]


def _median(result: TrialResult | None, reference: TrialResult | None = None) -> float | None:
    if result is None or result.step_time_s is None:
        return None
    return result.step_time_s.median * _scale(result, reference)


def drift_estimate(results: list[TrialResult]) -> tuple[float | None, list[str]]:
    """Largest relative distance of a baseline re-measurement's median from the baseline's median."""
    base = reference(results)
    reference_median = _median(base) if base is not None and base.status == "ok" else None
    if not reference_median:
        return None, []
    repeats = [r for r in results if (_kind(r) == "baseline-repeat" or r.stage == DRIFT_STAGE) and r.status == "ok"
               and _median(r)]
    if not repeats:
        return None, []
    return max(abs(_median(r) / reference_median - 1) for r in repeats), [r.name for r in repeats]


def paired_comparison(result: TrialResult, base: TrialResult | None, threshold: float,
                      rule: Callable[[list[float], float, float], Comparison | None] = paired_compare
                      ) -> Comparison | None:
    """The paired verdict from a result's raw blocks (per-token ratios), or None when it has no full round;
    `rule`: stats.paired_compare for a change, stats.aa_compare for the A/A comparison."""
    ratios = block_ratios(result.blocks)
    if not ratios:
        return None
    factor = _scale(result, base)
    confidence = EXTENDED_CONFIDENCE if result.timing.get("extended_after") else CONFIDENCE
    return rule([r * factor for r in ratios], threshold, confidence)


def measuring_threshold(results: list[TrialResult], context: DecisionContext = DecisionContext()) -> float:
    """The change a comparison must show on the A/A's resolution, known while the run goes on (the A/A runs
    before the changes): max(paired floor, resolution), or the floor alone without an A/A or in a run too noisy
    to decide on it. A change whose centre lies beyond it but whose interval does not is measured on."""
    resolution, _ = resolution_of(results, context)
    if resolution is None or resolution > NOISY_LIMIT:
        return context.paired_floor
    return max(context.paired_floor, resolution)


def resolution_of(results: list[TrialResult], context: DecisionContext) -> tuple[float | None, Comparison | None]:
    """The run's resolution: how far the A/A comparison's trimmed interval (the noise-probe's paired blocks
    against the baseline's, stats.aa_compare) reaches from 1; with that comparison, its verdict against the
    floor alone, so that two workers of one configuration that differ beyond the floor show as such (None,
    None: no paired A/A)."""
    probe = _probe(results)
    if probe is None:
        return None, None
    aa = paired_comparison(probe, reference(results), context.paired_floor, aa_compare)  # a bias shows
    return (None if aa is None else aa.reach), aa


def _probe(results: list[TrialResult]) -> TrialResult | None:
    probe = next((r for r in results if r.name == NOISE_PROBE and r.status in ("ok", "cancelled")), None)
    return probe if probe is not None and probe.design == "paired" else None


def pooled_resolution_of(results: list[TrialResult], aa: Comparison | None) -> float | None:
    """The A/A's resolution at the run's pooled noise (stats.pooled_resolution over the A/A's block ratios and
    those of every paired change that ran); None without an A/A interval, or when the A/A itself came out
    different (a bias between workers: its own resolution is what guards then)."""
    probe = _probe(results)
    if probe is None or aa is None or aa.low is None or aa.verdict in ("faster", "slower"):
        return None
    changes = [block_ratios(r.blocks) for r in results
               if r.stage in ("single", "combined") and r.status == "ok" and r.design == "paired"]
    return pooled_resolution(block_ratios(probe.blocks), changes)


def memory_binding(results: list[TrialResult], context: DecisionContext) -> tuple[bool, str]:
    base = reference(results)
    if context.objective == "memory":
        return True, "the objective is memory (--objective memory)"
    if base is None:
        return False, "no baseline"
    if base.status == "oom":
        return True, "the baseline ran out of memory within the budget"
    if context.budget_bytes and base.peak_memory_bytes:
        limit = context.budget_bytes * (1 - context.margin)
        used = base.peak_memory_bytes / context.budget_bytes
        if base.peak_memory_bytes > limit:
            return True, (f"the baseline peaks at {100 * used:.0f}% of the budget, above the "
                          f"{100 * (1 - context.margin):.0f}% the margin leaves")
        return False, (f"the baseline peaks at {format_bytes(base.peak_memory_bytes, 'GiB')} of "
                       f"{format_bytes(context.budget_bytes, 'GiB')} "
                       f"({100 * used:.0f}%): memory does not bind")
    return False, "memory does not bind (no budget figure)"


def trajectory_check(result: TrialResult, baseline: TrialResult | None, noise_deviation: float | None,
                     model_has_dropout: bool) -> Trajectory | None:
    """Classify a change by its training losses against the baseline's over the same steps, against the class
    its kind promises (``TrialResult.losses``)."""
    expected = result.trial_kind.losses
    if expected is None or baseline is None or not result.train_losses or not baseline.train_losses:
        return None
    steps = min(len(result.train_losses), len(baseline.train_losses))
    deviation = max(abs(a - b) / max(abs(b), 1e-12)
                    for a, b in zip(result.train_losses[:steps], baseline.train_losses[:steps]))
    measured = ("equivalent" if deviation <= EQUIVALENT_TOLERANCE else
                "close" if deviation <= CLOSE_TOLERANCE else "approximate")
    tolerance = {"equivalent": EQUIVALENT_TOLERANCE, "close": CLOSE_TOLERANCE}.get(expected)
    note = ""
    if model_has_dropout and result.trial_kind.redraws_dropout and tolerance is not None:
        # Dropout draws its masks per call: another batch split or kernel order draws other masks, so the
        # losses are equal in distribution only; the noise-probe (same model, windows reordered) says how far.
        tolerance = max(tolerance, CLOSE_TOLERANCE if noise_deviation is None else 2 * noise_deviation)
        note = "the model uses dropout, whose masks this change draws differently: compared with the noise-probe"
    defect = tolerance is not None and deviation > tolerance
    return Trajectory(expected, measured, deviation, steps, tolerance, defect, note)


def _quality_ok(result: TrialResult, trajectories: dict[str, Trajectory]) -> bool:
    if not result.quality_passed:
        return False
    check = trajectories.get(result.name)
    return not (check is not None and check.defect)


def _describe(result: TrialResult, comparison: Comparison | None, base_median: float | None,
              median: float | None) -> str:
    """'name: 455.3 ms/step vs the baseline's 470.2 ms (-3.2%, ...)'. A paired trial's two medians are those of
    its blocks and the baseline's blocks beside them (the baseline's own row was measured at another time, so
    its median would not match the change the blocks measured)."""
    if comparison is not None and comparison.design == "paired" and result.blocks:
        theirs = [t for block in result.blocks for t in block.get("baseline_s") or []]
        if result.step_times_s and theirs:  # a paired trial's step times are its blocks'
            median, base_median = statistics.median(result.step_times_s), statistics.median(theirs)
    if comparison is None or base_median is None or median is None:
        return result.name
    where = " beside it" if comparison.design == "paired" else ""
    return (f"{result.name}: {_ms(median)}/step vs the baseline's {_ms(base_median)}{where} "
            f"({comparison.pct:+.1f}%, {comparison.interval_text()})")


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"


def compare_to_baseline(result: TrialResult, base: TrialResult, decision: Decision) -> Comparison | None:
    """The trial against the baseline in the design it was measured in, with what decided its verdict."""
    if result.design != "paired":
        found = compare(_times(result, base), _times(base), decision.threshold, _median(result, base),
                        _median(base))
        return None if found is None else replace(found, evidence=SEQUENTIAL_THRESHOLD)
    found = paired_comparison(result, base, decision.paired_threshold)
    if found is None:
        return None
    if decision.resolution is None:
        return replace(found, evidence=PAIRED_FLOOR_ONLY)
    if found.verdict in ("faster", "slower") and not decision.noisy:
        return replace(found, evidence=AA_RESOLUTION)
    own = decision.own_threshold
    if own is not None and found.high is not None and found.low is not None:
        if found.high <= 1 - own:
            return replace(found, verdict="faster", threshold=own, evidence=OWN_INTERVAL)
        if found.low >= 1 + own:
            return replace(found, verdict="slower", threshold=own, evidence=OWN_INTERVAL)
    return replace(found, evidence=AA_RESOLUTION)


def decide(results: list[TrialResult], context: DecisionContext = DecisionContext()) -> Decision:
    """Every verdict, the combination's members and the recommendation, from the results alone."""
    base = reference(results)
    drift, sources = drift_estimate(results)
    threshold = max(context.floor, drift or 0.0)
    resolution, aa = resolution_of(results, context)
    pooled = pooled_resolution_of(results, aa) if base is not None and base.status == "ok" else None
    binds, why_memory = memory_binding(results, context)
    paired = any(r.design == "paired" for r in results)
    smallest = resolution if resolution is not None else None if paired else threshold
    decision = Decision(threshold=threshold, drift=drift, drift_sources=sources,
                        noisy=smallest is not None and smallest > NOISY_LIMIT, memory_binds=binds,
                        memory_reason=why_memory, resolution=resolution,
                        paired_threshold=max(context.paired_floor, resolution or 0.0), smallest_change=smallest,
                        pooled_resolution=pooled,
                        own_threshold=None if pooled is None else max(context.paired_floor, pooled))
    base_ok = base is not None and base.status == "ok"
    comparisons: dict[str, Comparison] = {} if aa is None else {NOISE_PROBE: aa}
    costs: dict[str, OneTimeCost] = {}
    for result in results:
        if result.stage not in ("single", "combined") or result.status != "ok" or not base_ok:
            continue
        comparison = compare_to_baseline(result, base, decision)
        if comparison is not None:
            comparisons[result.name] = comparison
            cost = one_time_costs(result, base, comparison)
            if cost is not None:
                costs[result.name] = cost
    probe = next((r for r in results if r.name == NOISE_PROBE), None)
    noise_dev = None
    if probe is not None and base is not None and probe.train_losses and base.train_losses:
        noise_dev = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(probe.train_losses, base.train_losses))
    checks = {r.name: trajectory_check(r, base, noise_dev, context.model_has_dropout) for r in results}
    decision = replace(decision, comparisons=comparisons, costs=costs,
                       trajectories={name: check for name, check in checks.items() if check is not None})
    decision = replace(decision, eligible=[r.name for r in results
                                           if r.stage == "single" and _eligible(r, decision, base_ok)])
    decision = replace(decision, combination=_combination(results, decision))
    source, reason = _recommend(results, decision, context)
    if context.objective == "time-to-quality":  # the time to the baseline's val loss decides (target.py)
        source, reason = recommend_by_target(results)
    return replace(decision, source=source, reason=reason)


def _worth_it(result: TrialResult, decision: Decision) -> bool:
    cost = decision.costs.get(result.name)
    return cost is None or cost.worth


def _eligible(result: TrialResult, decision: Decision, base_ok: bool) -> bool:
    if result.status != "ok" or not _quality_ok(result, decision.trajectories):
        return False
    if _kind(result) == "memory":
        return decision.memory_binds
    if not base_ok:  # nothing to be faster than: running within the budget is what counts
        return True
    comparison = decision.comparisons.get(result.name)
    return (comparison is not None and comparison.verdict == "faster"
            and (not decision.noisy or comparison.evidence == OWN_INTERVAL) and _worth_it(result, decision))


def _combination(results: list[TrialResult], decision: Decision) -> list[str]:
    """The eligible singles, one per group (the fastest of a group)."""
    chosen: dict[str, TrialResult] = {}
    base = reference(results)
    for result in results:
        if result.name not in decision.eligible:
            continue
        key = result.trial_kind.group or result.name
        best = chosen.get(key)
        if best is None or _speed(result, base, decision) < _speed(best, base, decision):
            chosen[key] = result
    return [r.name for r in chosen.values()]


def _speed(result: TrialResult, base: TrialResult | None, decision: Decision) -> float:
    """How fast a trial is for ranking: its compared ratio to the baseline, else its per-token median."""
    comparison = decision.comparisons.get(result.name)
    if comparison is not None:
        return comparison.ratio * (_median(base) or 1.0)
    median = _median(result, base)
    return median if median is not None else float("inf")


def _slower_than(combined: TrialResult, single: TrialResult, base: TrialResult | None,
                 decision: Decision) -> float | None:
    """The combined trial's change against the best single's when it is slower beyond doubt, else None."""
    mine, theirs = decision.comparisons.get(combined.name), decision.comparisons.get(single.name)
    if combined.design == "paired" and single.design == "paired" and mine is not None and theirs is not None:
        if mine.low is not None and theirs.high is not None and mine.low > theirs.high:
            return 100 * (mine.ratio / theirs.ratio - 1)
        return None
    versus = compare(_times(combined, base), _times(single, base), decision.threshold, _median(combined, base),
                     _median(single, base))
    return versus.pct if versus is not None and versus.verdict == "slower" else None


def _noise_text(decision: Decision, context: DecisionContext) -> str:
    if decision.resolution is not None:
        return (f"beyond what this run can resolve (the paired threshold ±{100 * decision.paired_threshold:.1f}%: "
                f"the A/A comparison's interval reaches {100 * decision.resolution:.1f}% from 1, floor "
                f"{100 * context.paired_floor:.1f}%)")
    designs = {comparison.design for name, comparison in decision.comparisons.items() if name != NOISE_PROBE}
    if designs == {"paired"}:  # the A/A comparison did not run: the paired floor alone
        return (f"beyond the paired threshold of ±{100 * decision.paired_threshold:.1f}% (the floor alone: the A/A "
                f"comparison did not run)")
    return (f"beyond the sequential threshold of ±{100 * decision.threshold:.1f}% (max of the "
            f"{100 * context.floor:.0f}% floor and the measured drift)")


def _evidence_text(decision: Decision, context: DecisionContext, comparison: Comparison | None) -> str:
    """Why a change called faster is beyond the noise, in the words of the evidence that called it."""
    if comparison is None or comparison.evidence != OWN_INTERVAL or decision.own_threshold is None:
        return _noise_text(decision, context)
    return (f"its own {100 * comparison.confidence:g}% interval wholly beyond what this run's pooled noise can "
            f"resolve ({100 * decision.own_threshold:.1f}%: the A/A comparison's interval at the spread of every paired "
            f"comparison of the run; the A/A's own interval reaches {100 * (decision.resolution or 0):.1f}% from 1)")


def _cost_text(name: str, cost: OneTimeCost) -> str:
    return (f"{name} is faster ({100 * (cost.ratio - 1):+.1f}% per step) but its one-time cost "
            f"({format_duration(cost.one_time_s)} of warm-up and setup) "
            f"exceeds what it saves over the workload ({format_duration(max(0.0, cost.saving_s))} of "
            f"{format_duration(cost.workload_s)})")


def _noisy_reason(decision: Decision) -> str:
    if decision.resolution is not None:
        return (f"the timings are too noisy to decide: changes under {100 * decision.resolution:.1f}% "
                f"could not be told from noise in this run (the A/A comparison; limit "
                f"{100 * NOISY_LIMIT:.0f}%), and no change's own interval lay wholly beyond the pooled "
                f"resolution{_pooled_figure(decision)}, so no change can be called faster; kept the baseline "
                f"(rerun on a quieter machine)")
    return (f"the timings are too noisy to decide: the baseline's own re-measurements drifted by "
            f"{100 * (decision.drift or 0):.1f}% (limit {100 * NOISY_LIMIT:.0f}%), so no change "
            f"can be called faster; kept the baseline (rerun on a quiet machine)")


def _pooled_figure(decision: Decision) -> str:
    if decision.own_threshold is None:
        return " (not measured: the A/A came out different or had too few rounds)"
    return f" ({100 * decision.own_threshold:.1f}%)"


def _combined_note(results: list[TrialResult], decision: Decision, candidates: list[TrialResult]
                   ) -> tuple[str, TrialResult | None]:
    """What the recommendation says of the combined trial, and the combined trial when it is a candidate."""
    base = reference(results)
    base_ok = base is not None and base.status == "ok"
    combined = next((r for r in results if r.stage == "combined"), None)
    if combined is not None and combined.status == "ok" and _quality_ok(combined, decision.trajectories):
        singles = [r for r in candidates if _median(r, base) is not None]
        best_single = min(singles, key=lambda r: _speed(r, base, decision), default=None)
        slower = None if best_single is None else _slower_than(combined, best_single, base, decision)
        vs_base = decision.comparisons.get(combined.name)
        if slower is not None and best_single is not None:
            return (f"; the combination ({_ms(_median(combined, base) or 0)}/step) was slower than "
                    f"{best_single.name} alone ({slower:+.1f}%)"), None
        trusted = vs_base is not None and vs_base.verdict == "faster" and (
            not decision.noisy or vs_base.evidence == OWN_INTERVAL)
        if base_ok and (decision.noisy or not decision.memory_binds) and not trusted:
            return "; the combination was not faster than the baseline beyond the noise", None
        if base_ok and not _worth_it(combined, decision):
            return "; " + _cost_text("the combination", decision.costs[combined.name]), None
        return "", combined
    if combined is not None and combined.status not in ("ok", "skipped"):
        return f"; the combination ended {combined.status}", None
    return "", None


def _nothing_faster(results: list[TrialResult], decision: Decision, context: DecisionContext,
                    combined_note: str) -> str:
    """Why the baseline stays when no candidate is left: the costs not earned back, or the noise."""
    by_name = {r.name: r for r in results}
    costly = [_cost_text(name, decision.costs[name]) for name, c in decision.comparisons.items()
              if c.verdict == "faster" and name in decision.costs and not decision.costs[name].worth]
    near = [(n, c) for n, c in decision.comparisons.items() if c.ratio < 1 and n in by_name
            and by_name[n].stage == "single" and c.verdict != "faster"]
    best = min(near, key=lambda item: item[1].ratio, default=None)
    hint = ""
    if best is not None:
        name, comparison = best
        hint = f"; the closest, {name}, is within the noise ({comparison.interval_text()})"
    memory = "" if decision.memory_binds else f"; memory savers not needed ({decision.memory_reason})"
    if costly:
        return f"no change earns its cost: {'; '.join(costly)}{memory}{combined_note}"
    if not [name for name in decision.comparisons if name != NOISE_PROBE]:
        return f"no change was compared with the baseline{memory}{combined_note}"
    return f"no change was faster {_noise_text(decision, context)}{hint}{memory}{combined_note}"


def _called_on_own_interval(result: TrialResult, decision: Decision) -> bool:
    comparison = decision.comparisons.get(result.name)
    return comparison is not None and comparison.verdict == "faster" and comparison.evidence == OWN_INTERVAL


def _recommend(results: list[TrialResult], decision: Decision, context: DecisionContext) -> tuple[str, str]:
    """The recommended trial and why, in one sentence with the numbers."""
    by_name = {r.name: r for r in results}
    base = reference(results)
    base_ok = base is not None and base.status == "ok"
    kept = base.name if base is not None else "baseline"
    if base is None or base.status == "cancelled":
        return kept, "nothing to recommend: the baseline was not measured (the run was interrupted before it finished)"
    if base.status in ("failed", "timeout"):
        return kept, f"nothing to recommend: the baseline ended {base.status} ({base.reason})"
    candidates = [by_name[name] for name in decision.eligible]
    if decision.noisy and base_ok:  # only a change called on its own interval stands in a run this noisy
        candidates = [r for r in candidates if _called_on_own_interval(r, decision)]
    combined_note, combined = _combined_note(results, decision, candidates)
    if decision.noisy and base_ok and not candidates and combined is None:
        return kept, _noisy_reason(decision)
    if combined is not None:
        candidates.append(combined)
    if not candidates:
        if base_ok:
            return kept, _nothing_faster(results, decision, context, combined_note)
        return kept, "nothing ran within the budget: this is the reference config, which does not fit either"
    winner = min(candidates, key=lambda r: _speed(r, base, decision))
    median = _median(winner, base)
    if decision.memory_binds and not base_ok:
        return winner.name, (f"{winner.name} is the fastest configuration that fits ({decision.memory_reason}): "
                             f"{_ms(median) if median else 'n/a'}/step{combined_note}")
    what = "the combination " + "+".join(decision.combination) if winner.stage == "combined" else winner.name
    cost = decision.costs.get(winner.name)
    paid = "" if cost is None else (f"; over the workload it saves {format_duration(max(0.0, cost.saving_s))} of "
                                    f"{format_duration(cost.workload_s)}, more than its one-time cost of "
                                    f"{format_duration(cost.one_time_s)}")
    described = _describe(winner, decision.comparisons.get(winner.name), _median(base), median)
    return winner.name, (f"{what} is the fastest measured configuration: {described.split(': ', 1)[-1]}, "
                         f"{_evidence_text(decision, context, decision.comparisons.get(winner.name))}, "
                         f"quality guard passed{paid}"
                         + (f"; memory binds ({decision.memory_reason})" if decision.memory_binds else "")
                         + combined_note)
