"""The benchmark protocol's plan, quality guard, deltas and combination rule (no training here)."""

from __future__ import annotations

import pytest

from kronos_tune.errors import KronosTuneError
from kronos_tune.protocol import (
    Delta, ProtocolOptions, ProtocolReport, Spread, TrialResult, TrialSpec, plan_trials,
)
from kronos_tune.protocol.plan import combine
from kronos_tune.protocol.quality import (
    compute_deltas, helps, noise_estimate, quality_guard, quality_threshold, timing_band,
)


def test_cpu_preset_plan_runs_baseline_first_singles_then_combined_last() -> None:
    specs = plan_trials("cpu")
    names = [s.name for s in specs]
    assert names[0] == "baseline" and names[-1] == "combined"
    assert [s.stage for s in specs] == ["baseline", "baseline"] + ["single"] * 9 + ["baseline", "combined"]
    assert {"bf16", "fp16", "checkpointing", "accumulation", "autobatch", "compile", "dataloader", "fused-adamw",
            "ddp"} <= set(names)
    by_name = {s.name: s for s in specs}
    assert by_name["fp16"].skip_reason == "fp16 autocast needs CUDA"
    assert by_name["ddp"].skip_reason.startswith("DDP needs 2+ devices")
    assert all(by_name[n].skip_reason is None for n in ("baseline", "bf16", "checkpointing", "accumulation",
                                                        "compile", "dataloader", "fused-adamw"))
    base = by_name["baseline"].config
    assert (base.amp, base.activation_checkpointing, base.accumulation_steps, base.compile, base.num_workers,
            base.optimizer_impl) == ("none", "none", 1, "off", 0, "for-loop")
    assert by_name["bf16"].config.amp == "bf16"
    accumulation = by_name["accumulation"].config
    assert (accumulation.batch_size, accumulation.accumulation_steps) == (base.batch_size // 2, 2)
    runnable = [s for s in specs if s.config is not None and s.skip_reason is None]
    for spec in runnable:  # the same seed and tokens per optimizer step everywhere but the noise probe's seed
        assert spec.config.batch_size * spec.config.accumulation_steps * spec.nproc == base.batch_size
        assert spec.config.seed == base.seed + (1 if spec.name == "noise-probe" else 0)
    assert len({s.total_steps for s in specs}) == 1  # every trial is evaluated after the same step
    # a longer compile warm-up comes out of compile's measured steps; a very long one pads the others
    longer = {s.name: s for s in plan_trials("cpu", options=ProtocolOptions(compile_warmup=3))}
    assert (longer["compile"].warmup_steps, longer["compile"].measured_steps) == (3, 3)
    assert len({s.total_steps for s in longer.values()}) == 1 and longer["bf16"].pad_steps == 0
    padded = {s.name: s for s in plan_trials("cpu", options=ProtocolOptions(steps=1, compile_warmup=3))}
    assert padded["compile"].measured_steps == 1 and padded["bf16"].pad_steps == 1
    assert len({s.total_steps for s in padded.values()}) == 1
    # the metered step must follow AdamW's first step: at least 2 warm-up steps whatever is asked
    assert {s.warmup_steps for s in plan_trials("cpu", options=ProtocolOptions(warmup=0))} == {2}


def test_cpu_ddp_plans_two_gloo_processes_with_the_batch_split() -> None:
    ddp = {s.name: s for s in plan_trials("cpu", options=ProtocolOptions(cpu_ddp=True))}["ddp"]
    assert ddp.skip_reason is None and ddp.nproc == 2
    assert ddp.config.batch_size == 8 and ddp.changes == {"processes": 2, "batch_size": 8}


def test_skip_and_only_select_trials_and_bad_names_are_one_line_errors() -> None:
    options = ProtocolOptions(skip=("compile",), only=("bf16", "compile"))
    specs = {s.name: s for s in plan_trials("cpu", options=options)}
    assert specs["compile"].skip_reason == "skipped by --skip"
    assert specs["checkpointing"].skip_reason == "not selected by --only"
    assert specs["bf16"].skip_reason is None and specs["baseline"].skip_reason is None
    assert specs["compile"].warmup_steps == specs["baseline"].warmup_steps  # no compile, no padding
    for options, text in ((ProtocolOptions(skip=("nope",)), "--skip nope: no such train trial"),
                          (ProtocolOptions(skip=("baseline",)), "the baseline cannot be skipped"),
                          (ProtocolOptions(warmup=-1), "--warmup -1: give 0 or more warm-up steps")):
        with pytest.raises(KronosTuneError, match=text) as error:
            plan_trials("cpu", options=options)
        assert "\n" not in str(error.value)


def test_predict_plan_compares_against_full_recompute() -> None:
    specs = plan_trials("cpu", task="predict")
    assert [s.name for s in specs] == ["recompute", "kv-cache", "bf16", "autobatch", "sharding"]
    assert specs[0].stage == "baseline" and specs[0].config.use_cache is False
    assert specs[1].config.use_cache is True
    assert specs[-1].skip_reason == "sharding series needs 2+ devices"


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
    spread = Spread(median, median * 0.98, median * 1.02, 5)
    return TrialResult(name, stage, status, changes or {}, step_time_s=spread, samples_per_s=Spread(
        16 / median, 16 / median * 0.98, 16 / median * 1.02, 5), peak_memory_bytes=peak, val_loss=val)


def test_deltas_mark_noise_inside_the_spread_or_the_timing_band() -> None:
    base = _result("baseline", 1.0, 1000, stage="baseline")
    close, far = _result("a", 1.01, 1000), _result("b", 0.8, 900)
    assert compute_deltas(close, base, 0.01)["step_time_s"].noise
    deltas = compute_deltas(far, base, 0.01)
    assert deltas["step_time_s"] == Delta(pytest.approx(-20.0), False)
    assert deltas["peak_memory_bytes"] == Delta(pytest.approx(-10.0), False)
    assert deltas["val_loss"].noise
    assert timing_band(base, [_result("baseline-repeat", 1.3, 1000, stage="baseline")]) == pytest.approx(30.0)
    assert compute_deltas(far, base, 0.01, band_pct=30.0)["step_time_s"].noise  # the machine drifted more
    assert compute_deltas(base, base, 0.01) == {}  # the baseline has no delta against itself


def test_combination_takes_the_faster_of_conflicting_changes_and_leaves_flagged_ones_out() -> None:
    # bf16 and fp16 both help (fp16 as if measured on a GPU): the faster one wins the precision group
    specs = plan_trials("cpu")
    base_spec = specs[0]
    base = _result("baseline", 1.0, 1000, stage="baseline")
    results = {"baseline": base,
               "bf16": _result("bf16", 0.7, 1000, changes={"amp": "bf16"}),
               "fp16": _result("fp16", 0.75, 1000, changes={"amp": "fp16"}),
               "fused-adamw": _result("fused-adamw", 0.8, 1000, changes={"optimizer_impl": "fused"}),
               "checkpointing": _result("checkpointing", 1.4, 600, changes={"activation_checkpointing": "all"}),
               "accumulation": _result("accumulation", 1.0, 700, changes={"batch_size": 8, "accumulation_steps": 2}),
               "dataloader": _result("dataloader", 0.5, 1000, val=2.2, changes={"num_workers": 2})}
    for name, result in results.items():
        result.deltas = compute_deltas(result, base, 0.01)
        if name != "baseline":
            result.quality = quality_guard(2.0, result.val_loss, 0.005).to_dict()
    assert not helps(results["dataloader"], base)  # fastest, but worse quality
    assert not helps(results["checkpointing"], base)  # smaller but slower
    assert helps(results["accumulation"], base)  # smaller, time within the noise
    spec = combine(specs, results, base_spec)
    assert spec.skip_reason is None
    assert spec.changes == {"amp": "bf16", "optimizer_impl": "fused", "batch_size": 8, "accumulation_steps": 2}
    assert spec.config.amp == "bf16" and spec.config.batch_size == 8
    # nothing helped -> skipped, the baseline is the recommendation
    assert combine(specs, {"baseline": base}, base_spec).skip_reason.startswith("no single change helped")


def test_records_round_trip_and_spread_is_its_median() -> None:
    spread = Spread.of([3.0, 1.0, 2.0])
    assert spread == 2.0 and (spread.min, spread.max, spread.n) == (1.0, 3.0, 3)
    result = _result("bf16", 0.5, 10)
    result.deltas = {"step_time_s": Delta(-50.0, False)}
    again = TrialResult.from_dict(result.to_dict())
    assert again == result and again.step_time_s.max == pytest.approx(0.51)
    report = ProtocolReport("p", "train", "cpu", "device: cpu", 1, "simulated", trials=[again])
    assert ProtocolReport.from_dict(report.to_dict()).results == [again]
    assert TrialSpec("x", "single", {}, None, warmup_steps=1, measured_steps=3, pad_steps=1).total_steps == 5
