"""Snapshot tests of the dashboard with canned telemetry: 2 GPUs and no GPU, at 100x30 and 160x50.

Regenerate after a deliberate change with `pytest tests/test_tui_snapshots.py --snapshot-update`
and look at the SVGs under tests/__snapshots__/ before committing them.
"""

from __future__ import annotations

import dataclasses
import socket

import pytest
from textual.pilot import Pilot

from kronos_core.cpu_features import features_from_flags
from kronos_tune.presets import resolve_preset
from kronos_tune.tui.app import DashboardApp
from kronos_tune.benchmark.events import TrialFinished
from kronos_tune.tui.jobs import JobFinished, BenchmarkEvent, TelemetryUpdated
from test_tui_canned import GIB, SNAPSHOT_TRIALS, full_benchmark, series, trial_in_flight, trial_results
from test_tui_finished_fit import LONG_REASON



@pytest.fixture(autouse=True)
def snapshot_host(steady_dashboard, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host name the snapshots show."""
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-7")


SIZES = [(100, 30), (160, 50)]
FINISHED_SIZES = [(80, 24), (100, 30), (120, 40), (160, 50)]  # a finished benchmark at every common size


def canned_app() -> DashboardApp:
    """The dashboard without a live sampler: telemetry comes only from the test."""
    cpu = features_from_flags("fpu sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_int8".split(), cores=2)
    return DashboardApp(preset=resolve_preset("cpu"), cpu=cpu)


def feed(count: int, gpus: bool, trials: bool = False, running: bool = False, benchmark: bool = False,
         long_answer: bool = False):
    async def run_before(pilot: Pilot) -> None:
        app = pilot.app
        for snapshot in series(count, gpus):
            app.post_message(TelemetryUpdated(snapshot))
        for result in trial_results() if trials else ():
            app.post_message(BenchmarkEvent(TrialFinished(result)))
        if benchmark:  # the cpu preset's whole benchmark, finished, with its recommendation
            results, report = full_benchmark(names=SNAPSHOT_TRIALS)
            if long_answer:  # a reason as long as the real rule writes, and the memory headroom
                report.recommended = dataclasses.replace(report.recommended, reason=LONG_REASON)
                report.headroom = {"peak_bytes": int(2.4 * GIB), "budget_bytes": 8 * GIB, "batch": 16,
                                   "fits_batch": 240, "text": "2.40 of 8.0 GiB used (30%): batch 16 -> about 240 "
                                                              "would fit"}
            app.run_state.begin("benchmark train")
            for result in results:
                app.post_message(BenchmarkEvent(TrialFinished(result)))
            app.post_message(JobFinished("benchmark train", "done", f"{len(results)} ok", report))
        if running:  # as if `b` had started the benchmark and it were four steps into its fifth trial
            app.run_state.begin("benchmark train")
            for event in trial_in_flight():
                app.post_message(BenchmarkEvent(event))
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_screen_two_gpus(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(canned_app(), terminal_size=size, run_before=feed(40, gpus=True))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_screen_without_gpu(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(canned_app(), terminal_size=size, run_before=feed(40, gpus=False))


def test_too_small_terminal(snap_compare) -> None:
    assert snap_compare(canned_app(), terminal_size=(60, 20), run_before=feed(3, gpus=True))


def test_help_screen(snap_compare) -> None:
    assert snap_compare(canned_app(), terminal_size=(100, 30), press=["question_mark"],
                        run_before=feed(3, gpus=False))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_results_table_with_canned_trials(snap_compare, size: tuple[int, int]) -> None:
    """Deltas green (better) / red (worse) / dim with ~ (noise); skipped, OOM and failed rows show their reason."""
    assert snap_compare(canned_app(), terminal_size=size, run_before=feed(40, gpus=False, trials=True))


def test_results_sorted_by_step_time(snap_compare) -> None:
    assert snap_compare(canned_app(), terminal_size=(160, 50), press=["s", "s", "s", "s"],
                        run_before=feed(5, gpus=True, trials=True))


def test_run_panel_during_a_trial(snap_compare) -> None:
    """Trial 5/13 at step 4/6 with its loss, step time and throughput sparklines, rows already in."""
    assert snap_compare(canned_app(), terminal_size=(160, 50), run_before=feed(60, gpus=True, trials=True,
                                                                                running=True))


@pytest.mark.parametrize("size", FINISHED_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_whole_benchmark_with_recommendation(snap_compare, size: tuple[int, int]) -> None:
    """Every trial of the cpu benchmark and the recommendation panel at 80x24, 100x30, 120x40 and 160x50: the
    recommendation's first lines (what to run, the command) on screen, the table scrolled to the recommended row
    where it does not fit (the other rows one PgUp away, as its legend says); ▶ marks the recommended row, ★ the
    fastest; the Run panel shows the run's end."""
    assert snap_compare(canned_app(), terminal_size=size, run_before=feed(40, gpus=False, benchmark=True))


SMALL_SIZES = [(80, 24), (100, 30)]


@pytest.mark.parametrize("size", SMALL_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_long_recommendation_read_to_its_end(snap_compare, size: tuple[int, int]) -> None:
    """tab (the footer names it) gives the recommendation the focus and more rows; PgDn scrolls it to its end
    (the memory line); the table keeps its header and a trial row below it."""
    assert snap_compare(canned_app(), terminal_size=size, press=["tab", "pagedown", "pagedown", "pagedown"],
                        run_before=feed(40, gpus=False, benchmark=True, long_answer=True))


@pytest.mark.parametrize("size", SMALL_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_back_to_the_table_and_its_first_rows(snap_compare, size: tuple[int, int]) -> None:
    """tab twice more (the log, then the results), then PgUp to the top: the table's first rows under the
    recommendation's first lines."""
    assert snap_compare(canned_app(), terminal_size=size, press=["tab", "tab", "tab"] + ["pageup"] * 6,
                        run_before=feed(40, gpus=False, benchmark=True, long_answer=True))


def test_whole_benchmark_with_two_gpus(snap_compare) -> None:
    assert snap_compare(canned_app(), terminal_size=(160, 50), run_before=feed(40, gpus=True, benchmark=True))
