"""The decision rule: from trial results to a recommendation, as pure functions.

The runner (while the protocol runs: which changes go into the combined
trial) and ``kronos-tune report`` (afterwards, on any machine) call the same
functions, so a results.jsonl always yields the same recommendation.

The rule, in order:

1. Timing. Every trial's step times are compared with the baseline's as a
   ratio of medians with a 95 % bootstrap interval (``stats.compare``). A
   change is *faster* only when the interval lies below 1 and the ratio is
   beyond the threshold ``max(floor, drift)``; drift is how far the baseline's
   own re-measurements (noise-probe, interleaved drift checks,
   baseline-repeat) moved from the baseline. Past ``NOISY_LIMIT`` the machine
   is too noisy to decide and the baseline is kept.
2. Quality. A change must pass the validation-loss guard and its training
   losses must stay in the class its kind promises (equivalent, close,
   approximate: ``trajectory_check``); one that should be equivalent and is
   not is a defect and is left out.
3. Speed changes (AMP, TF32, compile, fused AdamW, loader workers, DDP) enter
   the combination only when faster. Memory changes (activation
   checkpointing, accumulation, autobatch, FSDP) only when memory binds: the
   baseline does not fit the budget with its margin, or the user asked for
   memory (``objective="memory"``).
4. The recommendation is the fastest measured configuration among the
   baseline, the eligible singles and the combined trial; the combined trial
   only when it is not slower than the best single; the baseline when
   nothing is faster beyond the noise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kronos_core.units import format_bytes
from kronos_tune.protocol.records import TrialResult
from kronos_tune.protocol.stats import Comparison, compare

SPEED_CHANGES = ("bf16", "fp16", "tf32", "compile", "compile-cudagraphs", "fused-adamw", "dataloader", "ddp")
MEMORY_CHANGES = ("checkpointing", "accumulation", "autobatch", "fsdp")
OPTIMIZATION_CHANGES = ("bigger-batch",)  # change what is trained: only when faster and passing the guard
BASELINE_REPEATS = ("noise-probe", "baseline-repeat")
DRIFT_STAGE = "drift"
OBJECTIVES = ("speed", "memory")
FLOOR = 0.03  # relative step-time change below which nothing is called faster or slower
NOISY_LIMIT = 0.25  # a threshold above this: the machine is too noisy to decide
DEFAULT_MARGIN = 0.10

# What each change promises about the training losses, step by step against the baseline's.
EXPECTED_CLASS = {
    "checkpointing": "equivalent", "accumulation": "equivalent", "autobatch": "equivalent",
    "dataloader": "equivalent", "ddp": "equivalent", "fsdp": "equivalent",
    "fused-adamw": "close", "compile": "close", "compile-cudagraphs": "close", "tf32": "close",
    "bf16": "approximate", "fp16": "approximate",
}
# Changes that split or reorder the random draws of dropout: equal only in distribution when the model drops out.
RNG_SENSITIVE = ("accumulation", "autobatch", "ddp", "fsdp", "compile", "compile-cudagraphs")
EQUIVALENT_TOLERANCE = 1e-4  # largest relative loss deviation that is float error
CLOSE_TOLERANCE = 2e-2


@dataclass(frozen=True)
class DecisionContext:
    """What the rule needs besides the results: the memory budget and the user's objective."""

    budget_bytes: int | None = None
    margin: float = DEFAULT_MARGIN
    objective: str = "speed"
    floor: float = FLOOR
    model_has_dropout: bool = False


@dataclass
class Decision:
    """The rule's answer. ``comparisons``: every timed trial against the baseline."""

    threshold: float
    drift: float | None
    drift_sources: list[str]
    noisy: bool
    memory_binds: bool
    memory_reason: str
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    trajectories: dict[str, dict[str, Any]] = field(default_factory=dict)
    eligible: list[str] = field(default_factory=list)
    combination: list[str] = field(default_factory=list)
    source: str = "baseline"
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["comparisons"] = {name: c.to_dict() for name, c in self.comparisons.items()}
        return out


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
    base = next((r for r in results if r.name == "baseline" and r.status == "ok"), None)
    reference = _median(base)
    if not reference:
        return None, []
    repeats = [r for r in results if (r.name in BASELINE_REPEATS or r.stage == DRIFT_STAGE) and r.status == "ok"
               and _median(r)]
    if not repeats:
        return None, []
    return max(abs(_median(r) / reference - 1) for r in repeats), [r.name for r in repeats]


def memory_binding(results: list[TrialResult], context: DecisionContext) -> tuple[bool, str]:
    base = next((r for r in results if r.name == "baseline"), None)
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
                     model_has_dropout: bool) -> dict[str, Any] | None:
    """Classify a change by its training losses against the baseline's over the same steps."""
    expected = EXPECTED_CLASS.get(result.name)
    if expected is None or baseline is None or not result.train_losses or not baseline.train_losses:
        return None
    steps = min(len(result.train_losses), len(baseline.train_losses))
    deviation = max(abs(a - b) / max(abs(b), 1e-12)
                    for a, b in zip(result.train_losses[:steps], baseline.train_losses[:steps]))
    measured = ("equivalent" if deviation <= EQUIVALENT_TOLERANCE else
                "close" if deviation <= CLOSE_TOLERANCE else "approximate")
    tolerance = {"equivalent": EQUIVALENT_TOLERANCE, "close": CLOSE_TOLERANCE}.get(expected)
    note = ""
    if model_has_dropout and result.name in RNG_SENSITIVE and tolerance is not None:
        # Dropout draws its masks per call: another batch split or kernel order draws other masks, so the
        # losses are equal in distribution only; the noise-probe (same model, windows reordered) says how far.
        tolerance = max(tolerance, CLOSE_TOLERANCE if noise_deviation is None else 2 * noise_deviation)
        note = "the model uses dropout, whose masks this change draws differently: compared with the noise-probe"
    defect = tolerance is not None and deviation > tolerance
    return {"expected": expected, "measured": measured, "max_rel_deviation": deviation, "steps": steps,
            "tolerance": tolerance, "defect": defect, "note": note}


def _quality_ok(result: TrialResult, trajectories: dict[str, dict[str, Any]]) -> bool:
    if result.quality is not None and not result.quality.get("passed", True):
        return False
    check = trajectories.get(result.name)
    return not (check and check["defect"])


def _describe(name: str, comparison: Comparison | None, base_median: float | None,
              median: float | None) -> str:
    if comparison is None or base_median is None or median is None:
        return name
    return (f"{name}: {_ms(median)}/step vs the baseline's {_ms(base_median)} ({comparison.pct:+.1f}%, "
            f"{comparison.interval_text()})")


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"


def decide(results: list[TrialResult], context: DecisionContext = DecisionContext()) -> Decision:
    """Every verdict, the combination's members and the recommendation, from the results alone."""
    by_name = {r.name: r for r in results}
    base = by_name.get("baseline")
    drift, sources = drift_estimate(results)
    threshold = max(context.floor, drift or 0.0)
    binds, why_memory = memory_binding(results, context)
    decision = Decision(threshold=threshold, drift=drift, drift_sources=sources, noisy=threshold > NOISY_LIMIT,
                        memory_binds=binds, memory_reason=why_memory)
    base_ok = base is not None and base.status == "ok"
    for result in results:
        if result.stage not in ("single", "combined") or result.status != "ok" or not base_ok:
            continue
        comparison = compare(_times(result, base), _times(base), threshold, _median(result, base), _median(base))
        if comparison is not None:
            decision.comparisons[result.name] = comparison
    probe = by_name.get("noise-probe")
    noise_dev = None
    if probe is not None and base is not None and probe.train_losses and base.train_losses:
        noise_dev = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(probe.train_losses, base.train_losses))
    for result in results:
        check = trajectory_check(result, base, noise_dev, context.model_has_dropout)
        if check is not None:
            decision.trajectories[result.name] = check
    decision.eligible = [r.name for r in results if r.stage == "single" and _eligible(r, decision, base_ok)]
    decision.combination = _combination(results, decision)
    _recommend(results, decision, context)
    return decision


def _eligible(result: TrialResult, decision: Decision, base_ok: bool) -> bool:
    if result.status != "ok" or not _quality_ok(result, decision.trajectories):
        return False
    if result.name in MEMORY_CHANGES:
        return decision.memory_binds
    if not base_ok:  # nothing to be faster than: running within the budget is what counts
        return True
    comparison = decision.comparisons.get(result.name)
    return comparison is not None and comparison.verdict == "faster" and not decision.noisy


def _group(result: TrialResult) -> str:
    if result.name in ("bf16", "fp16"):
        return "precision"
    if result.name in ("accumulation", "autobatch", "bigger-batch"):
        return "batch"
    if result.name in ("compile", "compile-cudagraphs"):
        return "compile"
    if result.name in ("ddp", "fsdp"):
        return "parallel"
    return result.name


def _combination(results: list[TrialResult], decision: Decision) -> list[str]:
    """The eligible singles, one per group (the fastest of a group)."""
    chosen: dict[str, TrialResult] = {}
    base = next((r for r in results if r.name == "baseline"), None)
    for result in results:
        if result.name not in decision.eligible:
            continue
        key = _group(result)
        best = chosen.get(key)
        if best is None or (_median(result, base) or float("inf")) < (_median(best, base) or float("inf")):
            chosen[key] = result
    return [r.name for r in chosen.values()]


def _recommend(results: list[TrialResult], decision: Decision, context: DecisionContext) -> None:
    by_name = {r.name: r for r in results}
    base = by_name.get("baseline")
    base_median = _median(base)
    base_ok = base is not None and base.status == "ok"
    pct = f"{100 * decision.threshold:.1f}%"
    if decision.noisy and base_ok:
        decision.source = "baseline"
        decision.reason = (f"the timings are too noisy to decide: the baseline's own re-measurements drifted by "
                           f"{100 * (decision.drift or 0):.1f}% (limit {100 * NOISY_LIMIT:.0f}%), so no change can "
                           f"be called faster; kept the baseline (rerun on a quiet machine)")
        return
    candidates = [by_name[name] for name in decision.eligible]
    combined = by_name.get("combined")
    combined_note = ""
    if combined is not None and combined.status == "ok" and _quality_ok(combined, decision.trajectories):
        singles = [r for r in candidates if _median(r, base) is not None]
        best_single = min(singles, key=lambda r: _median(r, base), default=None)
        vs_single = None
        if best_single is not None:
            vs_single = compare(_times(combined, base), _times(best_single, base), decision.threshold,
                                _median(combined, base), _median(best_single, base))
        vs_base = decision.comparisons.get("combined")
        if vs_single is not None and vs_single.verdict == "slower":
            combined_note = (f"; the combination ({_ms(_median(combined, base))}/step) was slower than "
                             f"{best_single.name} alone ({vs_single.pct:+.1f}%)")
        elif base_ok and not decision.memory_binds and (vs_base is None or vs_base.verdict != "faster"):
            combined_note = "; the combination was not faster than the baseline beyond the noise"
        else:
            candidates.append(combined)
    elif combined is not None and combined.status not in ("ok", "skipped"):
        combined_note = f"; the combination ended {combined.status}"
    if not candidates:
        if base_ok:
            decision.source = "baseline"
            near = [(n, c) for n, c in decision.comparisons.items() if c.ratio < 1 and n in by_name
                    and by_name[n].stage == "single"]
            best = min(near, key=lambda item: item[1].ratio, default=None)
            hint = ""
            if best is not None:
                name, comparison = best
                hint = (f"; the closest, {name} at {comparison.pct:+.1f}% ({comparison.interval_text()}), "
                        f"is within it")
            memory = "" if decision.memory_binds else f"; memory savers not needed ({decision.memory_reason})"
            decision.reason = (f"no change was faster beyond the noise threshold of {pct} (max of the {100 * context.floor:.0f}% "
                               f"floor and the measured drift){hint}{memory}{combined_note}")
        else:
            decision.source = "baseline"
            decision.reason = "nothing ran within the budget: this is the reference config, which does not fit either"
        return
    winner = min(candidates, key=lambda r: _median(r, base) if _median(r, base) is not None else float("inf"))
    decision.source = winner.name
    comparison = decision.comparisons.get(winner.name)
    if decision.memory_binds and not base_ok:
        decision.reason = (f"{winner.name} is the fastest configuration that fits ({decision.memory_reason}): "
                           f"{_ms(_median(winner, base)) if _median(winner, base) else 'n/a'}/step{combined_note}")
        return
    what = "the combination " + "+".join(decision.combination) if winner.name == "combined" else winner.name
    decision.reason = (f"{what} is the fastest measured configuration: "
                       f"{_describe(winner.name, comparison, base_median, _median(winner, base)).split(': ', 1)[-1]}, "
                       f"beyond the {pct} noise threshold, quality guard passed"
                       + (f"; memory binds ({decision.memory_reason})" if decision.memory_binds else "")
                       + combined_note)

