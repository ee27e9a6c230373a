"""Dashboard jobs for real on the tiny preset: autobatch, the benchmark, training, cancel, export, quit."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import psutil
import pytest
from textual import events

from kronos_tune.presets import resolve_preset
from kronos_tune.benchmark import BenchmarkOptions, plan_trials
from kronos_tune.telemetry.sampler import Sampler
from kronos_tune.tui.app import DashboardApp
from kronos_core.train import load_checkpoint
from kronos_tune.tui.widgets import AnswerPanel, LogPane, ResultsTable, RunPanel, StatusBar
from test_tui_canned import log_text, table_rows, until, write_tiny_preset

pytestmark = pytest.mark.usefixtures("steady_dashboard")

# A few steps per trial and a short measuring budget: the benchmark's defaults measure for 10 s a trial.
FAST = dict(steps=2, max_steps=3, warmup=2, max_warmup=2, trial_budget_s=0.5, drift_every=0, min_rounds=6,
            resolution_min_rounds=6)




async def _until_training(pilot, app: DashboardApp, trial: str | None = None) -> None:
    """Wait for a step of `trial` (any trial when None); fail at once if the job ended instead."""
    def stepping() -> bool:
        return app.run_state.step >= 1 and (trial is None or app.run_state.trial == trial)
    await until(pilot, lambda: stepping() or not app.busy, f"a training step of {trial or 'a trial'}")
    assert stepping(), f"the job ended first: {app.run_state.phase}: {app.run_state.outcome}; log: " \
        + " | ".join(log_text(app).splitlines()[-6:])


async def _key(pilot, key: str) -> None:
    """A key as the terminal driver delivers it. Pilot.press also waits until the process looks idle (up to
    1 s, twice), which it never does while a job trains in its thread; this returns after a short pause, by
    which the app has usually handled the key (on a loaded machine not always: `_start` waits for its job)."""
    pilot.app.post_message(events.Key(key, " " if key == "space" else key if len(key) == 1 else None))
    await pilot.pause(0.01)


async def _start(pilot, app: DashboardApp, key: str) -> None:
    """Press `key`, which starts a job, and wait until the app has started it: until then `not app.busy` is
    still the previous job's end, and a wait for "this job's step or its end" would return at once."""
    started = log_text(app).count(" started on preset ")
    await _key(pilot, key)
    await until(pilot, lambda: log_text(app).count(" started on preset ") > started, f"the job of key {key}")


@pytest.fixture
def tiny(tmp_path: Path):
    folder = write_tiny_preset(tmp_path / "presets")
    return resolve_preset("tiny-cpu", [folder]), folder


@pytest.mark.asyncio
async def test_autobatch_runs_in_a_worker(tiny, tmp_path: Path) -> None:
    preset, folder = tiny
    app = DashboardApp(preset=preset, preset_dirs=[folder], out_dir=tmp_path / "out")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("a")
        assert app.run_state.job == "autobatch"
        await until(pilot, lambda: not app.busy, "autobatch finished")
        await pilot.pause()
        assert app.run_state.phase == "done", app.run_state.outcome
        assert app.run_state.outcome.startswith("batch_size ")
        log = log_text(app)
        assert "autobatch: probe batch 1: " in log and "(ok, " in log
        assert "autobatch done: batch_size" in log
        assert "autobatch: done" in app.query_one(StatusBar).render().plain
        panel = app.query_one(RunPanel).render().plain
        assert "done" in panel and "now probe batch" in panel  # what it did, not "step 0 / loss n/a"
        assert "loss" not in panel and "step 0" not in panel


@pytest.mark.asyncio
async def test_cancelled_autobatch_stops_after_a_probe(tiny, tmp_path: Path) -> None:
    preset, folder = tiny
    app = DashboardApp(preset=preset, out_dir=tmp_path / "out")
    async with app.run_test(size=(120, 40)) as pilot:
        await _start(pilot, app, "a")
        await _key(pilot, "c")  # while the first probe runs
        assert app.run_state.phase == "cancelling"
        await until(pilot, lambda: not app.busy, "autobatch stopped")
        await pilot.pause()
        assert app.run_state.phase == "cancelled"
        log = log_text(app)
        assert "autobatch cancelled: stopped after a probe" in log
        assert log.count("autobatch: probe batch") == 1 and "autobatch done" not in log


def _rows(app: DashboardApp) -> dict[str, list[str]]:
    return {row[0]: row for row in table_rows(app)}


BENCHMARK_LIMIT_S = 600.0  # a safety limit against hangs (each tiny trial runs in its own worker process)


def _folders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


@pytest.mark.asyncio
async def test_benchmark_rows_arrive_then_export_and_train_recommended(tiny, tmp_path: Path) -> None:
    """b, e, t; then b again cancelled and t twice (a cancelled training continued by the next t): every run
    has its own folder, nothing is lost, and the partial benchmark never replaces the complete answer."""
    preset, folder = tiny
    out = tmp_path / "out"
    # baseline, noise probe, checkpointing: three ok rows; the baseline-repeat would add only a fourth trial process
    options = BenchmarkOptions(**FAST, only=("checkpointing",), skip=("baseline-repeat",))
    specs = plan_trials(preset, "train", options)
    planned, steps = [spec.name for spec in specs], specs[0].total_steps
    app = DashboardApp(preset=preset, out_dir=out, benchmark_options=options)
    async with app.run_test(size=(160, 50)) as pilot:
        await _start(pilot, app, "b")
        await _until_training(pilot, app, "baseline")
        assert app.run_state.steps_target == steps  # warm-up + measured (+ padding)
        run_panel = app.query_one(RunPanel).render().plain
        assert f"trial 1/{len(planned)} baseline" in run_panel and "loss" in run_panel
        assert f"step {app.run_state.step} " in run_panel and f"at least {steps}" in run_panel  # an open count
        await until(pilot, lambda: not app.busy, "the benchmark finished", BENCHMARK_LIMIT_S)
        await pilot.pause()
        assert app.run_state.phase == "done", app.run_state.outcome
        ended = app.query_one(RunPanel).render().plain
        assert "trial " not in ended and "step " not in ended  # the run's end, not its last trial
        rows = _rows(app)
        assert rows["baseline"][2] == "ok" and rows["checkpointing"][2] == "ok"
        assert "%" in rows["checkpointing"][5]  # peak memory with its delta vs the baseline
        assert rows["compile"][2] == "skipped" and rows["compile"][-1] == "not selected by --only"
        assert sorted(rows) == sorted(planned)
        log = log_text(app)
        assert f"trial 1/{len(planned)}: baseline (baseline)" in log and "checkpointing: ok, step" in log
        ok = sum(row[2] == "ok" for row in rows.values())
        assert ok >= 3 and f"benchmark train done: {ok} ok, {len(planned) - ok} skipped; reports in" in log
        (first,) = _folders(out / "benchmark")
        assert first.name.startswith("tiny-cpu-train-") and (first / "results.jsonl").is_file()
        assert app.recommended == first / "recommended.toml"
        answer = app.query_one(AnswerPanel)
        assert answer.display and app.answer is not None and app.answer.recommended is not None
        shown = answer.plain
        assert app.answer.recommended in shown and str(first / "recommended.toml") in shown

        await pilot.press("e")
        await until(pilot, lambda: "exported" in log_text(app), "the export")
        (exported,) = _folders(out / "exports")
        assert exported.name.startswith("tiny-cpu-train-")
        assert {p.name for p in exported.iterdir()} >= {"report.json", "report.csv", "report.md", "recommended.toml"}
        assert str(exported) in log_text(app)

        await _start(pilot, app, "t")
        await until(pilot, lambda: not app.busy, "training finished")
        await pilot.pause()
        assert app.run_state.job == "training" and app.run_state.phase == "done", app.run_state.outcome
        assert app.run_state.step == app.run_state.steps_target == 4  # 32 samples / batch 8
        assert "step 4/4" in app.query_one(RunPanel).render().plain
        (trained,) = _folders(out / "train")
        assert (trained / "checkpoints" / "last.pt").is_file() and "training done: 4/4 steps, done" in log_text(app)
        metrics = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
        assert [line["step"] for line in metrics if line["kind"] == "train"] == [1, 2, 3, 4]  # as `train` writes

        # t again: a new folder; cancelled after its first step; the next t continues that run in place
        await _start(pilot, app, "t")
        await until(pilot, lambda: app.run_state.step >= 1 or not app.busy, "a training step")
        await _key(pilot, "c")
        await until(pilot, lambda: not app.busy, "training stopped")
        await pilot.pause()
        trains = _folders(out / "train")
        assert len(trains) == 2 and trained in trains
        second = next(f for f in trains if f != trained)
        stopped = load_checkpoint(second)["step"]
        if app.run_state.phase == "cancelled":  # the cancel landed before the last step
            assert stopped < 4 and json.loads((second / "run.json").read_text())["status"] == "cancelled"
            await _start(pilot, app, "t")
            await until(pilot, lambda: not app.busy, "the resumed training finished")
            await pilot.pause()
            assert f"continuing the cancelled run in {second}" in log_text(app)
            assert _folders(out / "train") == trains  # continued, not restarted in a third folder
            assert load_checkpoint(second)["step"] == 4
        else:  # the cancel landed after the last step: the dashboard, the folder and the checkpoint agree on done
            assert app.run_state.phase == "done" and stopped == 4
            assert json.loads((second / "run.json").read_text())["status"] == "complete"
        assert load_checkpoint(trained)["step"] == 4  # the first training run is untouched

        # b again, cancelled during its first trial: kept in its own folder, marked partial; the answer stays
        await _start(pilot, app, "b")
        await _until_training(pilot, app, "baseline")
        await _key(pilot, "c")
        await until(pilot, lambda: not app.busy, "the second benchmark stopped", BENCHMARK_LIMIT_S)
        await pilot.pause()
        benches = _folders(out / "benchmark")
        assert len(benches) == 2 and first in benches
        assert json.loads((first / "report.json").read_text())["cancelled"] is False
        assert app.answer.newer_partial == str(next(f for f in benches if f != first))
        assert app.recommended == first / "recommended.toml"
        assert "the recommendation stays from the complete run" in log_text(app)


@pytest.mark.slow  # a whole benchmark or job run: the default suite stays under 300 s
@pytest.mark.asyncio
async def test_cancel_stops_at_a_step_boundary_and_keeps_finished_trials(tiny, tmp_path: Path) -> None:
    preset, folder = tiny
    out = tmp_path / "out"
    options = BenchmarkOptions(**{**FAST, "steps": 60}, only=("checkpointing",))
    app = DashboardApp(preset=preset, out_dir=out, benchmark_options=options)
    async with app.run_test(size=(160, 48)) as pilot:
        await _start(pilot, app, "b")
        await _until_training(pilot, app, "baseline")
        await _key(pilot, "space")  # keys are answered while the trial trains in its thread
        assert app.paused and app.run_state.trial == "baseline" and app.busy
        await _key(pilot, "space")
        await _key(pilot, "a")  # one job at a time
        assert "benchmark train is still running: wait for it or cancel it (c) first" in log_text(app)
        await _until_training(pilot, app, "noise-probe")
        await _key(pilot, "c")
        assert app.run_state.phase == "cancelling" and app.run_state.trial == "noise-probe"
        await until(pilot, lambda: not app.busy, "the benchmark stopped", BENCHMARK_LIMIT_S)
        await pilot.pause()
        assert app.run_state.phase == "cancelled"
        rows = _rows(app)
        assert rows["baseline"][2] == "ok"  # finished before the cancel: kept
        assert rows["noise-probe"][2] == "cancelled" and rows["noise-probe"][-1].startswith("cancelled after")
        assert "checkpointing" not in rows  # never started
        assert app.report is not None and app.report.cancelled
        await pilot.press("e")  # a cancelled run still exports what it has
        await until(pilot, lambda: "exported" in log_text(app), "the export")
        assert "benchmark train cancelled" in log_text(app)


@pytest.mark.asyncio
async def test_out_of_memory_trial_shows_its_reason_and_the_app_stays_up(tmp_path: Path) -> None:
    folder = write_tiny_preset(tmp_path / "presets", name="tiny-2mib", memory_gb=0.002)
    preset = resolve_preset("tiny-2mib", [folder])
    # the baseline's out-of-memory row is what is checked: the noise probe and the baseline-repeat (two more trial
    # processes, out of memory alike) are left out, and --only tf32 (CUDA only, skipped here) runs no single trial
    options = BenchmarkOptions(**FAST, only=("tf32",), skip=("noise-probe", "baseline-repeat"))
    app = DashboardApp(preset=preset, out_dir=tmp_path / "out", benchmark_options=options)
    async with app.run_test(size=(160, 48)) as pilot:
        await _start(pilot, app, "b")
        await until(pilot, lambda: not app.busy, "the benchmark ended", BENCHMARK_LIMIT_S)
        await pilot.pause()
        baseline = _rows(app)["baseline"]
        assert baseline[2] == "oom" and "simulated device out of memory" in baseline[-1]
        assert "baseline: oom: simulated device out of memory" in log_text(app)
        await _key(pilot, "space")  # still answering keys
        assert app.paused


@pytest.mark.slow  # a whole benchmark or job run: the default suite stays under 300 s
@pytest.mark.asyncio
async def test_predict_benchmark_with_shift_b(tiny, tmp_path: Path) -> None:
    preset, folder = tiny
    options = BenchmarkOptions(**FAST, only=("kv-cache",), predict_repeats=2)
    app = DashboardApp(preset=preset, out_dir=tmp_path / "out", benchmark_options=options)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("B")
        assert app.run_state.job == "benchmark predict"
        await until(pilot, lambda: not app.busy, "the predict benchmark finished", BENCHMARK_LIMIT_S)
        await pilot.pause()
        assert app.run_state.phase == "done", app.run_state.outcome
        rows = _rows(app)
        assert rows["recompute"][2] == "ok" and rows["kv-cache"][2] == "ok"
        assert "series/s" in [str(c.label) for c in app.query_one(ResultsTable).columns.values()]
        assert rows["kv-cache"][6].endswith("×")  # the speed-up over full recompute
        panel = app.query_one(RunPanel).render().plain
        assert panel.startswith("done") and "trial " not in panel and "loss" not in panel  # the run's end
        await pilot.press("t")  # a predict benchmark recommends no training config
        assert "no recommended.toml yet" in log_text(app)


def test_quit_during_a_run_leaves_nothing_running(tiny, tmp_path: Path) -> None:
    """q sets the cancel event, waits for the worker's step, stops the sampler; then every thread is gone."""
    preset, folder = tiny
    before = {thread.ident for thread in threading.enumerate()}
    sampler = Sampler(interval_s=0.1, capacity=50)
    options = BenchmarkOptions(**{**FAST, "steps": 30}, only=("checkpointing",))
    app = DashboardApp(preset=preset, sampler=sampler, out_dir=tmp_path / "out", benchmark_options=options)

    async def session() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await _start(pilot, app, "b")
            await _until_training(pilot, app)
            await _key(pilot, "q")
            await until(pilot, lambda: not app.is_running, "the app exited", limit_s=60)
        assert not app.busy  # the worker finished its step and returned before the app exited
        assert not sampler.running
        assert app.return_value == 0
        # nothing of ours is left: only idle executor threads of this event loop, which asyncio.run joins
        ours = [t for t in threading.enumerate() if t.ident not in before and not t.name.startswith("asyncio_")]
        assert ours == []

    asyncio.run(session())
    assert {thread.ident for thread in threading.enumerate()} <= before
    assert psutil.Process().children() == []
    (folder,) = _folders(tmp_path / "out" / "benchmark")
    results = (folder / "results.jsonl").read_text()
    assert '"status": "cancelled"' in results  # the trial in flight was recorded as cancelled
