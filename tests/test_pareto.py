"""The benchmark's picture: the Pareto front, the scatter's data, pareto.png/.svg in the run folder, and the
one-line hint without matplotlib."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from kronos_tune.benchmark import TrialResult
from kronos_tune.benchmark.report.pareto import Point, budget_in_view, front_staircase, pareto_front, scatter_of
from kronos_tune.benchmark.results import Spread

from test_decision import h200_like_results
from test_report_cli import run_cli, write_gpu_run

MIB = 2**20
GIB = 2**30
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def names(points: list[Point]) -> list[str]:
    return [p.name for p in points]


def test_front_keeps_only_points_nothing_beats_on_both_axes() -> None:
    points = [Point("big-fast", 900, 1.0), Point("small-slow", 100, 5.0), Point("middle", 500, 2.0),
              Point("dominated", 600, 3.0),  # middle is smaller and faster
              Point("worse-twin", 900, 1.5),  # same memory as big-fast, slower
              Point("same-time-more-memory", 950, 1.0)]  # as fast as big-fast, bigger
    assert names(pareto_front(points)) == ["small-slow", "middle", "big-fast"]


def test_front_ties_equal_points_stay_and_order_does_not_matter() -> None:
    points = [Point("b", 200, 2.0), Point("a", 200, 2.0), Point("c", 100, 3.0), Point("d", 300, 2.0)]
    front = pareto_front(points)
    assert sorted(names(front)) == ["a", "b", "c"]  # a and b tie exactly; d is as fast but bigger
    assert sorted(names(pareto_front(reversed(points)))) == ["a", "b", "c"]
    assert [p.memory_bytes for p in front] == [100, 200, 200]  # least memory first
    assert pareto_front([]) == []
    assert names(pareto_front([Point("only", 5, 5)])) == ["only"]


def test_staircase_runs_right_then_down() -> None:
    front = [Point("a", 1, 9.0), Point("b", 4, 5.0), Point("c", 6, 2.0)]
    assert front_staircase(front) == ([1, 4, 4, 6, 6], [9.0, 9.0, 5.0, 5.0, 2.0])


def test_scatter_leaves_out_failures_and_keeps_repeats_off_the_front() -> None:
    trials = h200_like_results(8, outlier=False)
    by_name = {t.name: t for t in trials}
    by_name["checkpointing"].status, by_name["checkpointing"].reason = "oom", "CUDA out of memory"
    by_name["noise-probe"].step_time_s = Spread.of([0.001] * 8)  # fastest of all, but not a configuration
    scatter = scatter_of(trials, "train", budget_bytes=11 * 2**30, recommended="compile")
    assert scatter.unit == "step" and "optimizer step" in scatter.axis_label
    assert "checkpointing" not in names(scatter.points)
    assert scatter.left_out == [("checkpointing", "oom")] and "checkpointing (oom)" in scatter.caption()
    assert scatter.point("noise-probe").repeat and "noise-probe" not in names(scatter.front)
    # combined 646 MiB/132 ms, accumulation 1320/88, bf16 1650/48, compile 1720/46.4: each faster, each bigger
    assert names(scatter.front) == ["combined", "accumulation", "bf16", "compile"]
    assert scatter.point("baseline").seconds == pytest.approx(by_name["baseline"].step_time_s.median)


def test_different_batches_compare_time_per_sample() -> None:
    trials = h200_like_results(4, outlier=False)[:3]
    for trial, (tokens, samples_per_s) in zip(trials, [(5000, 1000.0), (5000, 1100.0), (20000, 4000.0)]):
        trial.tokens_per_step, trial.samples_per_s = tokens, Spread.of([samples_per_s])
    scatter = scatter_of(trials, "train")
    assert scatter.unit == "sample" and "batches differ" in scatter.axis_label
    assert [p.seconds for p in scatter.points] == pytest.approx([1 / 1000, 1 / 1100, 1 / 4000])


def test_a_failed_trial_without_memory_is_listed_not_drawn() -> None:
    trials = [TrialResult("baseline", "baseline", "ok", step_time_s=Spread.of([0.1, 0.1]), peak_memory_bytes=MIB),
              TrialResult("bigger-batch", "single", "timeout", reason="watchdog"),
              TrialResult("fp16", "single", "skipped", reason="CUDA only"),
              TrialResult("ddp", "single", "skipped", reason="CUDA only")]
    scatter = scatter_of(trials, "train")
    assert names(scatter.points) == ["baseline"] and names(scatter.front) == ["baseline"]
    assert scatter.caption() == "not drawn: bigger-batch (timeout); skipped: fp16, ddp"


def test_report_writes_the_picture_and_embeds_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    trials = h200_like_results(8)
    trials[3].status, trials[3].reason = "oom", "CUDA out of memory"  # checkpointing
    run = write_gpu_run(tmp_path / "run", trials)
    code, out, err = run_cli(["report", str(run)], capsys)
    assert code == 0, err
    assert (run / "pareto.png").read_bytes()[:8] == PNG_SIGNATURE
    svg = ElementTree.parse(run / "pareto.svg").getroot()
    texts = {element.text for element in svg.iter() if element.tag.endswith("text") and element.text}
    names = {text.lstrip("▶★ ") for text in texts}  # a point's label: its marks, then its name
    for trial in trials:
        if trial.name != "checkpointing":
            assert trial.name in names, trial.name
    assert "not drawn: checkpointing (oom)" in " ".join(texts)
    chosen = next(text for text in texts if text.startswith("▶ recommended: ")).split(": ")[1]
    assert {f"▶ {chosen}", f"▶★ {chosen}"} & texts  # the mark is in the recommended point's own label
    markdown = (run / "report.md").read_text()
    assert "![step time vs peak memory](pareto.png)" in markdown
    assert markdown.index("| baseline") < markdown.index("pareto.png")  # under the table
    assert f"picture (time vs peak memory, Pareto front): {run / 'pareto.png'} and pareto.svg" in out


def test_an_unchanged_run_keeps_its_picture_and_a_changed_one_is_redrawn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from kronos_tune.figures import png_key

    trials = h200_like_results(8)
    run = write_gpu_run(tmp_path / "run", trials)
    assert run_cli(["report", str(run)], capsys)[0] == 0
    drawn = {name: (run / name).stat().st_ino for name in ("pareto.png", "pareto.svg")}
    first_key = png_key(run / "pareto.png")
    assert first_key is not None and len(first_key) == 32
    assert run_cli(["report", str(run)], capsys)[0] == 0
    assert {name: (run / name).stat().st_ino for name in drawn} == drawn  # not rewritten
    assert "![step time vs peak memory](pareto.png)" in (run / "report.md").read_text()

    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    (run / "results.jsonl").write_text("".join(lines[:-1]))  # one trial fewer: another picture
    assert run_cli(["report", str(run)], capsys)[0] == 0
    assert (run / "pareto.png").stat().st_ino != drawn["pareto.png"]
    assert png_key(run / "pareto.png") not in (None, first_key)

    (run / "pareto.png").write_bytes(PNG_SIGNATURE + b"\0\0\0\0IEND")  # a picture without a key: redrawn
    assert run_cli(["report", str(run)], capsys)[0] == 0
    assert png_key(run / "pareto.png") is not None


def test_without_matplotlib_the_report_says_how_to_get_the_picture(tmp_path: Path) -> None:
    run = write_gpu_run(tmp_path / "run")
    script = ("import sys; sys.modules['matplotlib'] = None\n"  # what an environment without the extra looks like
              "from kronos_tune.cli import main\n"
              f"main(['report', {str(run)!r}])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    hint = f'no picture: matplotlib is not installed; pip install "kronos-tune[plot]", then kronos-tune report {run}'
    assert hint in " ".join(done.stdout.split())
    assert not (run / "pareto.png").exists() and not (run / "pareto.svg").exists()
    markdown = (run / "report.md").read_text()
    assert (f'No picture: matplotlib is not installed; `pip install "kronos-tune[plot]"`, then '
            f"`kronos-tune report {run}`.") in markdown.splitlines()
    assert json.loads((run / "report.json").read_text())["recommended"]["source"]


def test_the_budget_is_drawn_only_when_it_does_not_crowd_the_points() -> None:
    points = [TrialResult("baseline", "baseline", "ok", step_time_s=Spread.of([0.1]), peak_memory_bytes=2 * GIB)]
    assert budget_in_view(scatter_of(points, "train", budget_bytes=4 * GIB))
    assert not budget_in_view(scatter_of(points, "train", budget_bytes=140 * GIB))  # an H200 for a small model
    assert not budget_in_view(scatter_of(points, "train", budget_bytes=0))  # no budget known


def test_prediction_trials_compare_time_per_series() -> None:
    trials = [TrialResult("recompute", "baseline", "ok", task="predict", series_per_s=Spread.of([4.0]),
                          peak_memory_bytes=300 * MIB),
              TrialResult("kv-cache", "single", "ok", task="predict", series_per_s=Spread.of([10.0]),
                          peak_memory_bytes=320 * MIB)]
    scatter = scatter_of(trials, "predict")
    assert scatter.unit == "series" and [p.seconds for p in scatter.points] == [0.25, 0.1]
    assert names(scatter.front) == ["recompute", "kv-cache"]  # smaller, or faster
