"""The dashboard at 160x50 after a finished benchmark: every trial row and the recommendation on screen at once
(canned results as in test_tui_canned.py; the predict answer is the real rule's, from predict_summary)."""

from __future__ import annotations

import dataclasses

import pytest

from kronos_tune.presets import resolve_preset
from kronos_tune.benchmark import BenchmarkOptions, plan_trials
from kronos_tune.benchmark.predict.summary import summarize_predict
from kronos_tune.benchmark.events import TrialFinished
from kronos_tune.benchmark.results import BenchmarkReport, Spread, TrialResult
from kronos_tune.tui.app import DashboardApp
from kronos_tune.tui.jobs import JobFinished, BenchmarkEvent, TelemetryUpdated
from kronos_tune.tui.model import ResultsModel
from kronos_tune.tui.widgets import AnswerPanel, ResultsTable, columns
from test_tui_canned import full_benchmark, row_marks, series, table_rows

pytestmark = pytest.mark.usefixtures("steady_dashboard")

GIB = 2**30
LONG_REASON = ("combined: dataloader + fused-adamw together, 14.5% faster per step than the baseline (95% interval "
               "-16.9% to -12.1%), validation loss within the noise; left out: compile (its 103 s of one-time "
               "compilation exceed the 4.2 s it saves over the workload), checkpointing (a memory saver, memory "
               "does not bind: 30% of the budget), accumulation (slower, +11.6%), bigger-batch (changes the "
               "optimization and was not faster beyond the noise); changes under 3.8% could not be told from "
               "noise in this run")


def _predict_report() -> BenchmarkReport:
    """A finished predict run on the cpu preset: kv-cache 10x the recompute, autobatch the same, bf16 skipped."""
    def trial(name: str, seconds: float, stage: str = "single", **config: object) -> TrialResult:
        times = [seconds * f for f in (0.99, 1.0, 1.01)]
        settings = {"model_size": "mini", "lookback": 400, "pred_len": 30, "sample_count": 1, "series_count": 100,
                    "measured_series": 100, "use_cache": name != "recompute", "amp": "none", "devices": 1,
                    "max_batch_size": None, **config}
        return TrialResult(name, stage, "ok", {"use_cache": name != "recompute"}, task="predict",
                           step_times_s=times, series_per_s=Spread.of([100 / t for t in times]),
                           tokens_per_s=Spread.of([3000 / t for t in times]), peak_memory_bytes=GIB,
                           speedup=None, output_max_abs_diff=None if name == "recompute" else 0.0,
                           quality=None if name == "recompute" else {
                               "spearman": 1.0, "series": 100, "measure": "rank agreement",
                               "reference": "recompute" if name == "kv-cache" else "kv-cache"},
                           config=settings, projected_predict_time_s=seconds)

    trials = [trial("recompute", 170.0, "baseline"), trial("kv-cache", 17.0),
              TrialResult("bf16", "single", "skipped", task="predict",
                          reason="the preset's hardware has no native bf16 (hardware.bf16_supported = false)"),
              trial("autobatch", 17.2, max_batch_size=128),
              TrialResult("sharding", "single", "skipped", task="predict", reason="sharding series needs 2+ devices")]
    for t in trials[1:]:
        if t.status == "ok":
            t.speedup = 170.0 / t.step_times_s[1]
    report = BenchmarkReport(preset="cpu", task="predict", device="cpu", device_line="device: cpu (2 cores)",
                            budget_bytes=8 * GIB, budget_mode="simulated", trials=trials,
                            planned=[t.name for t in trials], out_dir="runs/benchmark/cpu-predict-20261130-120000")
    summarize_predict(report)
    return report


async def _finish(pilot, app: DashboardApp, results: list, report: BenchmarkReport, gpus: bool) -> None:
    for snapshot in series(5, gpus=gpus):
        app.post_message(TelemetryUpdated(snapshot))
    app.run_state.begin(f"benchmark {report.task}")
    app.results_task, app.results = report.task, ResultsModel(columns(report.task))  # as `b` / `B` start it
    for result in results:
        app.post_message(BenchmarkEvent(TrialFinished(result)))
        await pilot.pause()
    app.post_message(JobFinished(f"benchmark {report.task}", "done", f"{len(results)} trials", report))
    await pilot.pause()
    await pilot.pause()


def _assert_all_on_screen(app: DashboardApp, results: list) -> str:
    table, panel = app.query_one(ResultsTable), app.query_one(AnswerPanel)
    assert [row[0] for row in table_rows(app)] == [r.name for r in results]
    assert table.max_scroll_y == 0 and table.scroll_y == 0  # nothing scrolled off, the baseline rows included
    assert table.scrollable_content_region.height >= table.header_height + len(results)
    assert table.region.bottom <= app.screen.region.bottom - 1  # above the footer
    assert panel.display and panel.region.bottom <= table.region.y  # the recommendation above, not overlapped
    assert panel.region.height == panel.content_rows(panel.region.width - 4) + 2  # every line of it
    assert panel.max_scroll_y == 0  # nothing of it scrolled away
    return " ".join(panel.plain.split())


@pytest.mark.asyncio
@pytest.mark.parametrize("drift_every", [3, 1], ids=["cpu-plan", "drift-after-every-single"])
async def test_every_row_of_a_finished_train_run_and_a_long_answer_fit_at_160x50(drift_every: int) -> None:
    names = tuple(s.name for s in plan_trials(resolve_preset("cpu"), "train",
                                            BenchmarkOptions(drift_every=drift_every, full=True)))  # every trial
    results, report = full_benchmark(names=names)
    report.recommended = dataclasses.replace(report.recommended, reason=LONG_REASON)
    report.headroom = {"peak_bytes": int(2.4 * GIB), "budget_bytes": 8 * GIB, "batch": 16, "fits_batch": 240,
                       "text": "2.40 of 8.0 GiB used (30%): batch 16 -> about 240 would fit"}
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(160, 50)) as pilot:
        await _finish(pilot, app, results, report, gpus=True)
        text = _assert_all_on_screen(app, results)
        assert len(results) >= (23 if drift_every == 1 else 19)
        assert "▶ run combined: num_workers = 2, optimizer_impl = fused" in text
        assert "changes under 3.8% could not be told from noise in this run" in text
        assert report.recommended.command + " (t runs it here)" in text
        assert row_marks(app)["combined"].startswith("▶")


@pytest.mark.asyncio
async def test_a_finished_predict_run_shows_every_row_and_its_recommended_settings_at_160x50() -> None:
    report = _predict_report()
    assert report.recommended.source == "kv-cache"
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(160, 50)) as pilot:
        await _finish(pilot, app, report.trials, report, gpus=False)
        text = _assert_all_on_screen(app, report.trials)
        assert ("▶ run kv-cache: window_mode = refill, amp = none, weight_dtype = fp32, cuda_graphs = False, "
                "kv_cache = True, nproc = 1"
                in text)
        assert "why 10.00x (95% interval" in text and "identical greedy output to recompute's over 100 series" in text
        assert "command kronos-tune predict --config runs/benchmark/cpu-predict-20261130-120000/recommended.toml" \
            in text and "t runs it here" not in text  # t trains; the predict settings run from a shell
        assert row_marks(app) == {"kv-cache": "▶★"}
