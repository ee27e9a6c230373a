"""Typed decisions read back from the JSON they write: report.json and results.jsonl keep their bytes, and
lines written by older versions still load."""

from __future__ import annotations

import json
from pathlib import Path

from kronos_tune.benchmark.predict.summary import summarize_predict
from kronos_tune.benchmark.predict.verdicts import PredictDecision
from kronos_tune.benchmark.recommendation import Recommendation
from kronos_tune.benchmark.report.rebuild import load_run
from kronos_tune.benchmark.results import BenchmarkReport, TrialResult
from kronos_tune.benchmark.stats import Comparison
from kronos_tune.benchmark.tasks import report_from_dict
from kronos_tune.benchmark.train.verdicts import Decision, OneTimeCost

from test_decision import GIB, _times, _trial
from test_predict_same_work import _run
from test_report_cli import write_gpu_run


def _same_bytes(report: BenchmarkReport) -> BenchmarkReport:
    text = json.dumps(report.to_dict(), indent=2)
    again = report_from_dict(json.loads(text))
    assert json.dumps(again.to_dict(), indent=2) == text
    return again


def test_a_train_report_reads_back_typed_and_writes_the_same_json(tmp_path: Path) -> None:
    results = [_trial("baseline", _times(1.0), stage="baseline"), _trial("noise-probe", _times(1.0, seed=9),
                                                                        stage="baseline"),
               _trial("bf16", _times(0.7, seed=1)), _trial("fused-adamw", _times(0.9, seed=2)),
               _trial("checkpointing", _times(1.2, seed=3), peak=GIB // 2),
               _trial("combined", _times(0.8, seed=4), stage="combined")]
    report = load_run(write_gpu_run(tmp_path / "run", results)).report
    again = _same_bytes(report)
    assert isinstance(again.decision, Decision) and again.decision == report.decision
    assert again.decision.source == "bf16" and again.decision.combination == ["bf16", "fused-adamw"]
    assert isinstance(again.recommended, Recommendation) and again.recommended.config
    assert all(isinstance(c, OneTimeCost) for c in again.decision.costs.values())
    assert isinstance(again.trial("bf16").comparison, Comparison)
    lines = [json.dumps(t.to_dict()) for t in report.trials]
    assert [json.dumps(TrialResult.from_dict(json.loads(line)).to_dict()) for line in lines] == lines


def test_a_predict_report_reads_back_typed_and_writes_the_same_json(tmp_path: Path) -> None:
    report = BenchmarkReport(preset="cpu", task="predict", device="cpu", device_line="cpu", budget_bytes=2**33,
                            budget_mode="simulated", trials=_run(), out_dir=str(tmp_path),
                            planned=["recompute", "kv-cache", "autobatch"], options={"predict_repeats": 5})
    summarize_predict(report)
    again = _same_bytes(report)
    assert isinstance(again.decision, PredictDecision) and again.decision == report.decision
    assert again.recommended is not None and again.recommended.settings and again.recommended.config is None
    assert list(again.to_dict()["recommended"]) == ["source", "reason", "settings", "changes", "command", "partial",
                                                    "missing"]


def test_a_report_read_without_a_decision_reader_leaves_the_decision_out() -> None:
    assert BenchmarkReport.from_dict({"preset": "p", "task": "train", "device": "cpu", "device_line": "",
                                     "budget_bytes": 1, "budget_mode": "simulated",
                                     "decision": {"threshold": 0.03}}).decision is None  # no reader given


def test_summarize_returns_a_new_report_and_leaves_the_given_one_as_it_was() -> None:
    from kronos_tune.benchmark.report.shown import summarize

    report = BenchmarkReport(preset="cpu", task="predict", device="cpu", device_line="cpu", budget_bytes=2**33,
                            budget_mode="simulated", trials=_run(), planned=["recompute", "kv-cache", "autobatch"],
                            options={"predict_repeats": 5})
    before = json.dumps(report.to_dict())
    summary = summarize(report, None)
    assert summary is not report and json.dumps(report.to_dict()) == before
    assert report.decision is None and report.trial("kv-cache").comparison is None
    assert isinstance(summary.decision, PredictDecision) and summary.trial("kv-cache").comparison is not None
