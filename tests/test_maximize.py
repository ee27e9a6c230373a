"""Use the whole card: autobatch --maximize, the learning-rate rules and the benchmark's bigger-batch trial."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kronos_core.train import TrainConfig
from kronos_tune.autobatch.maximize import MIN_STEPS_PER_EPOCH, check_rule, scale_for_batch
from kronos_tune.autobatch.train_probes import TrainProbes
from kronos_tune.cli import app
from kronos_tune.errors import KronosTuneError
from kronos_tune.memory import CpuExactMeter
from kronos_tune.presets import resolve_preset
from kronos_tune.benchmark import BenchmarkOptions, run_benchmark

from cli_errors import one_line_error
from tiny_preset import write_tiny_preset  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(**changes: object) -> TrainConfig:
    values = dict(model_size="tiny", lookback_window=16, predict_window=4, batch_size=8, accumulation_steps=2,
                  samples_per_epoch=1024, eval_samples=8, lr=1e-4, pct_start=0.04, device="cpu")
    values.update(changes)
    return TrainConfig(**values)


def test_learning_rate_rules_on_a_known_change() -> None:
    config = _config()  # effective batch 16
    scaled, change = scale_for_batch(config, 64, "sqrt")  # x4
    assert (scaled.batch_size, scaled.accumulation_steps) == (64, 1)
    assert scaled.lr == pytest.approx(2e-4) and scaled.pct_start == pytest.approx(0.04)
    assert change.factor == 4 and change.lr_from == pytest.approx(1e-4)
    linear, change = scale_for_batch(config, 64, "linear")
    assert linear.lr == pytest.approx(4e-4) and linear.pct_start == pytest.approx(0.08)  # warm-up x sqrt(4)
    same, _ = scale_for_batch(config, 64, "none")
    assert same.lr == pytest.approx(1e-4)
    capped, change = scale_for_batch(config, 4096, "sqrt")  # the data allows 1024 / 4 = 256
    assert capped.batch_size == 1024 // MIN_STEPS_PER_EPOCH and "capped at 256 by the data" in change.notes[0]
    assert capped.lr == pytest.approx(1e-4 * math.sqrt(256 / 16))
    with pytest.raises(KronosTuneError, match="--lr-rule cubic: unknown rule; use one of sqrt, linear, none"):
        check_rule("cubic")


def test_maximize_finds_the_largest_fitting_micro_batch_and_verifies_it() -> None:
    config = _config(accumulation_steps=1)
    budget = 48 * 2**20
    with TrainProbes(config, device="cpu") as task:
        found = task.run(budget, margin=0.05, max_probes=6)

        def peak(batch: int) -> int | None:  # an independent measurement: a real step under the exact tracker
            meter = CpuExactMeter(budget_bytes=None)
            step = task.step_factory(batch)
            try:
                with meter:
                    step.run()
                    step.run()
            finally:
                step.on_close and step.on_close()
            return meter.peak_bytes()

        usable = found.usable_bytes
        assert found.search_probes <= 6 and found.accumulation_steps == 1
        assert peak(found.batch_size) <= usable  # never above what fits
        assert peak(int(found.batch_size / 0.9) + 1) > usable  # and at least 90% of the largest that fits


def test_autobatch_json_reports_verified_and_predicted_with_and_without_maximize(tmp_path: Path) -> None:
    folder = write_tiny_preset(tmp_path / "presets", "tiny-max", samples_per_epoch=256)
    base = ["autobatch", "--preset", "tiny-max", "--preset-dir", str(folder), "--estimate", "--json",
            "--budget-gb", "0.05"]
    kept = CliRunner().invoke(app, base)
    assert kept.exit_code == 0, kept.output
    data = json.loads(kept.stdout)
    assert data["largest_fitting_verified"] >= data["batch_size"] and data["largest_fitting_predicted"] >= 1
    assert data["maximize"] is None
    assert data["batch_size"] * data["accumulation_steps"] == 8  # the preset's effective batch is kept
    grown = CliRunner().invoke(app, [*base, "--maximize", "--lr-rule", "linear"])
    assert grown.exit_code == 0, grown.output
    data = json.loads(grown.stdout)
    change, config = data["maximize"], data["train_config"]
    assert change["rule"] == "linear" and change["batch_from"] == 8
    assert config["batch_size"] == change["batch_to"] == min(data["batch_size"], 256 // MIN_STEPS_PER_EPOCH)
    assert config["accumulation_steps"] == 1 and config["lr"] == pytest.approx(change["lr_to"])


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, text in ((["autobatch", "--preset", "cpu", "--task", "predict", "--maximize"],
                        "the predict call is already the largest that fits"),
                       (["autobatch", "--preset", "cpu", "--task", "predict", "--estimate"],
                        "--estimate covers --task train only"),
                       (["autobatch", "--preset", "cpu", "--task", "nope"], "--task must be one of train, predict"),
                       (["autobatch", "--preset", "cpu", "--maximize", "--lr-rule", "cubic"], "--lr-rule cubic")):
        assert text in one_line_error(argv, capsys)


@pytest.mark.slow  # a whole benchmark or job run: the default suite stays under 300 s
def test_bigger_batch_trial_is_evaluated_at_equal_samples_seen(tmp_path: Path) -> None:
    preset = resolve_preset(write_tiny_preset(tmp_path / "presets", "tiny-big", samples_per_epoch=64)
                            / "tiny-big.toml")
    options = BenchmarkOptions(steps=2, max_steps=3, warmup=2, max_warmup=2, trial_budget_s=0.5, drift_every=0,
                              only=("bigger-batch",), skip=("noise-probe", "baseline-repeat"))
    report = run_benchmark(preset, options=options, out_dir=tmp_path / "out")
    base, big = report.trial("baseline"), report.trial("bigger-batch")
    assert big.status == "ok", big.reason
    assert big.changes["batch_size"] == 16 and big.changes["accumulation_steps"] == 1  # capped by 64 samples / 4
    assert big.changes["lr"] == pytest.approx(base.config["lr"] * math.sqrt(2) if base.config["lr"] else
                                              TrainConfig(model_size="tiny").effective_lr * math.sqrt(2))
    samples_base = base.val_loss_step * base.config["batch_size"]
    samples_big = big.val_loss_step * big.config["batch_size"]
    assert abs(samples_big - samples_base) <= big.config["batch_size"]  # the same samples, to one batch
    assert big.quality is not None and "passed" in big.quality
    assert big.trajectory is None  # not comparable step by step: another optimization
    assert any("effective batch 8 -> 16" in note for note in big.notes)
    assert report.headroom["batch"] == 8 and report.headroom["fits_batch"] == big.changes["memory_allows"] >= 16
    assert "would fit" in report.headroom["text"]
    assert f"Memory: {report.headroom['text']}" in (tmp_path / "out" / "report.md").read_text()
    from kronos_tune.tui.model import answer_from
    from kronos_tune.tui.widgets.answer import AnswerPanel

    panel = AnswerPanel()  # the dashboard's recommendation panel draws the same as a bar
    panel._answer = answer_from(report)
    shown = "\n".join(text.plain for _, text in panel.lines(160))
    assert "memory █" in shown and report.headroom["text"] in shown
