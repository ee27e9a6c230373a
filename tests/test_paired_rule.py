"""The paired design's statistics and decision on constructed block times (no training here): drift and a periodic
load cancel in paired block ratios and fool the sequential rule; one-time costs; old and newer result files."""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from kronos_tune.benchmark import Spread, TrialResult
from kronos_tune.benchmark.train.decide import DecisionContext, decide
from kronos_tune.benchmark.results import SCHEMA_VERSION, OtherSchema, TrialKind, untyped_kind
from kronos_tune.benchmark.stats import block_ratios, paired_compare, paired_estimate, signed_rank_cut

from test_report_cli import run_cli, write_gpu_run  # noqa: E402

GIB = 2**30
STEP_S = 0.5
Load = Callable[[float], float]


def linear_drift(t: float) -> float:
    return 1.0 + 0.004 * t  # +24% a minute: a machine warming up, a neighbour ramping up


def periodic(t: float) -> float:
    return 1.6 if (t % 20.0) < 10.0 else 1.0  # one core busy 10 s, idle 10 s


class Clock:
    """Step times of a simulated machine: STEP_S x the load at that moment x (1 - effect) x 1% noise."""

    def __init__(self, load: Load, seed: int) -> None:
        self.t, self.load, self.rng = 0.0, load, random.Random(seed)

    def steps(self, n: int, effect: float = 0.0) -> list[float]:
        out = []
        for _ in range(n):
            seconds = STEP_S * self.load(self.t) * (1 - effect) * (1 + self.rng.uniform(-0.01, 0.01))
            out.append(seconds)
            self.t += seconds
        return out


def _result(name: str, kind: TrialKind, times: list[float], stage: str = "single", **fields) -> TrialResult:
    result = TrialResult(name, stage, "ok", {}, step_time_s=Spread.of(times), step_times_s=list(times),
                         samples_per_s=Spread.of([16 / t for t in times]), peak_memory_bytes=GIB // 4, val_loss=2.0,
                         tokens_per_step=1600, config={"epochs": 2, "samples_per_epoch": 4096, "batch_size": 16},
                         **fields)
    result.set_kind(kind)
    return result


def paired_run(load: Load, effect: float, rounds: int = 16, seed: int = 1, steps: int = 1) -> list[TrialResult]:
    """The baseline's own row, then the noise-probe (A/A) and one speed change, each in alternating blocks (one
    step of about 0.5 s each, as on the cpu preset) with the baseline, in a seeded random order."""
    clock, order = Clock(load, seed), random.Random(seed + 1)
    base = _result("baseline", TrialKind("reference"), clock.steps(8), "baseline")
    trials = []
    for name, kind, planted in (("noise-probe", TrialKind("baseline-repeat"), 0.0),
                                ("fused-adamw", TrialKind("speed", "optimizer"), effect)):
        blocks = []
        for index in range(rounds):
            first = order.choice(["trial", "baseline"])
            times = {}
            for side in (first, "baseline" if first == "trial" else "trial"):
                times[side] = clock.steps(steps, planted if side == "trial" else 0.0)
            blocks.append({"round": index + 1, "first": first, "trial_s": times["trial"],
                           "baseline_s": times["baseline"]})
        times = [t for block in blocks for t in block["trial_s"]]
        trials.append(_result(name, kind, times, "baseline" if name == "noise-probe" else "single",
                              design="paired", blocks=blocks))
    return [base, *trials]


def sequential_run(load: Load, effect: float, seed: int = 1, steps: int = 12) -> list[TrialResult]:
    """The same machine, measured as the benchmark did before: baseline, noise-probe, the change, baseline-repeat,
    each for `steps` steps one after the other."""
    clock = Clock(load, seed)
    return [_result("baseline", TrialKind("reference"), clock.steps(steps), "baseline"),
            _result("noise-probe", TrialKind("baseline-repeat"), clock.steps(steps), "baseline", design="sequential"),
            _result("fused-adamw", TrialKind("speed", "optimizer"), clock.steps(steps, effect), design="sequential"),
            _result("baseline-repeat", TrialKind("baseline-repeat"), clock.steps(steps), "baseline",
                    design="sequential")]


CONTEXT = DecisionContext(budget_bytes=8 * GIB)


@pytest.mark.parametrize("load", [linear_drift, periodic], ids=["linear-drift", "periodic-load"])
def test_a_real_10pct_change_is_found_by_the_paired_rule_and_missed_by_the_sequential_one(load: Load) -> None:
    paired = decide(paired_run(load, 0.10), CONTEXT)
    assert paired.comparisons["fused-adamw"].verdict == "faster" and paired.source == "fused-adamw"
    assert paired.comparisons["fused-adamw"].ratio == pytest.approx(0.90, abs=0.02)
    assert paired.comparisons["noise-probe"].verdict == "same" and not paired.noisy
    assert paired.resolution is not None and paired.resolution < 0.05
    # the reason quotes the medians of the blocks (trial and baseline side by side), not the baseline's own row
    blocks = next(r for r in paired_run(load, 0.10) if r.name == "fused-adamw").blocks
    beside = statistics.median(t for block in blocks for t in block["baseline_s"])
    assert f"vs the baseline's {1000 * beside:.1f} ms beside it (-" in paired.reason
    sequential = decide(sequential_run(load, 0.10), CONTEXT)
    # the drift the re-measurements saw swamps the change: not called faster, or the whole run too noisy
    assert sequential.comparisons["fused-adamw"].verdict != "faster" or sequential.noisy
    assert sequential.source == "baseline"


def test_under_a_periodic_load_the_sequential_rule_sees_an_effect_that_is_not_there() -> None:
    """No effect at all; the baseline and the noise-probe were measured while the load ran, the change while it
    paused: their drift is small, the change looks 38% faster."""
    sequential = decide(sequential_run(periodic, 0.0, seed=3, steps=6)[:3], CONTEXT)  # no late baseline-repeat
    assert sequential.drift < 0.03 and sequential.comparisons["fused-adamw"].ratio < 0.7
    assert sequential.comparisons["fused-adamw"].verdict == "faster"  # a false positive
    paired = decide(paired_run(periodic, 0.0, seed=3), CONTEXT)
    assert paired.comparisons["fused-adamw"].verdict == "same" and paired.source == "baseline"
    assert "could not be told" not in paired.reason and "what this run can resolve" in paired.reason


def test_the_wilcoxon_cut_and_the_hodges_lehmann_centre() -> None:
    # two-sided 95% critical values of the signed-rank statistic (tables): n=6: 0, 7: 2, 8: 3, 10: 8, 20: 52
    assert [signed_rank_cut(n) for n in (5, 6, 7, 8, 10, 20)] == [None, 1, 3, 4, 9, 53]
    estimate = paired_estimate([0.9] * 5)  # too few pairs for a 95% interval
    assert estimate.ratio == pytest.approx(0.9) and estimate.low is None and math.isinf(estimate.halfwidth)
    ratios = [0.90, 0.91, 0.89, 0.90, 0.92, 0.88, 0.90, 0.91, 3.0, 0.2]  # two blocks hit by bursts
    found = paired_compare(ratios, 0.02)
    assert found.ratio == pytest.approx(0.90, abs=0.01) and found.high < 1 and found.verdict == "faster"
    assert found.design == "paired" and "Wilcoxon" in found.method
    assert block_ratios([{"trial_s": [1.0, 3.0, 2.0], "baseline_s": [4.0]}, {"trial_s": [], "baseline_s": [1.0]}]) \
        == [0.5]


def test_a_run_whose_resolution_is_past_25pct_is_too_noisy_and_says_the_figure() -> None:
    def wild(t: float) -> float:
        return 1.0 + 3.0 * abs(math.sin(37.1 * t * t))  # noise far beyond what blocks can pair away

    results = paired_run(wild, 0.10, rounds=8)
    decision = decide(results, CONTEXT)
    assert decision.resolution is not None and decision.resolution > 0.25 and decision.noisy
    assert decision.source == "baseline"
    assert f"changes under {100 * decision.resolution:.1f}% could not be told from noise" in decision.reason


def test_a_one_time_cost_above_the_saving_is_not_recommended_and_the_reason_has_both_numbers() -> None:
    results = paired_run(linear_drift, 0.10)
    compiled = results[-1]
    compiled.name, compiled.group, compiled.losses = "compile", "compile", "close"
    compiled.warmup_times_s = [60.0, 30.0, 10.0, STEP_S]  # compilation: 100 s before its first steady step
    results[0].warmup_times_s = [1.0, STEP_S]
    decision = decide(results, CONTEXT)
    costs = decision.costs["compile"]
    assert decision.comparisons["compile"].verdict == "faster" and not costs.worth
    # 2 x 4096 samples at 16 per 0.5 s step = 256 s of workload; 10% of it saved, ~99 s paid once
    assert costs.workload_s == pytest.approx(256, rel=0.05) and costs.saving_s == pytest.approx(25.6, rel=0.2)
    assert costs.one_time_s == pytest.approx(98.0, abs=1.0)
    assert decision.source == "baseline" and "compile" not in decision.eligible
    assert decision.reason.startswith("no change earns its cost: compile is faster (-10.")
    assert (f"its one-time cost ({costs.one_time_s:.1f} s of warm-up and setup) exceeds what it saves over the "
            f"workload ({costs.saving_s:.1f} s of 4.3 min)") in decision.reason
    longer = [r for r in results]
    for r in longer:
        r.config = {**r.config, "epochs": 100}  # a workload long enough earns the compilation back
    worth = decide(longer, CONTEXT)
    assert worth.source == "compile" and "more than its one-time cost of 9" in worth.reason


def test_kinds_come_from_the_results_and_other_schemas_are_refused() -> None:
    renamed = paired_run(linear_drift, 0.10)
    renamed[-1].name = "my-own-change"  # the rule reads the kind, not the name
    assert decide(renamed, CONTEXT).source == "my-own-change"
    saver = paired_run(linear_drift, 0.10)
    saver[-1].set_kind(TrialKind("memory", "checkpointing", "equivalent"))
    assert decide(saver, CONTEXT).eligible == []  # a memory saver, and memory does not bind
    assert untyped_kind("kv-cache", "single").kind == "speed"
    assert untyped_kind("recompute", "baseline").kind == "reference"
    with pytest.raises(OtherSchema, match=f"older than the {SCHEMA_VERSION}"):  # schema 2 wrote no version
        TrialResult.from_dict({"name": "checkpointing", "stage": "single", "status": "ok"})
    with pytest.raises(OtherSchema, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        TrialResult.from_dict({"name": "x", "stage": "single", "status": "ok", "schema_version": SCHEMA_VERSION + 1})


V3_KEYS = ("kind", "group", "losses", "redraws_dropout", "design", "design_reason", "blocks", "setup_costs_s",
           "schema_version")


def _as_schema(line: dict, schema: str) -> dict:
    if schema == "earlier":  # as schema 2 wrote it: no v3 keys at all
        return {key: value for key, value in line.items() if key not in V3_KEYS}
    return {**line, "schema_version": SCHEMA_VERSION + 1}


@pytest.mark.parametrize("schema, said", [
    ("earlier", f"line 1 has results of schema version none (before 3), older than the {SCHEMA_VERSION}"),
    ("newer", f"line 1 has results of schema version {SCHEMA_VERSION + 1}, newer than the {SCHEMA_VERSION}"),
])
def test_report_refuses_a_results_file_of_another_schema_in_one_line(tmp_path: Path, schema: str, said: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = write_gpu_run(tmp_path / "run")
    lines = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    (run / "results.jsonl").write_text("".join(json.dumps(_as_schema(line, schema)) + "\n" for line in lines))
    code, _, err = run_cli(["report", str(run)], capsys)
    assert code == 2
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert said in line
    assert ("run the benchmark again" if schema == "earlier" else "upgrade kronos-tune") in line


def test_the_resolution_is_stated_in_the_report_the_terminal_and_the_dashboard(tmp_path: Path) -> None:
    from rich.console import Console

    from kronos_tune.commands.benchmark import render
    from kronos_tune.benchmark import BenchmarkReport
    from kronos_tune.benchmark.report.files import report_markdown
    from kronos_tune.benchmark.report.shown import summarize
    from kronos_tune.tui.model import answer_from
    from kronos_tune.tui.widgets.answer import AnswerPanel

    report = BenchmarkReport("cpu", "train", "cpu", "device: cpu", 8 * GIB, "simulated",
                            trials=paired_run(periodic, 0.10), out_dir=str(tmp_path))
    report.planned = [t.name for t in report.trials]
    report = summarize(report, None)
    figure = report.timing["resolution_pct"]
    line = f"changes under {figure:.1f}% could not be told from noise in this run"
    assert line in report_markdown(report)
    console = Console(record=True, width=200)
    render(console, report)
    assert line in console.export_text()
    panel = AnswerPanel()
    panel._answer = answer_from(report)
    assert line in "\n".join(text.plain for _, text in panel.lines(160))
    assert report.recommended.source == "fused-adamw"


def test_the_order_is_counterbalanced_so_a_slow_second_block_is_charged_to_neither_side() -> None:
    from itertools import islice

    from kronos_tune.benchmark.run.order import trial_leads

    leads = list(islice(trial_leads("100:noise-probe"), 39))
    assert leads == list(islice(trial_leads("100:noise-probe"), 39))  # seeded: the run can be repeated
    assert all(abs(2 * sum(leads[:n]) - n) <= 1 for n in range(len(leads) + 1))  # every prefix balanced
    assert {(leads[i], leads[i + 1]) for i in range(0, 38, 2)} == {(True, False), (False, True)}  # still random

    coin = random.Random("100:noise-probe")  # the order before: a coin per round, which led 25 of these 39 rounds
    coins = [coin.random() < 0.5 for _ in range(39)]
    assert sum(coins) == 25

    def aa_centre(order: list[bool], seed: int) -> float:
        """An A/A comparison where the block run second in a round is 1.5% slow (it follows the other worker's)."""
        rng, blocks = random.Random(seed), []
        for index, trial_first in enumerate(order):
            trial, base = (STEP_S * rng.gauss(1.0, 0.01) for _ in range(2))
            if trial_first:
                base *= 1.015
            else:
                trial *= 1.015
            blocks.append({"round": index + 1, "first": "trial" if trial_first else "baseline",
                           "trial_s": [trial], "baseline_s": [base]})
        return paired_estimate(block_ratios(blocks)).ratio - 1

    uneven = statistics.mean(aa_centre(coins, seed) for seed in range(40))
    even = statistics.mean(aa_centre(leads, seed) for seed in range(40))
    assert uneven < -0.003  # about -0.4%: the same bias in every run with that seed
    assert abs(even) < 0.001


def test_an_a_a_comparison_past_the_floor_is_said_in_the_timing_section() -> None:
    from kronos_tune.benchmark import BenchmarkReport
    from kronos_tune.benchmark.results import NOISE_PROBE
    from kronos_tune.benchmark.stats import Comparison
    from kronos_tune.benchmark.train.text import timing_lines
    from kronos_tune.benchmark.train.verdicts import Decision

    probe = TrialResult(NOISE_PROBE, "baseline", "ok", {}, None, "", task="train")
    decision = Decision(threshold=0.03, drift=None, drift_sources=[], noisy=False, memory_binds=False,
                        memory_reason="", resolution=0.04)
    report = BenchmarkReport("cpu", "train", "cpu", "device: cpu", 8 * GIB, "simulated", trials=[probe],
                            timing={"rule": "paired"}, decision=decision)
    for verdict, said in (("slower", True), ("same", False)):
        probe.comparison = Comparison(1.04, 1.01, 1.07, 0.02, verdict, 20, 20, "hodges-lehmann", "paired")
        lines = timing_lines(report)
        assert any("The A/A comparison itself came out slower (+4.0%)" in line for line in lines) is said


def _blocks(ratios: list[float]) -> list[dict]:
    """One round per ratio: a one-step trial block of STEP_S x ratio beside a one-step baseline block."""
    return [{"round": index + 1, "first": "trial" if index % 2 else "baseline", "trial_s": [STEP_S * ratio],
             "baseline_s": [STEP_S]} for index, ratio in enumerate(ratios)]


def _from_ratios(aa: list[float], change: list[float]) -> list[TrialResult]:
    base = _result("baseline", TrialKind("reference"), [STEP_S] * 8, "baseline")
    probe = _result("noise-probe", TrialKind("baseline-repeat"), [STEP_S * r for r in aa], "baseline",
                    design="paired", blocks=_blocks(aa))
    trial = _result("fused-adamw", TrialKind("speed", "optimizer"), [STEP_S * r for r in change],
                    design="paired", blocks=_blocks(change))
    return [base, probe, trial]


# An A/A under a periodic load: ten rounds spread as normal quantiles of sd 0.12 in log, then one round 1.82x.
SPREAD = [0.12 * statistics.NormalDist().inv_cdf((i + 0.5) / 9) for i in range(9)]
LOADED_AA = [math.exp(x) for x in SPREAD]
EFFECT = [0.82, 0.83, 0.825, 0.84, 0.835, 0.845, 0.83, 0.84, 0.85, 0.835]  # 16.5% faster, a tight interval


@pytest.mark.parametrize("outlier", [1.82, 0.52], ids=["slow-round", "fast-round"])
def test_one_outlying_a_a_round_neither_erases_a_measured_effect_nor_makes_the_a_a_differ(outlier: float) -> None:
    aa = LOADED_AA + [outlier]
    # the signed-rank interval: under the five-sigma rule the round stays, and with 10 rounds (cut 9 < 10) its
    # Walsh averages carry the interval's edge past 20%: before, the 16.5% effect was erased (past 25% with the
    # slow round: the whole run read as too noisy)
    assert paired_compare(aa, 0.02).reach > 0.2
    decision = decide(_from_ratios(aa, EFFECT), CONTEXT)
    assert decision.resolution is not None and decision.resolution < 0.15 and not decision.noisy
    assert decision.comparisons["noise-probe"].verdict not in ("faster", "slower")
    found = decision.comparisons["fused-adamw"]
    assert found.verdict == "faster" and found.ratio == pytest.approx(0.835, abs=0.005)
    assert decision.source == "fused-adamw"
    assert "Tukey-McLaughlin" in decision.comparisons["noise-probe"].method
    # the outlier moves the resolution no further than any other round at that end would
    assert decide(_from_ratios(LOADED_AA + [max(LOADED_AA) if outlier > 1 else min(LOADED_AA)], EFFECT),
                  CONTEXT).resolution == pytest.approx(decision.resolution, rel=1e-9)


def test_a_bias_between_the_workers_still_shows_past_one_outlying_round() -> None:
    biased = [1.06 * (1 + 0.004 * (i % 5 - 2)) for i in range(11)] + [2.5]
    decision = decide(_from_ratios(biased, EFFECT), CONTEXT)
    assert decision.comparisons["noise-probe"].verdict == "slower"  # two workers of one config differ by 6%
    assert decision.comparisons["noise-probe"].ratio == pytest.approx(1.06, abs=0.005)
    assert decision.resolution == pytest.approx(decision.comparisons["noise-probe"].reach)
    assert decision.resolution > 0.06  # no change smaller than the bias is called faster


@pytest.mark.parametrize("rounds", [10, 23])
def test_the_a_a_interval_keeps_its_coverage_with_heavy_tailed_noise(rounds: int) -> None:
    """A/As of identical workers with Student-t (3 df) noise: the trimmed interval covers "no change" about 95%
    of the time and calls the A/A different about 5% of the time, no more."""
    import numpy as np

    from kronos_tune.benchmark.stats import aa_compare

    rng = np.random.default_rng(7)
    found = [aa_compare(list(np.exp(0.05 * rng.standard_t(3, rounds))), 0.02) for _ in range(400)]
    covered = sum(c.low < 1 < c.high for c in found) / len(found)
    different = sum(c.verdict in ("faster", "slower") for c in found) / len(found)
    assert 0.92 <= covered <= 0.985 and different <= 0.06
