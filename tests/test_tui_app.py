"""Dashboard pilots without the benchmark: real telemetry, screens, picker, pause, sort, bad input."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from kronos_tune.cli import app as cli_app
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import resolve_preset
from kronos_tune.telemetry.sampler import Sampler
from kronos_tune.tui.app import DashboardApp
from kronos_tune.benchmark.events import TrialFinished
from kronos_tune.tui.jobs import BenchmarkEvent, TelemetryUpdated
from kronos_tune.tui.screens import HelpScreen, PresetPicker, TooSmallScreen
from kronos_tune.tui.widgets import (
    AnswerPanel, GpuPanel, HostPanel, LogPane, NoGpuPanel, ResultsTable, RunPanel, StatusBar,
)
from test_tui_canned import (
    full_benchmark, log_text, row_marks, series, table_rows, trial_results, until, write_tiny_preset,
)

pytestmark = pytest.mark.usefixtures("steady_dashboard")

runner = CliRunner()


def _render(widget) -> str:
    return widget.render().plain




@pytest.mark.asyncio
async def test_real_sampler_fills_host_panel_and_explains_missing_gpu() -> None:
    sampler = Sampler(interval_s=0.1, capacity=100)
    app = DashboardApp(preset=resolve_preset("cpu"), sampler=sampler)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: sampler.sample_count >= 3 and app.telemetry.latest is not None, "3 samples")
        await pilot.pause()
        latest = app.telemetry.latest
        host = _render(app.query_one(HostPanel))
        assert f"Host · {psutil.cpu_count()} cores" in str(app.query_one(HostPanel).border_title)
        assert "RAM" in host and "cores" in host and "ours" in host
        assert f"{latest.host.ram_total_bytes / 2**30:.1f} GiB" in host
        assert len(app.telemetry.series("cpu")) >= 3  # the history grows with every sample
        if latest.gpus:  # a machine with a driver: one panel per GPU
            assert len(app.query(GpuPanel)) == len(latest.gpus)
        else:
            panel = _render(app.query_one(NoGpuPanel))
            assert "No NVIDIA GPU" in panel and latest.gpu_unavailable_reason.split(":")[0] in panel
            assert "Budget 8.0 GiB × 1 (preset cpu) simulated on the CPU" in " ".join(panel.split())
        assert "preset cpu" in _render(app.query_one(StatusBar))
        await pilot.press("q")
    assert not sampler.running  # quit stopped the sampler thread
    assert app.return_value == 0


@pytest.mark.asyncio
async def test_canned_gpus_get_one_panel_each_and_history() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(160, 48)) as pilot:
        for snapshot in series(12, gpus=True):
            app.post_message(TelemetryUpdated(snapshot))
        await pilot.pause()
        await pilot.pause()
        panels = list(app.query(GpuPanel))
        assert [p.index for p in panels] == [0, 1] and not app.query(NoGpuPanel)
        first = _render(panels[0])
        assert "31.0 GiB / 80.0 GiB" in first  # the newest snapshot (i = 11): 20 + 11 GiB used
        assert "temp 64°C" in first and "power 512 W / 700 W" in first and "ours 12.0 GiB" in first
        assert "power n/a / 700 W" in _render(panels[1])  # no power sensor on the second board
        assert len(app.telemetry.series("gpu0.memory")) == 12
        assert "2× NVIDIA H100 80GB HBM3" in _render(app.query_one(StatusBar))


@pytest.mark.asyncio
async def test_pause_freezes_panels_until_resumed() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    snapshots = series(30, gpus=False)
    async with app.run_test(size=(100, 30)) as pilot:
        app.post_message(TelemetryUpdated(snapshots[0]))
        await pilot.pause()
        await pilot.press("space")
        assert app.paused and "paused" in _render(app.query_one(StatusBar))
        before = _render(app.query_one(HostPanel))
        for snapshot in snapshots[1:]:
            app.post_message(TelemetryUpdated(snapshot))
        await pilot.pause()
        assert _render(app.query_one(HostPanel)) == before  # frozen
        assert len(app.telemetry.series("ram")) == 30  # but still recorded
        await pilot.press("space")
        assert not app.paused and _render(app.query_one(HostPanel)) != before
        assert "panels paused" in log_text(app) and "panels resumed" in log_text(app)


@pytest.mark.asyncio
async def test_too_small_terminal_shows_notice_and_recovers() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(70, 20)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, TooSmallScreen)
        notice = str(app.screen.query_one("#too-small").render())
        assert "please enlarge the terminal to at least 80x24" in notice and "70x20" in notice
        app.post_message(TelemetryUpdated(series(1, gpus=False)[0]))  # data keeps arriving: no crash
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert not isinstance(app.screen, TooSmallScreen)
        assert app.query_one(NoGpuPanel)
        await pilot.resize_terminal(80, 23)
        await pilot.pause()
        assert isinstance(app.screen, TooSmallScreen)
        await pilot.press("q")
    assert app.return_value == 0


@pytest.mark.asyncio
async def test_help_lists_every_binding_and_palette_has_them() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        listed = dict(app.screen.keys)
        for key in ("p", "b", "B (shift+b)", "a", "t", "c", "e", "space", "s", "?", "q"):
            assert key in listed
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        titles = [command.title for command in app.get_system_commands(app.screen)]
        for title in ("Preset (p)", "Bench (b)", "Bench predict (B (shift+b))", "Autobatch (a)", "Train (t)",
                      "Cancel (c)", "Export (e)", "Pause (space)", "Help (?)", "Quit (q)"):
            assert title in titles


@pytest.mark.asyncio
async def test_preset_picker_switches_preset(tmp_path: Path) -> None:
    folder = write_tiny_preset(tmp_path / "presets")
    app = DashboardApp(preset=None, preset_dirs=[folder])
    async with app.run_test(size=(120, 40)) as pilot:
        assert "no preset" in log_text(app)
        await pilot.press("b")  # nothing to run without a preset
        assert "pick one first" in log_text(app) and app.run_state.job is None
        await pilot.press("p")
        picker = app.screen
        assert isinstance(picker, PresetPicker)
        names = [p.name for p in picker.presets]
        assert "tiny-cpu" in names and "cpu" in names
        picker.query_one("#preset-list").highlighted = names.index("tiny-cpu")
        await pilot.press("enter")
        assert app.preset is not None and app.preset.name == "tiny-cpu"
        assert "preset tiny-cpu" in _render(app.query_one(StatusBar))
        await pilot.press("p", "escape")  # escape keeps the preset
        assert app.preset.name == "tiny-cpu" and not isinstance(app.screen, PresetPicker)


@pytest.mark.asyncio
async def test_actions_without_results_explain_themselves() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("t", "e", "c")
        log = log_text(app)
        assert "no recommended.toml yet" in log
        assert "nothing to export" in log
        assert "nothing to cancel" in log
        assert app.run_state.job is None and "idle" in _render(app.query_one(RunPanel))


def test_unknown_preset_is_one_line_exit_2_before_the_app_starts(capsys: pytest.CaptureFixture[str]) -> None:
    from kronos_tune.cli import main

    started = threading.active_count()
    with pytest.raises(SystemExit) as exited:
        main(["dashboard", "--preset", "rtx3090"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown preset 'rtx3090'") and "rtx3080" in err and err.count("\n") == 1
    assert threading.active_count() == started  # no sampler thread was started, no app ran


def test_bad_interval_and_preset_dir_are_errors(tmp_path: Path) -> None:
    result = runner.invoke(cli_app, ["dashboard", "--interval", "0.001"])
    assert isinstance(result.exception, KronosTuneError) and "--interval" in str(result.exception)
    result = runner.invoke(cli_app, ["dashboard", "--preset-dir", str(tmp_path / "missing")])
    assert isinstance(result.exception, KronosTuneError) and "missing" in str(result.exception)


def _table_rows(app: DashboardApp) -> list[list[str]]:
    return table_rows(app)


@pytest.mark.asyncio
async def test_finished_trials_fill_the_table_with_reasons_and_sort() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(160, 48)) as pilot:
        for result in trial_results():
            app.post_message(BenchmarkEvent(TrialFinished(result)))
        await pilot.pause()
        rows = _table_rows(app)
        assert [row[0] for row in rows] == [r.name for r in trial_results()]  # arrival order
        by_name = {row[0]: row for row in rows}
        assert by_name["autobatch"][2] == "oom" and "simulated device out of memory" in by_name["autobatch"][-1]
        assert by_name["compile"][2] == "failed" and "C compiler" in by_name["compile"][-1]
        assert by_name["checkpointing"][5] == "1.6 GiB -32.8%"  # memory down: a better delta
        assert by_name["noise-probe"][3] == "1.5 s ~+1.3%"  # inside the noise
        log = log_text(app)
        assert "autobatch: oom: simulated device out of memory in backward" in log
        assert "compile: failed: torch.compile needs a C compiler" in log
        assert "dataloader: ok, step 1.3 s, 1.2k tokens/s" in log

        table = app.query_one(ResultsTable)
        header_x = 1 + sum(column.get_render_width(table) for column in list(table.columns.values())[:5])
        await pilot.click("#results", offset=(header_x + 2, 1))  # the "peak mem" header
        assert app.results.sort_key == "peak_memory_bytes" and not app.results.reverse
        names = [row[0] for row in _table_rows(app)]
        assert names[0] == "checkpointing" and names[-3:] == ["bf16", "autobatch", "compile"]  # unknown last
        await pilot.click("#results", offset=(header_x + 2, 1))  # again: descending
        assert app.results.reverse and _table_rows(app)[0][0] in ("dataloader", "combined")
        assert "peak mem ▼" in str(table.border_title)

        app.results.sort_by(None)  # back to arrival order, then the key cycles columns
        await pilot.press("s")
        assert app.results.sort_key == "name" and [r[0] for r in _table_rows(app)][0] == "autobatch"
        await pilot.press("S")
        assert app.results.reverse and [r[0] for r in _table_rows(app)][0] == "noise-probe"


def _feed_benchmark(app: DashboardApp, partial: bool = False) -> None:
    from kronos_tune.tui.jobs import JobFinished

    results, report = full_benchmark(partial)
    app.run_state.begin("benchmark train")
    for result in results:
        app.post_message(BenchmarkEvent(TrialFinished(result)))
    phase = "cancelled" if partial else "done"
    app.post_message(JobFinished("benchmark train", phase, f"{len(results)} trials", report))


@pytest.mark.asyncio
async def test_whole_benchmark_and_recommendation_fit_at_160x50() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(160, 50)) as pilot:
        for snapshot in series(5, gpus=False):
            app.post_message(TelemetryUpdated(snapshot))
        _feed_benchmark(app)
        await pilot.pause()
        await pilot.pause()
        table = app.query_one(ResultsTable)
        results, report = full_benchmark()
        assert table.row_count == len(results) >= 16
        assert table.max_scroll_y == 0  # every trial row is on screen, no scrolling
        assert table.region.bottom <= app.screen.region.bottom - 1  # above the footer
        panel = app.query_one(AnswerPanel)
        assert panel.display and panel.region.height >= 5
        text = panel.plain
        assert "▶ run combined: num_workers = 2, optimizer_impl = fused" in text
        assert "why fastest of the trials that kept the validation loss within the noise" in text
        assert report.recommended.command in " ".join(text.split())
        assert "★ fastest: combined" in text
        assert row_marks(app) == {"combined": "▶★"}  # recommended and fastest: the same row here


@pytest.mark.asyncio
async def test_results_scroll_at_100x30_and_the_recommended_row_is_shown() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(100, 30)) as pilot:
        _feed_benchmark(app)
        await pilot.pause()
        await pilot.pause()
        table = app.query_one(ResultsTable)
        assert table.max_scroll_y > 0 and app.focused is table  # it scrolls, and keys go to it at once
        names = [row[0] for row in table_rows(app)]
        assert table.cursor_row == names.index("combined")  # the recommended row, scrolled into view
        top = table.scroll_y
        visible = table.size.height - 1  # the header row stays
        assert top <= table.cursor_row < top + visible
        await pilot.press("ctrl+home")
        assert table.cursor_row == 0 and table.scroll_y == 0
        await pilot.press("pagedown")
        assert table.scroll_y > 0
        assert app.query_one(AnswerPanel).display


@pytest.mark.asyncio
async def test_a_partial_run_never_replaces_the_complete_answer_and_a_new_preset_clears(tmp_path: Path) -> None:
    folder = write_tiny_preset(tmp_path / "presets")
    app = DashboardApp(preset=resolve_preset("cpu"), preset_dirs=[folder])
    async with app.run_test(size=(160, 50)) as pilot:
        _feed_benchmark(app)
        await pilot.pause()
        _feed_benchmark(app, partial=True)
        await pilot.pause()
        await pilot.pause()
        assert app.answer is not None and app.answer.recommended == "combined" and not app.answer.partial
        assert app.answer.newer_partial == "runs/benchmark/cpu-train-20261130-120000"
        assert "a later run was cancelled" in app.query_one(AnswerPanel).plain
        assert "the recommendation stays from the complete run" in log_text(app)

        await pilot.press("p")
        picker = app.screen
        picker.query_one("#preset-list").highlighted = [p.name for p in picker.presets].index("tiny-cpu")
        await pilot.press("enter")
        await pilot.pause()
        assert app.preset.name == "tiny-cpu"
        assert app.query_one(ResultsTable).row_count == 0 and not app.query_one(AnswerPanel).display
        assert app.answer is None and app.recommended is None
        assert "results of preset cpu cleared from the screen" in log_text(app)


@pytest.mark.asyncio
async def test_partial_answer_says_what_is_missing() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(160, 50)) as pilot:
        _feed_benchmark(app, partial=True)
        await pilot.pause()
        await pilot.pause()
        text = " ".join(app.query_one(AnswerPanel).plain.split())
        assert "partial: cancelled before" in text and "this covers only the finished trials" in text


@pytest.mark.asyncio
async def test_help_names_the_scroll_keys() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        listed = dict(app.screen.keys)
        assert "PgUp PgDn" in " ".join(listed) and "mouse wheel" in listed


@pytest.mark.asyncio
async def test_results_refit_when_the_terminal_grows_back() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.resize_terminal(70, 20)
        await pilot.pause()
        _feed_benchmark(app)  # the benchmark finishes while the terminal is too small
        await pilot.pause()
        await pilot.pause()
        await pilot.resize_terminal(160, 50)
        await pilot.pause()
        await pilot.pause()
        assert not isinstance(app.screen, TooSmallScreen)
        assert app.query_one(ResultsTable).max_scroll_y == 0  # every row on screen again


@pytest.mark.asyncio
async def test_q_leaves_the_session_run_folders_behind(tmp_path: Path) -> None:
    app = DashboardApp(preset=resolve_preset("cpu"), out_dir=tmp_path / "runs")
    assert app.farewell() == f"no run started; run folders go under {tmp_path / 'runs'}/"
    async with app.run_test(size=(100, 30)) as pilot:
        app.report = full_benchmark()[1]
        await pilot.press("e")  # an export: one folder of this session
        await pilot.pause()
        await pilot.press("q")
    (exported,) = app.folders
    assert exported.parent == tmp_path / "runs" / "exports"
    assert app.farewell() == f"run folders of this session: {exported}"


@pytest.mark.asyncio
async def test_help_scrolls_on_a_short_terminal() -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        keys = app.screen.query_one("#help-keys")
        assert keys.max_scroll_y > 0  # more keys than lines: they scroll, the footer stays
        await pilot.press("end")
        await pilot.pause()
        assert keys.scroll_y == keys.max_scroll_y
