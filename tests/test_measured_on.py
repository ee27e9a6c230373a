"""A change whose rounds leave its verdict open when its budget is spent is measured on once, then judged on a 99%
interval: on constructed block ratios (the rule) and in decide() (what every view says). Two live workers going on
while the verdict is open: tests/test_benchmark_paired.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kronos_tune.benchmark.results import BenchmarkReport
from kronos_tune.benchmark.report.files import report_markdown
from kronos_tune.benchmark.report.shown import summarize
from kronos_tune.benchmark.run.paired import EXTENSION_FACTOR
from kronos_tune.benchmark.stats import EXTENDED_CONFIDENCE, paired_compare, verdict_open
from kronos_tune.benchmark.train.decide import decide, measuring_threshold
from kronos_tune.benchmark.train.text import evidence_line

from test_own_evidence import run_with, spread  # noqa: E402
from test_paired_rule import CONTEXT, GIB  # noqa: E402

THRESHOLD = 0.03


def test_a_verdict_is_open_only_where_the_centre_looks_like_a_change_the_interval_does_not_show() -> None:
    assert verdict_open(spread(10, 0.17, 0.90, seed=1), THRESHOLD)  # -10% with an interval across 1
    assert not verdict_open(spread(10, 0.02, 0.90, seed=1), THRESHOLD)  # shown: nothing to add
    assert not verdict_open(spread(10, 0.17, 0.995, seed=1), THRESHOLD)  # the centre within the threshold
    assert verdict_open(spread(10, 0.17, 1.12, seed=1), THRESHOLD)  # slower mirrored
    assert not verdict_open(spread(4, 0.17, 0.90, seed=1), THRESHOLD)  # too few rounds for an interval


def _measure(rng: np.random.Generator, effect: float, sd: float, confidence_after: float) -> str:
    """One change as the Interleaver measures it: 10 rounds; where they leave the verdict open, as many again
    twice over; the verdict at `confidence_after` for a change measured on."""
    draw = lambda rounds: list(np.exp(math.log(effect) + sd / math.sqrt(3) * rng.standard_t(3, rounds)))  # noqa: E731
    ratios, confidence = draw(10), 0.95
    if verdict_open(ratios, THRESHOLD):
        ratios += draw((EXTENSION_FACTOR - 1) * 10)
        confidence = confidence_after
    return paired_compare(ratios, THRESHOLD, confidence).verdict


def test_measuring_on_finds_more_real_changes_and_calls_no_more_null_ones() -> None:
    """1500 null changes and 300 real 13% speed-ups, heavy-tailed rounds as noisy as the quiet cpu run's planted
    trial (log sd 0.17). Measured on and judged at 99%, a null change is called no more often than with 10
    rounds alone (plus a draw's noise); two looks both at 95% would call more; the real change is found far more
    often than with 10 rounds."""
    def rate(effect: float, trials: int, confidence_after: float | None, seed: int) -> float:
        rng = np.random.default_rng(seed)
        if confidence_after is None:  # 10 rounds and no more
            return sum(paired_compare(list(np.exp(math.log(effect) + 0.17 / math.sqrt(3) * rng.standard_t(3, 10))),
                                      THRESHOLD).verdict in ("faster", "slower") for _ in range(trials)) / trials
        return sum(_measure(rng, effect, 0.17, confidence_after) in ("faster", "slower")
                   for _ in range(trials)) / trials

    plain_null, measured_on_null = rate(1.0, 1500, None, 3), rate(1.0, 1500, EXTENDED_CONFIDENCE, 3)
    assert measured_on_null <= plain_null + 0.02 and measured_on_null <= 0.08
    assert rate(1.0, 1500, 0.95, 3) >= measured_on_null + 0.005  # the same draws: the 99% pays for the second look
    found_plain, found_measured_on = rate(0.87, 300, None, 4), rate(0.87, 300, EXTENDED_CONFIDENCE, 4)
    assert found_plain < 0.9 and found_measured_on >= 0.9 and found_measured_on > found_plain + 0.1


def test_decide_judges_a_change_measured_on_at_99_percent_and_says_so(tmp_path: Path) -> None:
    ratios = spread(30, 0.10, 0.90, seed=9)
    results = run_with(spread(40, 0.03, 1.0, seed=8), ratios, others=1)
    change = next(r for r in results if r.name == "fused-adamw")
    change.timing = {"design": "paired", "stop": "extended", "extended_after": 10, "ci_halfwidth": 0.05}
    found = decide(results, CONTEXT).comparisons["fused-adamw"]
    expected = paired_compare(ratios, found.threshold, EXTENDED_CONFIDENCE)
    assert found.confidence == EXTENDED_CONFIDENCE and (found.low, found.high) == (expected.low, expected.high)
    assert found.interval_text().startswith("99% interval")
    # the same rounds not measured on keep the 95% interval, which is narrower
    change.timing = {"design": "paired", "stop": "budget", "ci_halfwidth": 0.05}
    plain = decide(results, CONTEXT).comparisons["fused-adamw"]
    assert plain.confidence == 0.95 and plain.low > found.low and plain.high < found.high
    change.timing = {"design": "paired", "stop": "extended", "extended_after": 10, "ci_halfwidth": 0.05}
    report = BenchmarkReport("cpu", "train", "cpu", "device: cpu", 8 * GIB, "simulated", trials=results,
                             out_dir=str(tmp_path))
    report.planned = [t.name for t in report.trials]
    report = summarize(report, None)
    said = "measured on after its first rounds left the verdict open, so judged on a 99% interval"
    assert said in (evidence_line(report) or "") and said in report_markdown(report)
    assert "extended = measured on because the first rounds left the verdict open" in report_markdown(report)


def test_the_threshold_while_measuring_is_the_one_the_a_a_sets() -> None:
    quiet = run_with(spread(40, 0.02, 1.0, seed=5), spread(10, 0.02, 0.95, seed=6), others=0)
    reach = decide(quiet, CONTEXT).resolution
    assert measuring_threshold(quiet, CONTEXT) == pytest.approx(max(0.02, reach))
    noisy = run_with(spread(14, 0.5, 1.0, seed=1), spread(10, 0.02, 0.95, seed=6), others=0)
    assert decide(noisy, CONTEXT).noisy and measuring_threshold(noisy, CONTEXT) == 0.02  # the floor alone
    alone = [r for r in quiet if r.name != "noise-probe"]
    assert measuring_threshold(alone, CONTEXT) == 0.02
