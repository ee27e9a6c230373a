"""The dashboard at 80x24 and 100x30 after a finished benchmark with a long answer: the results table stays on
screen with the recommended row, the recommendation is whole (scrolling where it is cut), and the keys the
footer and the panels name reach both; the keys the issue tried (PgDn, PgUp, Down, ctrl+End, s) never push the
table away."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console
from textual.widgets._footer import FooterKey

from kronos_tune.presets import resolve_preset
from kronos_tune.tui.app import DashboardApp
from kronos_tune.tui.widgets import AnswerPanel, LogPane, ResultsTable
from test_tui_canned import SNAPSHOT_TRIALS, full_benchmark, series
from test_tui_finished_fit import LONG_REASON, _finish

pytestmark = pytest.mark.usefixtures("steady_dashboard")

GIB = 2**30
SIZES = [(80, 24), (100, 30)]


def screen_text(app: DashboardApp) -> str:
    """What the terminal shows, as plain text (Textual has no public text export: the compositor's frame)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, color_system=None)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def footer_keys(app: DashboardApp) -> set[str]:
    return {key.key_display for key in app.query(FooterKey)}


async def _finished(pilot, app: DashboardApp):
    results, report = full_benchmark(names=SNAPSHOT_TRIALS)
    report.recommended = dataclasses.replace(report.recommended, reason=LONG_REASON)
    report.headroom = {"peak_bytes": int(2.4 * GIB), "budget_bytes": 8 * GIB, "batch": 16, "fits_batch": 240,
                       "text": "2.40 of 8.0 GiB used (30%): batch 16 -> about 240 would fit"}
    await _finish(pilot, app, results, report, gpus=False)
    for _ in range(3):
        await pilot.pause()
    return results, report


def assert_table_reachable(app: DashboardApp, row: str) -> None:
    """The table is on screen above the footer with at least one trial row, and `row` is one of those shown."""
    table = app.query_one(ResultsTable)
    assert table.display and table.region.height >= 5
    assert table.region.bottom <= app.screen.region.bottom - 1  # above the footer
    assert "Results (train)" in screen_text(app)
    shown = [line for line in screen_text(app).splitlines() if line.startswith("│ ")]
    assert any(f" {row} " in f" {line.lstrip('│ ▶★')} " for line in shown), row


@pytest.mark.asyncio
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_table_and_the_whole_recommendation_are_reachable(size: tuple[int, int]) -> None:
    app = DashboardApp(preset=resolve_preset("cpu"))
    async with app.run_test(size=size) as pilot:
        results, report = await _finished(pilot, app)
        panel, table = app.query_one(AnswerPanel), app.query_one(ResultsTable)
        # the table keeps its rows beside the recommendation, scrolled to the recommended row
        assert app.focused is table
        assert_table_reachable(app, "combined")
        assert table.region.height >= 7  # border, header, 3 trials, the scrollbar
        # the recommendation holds every word, and the first rows are on screen: what to run
        whole = " ".join(panel.plain.split())
        assert LONG_REASON in whole and report.recommended.command in whole and "about 240 would fit" in whole
        assert "▶ run combined" in screen_text(app)

        # the footer names tab at both sizes (the palette's ^p leaves it room at 80 columns), every key whole
        assert "tab" in footer_keys(app) and {"p", "b", "t", "?", "q"} <= footer_keys(app)
        assert max(key.region.right for key in app.query(FooterKey)) <= size[0]
        cut = panel.max_scroll_y > 0
        if cut:  # the panel says how to read the rest
            assert "more: tab, then ↑↓ PgUp PgDn" in screen_text(app)
        assert size == (100, 30) or cut  # 80x24 cannot hold it whole

        await pilot.press("tab")
        assert app.focused is panel
        seen = _flat(screen_text(app))
        for _ in range(20):  # down through the recommendation to its end, reading what it shows
            await pilot.press("pagedown")
            await pilot.pause()
            seen += " " + _flat(screen_text(app))
            if panel.scroll_y >= panel.max_scroll_y:
                break
        assert panel.scroll_y == panel.max_scroll_y
        for words in (LONG_REASON[:60], LONG_REASON[-60:], "about 240 would fit", "recommended.toml"):
            assert " ".join(words.split()) in seen, words
        assert_table_reachable(app, "combined")  # still there, one trial row at least, while the panel reads

        await pilot.press("tab")  # the log, then back to the results
        assert app.focused is app.query_one(LogPane)
        await pilot.press("tab")
        assert app.focused is table
        for key in ("pageup", "ctrl+home"):
            await pilot.press(key)
        await pilot.pause()
        assert_table_reachable(app, "baseline")  # the first rows, one key away
        for key in ("pagedown", "down", "ctrl+end", "s"):  # what the issue pressed: the table stays
            await pilot.press(key)
            await pilot.pause()
            assert_table_reachable(app, table.get_row_at(table.cursor_row)[0].plain.lstrip("▶★ "))
        await pilot.press("shift+tab")  # and backwards: the log
        assert app.focused is app.query_one(LogPane)
