"""One estimate per trial in every view: a constructed run where the raw medians and the paired ratios
disagree (fused-adamw's raw median is the lowest, but paired against the baseline it is 3.7% slower, while
dataloader's raw median is the highest and its paired ratio the lowest). The fastest mark, the table's time
cells and their order (report.md, the CLI, the dashboard), the scatter's points, the drawn picture and its
star all follow the paired estimate."""

from __future__ import annotations

import pytest

from kronos_tune.benchmark.report.shown import fastest, raw_and_shown, shown_step_time
from kronos_tune.benchmark.report.pareto import scatter_of
from kronos_tune.benchmark.results import Spread, TrialResult
from kronos_tune.benchmark.stats import Comparison
from kronos_tune.tui.model import ResultsModel, best_trial
from kronos_tune.tui.widgets.results import columns, row_cells

GIB = 2**30


def _trial(name: str, stage: str, raw_s: float, ratio: float | None) -> TrialResult:
    trial = TrialResult(name=name, stage=stage, status="ok", step_time_s=Spread(raw_s, raw_s * 0.98, raw_s * 1.02, 9),
                        tokens_per_step=800, peak_memory_bytes=int((2.0 if stage == "baseline" else 2.1) * GIB))
    if ratio is not None:
        trial.comparison = Comparison(ratio, ratio - 0.02, ratio + 0.02, 0.05, "same", 12, 12, "test", "paired")
        trial.design = "paired"
    return trial


@pytest.fixture
def trials() -> list[TrialResult]:
    return [_trial("baseline", "baseline", 0.347, None),
            _trial("fused-adamw", "single", 0.335, 1.037),  # lowest raw median, slower when paired
            _trial("dataloader", "single", 0.360, 0.95)]    # highest raw median, fastest when paired


def test_the_estimate_is_the_baseline_median_times_the_paired_ratio(trials) -> None:
    base, fused, loader = trials
    assert shown_step_time(fused, base) == pytest.approx(0.347 * 1.037)
    assert shown_step_time(base, base) == pytest.approx(0.347)
    kept = raw_and_shown(fused, base)
    assert kept["raw_median"] == pytest.approx(0.335) and kept["shown"] == pytest.approx(0.347 * 1.037)
    assert kept["source"] == "compared ratio x baseline median" and kept["design"] == "paired"


def test_every_view_orders_the_trials_the_same_way(trials) -> None:
    expected = ["dataloader", "baseline", "fused-adamw"]
    assert fastest(trials, "train").name == best_trial(trials, "train").name == "dataloader"
    model = ResultsModel(columns("train"))
    for trial in trials:
        model.add(trial)
    model.sort_by("step_time_s")
    assert [r.name for r in model.rows()] == expected
    cells = {t.name: row_cells(t, "train", baseline=trials[0])[3].plain for t in trials}
    assert cells["fused-adamw"].startswith("360") and cells["dataloader"].startswith("330")  # ms, the estimate
    scatter = scatter_of(trials, "train")
    assert [p.name for p in sorted(scatter.points, key=lambda p: p.seconds)] == expected
    assert scatter.point("fused-adamw").seconds == pytest.approx(0.347 * 1.037)


def test_the_report_table_shows_the_estimate_with_the_raw_median(trials) -> None:
    from kronos_tune.benchmark.report.shown import table
    from kronos_tune.benchmark.results import BenchmarkReport

    report = BenchmarkReport(preset="cpu", task="train", device="cpu", device_line="cpu", budget_bytes=8 * GIB,
                            budget_mode="simulated", trials=trials)
    header, rows = table(report)
    cells = {row[0].text.split(" (")[0]: row[header.index("time/step [IQR] n")].text for row in rows}
    assert cells["fused-adamw"].startswith("360 ms (raw 335 ms") and cells["dataloader"].startswith("330 ms (raw 360")
    assert cells["baseline"].startswith("347 ms [")  # its own median: nothing to add


EXPECTED = ["dataloader", "baseline", "fused-adamw"]  # fastest first, by the paired estimate


def _report(trials, tmp_path=None):
    from kronos_tune.benchmark.recommendation import Recommendation
    from kronos_tune.benchmark.results import BenchmarkReport

    rec = Recommendation("dataloader", "fastest by the paired estimate", {"num_workers": 2}, "kronos-tune train")
    return BenchmarkReport(preset="cpu", task="train", device="cpu", device_line="cpu", budget_bytes=8 * GIB,
                          budget_mode="simulated", trials=trials, recommended=rec,
                          out_dir=None if tmp_path is None else str(tmp_path))


def _ms(text: str) -> float:
    """The figure a time cell leads with ('330 ms (raw ...' or '347 ms [IQR ...'), in ms."""
    number, unit = text.split()[:2]
    assert unit == "ms", text
    return float(number)


def _by_time(cells: dict[str, str]) -> list[str]:
    return sorted(cells, key=lambda name: _ms(cells[name]))


def test_report_md_the_cli_and_the_dashboard_show_one_time_and_one_order(trials) -> None:
    """report.md's rows and time column, the CLI table's and the dashboard's: the same figure per trial (the
    estimate, not the raw median), so ordering by it gives one order everywhere."""
    from rich.console import Console

    from kronos_tune.benchmark.report.files import report_markdown
    from kronos_tune.commands.benchmark import render

    report = _report(trials)
    rows = [line for line in report_markdown(report).splitlines() if line.startswith("| ") and " ms" in line]
    header = next(line for line in report_markdown(report).splitlines() if line.startswith("| configuration"))
    column = [cell.strip() for cell in header.strip("|").split("|")].index("time/step [IQR] n")
    markdown = {row.strip("|").split("|")[0].strip().split(" (")[0]: row.strip("|").split("|")[column].strip()
                for row in rows}
    assert list(markdown) == [t.name for t in trials]  # rows in run order
    assert _by_time(markdown) == EXPECTED and _ms(markdown["fused-adamw"]) == 360.0

    console = Console(record=True, width=240, color_system=None)
    render(console, report)
    lines = console.export_text().splitlines()
    at = next(line for line in lines if line.split()[:1] == ["trial"]).index("time/step")  # the time column
    cli = {}
    for name in markdown:  # each trial's row: its name, then the time cell's first line ("360 ms")
        row = next(line for line in lines if line.split()[:1] == [name])
        cli[name] = " ".join(row[at:].split()[:2])
    assert [n for n in (line.split()[0] for line in lines if line.split()) if n in markdown][:3] == list(markdown)
    assert {name: _ms(text) for name, text in cli.items()} == {name: _ms(text) for name, text in markdown.items()}

    model = ResultsModel(columns("train"))
    for trial in trials:
        model.add(trial)
    model.sort_by("step_time_s")
    dashboard = {t.name: row_cells(t, "train", baseline=trials[0])[3].plain for t in model.rows()}
    assert list(dashboard) == _by_time(markdown) == _by_time(cli)
    assert {name: _ms(text) for name, text in dashboard.items()} == {n: _ms(t) for n, t in markdown.items()}


def test_the_picture_marks_the_recommended_point_and_plots_the_estimate(trials, tmp_path) -> None:
    """pareto.png: each point at its estimate (the order of the table), ▶ on the recommended trial's point and
    ★ on the fastest's (as the results table marks them), and the file carries the key of what it shows."""
    from kronos_tune.benchmark.report.picture import FILES, draw, picture_key, report_scatter, write_picture
    from kronos_tune.figures import new_figure, png_key

    report = _report(trials, tmp_path)
    scatter = report_scatter(report)
    assert scatter.recommended == "dataloader"
    assert {p.name: p.seconds for p in scatter.points} == pytest.approx(
        {t.name: shown_step_time(t, trials[0]) for t in trials})
    figure = new_figure(figsize=(9, 6), layout="constrained")
    draw(figure, scatter, "one estimate")
    axes = figure.axes[0]
    drawn = {c.get_label(): c.get_offsets().tolist() for c in axes.collections if not c.get_label().startswith("_")}
    names = [p.name for p in scatter.points if not p.repeat]
    points = dict(zip(names, drawn["trial"]))
    assert sorted(points, key=lambda name: points[name][1]) == EXPECTED  # y: time, ms, the estimate's order
    assert points["fused-adamw"][1] == pytest.approx(1000 * 0.347 * 1.037)
    assert drawn["▶ recommended: dataloader"] == [pytest.approx(points["dataloader"])]
    assert drawn["▶ recommended: dataloader"][0] != pytest.approx(points["fused-adamw"])  # not the raw-fastest one
    assert drawn["★ fastest (by the time shown): dataloader"] == [pytest.approx(points["dataloader"])]
    labels = {text.get_text() for text in axes.texts}
    assert "▶★ dataloader" in labels and "fused-adamw" in labels  # the marks in the point's own label
    written, line = write_picture(report, tmp_path)
    png = tmp_path / FILES[0]
    assert png in written and png.stat().st_size > 0 and line == f"![step time vs peak memory]({FILES[0]})"
    assert png_key(png) == picture_key(scatter, "kronos-tune benchmark: preset cpu, task train")
