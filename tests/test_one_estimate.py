"""One estimate per trial in every view: a constructed run where the raw medians and the paired ratios
disagree (fused-adamw's raw median is the lowest, but paired against the baseline it is 3.7% slower, while
dataloader's raw median is the highest and its paired ratio the lowest). The fastest mark, the table's time
cells and their order, the scatter's points (the picture's data) and the answer all follow the paired
estimate."""

from __future__ import annotations

import pytest

from kronos_tune.benchmark.report.estimate import fastest, raw_and_estimate, step_time_estimate
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
    assert step_time_estimate(fused, base) == pytest.approx(0.347 * 1.037)
    assert step_time_estimate(base, base) == pytest.approx(0.347)
    kept = raw_and_estimate(fused, base)
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
    from kronos_tune.benchmark.report.table import table
    from kronos_tune.benchmark.results import ProtocolReport

    report = ProtocolReport(preset="cpu", task="train", device="cpu", device_line="cpu", budget_bytes=8 * GIB,
                            budget_mode="simulated", trials=trials)
    header, rows = table(report)
    cells = {row[0].text.split(" (")[0]: row[header.index("time/step [IQR] n")].text for row in rows}
    assert cells["fused-adamw"].startswith("360 ms (raw 335 ms") and cells["dataloader"].startswith("330 ms (raw 360")
    assert cells["baseline"].startswith("347 ms [")  # its own median: nothing to add
