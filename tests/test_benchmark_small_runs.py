"""The benchmark for real on the tiny model, in benchmarks of their own: predict, the CLI, CPU DDP.

Split from test_benchmark_run.py (whose end-to-end run is a module fixture) so that --dist loadfile can run the two
files on both test workers. No timing is asserted anywhere: only what was measured and written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kronos_tune.cli import app, main
from kronos_tune.predict.config_file import read_predict_file
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import resolve_preset
from kronos_tune.benchmark import BenchmarkOptions, TrialStarted, TrialStep, run_benchmark
from kronos_tune.benchmark.predict.summary import predict_decision_lines

from test_benchmark_run import FAST, Events, write_preset  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow  # a whole benchmark or job run: the default suite stays under 300 s
def test_predict_benchmark_reports_the_cache_speedup_row_and_recommends_settings(tmp_path: Path, capsys) -> None:
    preset = resolve_preset(write_preset(tmp_path / "presets"))  # 6 series; bf16 supported
    events = Events()
    report = run_benchmark(preset, task="predict", options=BenchmarkOptions(predict_repeats=2, predict_series=3,
                                                                          agreement_series=5),
                          out_dir=tmp_path / "out", on_event=events)
    assert [t.name for t in report.trials] == ["recompute", "kv-cache", "bf16", "bf16-weights", "autobatch",
                                               "sharding"]
    reference, cached = report.trial("recompute"), report.trial("kv-cache")
    for row in (reference, cached):
        assert row.status == "ok" and row.series_per_s.n == 2 and row.projected_predict_time_s > 0
        assert row.peak_memory_bytes > 0
    assert cached.speedup > 0 and "series_per_s" in cached.deltas
    assert cached.output_max_abs_diff == 0.0  # greedy: the cache reproduces the reference exactly
    # 3 series timed, the quality check over the 5 asked for (one more untimed run each): kv-cache against the
    # recompute on the 3 both predicted, the later trials against kv-cache's (proved identical) over all 5
    assert cached.quality["spearman"] == 1.0 and cached.quality["series"] == 3
    assert cached.quality["reference"] == "recompute" and cached.quality["class"] == "exact"
    assert cached.quality["passed"] and any("identical to the recompute's output on the 3" in n for n in cached.notes)
    assert cached.quality["sampled_max_abs_diff"] == 0.0  # the sampled run too: per-series streams
    assert report.trial("autobatch").quality["sampled_max_abs_diff"] == 0.0  # another chunk size, same draws
    bf16 = report.trial("bf16").quality
    assert bf16["series"] == 5 and bf16["reference"] == "kv-cache" and bf16["class"] == "approximate"
    # held to float32 in a quant's terms: identical greedy tokens, the forecast's relative difference, the sampled
    # return difference against two float32 seeds' spread (kv-cache sampled once more on the next seed)
    for name in ("bf16", "bf16-weights"):
        quality = report.trial(name).quality
        assert 0.0 <= quality["identical_tokens"] <= 1.0 and quality["forecast_max_rel_diff"] >= 0.0, name
        spread = quality["sampled_vs_float32"]
        assert spread["sampled_series"] == 5 and spread["seed_spread"] > 0, name
        assert "identical greedy tokens" in quality["text"] and "sampling noise" in quality["text"], name
    assert report.trial("sharding").status == "skipped"
    assert report.trial("autobatch").status == "ok" and report.trial("autobatch").changes["max_batch_size"] >= 1
    # bf16 and autobatch alternate their timed runs with kv-cache's settings in one worker: paired, 6+ rounds
    # (the fewest with a 95 % signed-rank interval), decided from the per-round ratios; kv-cache against the
    # recompute stays sequential (the reason says why)
    assert cached.design == "sequential" and "recompute" in cached.design_reason and not cached.blocks
    for name in ("bf16", "autobatch"):
        paired = report.trial(name)
        assert paired.design == "paired" and paired.timing["paired_with"] == "kv-cache", name
        assert len(paired.blocks) == paired.timing["rounds"] >= 6 and paired.series_per_s.n == len(paired.blocks)
        assert [b["first"] for b in paired.blocks] == paired.timing["order"]
        assert abs(paired.timing["order"].count("trial") - paired.timing["order"].count("baseline")) <= 1
        assert all(len(b["trial_s"]) == len(b["baseline_s"]) == 1 and b["baseline_s"][0] > 0 for b in paired.blocks)
        assert report.decision.verdicts[name].vs_reference.design == "paired"
        assert report.decision.verdicts[name].vs_reference.n == len(paired.blocks)
    assert "paired over 6 rounds" in "\n".join(predict_decision_lines(report))
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["task"] == "predict" and data["trials"][1]["speedup"] == pytest.approx(cached.speedup)
    assert set(data["decision"]["verdicts"]) == {"kv-cache", "bf16", "bf16-weights", "autobatch"}
    assert data["recommended"]["source"] == report.recommended.source in ("recompute", "kv-cache", "bf16",
                                                                              "bf16-weights", "autobatch")
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| kv-cache (use_cache=True) |" in markdown
    assert f"Recommended: **{report.recommended.source}**" in markdown and "kv-cache (exact): " in markdown
    # Progress counts what the trial announced: the metered warm-up run, the timed runs, the quality run.
    started = next(e.spec for e in events.events if isinstance(e, TrialStarted) and e.spec.name == "kv-cache")
    steps = [e.record for e in events.events if isinstance(e, TrialStep) and e.trial_name == "kv-cache"]
    assert [(r.step, r.total, r.timed, r.series) for r in steps] == [(1, 4, False, 3), (2, 4, True, 3),
                                                                     (3, 4, True, 3), (4, 4, False, 5)]
    assert started.total_steps == 4
    # recommended.toml holds the prediction settings, and `kronos-tune predict --config` runs them
    recommended = tmp_path / "out" / "recommended.toml"
    settings = read_predict_file(recommended)
    assert settings["size"] == "tiny" and settings["lookback"] == 32 and settings["pred_len"] == 4
    assert settings["kv_cache"] is (report.recommended.source != "recompute") and settings["nproc"] == 1
    chosen = report.trial(report.recommended.source).config  # every key the trial ran with, its series too
    assert settings["synthetic"] == chosen["measured_series"] and settings["chunk_series"] == chosen["chunk_series"]
    assert settings["seed"] == chosen["seed"] and settings["device"] == "cpu" and settings["top_p"] == 0.9
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--config", str(recommended), "--synthetic", "2", "--json"])
    assert exit_info.value.code in (0, None)
    printed = json.loads(capsys.readouterr().out)
    assert printed["series"] == 2  # ran: --size (tiny), --lookback and --pred-len came from the file
    assert [len(item["close"]) for item in printed["predictions"]] == [4, 4]  # the file's pred_len


@pytest.mark.slow  # a whole benchmark or job run: the default suite stays under 300 s
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
    options = BenchmarkOptions(**{**FAST, "skip": ("compile", "noise-probe", "baseline-repeat"), "only": ("ddp",),
                                 "cpu_ddp": True})
    report = run_benchmark(preset, options=options, on_event=events, out_dir=tmp_path / "out")
    ddp, baseline = report.trial("ddp"), report.trial("baseline")
    assert ddp.status == "ok", ddp.reason
    assert ddp.nproc == 2 and ddp.hardware == "2 x cpu (gloo)" and ddp.changes["batch_size"] == 4
    assert ddp.tokens_per_step == baseline.tokens_per_step and ddp.val_loss_step == baseline.val_loss_step
    assert ddp.val_loss == pytest.approx(baseline.val_loss, rel=1e-4)  # the same global batches, split in two
    assert ddp.peak_memory_bytes < baseline.peak_memory_bytes  # half the micro-batch per process
    # rank 0's step records came back through torchrun's stdout as events, one per optimizer step
    assert sum(1 for e in events.events if isinstance(e, TrialStep) and e.trial_name == "ddp") == \
        len(ddp.train_losses) >= ddp.val_loss_step
    assert ddp.trajectory.expected == "equivalent" and not ddp.trajectory.defect
