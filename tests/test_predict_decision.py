"""The predict task's decision rule and recommended settings on constructed results (no prediction here)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from kronos_tune.predict.config_file import read_predict_file
from kronos_tune.benchmark.predict.decide import decide_predict
from kronos_tune.benchmark.predict.summary import recommended_predict_toml, summarize_predict
from kronos_tune.benchmark.results import BenchmarkReport, Spread, TrialResult

SERIES = 100


def _times(seconds: float, n: int = 5, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [seconds * (1 + rng.uniform(-0.01, 0.01)) for _ in range(n)]


def _trial(name: str, seconds: float | None, *, diff: float | None = 0.0, spearman: float | None = None,
           status: str = "ok", stage: str = "single", seed: int = 0, **config: object) -> TrialResult:
    times = _times(seconds, seed=seed) if seconds else []
    settings = {"model_size": "mini", "lookback": 400, "pred_len": 30, "sample_count": 1, "series_count": SERIES,
                "measured_series": SERIES, "use_cache": name != "recompute", "amp": "none", "max_batch_size": None,
                "devices": 1, "seed": 100, **config}
    quality = None if spearman is None else {"spearman": spearman, "series": SERIES, "measure": "rank agreement",
                                             "reference": "recompute"}
    return TrialResult(name, stage, status, task="predict", step_times_s=times,
                       series_per_s=Spread.of([SERIES / t for t in times]), output_max_abs_diff=diff,
                       quality=quality, config=settings)


def _trials(bf16_spearman: float = 0.99, bf16_seconds: float = 1.5) -> list[TrialResult]:
    # the reference times 10 of the 100 series: 0.2 s a series against kv-cache's 0.02
    return [_trial("recompute", 2.0, diff=None, stage="baseline", seed=1, measured_series=10),
            _trial("kv-cache", 2.0, spearman=1.0, seed=2),
            _trial("bf16", bf16_seconds, diff=0.4, spearman=bf16_spearman, seed=3, amp="bf16"),
            _trial("autobatch", 2.0, spearman=1.0, seed=4, max_batch_size=64)]


def test_the_fastest_setting_that_keeps_its_class_is_recommended() -> None:
    decision = decide_predict(_trials(), threshold=0.03)
    assert decision.source == "bf16"
    kv = decision.verdicts["kv-cache"]
    assert kv.reference == "recompute" and kv.exactness == "exact" and kv.eligible
    assert kv.vs_reference.verdict == "faster" and kv.vs_reference.ratio == pytest.approx(0.1, rel=0.03)
    bf16 = decision.verdicts["bf16"]
    assert bf16.reference == "kv-cache" and bf16.exactness == "approximate" and bf16.eligible
    assert bf16.quality.passed and "Spearman 0.990 >= 0.95 over 100 series" in bf16.quality.text
    same = decision.verdicts["autobatch"]  # as fast as kv-cache: exact, but not faster than its reference
    assert not same.eligible and same.vs_reference.verdict == "same" and same.why.startswith("as fast as kv-cache (")
    assert decision.reason.startswith("13.3") and "the series/s of recompute, 1.34x (95% interval" in decision.reason
    assert "also eligible but slower: kv-cache" in decision.reason


def test_an_approximate_setting_below_the_users_spearman_is_left_out() -> None:
    decision = decide_predict(_trials(bf16_spearman=0.90), threshold=0.03)
    assert decision.source == "kv-cache"
    assert not decision.verdicts["bf16"].eligible
    assert "Spearman 0.900 < 0.95 over 100 series" in decision.verdicts["bf16"].why
    assert "identical greedy output to recompute's over 100 series" in decision.reason
    assert decide_predict(_trials(bf16_spearman=0.90), threshold=0.03, min_spearman=0.85).source == "bf16"


def test_an_exact_setting_whose_output_differs_is_a_defect_and_nothing_faster_keeps_the_reference() -> None:
    trials = _trials(bf16_seconds=2.0)
    trials[1].output_max_abs_diff = 0.02  # kv-cache no longer reproduces the reference
    decision = decide_predict(trials, threshold=0.03)
    assert "not identical to recompute's output (max difference 0.02 σ over 100 series)" in \
        decision.verdicts["kv-cache"].why and "a defect" in decision.verdicts["kv-cache"].why
    # bf16 is faster than the recompute, but not than its own reference (kv-cache): left out too
    assert decision.verdicts["bf16"].why.startswith("as fast as kv-cache")
    assert decision.source == "recompute" and decision.reason.startswith("no setting was faster")


def test_the_reference_that_did_not_run_gives_no_recommendation() -> None:
    trials = _trials()
    trials[0] = _trial("recompute", None, status="oom", stage="baseline")
    trials[0].reason = "simulated device out of memory"
    decision = decide_predict(trials, threshold=0.03)
    assert decision.source is None and "oom: simulated device out of memory" in decision.reason


def test_the_estimator_plugs_in() -> None:
    """A paired estimator over interleaved blocks takes the same two lists of per-repeat times."""
    calls: list[tuple[int, int]] = []

    def paired(trial: Sequence[float], reference: Sequence[float]) -> tuple[float, float, float]:
        calls.append((len(trial), len(reference)))
        logs = [math.log(a / b) for a, b in zip(trial, reference)]
        mean = sum(logs) / len(logs)
        return math.exp(mean), math.exp(mean - 3), math.exp(mean + 3)  # so wide that nothing is decided

    decision = decide_predict(_trials(), threshold=0.03, estimator=paired, method="paired blocks (test)")
    assert calls and all(pair == (5, 5) for pair in calls)
    assert decision.estimator == "paired blocks (test)" and decision.source == "recompute"
    assert all(v.vs_reference.verdict == "unresolved" for v in decision.verdicts.values())


def test_the_recommendation_follows_the_compared_ratio_not_the_raw_medians() -> None:
    """autobatch's raw median is the lower (three quick runs, two slow ones), bf16's mean is: with an estimator
    of the ratio of means, bf16 is the faster by the comparison every view shows, and is the one recommended."""

    def ratio_of_means(trial: Sequence[float], reference: Sequence[float]) -> tuple[float, float, float]:
        ratio = (sum(trial) / len(trial)) / (sum(reference) / len(reference))
        return ratio, ratio * 0.99, ratio * 1.01

    trials = _trials(bf16_seconds=1.2)
    autobatch = trials[3]
    autobatch.step_times_s = [1.0, 1.0, 1.0, 1.8, 1.8]
    autobatch.series_per_s = Spread.of([SERIES / t for t in autobatch.step_times_s])
    bf16 = trials[2]
    assert autobatch.series_per_s.median > bf16.series_per_s.median  # raw: autobatch first
    decision = decide_predict(trials, threshold=0.03, estimator=ratio_of_means, method="ratio of means (test)")
    assert decision.verdicts["bf16"].eligible and decision.verdicts["autobatch"].eligible
    assert decision.verdicts["bf16"].vs_baseline.ratio < decision.verdicts["autobatch"].vs_baseline.ratio
    assert decision.source == "bf16" and "also eligible but slower: kv-cache, autobatch" in decision.reason


def test_the_recommended_settings_round_trip_through_the_config_file(tmp_path: Path) -> None:
    report = BenchmarkReport(preset="cpu", task="predict", device="cpu", device_line="cpu", budget_bytes=2**33,
                            budget_mode="simulated", trials=_trials(), out_dir=str(tmp_path),
                            planned=["recompute", "kv-cache", "bf16", "autobatch"],
                            options={"min_spearman": 0.995})
    summarize_predict(report)
    rec = report.recommended
    assert rec.source == "kv-cache"  # bf16's 0.99 is below the user's 0.995
    assert rec.command == f"kronos-tune predict --config {tmp_path / 'recommended.toml'}"
    path = tmp_path / "recommended.toml"
    path.write_text(recommended_predict_toml(report), encoding="utf-8")
    # every key the trial ran with, its synthetic series and predict's decoding included (the benchmark's own
    # job is built from these keys); chunk_series absent: a report from before it was recorded
    assert read_predict_file(path) == {"size": "mini", "lookback": 400, "pred_len": 30, "sample_count": 1,
                                       "synthetic": 100, "seed": 100, "temperature": 1.0, "top_k": 0, "top_p": 0.9,
                                       "device": "cpu", "window_mode": "refill", "amp": "none", "weight_dtype": "fp32",
                                       "cuda_graphs": False,
                                       "kv_cache": True, "nproc": 1}
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# kronos-tune benchmark --task predict, preset cpu: kv-cache")
    assert "max_batch_size not set" in text
    kv = report.trial("kv-cache")
    assert kv.quality["passed"] and kv.quality["spearman"] == 1.0  # the measured agreement is kept
    assert kv.deltas["series_per_s"].noise is False and kv.comparison.verdict == "faster"
    assert "peak_memory_bytes" not in kv.deltas  # the reference's peak is for its 10 series, not the 100


def _drifting_pair(trial: TrialResult, reference: TrialResult, effect: float, rounds: int = 8) -> None:
    """The trial's runs interleaved with its reference's while the machine slows down 30 % over the run: each
    round's two runs share the slowdown, the trial truly `effect` faster."""
    rng = random.Random(5)
    blocks, mine, theirs = [], [], []
    for index in range(rounds):
        level = 2.0 * (1 + 0.3 * index / rounds)
        other = level * (1 + rng.uniform(-0.01, 0.01))
        own = level * (1 - effect) * (1 + rng.uniform(-0.01, 0.01))
        blocks.append({"round": index + 1, "first": "trial" if index % 2 else "baseline", "trial_s": [own],
                       "baseline_s": [other]})
        mine.append(own)
        theirs.append(other)
    trial.step_times_s, trial.series_per_s = mine, Spread.of([SERIES / t for t in mine])
    trial.design, trial.blocks = "paired", blocks
    trial.timing = {"design": "paired", "paired_with": reference.name, "rounds": rounds}


def test_a_paired_trial_is_decided_from_its_rounds_and_drift_cannot_hide_its_effect() -> None:
    trials = _trials(bf16_spearman=0.99)
    kv, bf16 = trials[1], trials[2]
    _drifting_pair(bf16, kv, effect=0.08)  # its own runs spread over the slowdown: the medians cannot tell
    paired = decide_predict(trials, threshold=0.03).verdicts["bf16"]
    assert paired.vs_reference.design == "paired" and paired.vs_reference.n == 8
    assert paired.vs_reference.verdict == "faster" and paired.vs_reference.ratio == pytest.approx(0.92, abs=0.01)
    assert paired.vs_reference.high < 0.95 and paired.eligible
    bf16.timing["paired_with"] = "recompute"  # paired with another trial than its reference: the sequential rule
    sequential = decide_predict(trials, threshold=0.03).verdicts["bf16"]
    assert sequential.vs_reference.design == "sequential" and sequential.vs_reference.verdict != "faster"


def test_a_precision_trials_verdict_states_its_agreement_with_float32() -> None:
    import numpy as np
    import pandas as pd

    from kronos_tune.benchmark.predict.decide import quality_check
    from kronos_tune.benchmark.predict.precision_agreement import (identical_token_share, max_relative_difference,
                                                                   sampled_agreement)

    tokens = np.zeros((2, 4, 2), dtype=np.int32)
    other = tokens.copy()
    other[1, 3, 1] = 7  # one of 8 positions differs in its s2 id
    assert identical_token_share(other, tokens) == 7 / 8
    columns = ["open", "high", "low", "close", "volume", "amount"]
    history = [pd.DataFrame([[10.0, 10, 10, 10, 0, 0]], columns=columns)] * 3

    def forecast(close: float) -> pd.DataFrame:
        return pd.DataFrame([[10.0, 10, 10, close, 0, 0]], columns=columns)

    float32, seed2 = [forecast(c) for c in (11.0, 9.0, 10.0)], [forecast(c) for c in (10.0, 10.0, 11.0)]
    bf16 = [forecast(c) for c in (11.0, 9.0, 10.1)]
    assert max_relative_difference(bf16, float32) == pytest.approx(0.01)  # volume 0 is left out
    spread = sampled_agreement(bf16, float32, seed2, history)
    assert spread["return_diff"] == pytest.approx(0.01 / 3) and spread["seed_spread"] == pytest.approx(0.1)
    trial = _trial("bf16", 1.0, spearman=0.99)
    trial.quality.update(identical_tokens=7 / 8, forecast_max_rel_diff=0.01, sampled_vs_float32=spread)
    check = quality_check(trial, 0.95)
    assert check.passed and check.text.startswith("ranking agreement Spearman 0.990 >= 0.95")
    assert "87.5% identical greedy tokens; forecast max relative difference 1%" in check.text
    assert "within sampling noise (two float32 seeds differ by 10%, ratio 0.03, 3 series)" in check.text
