"""The benchmark for real on the tiny model: every trial trains for real on the simulated CPU device.

One end-to-end run (module fixture) feeds several tests; OOM runs its own small benchmark. Predict, DDP and the CLI
are in test_benchmark_small_runs.py, how runs stop in test_benchmark_stops.py: files of their own, so that the test
workers (--dist loadfile) share them. No timing is asserted anywhere: only what was measured and written.
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
from kronos_tune.runs import MARK, RUN_FORMAT
from kronos_tune.benchmark import (
    BenchmarkFinished, BenchmarkOptions, TrialStarted, TrialStep, run_benchmark,
)

from cli_errors import one_line_error
from tiny_preset import write_tiny_preset  # noqa: E402

# compile: minutes of inductor work on a CPU; a short measuring budget keeps each trial to a few steps (paired: six
# rounds of a step or two each); full: memory savers too, though memory does not bind here
FAST = dict(steps=2, max_steps=3, warmup=2, max_warmup=2, trial_budget_s=0.5, drift_every=0, block_s=0.02,
            min_rounds=6, resolution_min_rounds=6, full=True, skip=("compile", "bigger-batch"))  # bigger-batch: its own search, tested in
#                                                                       test_maximize.py
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
    root = tmp_path_factory.mktemp("benchmark")
    preset = resolve_preset(write_preset(root / "presets"))
    events = Events()
    report = run_benchmark(preset, options=BenchmarkOptions(**FAST), out_dir=root / "out", on_event=events)
    return report, root / "out", events


def test_end_to_end_writes_every_report_file(full_run) -> None:
    report, out, events = full_run
    for name in ("results.jsonl", "report.json", "report.csv", "report.md", "recommended.toml", "run.json"):
        assert (out / name).is_file(), name
    data = json.loads((out / "report.json").read_text())
    assert {"preset", "task", "environment", "trials", "device_line", "quality", "timing", "flops",
            "recommended"} <= set(data)
    assert data["preset"] == "tiny-bench" and data["task"] == "train" and data["environment"]["torch"]
    cpu = data["environment"]["cpu_features"]  # what this CPU computes fast, in every report
    assert isinstance(cpu["native_bf16"], bool) and cpu["vector_width"] in ("AVX-512", "AVX2", "no AVX2")
    assert f"CPU: {data['environment']['cpu_summary']}" in (out / "report.md").read_text()
    assert data["device_line"].startswith("device: cpu (") and "simulated" in data["device_line"]
    assert [t["name"] for t in data["trials"]][0] == "baseline" and data["trials"][-1]["name"] == "combined"
    for trial in data["trials"]:
        assert TRIAL_KEYS <= set(trial), trial["name"]
        assert trial["stage"] in ("baseline", "single", "combined")
        if trial["status"] == "ok":
            assert set(trial["step_time_s"]) == {"median", "min", "max", "n", "q1", "q3"}
            if trial["name"] == "baseline":  # its own row: measured alone, as every trial was before
                assert 2 <= trial["step_time_s"]["n"] == len(trial["step_times_s"]) <= 3
                assert trial["timing"]["stop"] in ("interval", "budget", "max-steps")
            else:  # paired with the live baseline worker: at least 6 rounds of blocks, every step time kept
                assert trial["design"] == "paired" and "fit side by side" in trial["design_reason"]
                steps = trial["timing"]["steps_per_block"]
                assert len(trial["blocks"]) >= 6 and trial["timing"]["rounds"] == len(trial["blocks"])
                assert all(len(b["trial_s"]) == len(b["baseline_s"]) == steps for b in trial["blocks"])
                assert trial["step_time_s"]["n"] == len(trial["step_times_s"]) == steps * len(trial["blocks"])
                assert trial["timing"]["order"] == [b["first"] for b in trial["blocks"]]
                order = trial["timing"]["order"]
                assert set(order) <= {"trial", "baseline"}
                assert abs(order.count("trial") - order.count("baseline")) <= 1  # each side leads as often
                assert trial["timing"]["stop"] in ("interval", "budget", "extended", "max-rounds", "time-cap")
                if trial["timing"]["stop"] == "extended":  # measured on, its verdict open: to 3x the rounds
                    assert trial["timing"]["rounds"] == 3 * trial["timing"]["extended_after"]
                    assert trial["comparison"]["confidence"] == 0.99
                assert trial["timing"]["order_seed"] == f"100:{trial['name']}"
            assert len(trial["warmup_times_s"]) == 2  # max_warmup 2
            assert trial["mfu"] is None  # the preset has no peak figure
            assert trial["peak_memory_bytes"] > 0 and trial["val_loss"] > 0
    timings = {t["name"]: t["timing"] for t in data["trials"] if t.get("design") == "paired"}
    # the A/A comparison states the resolution: three trial budgets, spent whole (no stop on a tight interval)
    assert timings["noise-probe"]["whole_budget"] is True and timings["noise-probe"]["budget_s"] == 1.5
    assert timings["noise-probe"]["stop"] in ("budget", "max-rounds", "time-cap")
    assert all(not t["whole_budget"] and t["budget_s"] == 0.5 for name, t in timings.items() if name != "noise-probe")
    lines = (out / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["name"] for line in lines] == [t["name"] for t in data["trials"]]
    assert {json.loads(line)["schema_version"] for line in lines} == {3}
    markdown = (out / "report.md").read_text()
    assert "| configuration |" in markdown and "**Resolution**: changes under " in markdown
    assert "could not be told from noise in this run" in markdown and "Paired design (noise-probe, bf16," in markdown
    assert "the A/A comparison, whose reach is the resolution, runs its whole budget: " in markdown
    assert data["timing"]["resolution_pct"] is not None and data["decision"]["resolution"] is not None
    assert data["decision"]["comparisons"]["noise-probe"]["design"] == "paired"
    assert (out / "report.csv").read_text().startswith("name,stage,status,")
    config = TrainConfig.from_toml(out / "recommended.toml")
    assert config.model_size == "tiny" and config.eval_samples == 8
    assert report.recommended.command.startswith(f"kronos-tune train --config {out}/recommended.toml")
    assert data["partial"] is False and data["missing"] == [] and data["decision"]["threshold"] >= 0.03
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert not (out / "stacks").exists() or not any((out / "stacks").iterdir())  # nothing hung
    trained = CliRunner().invoke(app, ["train", "--config", str(out / "recommended.toml"), "--steps", "1",
                                       "--out", str(out.parent / "train")])
    assert trained.exit_code == 0, trained.output  # the recommendation runs as it is
    assert isinstance(events.events[-1], BenchmarkFinished)


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
    assert {"baseline", "noise-probe", "bf16", "checkpointing", "accumulation", "dataloader", "fused-adamw"} <= \
        {t.name for t in ran}
    # every comparison was paired with the live baseline, so no drift re-measurement was needed
    repeat = report.trial("baseline-repeat")
    assert repeat.status == "skipped" and "not needed" in repeat.reason
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
        assert check.expected in ("equivalent", "close") and not check.defect, (name, check)
        steps = check.steps
        assert trial.train_losses[:steps] == pytest.approx(base.train_losses[:steps], rel=1e-4)
    assert report.trial("checkpointing").trajectory.measured == "equivalent"
    assert report.trial("accumulation").trajectory.measured == "equivalent"
    assert report.trial("bf16").trajectory.expected == "approximate"
    assert report.quality["defects"] == []


def test_resume_refuses_a_folder_of_another_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "presets"
    write_preset(folder, "tiny-other")
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"tool": MARK, "format": RUN_FORMAT, "command": "benchmark",
                                              "identity": {"preset": "tiny-bench", "task": "train"}}))
    with pytest.raises(KronosTuneError, match="that 'benchmark' run was started with other settings \\(preset: "
                                              "'tiny-bench' there, 'tiny-other' now\\)"):
        run_benchmark(resolve_preset(folder / "tiny-other.toml"), out_dir=out, resume=True)
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
        assert text in one_line_error(argv, capsys)


@pytest.mark.slow  # a whole benchmark or job run: the default suite stays under 300 s
def test_out_of_memory_is_recorded_with_the_peak(full_run, tmp_path: Path) -> None:
    full, _, _ = full_run
    base, small = full.trial("baseline").peak_memory_bytes, full.trial("accumulation").peak_memory_bytes
    budget = (base + small) // 2  # the baseline does not fit, half its micro-batch does
    preset = resolve_preset(write_preset(tmp_path / "presets"))
    options = BenchmarkOptions(**{**FAST, "skip": ("compile", "noise-probe", "baseline-repeat"),
                                 "only": ("accumulation",), "budget_bytes": budget})
    report = run_benchmark(preset, options=options, out_dir=tmp_path / "out")
    oom = report.trial("baseline")
    assert oom.status == "oom" and "out of memory" in oom.reason
    assert 0 < oom.peak_memory_bytes <= budget
    assert report.trial("accumulation").status == "ok"
    assert report.recommended.source == "accumulation"  # with no baseline, fitting is what helps
    assert f"{budget / 2**30:.1f} GiB simulated" in report.device_line


@pytest.mark.slow  # a whole benchmark or job run: the default suite stays under 300 s
def test_where_two_workers_do_not_fit_side_by_side_the_comparison_is_sequential_and_the_report_says_why(
        full_run, tmp_path: Path) -> None:
    full, _, _ = full_run
    peak = full.trial("baseline").peak_memory_bytes
    budget = round(1.5 * peak)  # the baseline fits (and memory does not bind), two workers of its size do not
    preset = resolve_preset(write_preset(tmp_path / "presets"))
    options = BenchmarkOptions(**{**FAST, "skip": ("compile", "noise-probe"), "only": ("fused-adamw",),
                                 "budget_bytes": budget})
    report = run_benchmark(preset, options=options, out_dir=tmp_path / "out")
    trial = report.trial("fused-adamw")
    assert trial.status == "ok" and trial.design == "sequential" and trial.blocks == []
    assert "cannot live side by side" in trial.design_reason and "the simulated device" in trial.design_reason
    assert report.trial("baseline-repeat").status == "ok"  # the drift check is back, for the sequential comparison
    assert report.decision.comparisons["fused-adamw"].design == "sequential"
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "Sequential design (the trial alone against the baseline's own measurement" in markdown
    assert "fused-adamw: the trial's worker and a live baseline worker would need about" in markdown
    assert "changes under" in markdown and "sequential design's threshold" in markdown
