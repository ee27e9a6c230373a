"""The benchmark's plan, quality guard, deltas and combination rule (no training here)."""

from __future__ import annotations

import pytest

import kronos_core.cpu_features
from kronos_core.cpu_features import NO_NATIVE_BF16

from kronos_tune.errors import KronosTuneError
from kronos_tune.benchmark import (
    Delta, BenchmarkOptions, BenchmarkReport, Spread, TrialResult, TrialSpec, plan_trials,
)
from kronos_tune.benchmark.train.trial_list import combine
from kronos_tune.benchmark.quality import compute_deltas, noise_estimate, quality_guard, quality_threshold
from kronos_tune.benchmark.stats import Comparison


@pytest.fixture(autouse=True)
def avx2_only_cpu(tmp_path_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plans below as on a CPU without native bf16, whatever this machine has: the detection reads a
    /proc/cpuinfo of an AVX2-only CPU (test_cpu_features.py fakes both kinds)."""
    cpuinfo = tmp_path_factory.mktemp("cpu") / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AVX2 only\nflags\t\t: fpu sse2 avx avx2 fma\n")
    monkeypatch.setattr(kronos_core.cpu_features, "CPUINFO", cpuinfo)


def test_cpu_preset_plan_runs_baseline_first_singles_then_combined_last() -> None:
    specs = plan_trials("cpu", options=BenchmarkOptions(full=True))
    names = [s.name for s in specs]
    assert names[0] == "baseline" and names[-1] == "combined" and names[-2] == "baseline-repeat"
    drift = [s for s in specs if s.stage == "drift"]
    # a drift check after every 3 singles that run (7 run on the cpu preset), none after the last
    assert [s.name for s in drift] == ["drift-1", "drift-2"] and names[names.index("drift-1") - 1] == "autobatch"
    assert [s.stage for s in specs if s.stage != "drift"] == ["baseline", "baseline"] + ["single"] * 13 + [
        "baseline", "combined"]
    assert {"bf16", "fp16", "tf32", "checkpointing", "accumulation", "autobatch", "bigger-batch", "compile",
            "compile-cudagraphs", "dataloader", "fused-adamw", "ddp", "fsdp"} <= set(names)
    by_name = {s.name: s for s in specs}
    assert by_name["fp16"].skip_reason == "fp16 autocast needs CUDA"
    assert by_name["tf32"].skip_reason == by_name["compile-cudagraphs"].skip_reason == \
        "needs a CUDA device (this run is on the CPU)"
    assert by_name["bf16"].skip_reason == NO_NATIVE_BF16  # the cpu preset's "auto" on an AVX2-only CPU
    assert by_name["ddp"].skip_reason.startswith("DDP needs 2+ devices")
    assert all(by_name[n].skip_reason is None for n in ("baseline", "checkpointing", "accumulation",
                                                        "compile", "dataloader", "fused-adamw", "drift-1"))
    base = by_name["baseline"].config
    assert (base.amp, base.activation_checkpointing, base.accumulation_steps, base.compile, base.num_workers,
            base.optimizer_impl, base.matmul_precision) == ("none", "none", 1, "off", 0, "for-loop", "highest")
    assert by_name["tf32"].changes == {"matmul_precision": "high"}
    accumulation = by_name["accumulation"].config
    assert (accumulation.batch_size, accumulation.accumulation_steps) == (base.batch_size // 2, 2)
    runnable = [s for s in specs if s.config is not None and s.skip_reason is None]
    for spec in runnable:  # the same seed and tokens per optimizer step everywhere but the noise probe's seed
        assert spec.config.batch_size * spec.config.accumulation_steps * spec.nproc == base.batch_size
        assert spec.config.seed == base.seed + (1 if spec.name == "noise-probe" else 0)
    # every trial is evaluated after the same step, late enough for the slowest warm-up plus the minimum
    evals = {s.eval_step for s in specs if s.stage != "drift"}
    assert len(evals) == 1 and all(s.eval_step is None for s in drift)
    compile_spec = by_name["compile"]
    assert evals == {compile_spec.max_warmup_steps + 1 + compile_spec.measured_steps}
    assert compile_spec.max_warmup_steps > by_name["baseline"].max_warmup_steps
    assert by_name["baseline"].measured_steps == 8 and by_name["baseline"].max_measured_steps == 40
    assert drift[0].measured_steps == drift[0].max_measured_steps == 5
    every_two = [s.name for s in plan_trials("cpu", options=BenchmarkOptions(drift_every=2, full=True))
                 if s.stage == "drift"]
    assert every_two == ["drift-1", "drift-2", "drift-3"]
    # AdamW creates its state in the first step: at least 2 warm-up steps whatever is asked
    assert {s.warmup_steps for s in plan_trials("cpu", options=BenchmarkOptions(warmup=0))} == {2}
    assert not [s for s in plan_trials("cpu", options=BenchmarkOptions(drift_every=0)) if s.stage == "drift"]


def test_the_quick_run_leaves_out_what_rarely_pays_on_a_cpu_and_says_how_to_add_it() -> None:
    quick = {s.name: s for s in plan_trials("cpu")}
    for name in ("compile", "bigger-batch"):
        assert quick[name].skip_reason.startswith("left out of the quick run: ")
        assert quick[name].skip_reason.endswith(f"add it with --full, or --only {name}")
    assert "minutes on a CPU" in quick["compile"].skip_reason
    assert quick["fused-adamw"].skip_reason is None and quick["dataloader"].skip_reason is None
    assert quick["compile"].kind.kind == "speed" and quick["bigger-batch"].kind.kind == "optimization"
    only = {s.name: s for s in plan_trials("cpu", options=BenchmarkOptions(only=("compile",)))}
    assert only["compile"].skip_reason is None  # --only brings one back
    assert only["fused-adamw"].skip_reason == "not selected by --only"
    # every train trial's kind is data in the plan, not a list of names in the rule
    kinds = {s.name: (s.kind.kind, s.group) for s in plan_trials("cpu", options=BenchmarkOptions(full=True))}
    assert kinds["baseline"] == ("reference", None) and kinds["noise-probe"][0] == "baseline-repeat"
    assert kinds["checkpointing"] == ("memory", "checkpointing") and kinds["accumulation"] == ("memory", "batch")
    assert kinds["bf16"] == ("speed", "precision") and kinds["combined"] == ("combination", None)
    assert kinds["drift-1"][0] == "baseline-repeat"


def test_cpu_ddp_plans_two_gloo_processes_with_the_batch_split() -> None:
    ddp = {s.name: s for s in plan_trials("cpu", options=BenchmarkOptions(cpu_ddp=True))}["ddp"]
    assert ddp.skip_reason is None and ddp.nproc == 2
    assert ddp.config.batch_size == 8 and ddp.changes == {"processes": 2, "batch_size": 8}


def test_skip_and_only_select_trials_and_bad_names_are_one_line_errors() -> None:
    options = BenchmarkOptions(skip=("compile",), only=("fused-adamw", "compile"))
    specs = {s.name: s for s in plan_trials("cpu", options=options)}
    assert specs["compile"].skip_reason == "skipped by --skip"
    assert specs["checkpointing"].skip_reason == "not selected by --only"
    assert specs["fused-adamw"].skip_reason is None and specs["baseline"].skip_reason is None
    for options, text in ((BenchmarkOptions(skip=("nope",)), "--skip nope: no such train trial"),
                          (BenchmarkOptions(skip=("baseline",)), "the baseline cannot be skipped"),
                          (BenchmarkOptions(warmup=-1), "--warmup -1: give 0 or more warm-up steps"),
                          (BenchmarkOptions(trial_timeout_s=0), "--trial-timeout 0: give a positive number"),
                          (BenchmarkOptions(trial_timeout_s=-5), "--trial-timeout -5: give a positive number"),
                          (BenchmarkOptions(objective="cheap"), "--objective cheap: use one of speed, memory")):
        with pytest.raises(KronosTuneError, match=text) as error:
            plan_trials("cpu", options=options)
        assert "\n" not in str(error.value)


def test_predict_plan_compares_against_full_recompute() -> None:
    specs = plan_trials("cpu", task="predict")
    assert [s.name for s in specs] == ["recompute", "kv-cache", "bf16", "bf16-weights", "autobatch", "sharding"]
    assert specs[0].stage == "baseline" and specs[0].config.use_cache is False
    assert specs[1].config.use_cache is True
    assert specs[-1].skip_reason == "sharding series needs 2+ devices"


def test_predict_plan_times_the_presets_series_and_skips_bf16_as_train_does(tmp_path) -> None:
    from tiny_preset import write_tiny_preset

    specs = {s.name: s for s in plan_trials("cpu", task="predict")}  # 100 series, 400 + 30 steps, no bf16
    cached = specs["kv-cache"].config
    assert cached.measured_series == 100 and cached.quality_series == 100 and specs["kv-cache"].warmup_steps == 1
    reference = specs["recompute"].config  # timed on the first series whose passes hold 4096 tokens
    assert reference.measured_series == 10 and reference.quality_series == 10
    assert "timed and metered on the first 10 of the 100 series" in specs["recompute"].description
    train_bf16 = next(s for s in plan_trials("cpu", task="train") if s.name == "bf16")
    assert specs["bf16"].skip_reason == specs["bf16-weights"].skip_reason == train_bf16.skip_reason == \
        NO_NATIVE_BF16  # the cpu preset's "auto" on an AVX2-only CPU
    folder = write_tiny_preset(tmp_path, "tiny-bf16", bf16_supported=True, series_count=200)
    small = {s.name: s for s in plan_trials(str(folder / "tiny-bf16.toml"), task="predict",
                                            options=BenchmarkOptions(predict_series=20))}
    assert small["bf16"].skip_reason is None and small["bf16"].config.amp == "bf16"
    # 20 timed, quality over 100 of the 200 (one more untimed run), the reference all 20 (36-token windows)
    assert small["bf16"].config.measured_series == 20 and small["bf16"].config.quality_series == 100
    assert small["bf16"].warmup_steps == 2 and small["recompute"].config.measured_series == 20
    with pytest.raises(KronosTuneError, match="--min-spearman 1.5: a Spearman correlation is between -1 and 1"):
        plan_trials("cpu", task="predict", options=BenchmarkOptions(min_spearman=1.5))


def test_quality_guard_with_given_numbers() -> None:
    # noise 0.01 -> threshold max(2 x 0.01, 0.5% of 2.0) = 0.02
    assert quality_threshold(2.0, 0.01) == pytest.approx(0.02)
    assert quality_guard(2.0, 2.019, 0.01).passed
    flagged = quality_guard(2.0, 2.03, 0.01)
    assert not flagged.passed and flagged.delta == pytest.approx(0.03) and flagged.delta_pct == pytest.approx(1.5)
    assert quality_guard(2.0, 1.5, 0.01).passed  # better is never flagged
    # tiny noise: the 0.5% floor decides (4.0 -> 0.02)
    assert quality_guard(4.0, 4.019, 0.0001).passed and not quality_guard(4.0, 4.021, 0.0001).passed
    assert not quality_guard(4.0, 4.021, None).passed  # noise unknown: the floor alone
    assert noise_estimate(2.0, 2.003) == pytest.approx(0.003) and noise_estimate(None, 2.0) is None


def _result(name: str, median: float, peak: int, val: float = 2.0, stage: str = "single",
            changes: dict | None = None, status: str = "ok") -> TrialResult:
    times = [median * f for f in (0.98, 0.99, 1.0, 1.01, 1.02)]
    return TrialResult(name, stage, status, changes or {}, step_time_s=Spread.of(times), samples_per_s=Spread.of(
        [16 / t for t in times]), peak_memory_bytes=peak, val_loss=val, step_times_s=times)


def test_deltas_follow_the_decision_rule_not_the_spread() -> None:
    base = _result("baseline", 1.0, 1000, stage="baseline")
    far = _result("b", 0.8, 900)
    faster = Comparison(0.8, 0.78, 0.82, 0.03, "faster", 5, 5, "test")
    deltas = compute_deltas(far, base, 0.01, faster)
    assert deltas["step_time_s"] == Delta(pytest.approx(-20.0), False)
    assert deltas["samples_per_s"].noise is False
    assert deltas["peak_memory_bytes"] == Delta(pytest.approx(-10.0), False)
    assert deltas["val_loss"].noise
    same = Comparison(0.8, 0.5, 1.2, 0.3, "unresolved", 5, 5, "test")
    assert compute_deltas(far, base, 0.01, same)["step_time_s"].noise  # the rule could not call it
    assert compute_deltas(far, base, 0.01, None)["step_time_s"].noise  # nothing to decide from
    assert compute_deltas(base, base, 0.01) == {}  # the baseline has no delta against itself


def test_combination_is_built_from_the_members_the_rule_chose() -> None:
    specs = plan_trials("cpu")
    base_spec = specs[0]
    results = {"baseline": _result("baseline", 1.0, 1000, stage="baseline"),
               "bf16": _result("bf16", 0.7, 1000, changes={"amp": "bf16"}),
               "fused-adamw": _result("fused-adamw", 0.8, 1000, changes={"optimizer_impl": "fused"}),
               "accumulation": _result("accumulation", 1.0, 700, changes={"batch_size": 8, "accumulation_steps": 2})}
    spec = combine(specs, results, base_spec, ["bf16", "fused-adamw", "accumulation"])
    assert spec.skip_reason is None
    assert spec.changes == {"amp": "bf16", "optimizer_impl": "fused", "batch_size": 8, "accumulation_steps": 2}
    assert spec.config.amp == "bf16" and spec.config.batch_size == 8
    assert spec.description == "bf16 + fused-adamw + accumulation together"
    assert combine(specs, results, base_spec, []).skip_reason.startswith("no single change qualified")
    single = combine(specs, results, base_spec, ["bf16"])
    assert single.skip_reason == "only 'bf16' qualified: the combination is that trial"


def test_records_round_trip_and_spread_is_its_median() -> None:
    spread = Spread.of([3.0, 1.0, 2.0, 10.0])
    assert spread == 2.5 and (spread.min, spread.max, spread.n) == (1.0, 10.0, 4)
    assert (spread.q1, spread.q3) == (pytest.approx(1.75), pytest.approx(4.75))
    result = _result("bf16", 0.5, 10)
    result.deltas = {"step_time_s": Delta(-50.0, False)}
    again = TrialResult.from_dict(result.to_dict())
    assert again == result and again.step_time_s.max == pytest.approx(0.51)
    assert again.step_times_s == result.step_times_s
    report = BenchmarkReport("p", "train", "cpu", "device: cpu", 1, "simulated", trials=[again])
    assert BenchmarkReport.from_dict(report.to_dict()).results == [again]
    assert TrialSpec("x", "single", {}, None, warmup_steps=1, measured_steps=3).total_steps == 4
    assert TrialSpec("x", "single", {}, None, warmup_steps=1, measured_steps=3, eval_step=12).total_steps == 12
