"""The quality guard on validation windows: the paired interval, the A/A resolution, the guard's verdicts on
constructed per-window losses, the planted worsening (benchmarks.planted_trials), and a real tiny run with a planted worsening."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from kronos_tune.benchmark.quality import compare_windows, guard_all, guard_trial, quality_resolution
from kronos_tune.benchmark.results import NOISE_PROBE, BenchmarkReport, TrialResult
from benchmarks.planted_trials import WORSEN_ENV, worsen_for_test
from kronos_tune.train.moved import paired_interval

BASE_LOSS = 6.8
WINDOWS = 16


def _windows(losses: list[float], tokens: float = 99.0) -> list[list[float]]:
    return [[loss, tokens] for loss in losses]


def _result(name: str, losses: list[float], stage: str = "single") -> TrialResult:
    result = TrialResult(name, stage, "ok", val_loss=sum(losses) / len(losses), val_windows=_windows(losses))
    return result


def _runs(seed: int, aa_sd: float = 0.0025, shift_sd: float = 0.0006) -> tuple[list[float], list[float]]:
    """A baseline's per-window losses and an A/A repeat's: windows of different difficulty, the repeat off by a
    small common shift (another training order) and a per-window wobble (relative sizes as measured on the cpu
    preset: about 0.06% and 0.25%)."""
    draw = random.Random(seed)
    base = [BASE_LOSS * (1 + draw.gauss(0, 0.05)) for _ in range(WINDOWS)]
    shift = draw.gauss(0, shift_sd)
    return base, [b * (1 + shift + draw.gauss(0, aa_sd)) for b in base]


def test_paired_interval_is_the_weighted_mean_change_with_a_normal_interval() -> None:
    before = [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [4.0, 1.0]]
    after = [[1.1, 1.0], [2.3, 1.0], [3.1, 1.0], [4.3, 1.0]]
    change, low, high = paired_interval(before, after)
    assert change == pytest.approx(0.2)
    # differences 0.1, 0.3, 0.1, 0.3: sd of the mean = sqrt(4/3 * 4 * (0.25 * 0.1)**2) = 0.0577
    assert high - change == pytest.approx(change - low) == pytest.approx(1.959964 * 0.057735, rel=1e-4)
    assert paired_interval(before, after[:3]) is None  # other windows: no pairs
    assert paired_interval(before, [[v, 2.0] for v, _ in after]) is None  # other weights: other windows
    assert paired_interval(before[:1], after[:1]) is None  # one window: no spread


def test_a_planted_two_percent_worsening_is_flagged_and_the_aa_is_not_in_nine_of_ten() -> None:
    flagged_planted = flagged_aa = 0
    resolutions = []
    for seed in range(10):
        base_losses, probe_losses = _runs(seed)
        base = _result("baseline", base_losses, "baseline")
        probe = _result(NOISE_PROBE, probe_losses, "baseline")
        _, change_losses = _runs(seed)  # a change with training noise of its own: the same windows, redrawn
        draw = random.Random(1000 + seed)
        change_losses = [b * (1 + draw.gauss(0, 0.0006) + draw.gauss(0, 0.0025)) for b in base_losses]
        worsen = random.Random(seed)  # worsened as benchmarks.planted_trials does
        planted = _result("fused-adamw", [c * (1 + 0.02 * (1 + worsen.gauss(0, 1) / 2)) for c in change_losses])
        flagged_planted += not guard_trial(base, planted, probe).passed
        summary = guard_all([base, probe, planted], base, probe)
        flagged_aa += summary["aa"]["flagged"]
        resolutions.append(summary["resolution_pct"])
    assert flagged_planted >= 9 and flagged_aa <= 1
    assert max(resolutions) <= 1.0  # the stated resolution stays within 1% of the val loss


def test_the_guard_tolerates_the_larger_of_floor_and_resolution_and_never_flags_an_improvement() -> None:
    base_losses = [BASE_LOSS + 0.1 * (i % 4) for i in range(WINDOWS)]
    base = _result("baseline", base_losses, "baseline")
    noisy_probe = _result(NOISE_PROBE, [b * (1.008 + (0.001 if i % 2 else -0.001)) for i, b in
                                        enumerate(base_losses)], "baseline")
    resolution, aa = quality_resolution(base, noisy_probe)
    assert aa is not None and resolution == pytest.approx(aa.reach) and 0.008 < resolution < 0.0095
    worse = _result("x", [b * 1.007 for b in base_losses])  # beyond the 0.5% floor, not beyond the resolution
    assert guard_trial(base, worse, None).passed is False
    verdict = guard_trial(base, worse, noisy_probe)
    assert verdict.passed and verdict.threshold_pct == pytest.approx(100 * resolution)
    better = _result("y", [b * 0.95 for b in base_losses])
    assert guard_trial(base, better, noisy_probe).passed
    summary = guard_all([base, noisy_probe, worse, better], base, noisy_probe)
    assert summary["aa"]["flagged"] and noisy_probe.quality["passed"] is False  # the A/A itself above the floor
    assert summary["method"] == "windows" and summary["threshold_pct"] == pytest.approx(100 * resolution)
    assert worse.quality["passed"] and "over 16 windows" in worse.quality["text"]


def test_results_without_window_losses_keep_the_repeat_rule() -> None:
    base = TrialResult("baseline", "baseline", "ok", val_loss=2.0)
    probe = TrialResult(NOISE_PROBE, "baseline", "ok", val_loss=2.004)
    trial = TrialResult("x", "single", "ok", val_loss=2.02)
    assert compare_windows(base, trial) is None
    verdict = guard_trial(base, trial, probe)
    assert verdict.method == "repeat" and verdict.threshold == pytest.approx(0.01) and not verdict.passed
    summary = guard_all([base, probe, trial], base, probe)
    assert summary["method"] == "repeat" and summary["aa"] is None and summary["noise"] == pytest.approx(0.004)


def test_the_views_state_the_quality_resolution_beside_the_speed_resolution() -> None:
    from kronos_tune.benchmark.report.files import report_markdown, resolution_line
    from kronos_tune.benchmark.tasks import get

    base_losses, probe_losses = _runs(3)
    trials = [_result("baseline", base_losses, "baseline"), _result(NOISE_PROBE, probe_losses, "baseline"),
              _result("fused-adamw", [b * 1.03 for b in base_losses])]
    for trial, kind in zip(trials, ("reference", "baseline-repeat", "speed")):
        trial.kind = kind
    report = BenchmarkReport("cpu", "train", "cpu", "cpu", 2**30, "simulated", trials=trials,
                            options={"seed": 1, "quality_floor": 0.005})
    get("train").decide(report, None)
    line = resolution_line(report)
    assert line is not None and "changes in val loss under" in line and "could not be seen" in line
    assert report.quality["resolution_pct"] <= 1.0 and report.quality["flagged"] == ["fused-adamw"]
    markdown = report_markdown(report)
    assert "changes in val loss under" in markdown and "+3.00% [" in markdown
    assert any("tolerated worsening" in note for note in get("train").notes(report))


def test_the_worsening_hook_changes_only_the_named_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    from kronos_tune.benchmark.train.measure import TrainMeasurement

    losses = [[6.0 + 0.01 * i, 99.0] for i in range(400)]
    named, other = (TrainMeasurement("ok", val_loss=6.0, val_windows=[list(w) for w in losses]) for _ in range(2))
    monkeypatch.setenv(WORSEN_ENV, "fused-adamw:0.02:7")
    worsen_for_test(named, "fused-adamw")
    worsen_for_test(other, "dataloader")
    assert other.val_windows == losses
    ratios = [after[0] / before[0] for after, before in zip(named.val_windows, losses)]
    assert sum(ratios) / len(ratios) == pytest.approx(1.02, abs=0.002) and len(set(ratios)) > 1
    assert named.val_loss == pytest.approx(sum(w[0] for w in named.val_windows) / 400)


def test_window_sums_add_up_to_the_trainers_own_evaluation(tmp_path: Path) -> None:
    from kronos_core.train import TrainConfig, Trainer

    config = TrainConfig(what="predictor", model_size="tiny", data=["synthetic"], lookback_window=16,
                         predict_window=4, batch_size=3, samples_per_epoch=60, epochs=1, eval_samples=7,
                         synthetic_series=2, synthetic_rows=200, seed=1, device="cpu", num_workers=0,
                         output_dir=str(tmp_path / "run"))
    for what in ("predictor", "tokenizer"):
        with Trainer(config.replace(what=what, output_dir=str(tmp_path / what))) as trainer:
            trainer.train_step()
            rows = trainer.evaluate_by_window()
            assert rows.shape == (trainer.eval_windows, trainer.steps.eval_width)
            assert trainer.steps.eval_metrics(rows.sum(0))["val_loss"] == pytest.approx(
                trainer.evaluate()["val_loss"], rel=1e-6)  # float32 sums in another order


@pytest.mark.usefixtures("one_thread")
def test_a_real_tiny_run_flags_the_planted_worsening_and_not_the_aa(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   planted_trials) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_benchmark_run import FAST, write_preset

    from kronos_tune.benchmark.options import BenchmarkOptions
    from kronos_tune.benchmark.report.files import resolution_line
    from kronos_tune.benchmark.run.runner import run_benchmark
    from kronos_tune.presets import resolve_preset

    monkeypatch.setenv(WORSEN_ENV, "fused-adamw:0.02:1")
    preset = resolve_preset(write_preset(tmp_path / "presets"))
    options = BenchmarkOptions(**{**FAST, "only": ("fused-adamw",), "skip": ("baseline-repeat",)})
    report = run_benchmark(preset, options=options, out_dir=tmp_path / "out")
    trial = report.trial("fused-adamw")
    assert len(trial.val_windows) == len(report.trial("baseline").val_windows) == report.quality["eval_windows"]
    assert not trial.quality_passed and trial.quality["low_pct"] > 0.5
    assert report.quality["aa"]["flagged"] is False and report.trial(NOISE_PROBE).quality_passed
    assert "could not be seen" in resolution_line(report)
    assert "changes in val loss under" in (tmp_path / "out" / "report.md").read_text()
