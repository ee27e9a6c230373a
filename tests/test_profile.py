"""`kronos-tune profile` on the tiny model: ops table, memory categories, trace file, bad paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kronos_core.train import TrainConfig
from kronos_tune.errors import KronosTuneError
from kronos_tune.profiling.profiler import profile_training
from tiny_preset import tiny_preset_toml

TINY_PRESET = tiny_preset_toml("tiny-profile", batch_size=4)


def _tiny_config(tmp_path: Path) -> TrainConfig:
    return TrainConfig(model_size="tiny", lookback_window=16, predict_window=4, batch_size=4, samples_per_epoch=64,
                       eval_samples=8, synthetic_series=2, synthetic_rows=200, device="cpu",
                       output_dir=str(tmp_path / "run"))


def test_profile_reports_ops_memory_and_trace(tmp_path):
    trace = tmp_path / "trace.json"
    result = profile_training(_tiny_config(tmp_path), steps=2, warmup=1, wait=0, top=10, trace_path=trace)
    names = [op.name for op in result.top_ops]
    assert any(name in ("aten::mm", "aten::addmm", "aten::bmm") for name in names)
    assert not any(name.startswith("<built-in") for name in names)
    assert result.step_time_s["n"] == 2 and result.step_time_s["min"] <= result.step_time_s["median"]
    assert result.tokens_per_step == 4 * (16 + 4)
    assert result.memory_at_peak_bytes.get("parameter", 0) > 0
    assert result.mfu is None  # no peak FLOP/s given
    assert "traceEvents" in json.loads(trace.read_text())


def test_profile_mfu_uses_the_given_peak(tmp_path):
    result = profile_training(_tiny_config(tmp_path), steps=1, warmup=0, wait=0, peak_flops=1e12)
    expected = result.tokens_per_s * result.flops_per_token / 1e12
    assert result.mfu == pytest.approx(expected)


def test_trace_in_a_missing_folder_fails_before_work(tmp_path):
    with pytest.raises(KronosTuneError, match="does not exist"):
        profile_training(_tiny_config(tmp_path), trace_path=tmp_path / "nope" / "t.json")


@pytest.mark.slow  # a whole benchmark or job run: the default suite stays under 300 s
def test_cli_profile_json_and_bad_trace_path(tmp_path):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny-profile.toml").write_text(TINY_PRESET)
    base = [sys.executable, "-m", "kronos_tune.cli", "profile", "--preset", "tiny-profile",
            "--preset-dir", str(tmp_path / "presets"), "--steps", "1", "--warmup", "0"]
    ok = subprocess.run(base + ["--json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["top_ops"]
    bad = subprocess.run(base + ["--trace", str(tmp_path / "missing" / "t.json")], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def _table_ops(text: str) -> list[str]:
    """The op column of the printed table, folded cells joined back (a row continues while `calls` is blank)."""
    names: list[str] = []
    for line in text.splitlines():
        cells = line.split("│")
        if len(cells) < 4 or not cells[1].strip():
            continue
        fragment, calls = cells[1].strip(), cells[2].strip()
        if calls:
            names.append(fragment)
        elif names:
            names[-1] += fragment
    return names


def test_cli_profile_table_has_whole_distinct_names_and_no_kineto_lines(tmp_path):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny-profile.toml").write_text(TINY_PRESET)
    env = {**os.environ, "COLUMNS": "60"}
    done = subprocess.run([sys.executable, "-m", "kronos_tune.cli", "profile", "--preset", "tiny-profile",
                           "--preset-dir", str(tmp_path / "presets"), "--steps", "1", "--warmup", "1", "--top", "40"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "USDT" not in done.stderr + done.stdout and "profiler_start" not in done.stderr
    names = _table_ops(done.stdout.split("memory at peak")[0])
    assert len(names) >= 20 and "…" not in done.stdout
    assert len(set(names)) == len(names)  # folded, never cut to the same text
    assert any(name.startswith("autograd::engine::evaluate_function:") for name in names)
