"""Timing statistics and the decision rule on constructed results (no training here)."""

from __future__ import annotations

import math
import random

import pytest

from kronos_tune.benchmark import Spread, TrialResult
from kronos_tune.benchmark.train.decide import DecisionContext, decide, trajectory_check
from kronos_tune.benchmark.stats import compare, median_ci, ratio_ci, relative_halfwidth, trimmed_estimate, verdict
from planned import with_planned_kind

GIB = 2**30


def _times(median: float, n: int = 20, jitter: float = 0.01, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [median * (1 + rng.uniform(-jitter, jitter)) for _ in range(n)]


def _trial(name: str, times: list[float], stage: str = "single", peak: int = GIB, val: float = 2.0,
           changes: dict | None = None, status: str = "ok", losses: list[float] | None = None,
           kept_samples: bool = True) -> TrialResult:
    return with_planned_kind(TrialResult(
        name, stage, status, changes or {}, step_time_s=Spread.of(times) if times else None, peak_memory_bytes=peak,
        val_loss=val, step_times_s=list(times) if kept_samples else [], train_losses=losses or [7.0, 6.9, 6.8, 6.7],
        config={"model_size": "tiny"}))


# Statistics ------------------------------------------------------------------------------------------------

def test_median_interval_uses_order_statistics_and_ignores_one_outlier() -> None:
    assert median_ci([1.0, 2.0, 3.0]) == (1.0, 3.0)  # too few samples for 95%: the range
    samples = [50.0 + 0.1 * i for i in range(19)] + [200.0]
    low, high = median_ci(samples)
    assert 50.0 < low < high < 52.0  # the 200 ms step is outside the interval
    assert relative_halfwidth(samples) < 0.02


def test_ratio_interval_is_deterministic_and_covers_the_true_ratio() -> None:
    a, b = _times(0.9, seed=1), _times(1.0, seed=2)
    first, second = ratio_ci(a, b), ratio_ci(a, b)
    assert first == second
    ratio, low, high = first
    assert low < 0.9 < high and low < ratio < high and high < 1.0


def test_verdicts_need_the_interval_and_the_threshold() -> None:
    assert verdict(0.90, 0.88, 0.92, 0.03) == "faster"
    assert verdict(0.98, 0.97, 0.99, 0.03) == "same"  # real but below the threshold
    assert verdict(0.90, 0.80, 1.01, 0.03) == "same"  # the interval reaches 1
    assert verdict(0.90, 0.60, 1.40, 0.03) == "unresolved"
    assert verdict(1.33, 1.25, 1.40, 0.03) == "slower"
    assert verdict(0.90, None, None, 0.12) == "same"  # medians only: the ratio against the threshold
    assert compare(None, None, 0.03) is None


# The decision rule --------------------------------------------------------------------------------------

def _around(values: list[float], n: int, seed: int) -> list[float]:
    """`n` samples spread like `values` (n=4: the values themselves)."""
    if n == len(values):
        return list(values)
    rng = random.Random(seed)
    return [rng.choice(values) * (1 + rng.uniform(-0.005, 0.005)) for _ in range(n)]


def h200_like_results(n: int = 4, outlier: bool = True) -> list[TrialResult]:
    """The shape of the rtx3080 run on an H200: the baseline's steps 51, 52, 52 ms and one of 198 ms, memory far
    from binding (2.03 of 11.5 GiB), checkpointing +33%, accumulation +72%, compile -10%, the combined +156%."""
    base_times = _around([0.0515, 0.0518, 0.0520, 0.0521], n, 1)
    if outlier:
        base_times[-1] = 0.198
    mib = 2**20
    return [
        _trial("baseline", base_times, "baseline", peak=2080 * mib),
        _trial("noise-probe", _around([0.0431, 0.0455, 0.0460, 0.0488], n, 2), "baseline", peak=2080 * mib),
        _trial("bf16", _around([0.0466, 0.0480, 0.0495, 0.0587], n, 3), peak=1650 * mib, changes={"amp": "bf16"}),
        _trial("checkpointing", _around([0.0634, 0.0680, 0.0700, 0.0729], n, 4), peak=703 * mib,
               changes={"activation_checkpointing": "all"}),
        _trial("accumulation", _around([0.0865, 0.0880, 0.0900, 0.0931], n, 5), peak=1320 * mib,
               changes={"batch_size": 25, "accumulation_steps": 2}),
        _trial("compile", _around([0.0462, 0.0464, 0.0466, 0.0466], n, 6), peak=1720 * mib,
               changes={"compile": "default"}),
        _trial("dataloader", _around([0.0504, 0.0505, 0.0509, 0.0558], n, 7), peak=2080 * mib,
               changes={"num_workers": 2}),
        _trial("baseline-repeat", _around([0.0531, 0.0538, 0.0544, 0.0574], n, 8), "baseline", peak=2080 * mib),
        _trial("combined", _around([0.1287, 0.1320, 0.1338, 0.1435], n, 9), "combined", peak=646 * mib,
               changes={"batch_size": 25, "accumulation_steps": 2, "amp": "bf16",
                        "activation_checkpointing": "all", "compile": "default"}),
    ]


@pytest.mark.parametrize("n, kept_samples", [(4, False), (4, True), (20, True)])
def test_an_outlier_baseline_step_no_longer_admits_slower_changes(n: int, kept_samples: bool) -> None:
    results = h200_like_results(n)
    if not kept_samples:  # results written before raw step times were kept: medians only
        for result in results:
            result.step_times_s = []
    decision = decide(results, DecisionContext(budget_bytes=round(11.5 * GIB)))
    assert not decision.memory_binds and "does not bind" in decision.memory_reason
    # 4 samples with a 4x outlier cannot bound a ratio both ways; with 20, or from the medians, it is "slower"
    expected = {"unresolved", "slower"} if (n, kept_samples) == (4, True) else {"slower"}
    for name in ("checkpointing", "accumulation", "combined"):
        assert decision.comparisons[name].verdict in expected, name
    assert "checkpointing" not in decision.combination and "accumulation" not in decision.combination
    assert decision.source in ("baseline", "compile")
    by_name = {r.name: r for r in results}
    assert by_name[decision.source].step_time_s.median <= by_name["baseline"].step_time_s.median
    assert decision.drift == pytest.approx(1 - by_name["noise-probe"].step_time_s.median /
                                           by_name["baseline"].step_time_s.median)
    assert decision.threshold == decision.drift  # 11.6% drift, above the 3% floor
    assert any(ch.isdigit() for ch in decision.reason)  # the why carries its numbers


def test_memory_changes_enter_only_when_memory_binds() -> None:
    results = h200_like_results(outlier=False)
    results = [r for r in results if r.name != "combined"]
    tight = decide(results, DecisionContext(budget_bytes=2200 * 2**20))  # 2.03 GiB of 2.15: above 90%
    assert tight.memory_binds
    assert "checkpointing" in tight.eligible and "accumulation" in tight.eligible
    loose = decide(results, DecisionContext(budget_bytes=round(11.5 * GIB)))
    assert "checkpointing" not in loose.eligible
    asked = decide(results, DecisionContext(budget_bytes=round(11.5 * GIB), objective="memory"))
    assert asked.memory_binds and "checkpointing" in asked.eligible
    base_oom = [_trial("baseline", [], "baseline", status="oom")] + results[1:]
    decision = decide(base_oom, DecisionContext(budget_bytes=GIB))
    assert decision.memory_binds and decision.source != "baseline"


def test_a_faster_change_wins_and_a_slower_combination_loses_to_the_best_single() -> None:
    results = [_trial("baseline", _times(1.0, seed=1), "baseline"),
               _trial("noise-probe", _times(1.01, seed=2), "baseline"),
               _trial("bf16", _times(0.70, seed=3), changes={"amp": "bf16"}),
               _trial("fused-adamw", _times(0.90, seed=4), changes={"optimizer_impl": "fused"}),
               _trial("checkpointing", _times(1.3, seed=5), changes={"activation_checkpointing": "all"}),
               _trial("baseline-repeat", _times(0.99, seed=6), "baseline"),
               _trial("combined", _times(0.80, seed=7), "combined")]
    decision = decide(results, DecisionContext(budget_bytes=10 * GIB))
    assert decision.combination == ["bf16", "fused-adamw"]
    assert decision.source == "bf16"  # the combination (0.80) is slower than bf16 alone (0.70)
    assert "slower than bf16 alone" in decision.reason
    results[-1] = _trial("combined", _times(0.62, seed=8), "combined")
    assert decide(results, DecisionContext(budget_bytes=10 * GIB)).source == "combined"


def test_drift_beyond_the_limit_keeps_the_baseline_and_says_so() -> None:
    results = [_trial("baseline", _times(1.0, seed=1), "baseline"),
               _trial("noise-probe", _times(1.6, seed=2), "baseline"),
               _trial("bf16", _times(0.7, seed=3), changes={"amp": "bf16"}),
               _trial("drift-1", _times(0.9, seed=4), "drift"),
               _trial("baseline-repeat", _times(1.1, seed=5), "baseline")]
    decision = decide(results)
    assert decision.noisy and decision.drift == pytest.approx(0.6, rel=0.05)
    assert decision.source == "baseline" and "too noisy" in decision.reason
    quiet = decide(results[:1] + results[2:])  # without the 60% repeat: 10% drift, bf16 is 30% faster
    assert not quiet.noisy and quiet.source == "bf16"


def test_quality_failures_and_defects_are_left_out() -> None:
    base = _trial("baseline", _times(1.0, seed=1), "baseline")
    fast = _trial("fused-adamw", _times(0.7, seed=2), changes={"optimizer_impl": "fused"})
    fast.quality = {"passed": False}
    defect = _trial("checkpointing", _times(0.7, seed=3), losses=[7.0, 6.95, 6.85, 6.75],
                    changes={"activation_checkpointing": "all"})
    decision = decide([base, fast, defect], DecisionContext(objective="memory"))
    assert decision.trajectories["checkpointing"].defect
    assert decision.source == "baseline" and decision.eligible == []


def test_trajectory_classes() -> None:
    base = _trial("baseline", [1.0], "baseline", losses=[7.0, 6.5, 6.0])
    same = _trial("accumulation", [1.0], losses=[7.0, 6.5 * (1 + 1e-6), 6.0])
    check = trajectory_check(same, base, None, model_has_dropout=False)
    assert check.measured == "equivalent" and not check.defect and check.steps == 3
    drifted = _trial("accumulation", [1.0], losses=[7.0, 6.52, 6.03])
    assert trajectory_check(drifted, base, None, model_has_dropout=False).defect
    # with dropout, splitting the batch draws other masks: compared with the noise-probe's deviation
    assert not trajectory_check(drifted, base, 0.004, model_has_dropout=True).defect
    approx = _trial("bf16", [1.0], losses=[7.0, 6.8, 6.3])
    assert trajectory_check(approx, base, None, False).measured == "approximate"
    assert not trajectory_check(approx, base, None, False).defect


def test_the_trimmed_interval_is_tukey_mclaughlin_by_hand() -> None:
    # ten log ratios (given unsorted): two trimmed at each end, the winsorized ones clipped to the 3rd and the 8th,
    # Student's t with 10 - 4 - 1 = 5 degrees of freedom (tables: 2.571 two-sided at 95%)
    logs = [0.03, -0.30, 0.40, -0.02, 0.10, 0.0, -0.12, 0.06, 0.01, -0.05]
    ordered = sorted(logs)
    kept = ordered[2:8]
    winsorized = [ordered[2]] * 2 + kept + [ordered[7]] * 2
    mean = sum(winsorized) / 10
    error = math.sqrt(sum((w - mean) ** 2 for w in winsorized) / 9) / (0.6 * math.sqrt(10))
    found = trimmed_estimate([math.exp(x) for x in logs])
    centre = sum(kept) / 6
    assert math.log(found.ratio) == pytest.approx(centre, abs=1e-12)
    assert math.log(found.high) - centre == pytest.approx(2.571 * error, rel=1e-3)
    assert centre - math.log(found.low) == pytest.approx(2.571 * error, rel=1e-3)
