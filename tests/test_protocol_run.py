"""The benchmark protocol for real on the tiny model: every trial trains for real on the simulated CPU device.

One end-to-end run (module fixture) feeds several tests; OOM, predict, DDP and the CLI run their own small
protocols (how runs stop: test_protocol_stops.py). No timing is asserted anywhere: only what was measured and written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kronos_core.train import TrainConfig
from kronos_tune.cli import app, main
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import resolve_preset
from kronos_tune.protocol import (
    ProtocolFinished, ProtocolOptions, TrialStarted, TrialStep, run_protocol,
)

from tiny_preset import write_tiny_preset  # noqa: E402

# compile: minutes of inductor work on a CPU; a short measuring budget keeps each trial to a few steps
FAST = dict(steps=2, max_steps=3, warmup=2, max_warmup=2, trial_budget_s=0.5, drift_every=0,
            skip=("compile", "bigger-batch"))  # bigger-batch: its own search, tested in test_maximize.py
TRIAL_KEYS = {"name", "stage", "status", "changes", "step_time_s", "samples_per_s", "tokens_per_s",
              "peak_memory_bytes", "val_loss", "projected_train_time_s", "mfu", "deltas", "reason"}


pytestmark = pytest.mark.usefixtures("one_thread")


def write_preset(folder: Path, name: str = "tiny-bench") -> Path:
    return write_tiny_preset(folder, name, bf16_supported=True, series_count=6) / f"{name}.toml"


class Events:
    def __init__(self) -> None:
        self.events: list[object] = []

    def __call__(self, event: object) -> None:
        self.events.append(event)

    def started(self) -> list[str]:
        return [e.spec.name for e in self.events if isinstance(e, TrialStarted)]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("protocol")
    preset = resolve_preset(write_preset(root / "presets"))
    events = Events()
    report = run_protocol(preset, options=ProtocolOptions(**FAST), out_dir=root / "out", on_event=events)
    return report, root / "out", events


def test_end_to_end_writes_every_report_file(full_run) -> None:
    report, out, events = full_run
    for name in ("results.jsonl", "report.json", "report.csv", "report.md", "recommended.toml", "run.json"):
        assert (out / name).is_file(), name
    data = json.loads((out / "report.json").read_text())
    assert {"preset", "task", "environment", "trials", "device_line", "quality", "timing", "flops",
            "recommended"} <= set(data)
    assert data["preset"] == "tiny-bench" and data["task"] == "train" and data["environment"]["torch"]
    assert data["device_line"].startswith("device: cpu (") and "simulated" in data["device_line"]
    assert [t["name"] for t in data["trials"]][0] == "baseline" and data["trials"][-1]["name"] == "combined"
    for trial in data["trials"]:
        assert TRIAL_KEYS <= set(trial), trial["name"]
        assert trial["stage"] in ("baseline", "single", "combined")
        if trial["status"] == "ok":
            assert set(trial["step_time_s"]) == {"median", "min", "max", "n", "q1", "q3"}
            assert 2 <= trial["step_time_s"]["n"] == len(trial["step_times_s"]) <= 4  # +1 after the evaluation
            assert trial["timing"]["stop"] in ("interval", "budget", "max-steps")
            assert len(trial["warmup_times_s"]) == 2  # max_warmup 2
            assert trial["mfu"] is None  # the preset has no peak figure
            assert trial["peak_memory_bytes"] > 0 and trial["val_loss"] > 0
    lines = (out / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["name"] for line in lines] == [t["name"] for t in data["trials"]]
    assert "| configuration |" in (out / "report.md").read_text()
    assert (out / "report.csv").read_text().startswith("name,stage,status,")
    config = TrainConfig.from_toml(out / "recommended.toml")
    assert config.model_size == "tiny" and config.eval_samples == 8
    assert report.recommended["command"].startswith(f"kronos-tune train --config {out}/recommended.toml")
    assert data["partial"] is False and data["missing"] == [] and data["decision"]["threshold"] >= 0.03
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert not (out / "stacks").exists() or not any((out / "stacks").iterdir())  # nothing hung
    trained = CliRunner().invoke(app, ["train", "--config", str(out / "recommended.toml"), "--steps", "1",
                                       "--out", str(out.parent / "train")])
    assert trained.exit_code == 0, trained.output  # the recommendation runs as it is
    assert isinstance(events.events[-1], ProtocolFinished)


def test_each_trial_leaves_its_curve_in_jsonl(full_run) -> None:
    report, out, events = full_run
    for trial in report.trials:
        if trial.status != "ok":
            continue
        lines = [json.loads(line) for line in (out / "curves" / f"{trial.name}.jsonl").read_text().splitlines()]
        train = [line for line in lines if line["kind"] == "train"]
        steps = [e.record.step for e in events.events if isinstance(e, TrialStep) and e.trial_name == trial.name]
        assert [line["step"] for line in train] == steps and len(train) == len(trial.train_losses), trial.name
        assert [line["loss"] for line in train] == pytest.approx(trial.train_losses)
        assert all(line["step_time_s"] > 0 for line in train)
        assert [(line["step"], line["val_loss"]) for line in lines if line["kind"] == "eval"] == \
            [(trial.val_loss_step, pytest.approx(trial.val_loss))]
    assert not (out / "tensorboard").exists()  # TensorBoard curves only with --tensorboard


def test_every_trial_sees_the_same_tokens_steps_and_is_compared_to_the_baseline(full_run) -> None:
    report, _, events = full_run
    ran = [t for t in report.trials if t.status == "ok"]
    assert {"baseline", "noise-probe", "bf16", "checkpointing", "accumulation", "dataloader", "fused-adamw",
            "baseline-repeat"} <= {t.name for t in ran}
    assert len({t.tokens_per_step for t in ran}) == 1
    assert len({t.val_loss_step for t in ran}) == 1
    baseline = report.trial("baseline")
    # the same initial weights, data and val windows: the accumulation trial computes the same gradients
    assert report.trial("accumulation").val_loss == pytest.approx(baseline.val_loss, rel=1e-4)
    assert report.trial("accumulation").peak_memory_bytes < baseline.peak_memory_bytes
    assert report.trial("checkpointing").peak_memory_bytes < baseline.peak_memory_bytes
    for name in ("bf16", "checkpointing", "accumulation"):
        trial = report.trial(name)
        assert {"step_time_s", "peak_memory_bytes", "val_loss"} <= set(trial.deltas)
        assert trial.quality is not None and "passed" in trial.quality
    assert report.quality["noise_source"] == "noise-probe" and report.quality["noise"] is not None
    assert report.trial("fp16").status == "skipped" and report.trial("fp16").reason == "fp16 autocast needs CUDA"
    assert report.trial("compile").reason == "skipped by --skip"
    for trial in ran:  # every optimizer step of every trial came back as an event, from the trial's process
        steps = [e for e in events.events if isinstance(e, TrialStep) and e.trial_name == trial.name]
        assert [e.record.loss for e in steps] == pytest.approx(trial.train_losses)
        assert len(steps) >= trial.val_loss_step


def test_equivalent_changes_reproduce_the_baseline_losses(full_run) -> None:
    """The tiny model has no dropout: checkpointing and accumulation compute the same gradients, so their
    training losses equal the baseline's step by step up to float error; bf16 is approximate."""
    report, _, _ = full_run
    base = report.trial("baseline")
    for name in ("checkpointing", "accumulation", "dataloader", "fused-adamw"):
        trial = report.trial(name)
        check = trial.trajectory
        assert check["expected"] in ("equivalent", "close") and not check["defect"], (name, check)
        steps = check["steps"]
        assert trial.train_losses[:steps] == pytest.approx(base.train_losses[:steps], rel=1e-4)
    assert report.trial("checkpointing").trajectory["measured"] == "equivalent"
    assert report.trial("accumulation").trajectory["measured"] == "equivalent"
    assert report.trial("bf16").trajectory["expected"] == "approximate"
    assert report.quality["defects"] == []


def test_resume_refuses_a_folder_of_another_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "presets"
    write_preset(folder, "tiny-other")
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"preset": "tiny-bench", "task": "train"}))
    with pytest.raises(KronosTuneError, match="holds a 'benchmark' run \\(preset tiny-bench"):
        run_protocol(resolve_preset(folder / "tiny-other.toml"), out_dir=out, resume=True)
    with pytest.raises(SystemExit) as exited:
        main(["benchmark", "--preset", "tiny-other", "--preset-dir", str(folder), "--out", str(out), "--resume"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: --resume") and "\n" not in error


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for argv, text in ((["benchmark", "--preset", "no-such-preset"], "unknown preset 'no-such-preset'"),
                       (["benchmark", "--preset", "cpu", "--out", str(blocker / "sub")], "cannot write there"),
                       (["benchmark", "--preset", "cpu", "--skip", "warp-drive"], "--skip warp-drive")):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        error = capsys.readouterr().err.strip()
        assert text in error and "\n" not in error


def test_out_of_memory_is_recorded_with_the_peak(full_run, tmp_path: Path) -> None:
    full, _, _ = full_run
    base, small = full.trial("baseline").peak_memory_bytes, full.trial("accumulation").peak_memory_bytes
    budget = (base + small) // 2  # the baseline does not fit, half its micro-batch does
    preset = resolve_preset(write_preset(tmp_path / "presets"))
    options = ProtocolOptions(**{**FAST, "skip": ("compile", "noise-probe", "baseline-repeat"),
                                 "only": ("accumulation",), "budget_bytes": budget})
    report = run_protocol(preset, options=options, out_dir=tmp_path / "out")
    oom = report.trial("baseline")
    assert oom.status == "oom" and "out of memory" in oom.reason
    assert 0 < oom.peak_memory_bytes <= budget
    assert report.trial("accumulation").status == "ok"
    assert report.recommended["source"] == "accumulation"  # with no baseline, fitting is what helps
    assert f"{budget / 2**30:.1f} GiB simulated" in report.device_line


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
    as_json = CliRunner().invoke(app, [*args, "--json"])  # no --out: a fresh folder under runs/benchmark/
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
