"""The dashboard's scatter (`g`): the results' points, the Pareto front and the recommendation in a
textual-plotext plot that follows a running benchmark, and a table in its place without textual-plotext."""

from __future__ import annotations

import sys

import pytest
from rich.console import Console
from textual.widgets import Static

from kronos_tune.presets import resolve_preset
from kronos_tune.benchmark.events import TrialFinished
from kronos_tune.benchmark.results import Spread, TrialResult
from kronos_tune.tui.app import DashboardApp
from kronos_tune.tui.jobs import JobFinished, BenchmarkEvent
from kronos_tune.tui.widgets.scatter import ScatterPanel, ScatterScreen
from planned import with_planned_kind
from test_tui_canned import GIB, full_benchmark, trial_results, until

pytestmark = pytest.mark.usefixtures("steady_dashboard")


def _text(renderable: object) -> str:
    console = Console(width=140, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


@pytest.mark.asyncio
async def test_scatter_follows_the_running_benchmark_and_marks_the_front() -> None:
    pytest.importorskip("textual_plotext")
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, ScatterScreen), "the scatter screen")
        panel = app.screen.query_one(ScatterPanel)
        assert panel.drawn == {} and "No finished trials yet" in _text(panel.query_one("#scatter-caption").content)

        for result in trial_results():
            app.post_message(BenchmarkEvent(TrialFinished(result)))
        await until(pilot, lambda: "trials" in panel.drawn, "the points")
        assert app.screen.query("#scatter-plot")  # the textual-plotext widget, not the fallback
        xs, ys, names = panel.drawn["trials"]
        assert names == ["baseline", "checkpointing", "dataloader", "combined"]
        assert ys == pytest.approx([1.52, 1.71, 1.31, 1.30])  # seconds per step (all at least a second)
        assert xs == pytest.approx([2.41, 1.62, 2.45, 2.45])  # GiB
        assert panel.drawn["repeats"][2] == ["noise-probe"]  # drawn, but no configuration of its own
        # combined beats dataloader (same memory, faster); the baseline is smaller than combined and faster
        # than checkpointing
        assert panel.drawn["front"][2] == ["checkpointing", "baseline", "combined"]
        caption = _text(panel.query_one("#scatter-caption").content)
        # the cpu preset's 8 GiB, over 3x the largest peak: said, not drawn (the points would crowd the left)
        assert "budget" not in panel.drawn and "memory budget 8.0 GiB (far right of every point" in caption
        assert "autobatch (oom)" in caption and "compile (failed)" in caption and "bf16 (skipped)" in caption

        bigger = with_planned_kind(TrialResult("bigger-batch", "single", "ok", step_time_s=Spread(1.0, 0.95, 1.05, 5),
                                               peak_memory_bytes=int(4.0 * GIB)))
        app.post_message(BenchmarkEvent(TrialFinished(bigger)))
        await until(pilot, lambda: "bigger-batch" in panel.drawn["trials"][2], "the new trial's point")
        assert panel.drawn["front"][2] == ["checkpointing", "baseline", "combined", "bigger-batch"]
        assert panel.drawn["budget"][0] == [pytest.approx(8.0)]  # now within reach: the red line
        await pilot.press("escape")
        assert not isinstance(app.screen, ScatterScreen)


@pytest.mark.asyncio
async def test_finished_benchmark_marks_the_recommendation() -> None:
    pytest.importorskip("textual_plotext")
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(120, 40)) as pilot:
        results, report = full_benchmark()
        app.run_state.begin("benchmark train")
        for result in results:
            app.post_message(BenchmarkEvent(TrialFinished(result)))
        app.post_message(JobFinished("benchmark train", "done", f"{len(results)} trials", report))
        await until(pilot, lambda: app.answer is not None, "the answer")
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, ScatterScreen), "the scatter screen")
        panel = app.screen.query_one(ScatterPanel)
        assert panel.drawn["recommended"][2] == ["combined"]
        assert "▶★ combined" in panel.drawn["labels"][2]  # its marks in its own label, never by another name
        # the repeats of the baseline (noise-probe, drift checks) are not candidates: no point of their own
        ok = [r.name for r in results if r.status == "ok" and r.trial_kind.kind != "baseline-repeat"]
        assert panel.drawn["trials"][2] == ok
        assert "recommended: combined" in _text(panel.query_one("#scatter-caption").content)


@pytest.mark.asyncio
async def test_without_textual_plotext_a_table_takes_the_plots_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textual_plotext", None)  # what an environment without it looks like
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(120, 40)) as pilot:
        for result in trial_results():
            app.post_message(BenchmarkEvent(TrialFinished(result)))
        await pilot.pause()
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, ScatterScreen), "the scatter screen")
        await pilot.pause()
        assert not app.screen.query("#scatter-plot")
        table = _text(app.screen.query_one("#scatter-table", Static).content)
        lines = [line.split() for line in table.splitlines() if "GiB" in line]
        marked = {line[1]: line[0] for line in lines if line[0] in ("▶", "★", "▶★")}
        assert marked == {"combined": "★"}  # the fastest, marked as the results table marks it; none recommended
        lines = [line[1:] if line[0] in marked.values() else line for line in lines]
        assert [line[0] for line in lines] == ["checkpointing", "baseline", "noise-probe", "combined", "dataloader"]
        assert [line[0] for line in lines if line[-1] == "◆"] == ["checkpointing", "baseline", "combined"]
        assert lines[0][1:4] == ["1.71", "1.62", "GiB"]  # time per step, peak memory
        assert "time per optimizer step (compared estimate) [s]" in table


def test_names_of_close_points_do_not_run_into_each_other() -> None:
    from kronos_tune.tui.widgets.scatter import label_places

    cell = (0.1, 0.01)  # one column = 0.1 GiB, one row = 10 ms
    points = [("dataloader", 2.40, 1.300), ("combined", 2.45, 1.302), ("baseline", 2.0, 1.5)]
    places = label_places(points, cell, right=10.0)
    rows = {name: round(y / cell[1]) for name, (_, y) in places.items()}
    assert rows["dataloader"] != rows["combined"]  # the same row would have merged the two names
    assert rows["baseline"] == 150 and places["baseline"][0] == pytest.approx(2.2)  # alone: on its own row
