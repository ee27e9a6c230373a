"""The paired rule's two kinds of evidence on constructed block ratios (no training here): a change whose own interval
lies wholly beyond the run's pooled resolution is called on it, whatever one noisy A/A says; a null change with a
noisy A/A is not; a quiet run is decided as before; and every view says which evidence decided each verdict."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from kronos_tune.benchmark.results import TrialKind
from kronos_tune.benchmark.stats import aa_compare, paired_compare, pooled_resolution, trimmed_estimate
from kronos_tune.benchmark.train.decide import AA_RESOLUTION, OWN_INTERVAL, decide
from kronos_tune.benchmark.train.verdicts import Decision

from test_paired_rule import CONTEXT, GIB, STEP_S, _blocks, _from_ratios, _result  # noqa: E402


def spread(rounds: int, sd: float, centre: float = 1.0, seed: int = 0) -> list[float]:
    """`rounds` block ratios whose logs are the normal quantiles of `sd` around log(centre), in a seeded order."""
    logs = [math.log(centre) + sd * statistics.NormalDist().inv_cdf((i + 0.5) / rounds) for i in range(rounds)]
    random.Random(seed).shuffle(logs)
    return [math.exp(x) for x in logs]


# The run of issue 54: the A/A drew [0.63, 1.30] over 14 rounds, the truly faster change [0.76, 0.80] over 8.
NOISY_AA = spread(14, 0.50, 0.905, seed=1)
CLEAR = spread(8, 0.025, 0.778, seed=2)


def run_with(aa: list[float], change: list[float], others: int = 3, other_sd: float = 0.03) -> list:
    """The baseline, the A/A, `change` as fused-adamw, and `others` null speed changes of `other_sd` (a quick
    cpu run's other trials, none of them faster)."""
    results = _from_ratios(aa, change)
    for index in range(others):
        ratios = spread(10, other_sd, 1.0, seed=10 + index)
        results.append(_result(f"null-{index}", TrialKind("speed", f"null-{index}"), [STEP_S * r for r in ratios],
                               design="paired", blocks=_blocks(ratios)))
    return results


def test_the_pooled_resolution_is_the_a_a_interval_at_the_pooled_spread() -> None:
    alone = pooled_resolution(NOISY_AA, [])
    own = trimmed_estimate(NOISY_AA)
    assert alone == pytest.approx(own.high / own.ratio - 1, rel=1e-9)  # nothing pooled: the A/A's own half-width
    pooled = pooled_resolution(NOISY_AA, [CLEAR, spread(10, 0.03)])
    assert pooled < 0.6 * alone  # two quiet comparisons pool the A/A's burst of load down
    assert pooled_resolution(NOISY_AA[:5], [CLEAR]) is None  # too few A/A rounds for an interval
    assert pooled_resolution(NOISY_AA, [CLEAR[:5]]) == pytest.approx(alone, rel=1e-9)  # a set too short adds nothing


def test_a_clear_effect_with_a_noisy_a_a_is_called_faster_on_its_own_interval() -> None:
    aa = aa_compare(NOISY_AA, 0.02)
    assert aa.low == pytest.approx(0.63, abs=0.02) and aa.high == pytest.approx(1.30, abs=0.02)
    decision = decide(run_with(NOISY_AA, CLEAR), CONTEXT)
    assert decision.noisy and decision.resolution == pytest.approx(0.37, abs=0.02)  # the A/A alone: too noisy
    found = decision.comparisons["fused-adamw"]
    assert found.low == pytest.approx(0.76, abs=0.01) and found.high == pytest.approx(0.80, abs=0.01)
    assert found.verdict == "faster" and found.evidence == OWN_INTERVAL
    assert found.threshold == decision.own_threshold and decision.own_threshold < 1 - found.high
    assert decision.comparisons["noise-probe"].verdict not in ("faster", "slower")
    assert all(decision.comparisons[f"null-{i}"].verdict == "same" for i in range(3))
    assert decision.source == "fused-adamw" and decision.eligible == ["fused-adamw"]
    # both figures in the reason: what the change's own interval lies beyond, and the A/A's own reach
    assert f"what this run's pooled noise can resolve ({100 * decision.own_threshold:.1f}%" in decision.reason
    assert f"the A/A's own interval reaches {100 * decision.resolution:.1f}% from 1" in decision.reason


def test_a_null_change_with_a_noisy_a_a_stays_the_same_and_the_baseline_is_kept() -> None:
    decision = decide(run_with(NOISY_AA, spread(8, 0.03, 1.0, seed=4)), CONTEXT)
    assert decision.noisy and decision.comparisons["fused-adamw"].verdict in ("same", "unresolved")
    assert decision.comparisons["fused-adamw"].evidence == AA_RESOLUTION
    assert decision.source == "baseline" and decision.eligible == []
    assert f"changes under {100 * decision.resolution:.1f}% could not be told from noise" in decision.reason
    assert f"the pooled resolution ({100 * decision.own_threshold:.1f}%)" in decision.reason


def test_null_changes_beside_a_noisy_a_a_are_rarely_called_different() -> None:
    """400 runs of no effect at all: heavy-tailed rounds, an A/A four times as noisy as the change. Its own
    interval calls a null change different no more often than the 2.5% a side its 95% interval allows."""
    rng = np.random.default_rng(11)
    called = 0
    for _ in range(400):
        aa = list(np.exp(0.20 * rng.standard_t(3, 14)))
        change = list(np.exp(0.05 * rng.standard_t(3, 10)))
        called += decide(run_with(aa, change, others=2), CONTEXT).comparisons["fused-adamw"].verdict in (
            "faster", "slower")
    assert called / 400 <= 0.03


def test_a_quiet_run_is_decided_on_the_a_a_resolution_as_before() -> None:
    quiet_aa = spread(20, 0.012, 1.0, seed=5)
    effect = spread(12, 0.01, 0.95, seed=6)
    results = run_with(quiet_aa, effect, other_sd=0.012)
    decision = decide(results, CONTEXT)
    resolution = aa_compare(quiet_aa, 0.02).reach
    assert decision.resolution == pytest.approx(resolution) and resolution < 0.03 and not decision.noisy
    before = paired_compare(effect, max(0.02, resolution))  # the rule without its own-interval path
    found = decision.comparisons["fused-adamw"]
    assert (found.verdict, found.ratio, found.low, found.high, found.threshold) == (
        before.verdict, before.ratio, before.low, before.high, before.threshold)
    assert found.verdict == "faster" and found.evidence == AA_RESOLUTION
    assert all(decision.comparisons[f"null-{i}"].verdict == "same" for i in range(3))
    assert decision.source == "fused-adamw" and "beyond what this run can resolve" in decision.reason


def test_an_a_a_that_came_out_different_leaves_only_its_resolution_to_guard() -> None:
    biased = [1.06 * (1 + 0.004 * (i % 5 - 2)) for i in range(12)]  # two workers of one config 6% apart
    decision = decide(run_with(biased, spread(10, 0.005, 0.955, seed=7)), CONTEXT)
    assert decision.comparisons["noise-probe"].verdict == "slower" and decision.own_threshold is None
    found = decision.comparisons["fused-adamw"]
    assert found.high < 0.96 and found.verdict == "same" and found.evidence == AA_RESOLUTION  # the bias could be it
    assert decision.source == "baseline"


def test_every_view_says_which_evidence_decided_each_verdict(tmp_path: Path) -> None:
    from rich.console import Console

    from kronos_tune.benchmark import BenchmarkReport
    from kronos_tune.benchmark.report.shown import report_dict
    from kronos_tune.benchmark.report.files import report_markdown
    from kronos_tune.benchmark.report.shown import summarize
    from kronos_tune.commands.benchmark import render
    from kronos_tune.tui.model import answer_from
    from kronos_tune.tui.widgets.answer import AnswerPanel

    report = BenchmarkReport("cpu", "train", "cpu", "device: cpu", 8 * GIB, "simulated",
                             trials=run_with(NOISY_AA, CLEAR), out_dir=str(tmp_path))
    report.planned = [t.name for t in report.trials]
    report = summarize(report, None)
    decision = report.decision
    assert isinstance(decision, Decision)
    own = (f"fused-adamw faster: its own interval ({report.trial('fused-adamw').comparison.interval_text()[13:]}) "
           f"lies wholly beyond the pooled resolution {100 * decision.own_threshold:.1f}% (the A/A's own "
           f"{100 * decision.resolution:.1f}%)")
    null = f"null-0 same: not beyond the A/A's resolution {100 * decision.paired_threshold:.1f}%"
    markdown = report_markdown(report)
    assert own in markdown and null in markdown and "only changes called on their own interval stand" in markdown
    console = Console(record=True, width=400)
    render(console, report)
    text = console.export_text()
    assert f"verdicts: {own}" in text and null in text
    data = json.loads(json.dumps(report_dict(report)))
    assert data["timing"]["evidence"]["fused-adamw"] == OWN_INTERVAL
    assert data["timing"]["evidence"]["null-0"] == AA_RESOLUTION
    assert data["timing"]["own_threshold_pct"] == pytest.approx(100 * decision.own_threshold)
    rows = {t["name"]: t for t in data["trials"]}
    assert rows["fused-adamw"]["comparison"]["evidence"] == OWN_INTERVAL
    panel = AnswerPanel()
    panel._answer = answer_from(report)
    shown = "\n".join(line.plain for _, line in panel.lines(400))
    assert f"decided on their own interval {own}" in shown and null not in shown
