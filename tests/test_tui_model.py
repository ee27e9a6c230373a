"""The dashboard's view model and drawing helpers, without Textual."""

from __future__ import annotations

import math

from rich.text import Text

from kronos_tune.tui.format import duration, gib, rate, sparkline
from kronos_tune.tui.model import ResultsModel, RunState, TelemetryHistory
from kronos_tune.tui.widgets import columns
from kronos_tune.tui.widgets.base import fit_lines
from kronos_tune.tui.widgets.host import core_strip
from test_tui_canned import series, trial_results


def test_sparkline_uses_a_fixed_scale_and_keeps_the_newest_on_the_right() -> None:
    assert sparkline([0.0, 50.0, 100.0], 3, 0.0, 100.0) == "▁▅█"
    assert sparkline([50.0, 50.0], 4, 0.0, 100.0) == "  ▅▅"  # short history: padded on the left
    assert sparkline([10.0, 20.0, 30.0, 40.0], 2) == "▁█"  # own min/max without a scale, newest kept
    assert sparkline([math.nan, 100.0], 2, 0.0, 100.0) == " █"  # unknown readings are skipped
    assert sparkline([], 3) == "   "


def test_number_formats() -> None:
    assert gib(3 * 2**30) == "3.0 GiB" and gib(512 * 2**20) == "512 MiB" and gib(None) == "n/a"
    assert duration(0.0421) == "42 ms" and duration(12.34) == "12.3 s" and duration(245) == "4m05s"
    assert duration(7 * 3600 + 600) == "7h10m" and duration(3 * 86400 + 4 * 3600) == "3d04h"
    assert rate(1234.0) == "1.2k" and rate(943.2) == "943" and rate(12.345) == "12.3" and rate(2.5) == "2.50"


def test_fit_lines_keeps_important_groups_whole_and_in_order() -> None:
    a, b1, b2, c = Text("a"), Text("b1"), Text("b2"), Text("c")
    lines = [(2, [a]), (0, [b1, b2]), (1, [c])]
    assert fit_lines(lines, 4) == [a, b1, b2, c]
    assert fit_lines(lines, 3) == [b1, b2, c]
    assert fit_lines(lines, 2) == [b1, b2]
    assert fit_lines(lines, 1) == [c]  # the wrapped group does not fit: the next one that does is kept


def test_core_strip_has_one_cell_per_core() -> None:
    strip = core_strip((0.0, 50.0, 100.0))
    assert strip.plain == "▁▅█"


def test_history_keeps_the_newest_readings() -> None:
    history = TelemetryHistory(length=5)
    for snapshot in series(8):
        history.add(snapshot)
    assert len(history.series("ram")) == 5
    assert history.series("gpu0.memory")[-1] == 100 * (20 + 7) / 80  # i = 7: 27 of 80 GiB
    assert history.series("gpu1.util") == [0.0] * 5
    assert history.latest is not None and history.latest.timestamp_s == 1_700_000_007.0


def test_results_sort_unknown_last_and_cycle() -> None:
    model = ResultsModel(columns("train"))
    for result in trial_results():
        model.add(result)
    model.sort_by("step_time_s")
    names = [r.name for r in model.rows()]
    assert names[:2] == ["combined", "dataloader"] and names[-3:] == ["bf16", "autobatch", "compile"]
    model.sort_by("step_time_s")  # again: descending, unknown values still last
    assert [r.name for r in model.rows()][0] == "checkpointing" and model.reverse
    model.cycle_sort()
    assert model.sort_key == "tokens_per_s" and not model.reverse
    model.add(trial_results()[0])  # a result with the same name replaces the old one
    assert len(model.rows()) == 8


def test_run_state_tracks_trials_and_steps() -> None:
    run = RunState()
    run.begin("benchmark train")
    run.begin_trial("baseline", 1, 13, 6)
    run.add_step(1, 7.2, 1.5, 1000.0)
    assert (run.step, run.steps_target, list(run.loss)) == (1, 6, [7.2]) and run.busy
    run.begin_trial("noise-probe", 2, 13, 6)
    assert run.step == 0 and not run.loss  # each trial starts its own series
    run.cancelling()
    assert run.phase == "cancelling"
    run.end("cancelled", "2 ok")
    assert not run.busy and run.outcome == "2 ok"
    assert run.trial is None and run.step == 0 and run.steps_target is None  # the run's end, not its last trial


def test_a_step_line_never_runs_past_its_end() -> None:
    from kronos_tune.tui.widgets.run import RunPanel

    run = RunState()
    run.begin("benchmark train")
    run.begin_trial("baseline", 1, 3, 15, open_count=True)  # measured until the timing settles
    panel = RunPanel()
    for step in range(1, 61):
        run.add_step(step, 7.0, 0.1, 1000.0)
    panel.show(run)
    text = "\n".join(line.plain for _, line in panel.lines(60))
    assert "step 60 " in text and "at least 15" in text and "/15" not in text
    run.end_trial()
    assert "step" not in "\n".join(line.plain for _, line in panel.lines(60)).replace("steps", "")
    run.begin("training")
    run.steps_target = 4
    for step in (1, 2, 3, 4, 5):  # a count that passes its total turns into the open form
        run.add_step(step, 7.0, 0.1, 1000.0)
        shown = "\n".join(line.plain for _, line in panel.lines(60))
        assert (f"step {step}/4" in shown) == (step <= 4) and "5/4" not in shown
