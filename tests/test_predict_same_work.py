"""Two predict settings on identical work whose series/s differ beyond the run's resolution: a finding with the
figures and the resolution, or the side-by-side comparison that explains the gap (constructed results)."""

from __future__ import annotations

import pytest

from kronos_tune.benchmark.predict.decide import decide_predict
from kronos_tune.benchmark.predict.decide import same_batch
from kronos_tune.benchmark.predict.summary import predict_decision_lines, predict_markdown_lines, summarize_predict
from kronos_tune.benchmark.predict.verdicts import PredictDecision
from kronos_tune.benchmark.results import BenchmarkReport, Spread, TrialResult

from test_predict_decision import SERIES, _trial

KV_RATE, AUTO_RATE = 8.35, 9.45  # series/s: the figures, 13.2% apart


def _run(autobatch_rate: float = AUTO_RATE, chunk: int | None = 128, amp: str = "none",
         paired: bool = False) -> list[TrialResult]:
    """recompute, then kv-cache and autobatch; autobatch's chunk (128) holds all 100 measured series, so with
    the same amp both do the kv-cache runs again."""
    auto = _trial("autobatch", SERIES / autobatch_rate, spearman=1.0, seed=4, max_batch_size=chunk, amp=amp)
    if paired:  # side by side with kv-cache, whose runs took as long as its own in every round
        auto.design, auto.timing = "paired", {"paired_with": "kv-cache"}
        auto.blocks = [{"round": i, "first": "trial" if i % 2 else "baseline", "trial_s": [10.0 + 0.01 * (i % 3)],
                        "baseline_s": [10.0 + 0.01 * ((i + 1) % 3)]} for i in range(12)]
    base = _trial("recompute", 2.0, diff=None, stage="baseline", seed=1, measured_series=10)
    base.series_per_s = Spread.of([10 / t for t in base.step_times_s])  # it predicts 10 series a run
    return [base, _trial("kv-cache", SERIES / KV_RATE, spearman=1.0, seed=2), auto]


def test_identical_work_is_told_by_the_settings_and_the_batch() -> None:
    kv, auto = (t.config for t in _run()[1:])
    assert same_batch(kv, auto) == "each chunk holds all 100 measured series, as the predictor's default does"
    assert same_batch(kv, dict(kv)) == "the same settings and chunk size"
    assert same_batch(kv, {**auto, "max_batch_size": 50}) is None  # two chunks: other work
    assert same_batch(kv, {**auto, "amp": "bf16"}) is None


def test_a_gap_beyond_the_resolution_on_identical_work_is_a_finding() -> None:
    decision = decide_predict(_run(), threshold=0.03)
    (pair,) = decision.findings
    assert (pair.first, pair.second) == ("kv-cache", "autobatch")
    assert pair.first_rate == pytest.approx(KV_RATE, rel=0.02) and pair.second_rate == pytest.approx(AUTO_RATE, rel=0.02)
    assert pair.gap == pytest.approx(AUTO_RATE / KV_RATE - 1, abs=0.02) and pair.resolution == 0.03
    assert pair.direct is not None and pair.direct.verdict == "faster" and not pair.explained
    text = pair.text()
    assert f"differ by {100 * pair.gap:.1f}%" in text and "more than the run's resolution of 3.0%" in text
    assert f"({pair.second_rate:.3g} against {pair.first_rate:.3g})" in text
    assert "although the work is the same" in text and "read differences under" in text


def test_a_gap_the_side_by_side_comparison_calls_the_same_is_explained() -> None:
    (pair,) = decide_predict(_run(paired=True), threshold=0.03).findings
    assert pair.direct is not None and pair.direct.design == "paired" and pair.direct.verdict == "same"
    assert pair.explained and "so the gap is drift between measurements taken at different times" in pair.text()


@pytest.mark.parametrize("change", [{"autobatch_rate": KV_RATE * 1.01}, {"chunk": 50}, {"amp": "bf16"}],
                         ids=["within-the-resolution", "other-batches", "other-precision"])
def test_no_finding_inside_the_resolution_or_for_other_work(change: dict) -> None:
    assert decide_predict(_run(**change), threshold=0.03).findings == []


def test_the_finding_reaches_the_terminal_report_md_and_report_json() -> None:
    report = BenchmarkReport(preset="cpu", task="predict", device="cpu", device_line="cpu", budget_bytes=2**33,
                            budget_mode="simulated", trials=_run(), planned=["recompute", "kv-cache", "autobatch"],
                            options={"predict_repeats": 5})
    summarize_predict(report)
    assert isinstance(report.decision, PredictDecision)
    (pair,) = report.decision.findings
    line = f"Finding: {pair.text()}."
    assert line in predict_decision_lines(report) and f"- {line}" in predict_markdown_lines(report)
    kept = report.to_dict()["decision"]
    assert kept["findings"][0]["text"] == pair.text() and kept["findings"][0]["resolution"] == 0.03
    assert "verdicts" in kept and "estimator" in kept  # the old keys stay
    assert PredictDecision.from_dict(kept).findings == [pair]
