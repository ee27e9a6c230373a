"""Time to target: the time-to-quality recommendation on constructed runs, and a real tiny run of the
comparison through the benchmark (`--time-to-target`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.results import TrialResult
from kronos_tune.benchmark.train.target import SeedRun, TimeToTarget, recommend_by_target, summary_lines, wanted


def _with_target(name: str, seconds: list[float], reached: bool = True) -> TrialResult:
    result = TrialResult(name, "baseline" if name == "baseline" else "single", "ok")
    runs = [SeedRun(1000 + i, reached, s, 10 + i, 6.5) for i, s in enumerate(seconds)]
    result.time_to_target = TimeToTarget(6.6, 15, 60, runs).to_dict()
    return result


def test_a_change_is_recommended_only_when_every_seed_beats_the_baselines_fastest() -> None:
    base = _with_target("baseline", [10.0, 11.0, 12.0])
    overlapping = _with_target("dataloader", [8.0, 9.0, 10.5])
    clear = _with_target("fused-adamw", [7.0, 8.0, 9.5])
    source, reason = recommend_by_target([base, overlapping, clear])
    assert source == "fused-adamw" and "8.0 s to target" in reason and "baseline's 11.0 s" in reason
    assert recommend_by_target([base, overlapping])[0] == "baseline"
    missed = _with_target("bf16", [1.0, 1.0, 1.0], reached=False)
    assert recommend_by_target([base, missed])[0] == "baseline"
    assert recommend_by_target([TrialResult("baseline", "baseline", "ok")])[0] == "baseline"
    assert summary_lines([base, missed]) == ["baseline: 11.0 s to target (seeds 10.0–12.0 s, n=3; 10–12 steps)",
                                             "bf16: target reached by 0 of 3 seeds within 60 steps"]
    assert TimeToTarget.from_dict(clear.time_to_target).median_s == 8.0


def test_the_comparison_stays_out_of_the_quick_run() -> None:
    assert not wanted(BenchmarkOptions()) and not wanted(BenchmarkOptions(full=True))
    assert wanted(BenchmarkOptions(time_to_target=True)) and wanted(BenchmarkOptions(objective="time-to-quality"))


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_real_tiny_run_measures_the_time_to_target_over_three_seeds(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_benchmark_run import FAST, write_preset

    from kronos_tune.benchmark.report.rebuild import load_run
    from kronos_tune.benchmark.run.runner import run_benchmark
    from kronos_tune.presets import resolve_preset

    preset = resolve_preset(write_preset(tmp_path / "presets"))
    options = BenchmarkOptions(**{**FAST, "only": ("fused-adamw",), "skip": ("baseline-repeat", "noise-probe"),
                                 "objective": "time-to-quality", "target_max_factor": 3.0})
    report = run_benchmark(preset, options=options, out_dir=tmp_path / "out")
    base = TimeToTarget.from_dict(report.trial("baseline").time_to_target)
    assert base is not None and len(base.runs) == 3 and base.target == report.trial("baseline").val_loss
    assert all(run.steps <= base.max_steps and (run.reached or run.steps == base.max_steps) for run in base.runs)
    assert report.trial("fused-adamw").time_to_target is not None
    assert report.recommended.reason.startswith(("kept the baseline", "no change reached", "fused-adamw reaches"))
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "Time to target (each candidate" in markdown
    again = load_run(tmp_path / "out").report  # from results.jsonl alone: the last line of each name carries it
    assert again.trial("baseline").time_to_target == report.trial("baseline").time_to_target
