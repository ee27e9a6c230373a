"""autobatch on kronos_core: the Trainer-based train task, the predict task and `kronos-tune autobatch`."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kronos_core.train import TrainConfig, Trainer
from kronos_tune.autobatch.predict_probes import PredictProbes
from kronos_tune.autobatch.train_probes import TrainProbes
from kronos_tune.cli import app, main
from kronos_tune.memory import CpuExactMeter

from tiny_preset import tiny_preset_toml  # noqa: E402

runner = CliRunner()

TINY_PRESET = tiny_preset_toml("tiny-test", memory_gb=0.05, lookback_window=30, predict_window=5, batch_size=32,
                               accumulation_steps=2, samples_per_epoch=256, eval_samples=16, series_count=12,
                               sample_count=2)


@pytest.fixture
def preset_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "presets"
    folder.mkdir()
    (folder / "tiny.toml").write_text(TINY_PRESET)
    return folder


def _invoke_json(*args: str) -> dict:
    result = runner.invoke(app, ["autobatch", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _exit_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(["autobatch", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ")
    return err[-1]


def test_train_json_keys_types_and_a_pick_that_trains(preset_dir: Path) -> None:
    payload = _invoke_json("--preset", "tiny-test", "--preset-dir", str(preset_dir))
    ints = ("batch_size", "accumulation_steps", "budget_bytes", "predicted_peak_bytes", "measured_peak_bytes",
            "fixed_bytes")
    for key in ints:
        assert isinstance(payload[key], int) and not isinstance(payload[key], bool), key
    assert isinstance(payload["bytes_per_sample"], float) and payload["bytes_per_sample"] > 0
    assert payload["device"] == "cpu" and payload["simulated"] is False and payload["estimate"] is False
    assert isinstance(payload["assumptions"], list) and all(isinstance(a, str) for a in payload["assumptions"])
    assert payload["budget_bytes"] == round(0.05 * 2**30)
    probes = payload["probes"]
    assert probes and all({"batch_size", "peak_bytes", "status"} <= set(p) for p in probes)
    assert all(p["status"] in ("ok", "oom", "verify") for p in probes)
    assert sum(p["kind"] == "probe" for p in probes) <= 6
    assert payload["batch_size"] * payload["accumulation_steps"] == 64  # the preset's 32 x 2 is kept
    assert payload["measured_peak_bytes"] <= payload["budget_bytes"] * (1 - payload["margin"])

    config = TrainConfig(**payload["train_config"])
    assert (config.batch_size, config.accumulation_steps) == (payload["batch_size"], payload["accumulation_steps"])
    assert (config.model_size, config.lookback_window, config.predict_window) == ("tiny", 30, 5)

    # The pick trains for real on the simulated device: steps with accumulation plus an eval batch, no OOM.
    meter = CpuExactMeter(budget_bytes=payload["budget_bytes"])
    probe_config = config.replace(output_dir=str(preset_dir.parent / "run"), device="cpu")
    with meter:
        trainer = Trainer(probe_config, meter=meter)
        trainer.run_steps(2)
        trainer.eval_batch()
    assert meter.num_ooms == 0 and meter.peak_bytes() <= payload["budget_bytes"]
    del trainer
    gc.collect()


def test_estimate_matches_the_trainer_step(preset_dir: Path) -> None:
    config = TrainConfig(model_size="tiny", lookback_window=30, predict_window=5, batch_size=8, device="cpu")
    with TrainProbes(config) as task:
        real = task.run(40 << 20, max_probes=3)
        fake = task.run(40 << 20, max_probes=3, estimate=True)
    assert fake.batch_size == real.batch_size
    for r, f in zip(real.probes, fake.probes):
        assert r.batch_size == f.batch_size
        assert abs(r.peak_bytes - f.peak_bytes) <= 1e-3 * r.peak_bytes  # the replica allocates what the Trainer does
    assert real.leftover_bytes == 0


def test_predict_chunk_json(preset_dir: Path) -> None:
    payload = _invoke_json("--preset", "tiny-test", "--preset-dir", str(preset_dir), "--task", "predict",
                           "--budget-gb", "0.002")
    assert payload["task"] == "predict" and payload["train_config"] is None
    chunk = payload["predict_config"]
    assert payload["batch_size"] == chunk["max_batch_size"] == chunk["series_per_call"] * 2
    assert 1 <= chunk["series_per_call"] < 12  # 2 MiB does not hold all 12 series at once
    assert payload["measured_peak_bytes"] <= payload["budget_bytes"] * (1 - payload["margin"])
    assert payload["series_per_s"] > 0

    # The chunk really predicts the whole workload under the budget.
    task = PredictProbes("tiny", 32, 4, sample_count=2, series_count=12)
    predictor = task.predictor(chunk["max_batch_size"])
    meter = CpuExactMeter(budget_bytes=payload["budget_bytes"])
    meter.track_existing(predictor.model, predictor.tokenizer)
    with meter:
        frames = task.predict(predictor, 12, chunk["series_per_call"])
    assert len(frames) == 12 and meter.num_ooms == 0


def test_human_output_has_plot_and_snippet(preset_dir: Path) -> None:
    result = runner.invoke(app, ["autobatch", "--preset", "tiny-test", "--preset-dir", str(preset_dir),
                                 "--estimate", "--budget-gb", "0.03"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "batch_size = " in out and "accumulation_steps = " in out
    assert "peak memory vs batch size" in out and "▲" in out and "budget" in out


def test_bad_margin_exits_2(capsys: pytest.CaptureFixture[str], preset_dir: Path) -> None:
    for margin in ("1", "-0.2", "1.5"):
        line = _exit_line(capsys, "--preset", "tiny-test", "--preset-dir", str(preset_dir), "--margin", margin)
        assert "margin" in line


def test_unknown_preset_exits_2_with_suggestion(capsys: pytest.CaptureFixture[str], preset_dir: Path) -> None:
    line = _exit_line(capsys, "--preset", "tiny-tset", "--preset-dir", str(preset_dir))
    assert "unknown preset 'tiny-tset'" in line and "tiny-test" in line


def test_malformed_preset_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY_PRESET.replace('model_size = "tiny"', 'model_size = "tiny'))
    line = _exit_line(capsys, "--preset", str(bad))
    assert "malformed TOML" in line


def test_budget_below_fixed_cost_exits_2(capsys: pytest.CaptureFixture[str], preset_dir: Path) -> None:
    line = _exit_line(capsys, "--preset", "tiny-test", "--preset-dir", str(preset_dir), "--budget-gb", "0.001")
    assert "fixed cost" in line and "before any sample" in line and "smaller model_size" in line


def test_estimate_refuses_predict(capsys: pytest.CaptureFixture[str], preset_dir: Path) -> None:
    line = _exit_line(capsys, "--preset", "tiny-test", "--preset-dir", str(preset_dir), "--task", "predict",
                      "--estimate")
    assert "--estimate" in line
