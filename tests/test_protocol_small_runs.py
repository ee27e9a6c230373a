"""The benchmark protocol for real on the tiny model, in protocols of their own: predict, the CLI, CPU DDP.

Split from test_protocol_run.py (whose end-to-end run is a module fixture) so that --dist loadfile can run the two
files on both test workers. No timing is asserted anywhere: only what was measured and written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kronos_tune.cli import app
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import resolve_preset
from kronos_tune.protocol import ProtocolOptions, TrialStarted, TrialStep, run_protocol

from test_protocol_run import FAST, Events, write_preset  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_predict_protocol_reports_the_cache_speedup_row(tmp_path: Path) -> None:
    preset = resolve_preset(write_preset(tmp_path / "presets"))
    events = Events()
    report = run_protocol(preset, task="predict", options=ProtocolOptions(predict_repeats=2, predict_series=3),
                          out_dir=tmp_path / "out", on_event=events)
    assert [t.name for t in report.trials] == ["recompute", "kv-cache", "bf16", "autobatch", "sharding"]
    reference, cached = report.trial("recompute"), report.trial("kv-cache")
    for row in (reference, cached):
        assert row.status == "ok" and row.series_per_s.n == 2 and row.projected_predict_time_s > 0
        assert row.peak_memory_bytes > 0
    assert cached.speedup > 0 and "series_per_s" in cached.deltas
    assert cached.output_max_abs_diff == 0.0  # greedy: the cache reproduces the reference exactly
    assert cached.quality == {"spearman": 1.0, "series": 3, "measure": "rank agreement"}  # the same ranking
    assert report.trial("sharding").status == "skipped"
    assert report.trial("autobatch").status == "ok" and report.trial("autobatch").changes["max_batch_size"] >= 1
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["task"] == "predict" and data["trials"][1]["speedup"] == pytest.approx(cached.speedup)
    assert not (tmp_path / "out" / "recommended.toml").exists()
    assert "| kv-cache (use_cache=True) |" in (tmp_path / "out" / "report.md").read_text()
    # Progress counts what the trial announced: the metered warm-up run, then the timed runs.
    started = next(e.spec for e in events.events if isinstance(e, TrialStarted) and e.spec.name == "kv-cache")
    steps = [e.record for e in events.events if isinstance(e, TrialStep) and e.trial_name == "kv-cache"]
    assert [(r.step, r.total, r.timed) for r in steps] == [(1, 3, False), (2, 3, True), (3, 3, True)]
    assert started.total_steps == 3


def test_cli_renders_the_table_and_json_and_never_reuses_a_run_folder(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "presets"
    write_preset(folder)
    args = ["benchmark", "--preset", "tiny-bench", "--preset-dir", str(folder), "--steps", "2", "--max-steps", "2",
            "--trial-budget", "0.5", "--skip", "compile,noise-probe,baseline-repeat", "--only", "fused-adamw"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "kronos-tune benchmark: preset tiny-bench" in result.output and "fused-adamw" in result.output
    assert "recommended:" in result.output and (tmp_path / "out" / "report.json").is_file()
    assert f"next: kronos-tune train --config {tmp_path / 'out'}/recommended.toml" in result.output
    again = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])  # a finished run is never replaced
    message = str(again.exception)  # main() turns it into one line on stderr and exit code 2
    assert isinstance(again.exception, KronosTuneError) and "--resume" in message and "--overwrite" in message
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "complete"
    # no --out: a fresh folder under runs/benchmark/; --only tf32 (CUDA only, skipped here): the baseline alone
    as_json = CliRunner().invoke(app, [*args[:-1], "tf32", "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["trials"][0]["name"] == "baseline"
    assert Path(data["out_dir"]).parent == Path("runs/benchmark") and Path(data["out_dir"], "report.md").is_file()


@pytest.mark.slow
def test_cpu_ddp_trial_runs_two_gloo_processes_through_torchrun(tmp_path: Path) -> None:
    preset = resolve_preset(write_preset(tmp_path / "presets"))
    events = Events()
    options = ProtocolOptions(**{**FAST, "skip": ("compile", "noise-probe", "baseline-repeat"), "only": ("ddp",),
                                 "cpu_ddp": True})
    report = run_protocol(preset, options=options, on_event=events, out_dir=tmp_path / "out")
    ddp, baseline = report.trial("ddp"), report.trial("baseline")
    assert ddp.status == "ok", ddp.reason
    assert ddp.nproc == 2 and ddp.hardware == "2 x cpu (gloo)" and ddp.changes["batch_size"] == 4
    assert ddp.tokens_per_step == baseline.tokens_per_step and ddp.val_loss_step == baseline.val_loss_step
    assert ddp.val_loss == pytest.approx(baseline.val_loss, rel=1e-4)  # the same global batches, split in two
    assert ddp.peak_memory_bytes < baseline.peak_memory_bytes  # half the micro-batch per process
    # rank 0's step records came back through torchrun's stdout as events, one per optimizer step
    assert sum(1 for e in events.events if isinstance(e, TrialStep) and e.trial_name == "ddp") == \
        len(ddp.train_losses) >= ddp.val_loss_step
    assert ddp.trajectory["expected"] == "equivalent" and not ddp.trajectory["defect"]
