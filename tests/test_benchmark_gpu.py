"""The GPU-only trials of the benchmark, for real on a CUDA device (skipped without one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kronos_tune.presets import resolve_preset
from kronos_tune.benchmark import BenchmarkOptions, run_benchmark

from tiny_preset import tiny_preset_toml  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_tf32_and_cuda_graph_compile_trials_run_and_stay_close_to_the_baseline(tmp_path: Path) -> None:
    text = tiny_preset_toml("tiny-cuda", memory_gb=4.0, bf16_supported=True).replace('device = "cpu"',
                                                                                      'device = "cuda"')
    (tmp_path / "tiny-cuda.toml").write_text(text)
    preset = resolve_preset(tmp_path / "tiny-cuda.toml")
    options = BenchmarkOptions(steps=3, max_steps=5, max_warmup=3, trial_budget_s=2.0, drift_every=0,
                              only=("tf32", "compile-cudagraphs"), skip=("noise-probe", "baseline-repeat"))
    report = run_benchmark(preset, options=options, out_dir=tmp_path / "out")
    for name in ("tf32", "compile-cudagraphs"):
        trial = report.trial(name)
        assert trial.status == "ok", trial.reason
        assert trial.trajectory.expected == "close" and not trial.trajectory.defect, trial.trajectory
        assert trial.val_loss_step == report.trial("baseline").val_loss_step
    assert report.trial("tf32").config["matmul_precision"] == "high"
    assert report.trial("compile-cudagraphs").config["compile"] == "reduce-overhead"
