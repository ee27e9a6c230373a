"""What a finished (or partial) train benchmark means, from its results alone.

``summarize_train(report, preset)`` fills a report's derived sections from its
trials: the quality guard's verdicts, the decision rule's comparisons and
trajectory checks, deltas, the timing section (drift, threshold, warm-up
evidence), the MFU section and the recommendation. Nothing here touches a device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kronos_core.sizes import SIZES
from kronos_tune.presets import Preset
from kronos_tune.profiling.flops import size_train_flops_per_token
from kronos_tune.benchmark.costs import one_time_s, workload_time_s
from kronos_tune.benchmark.train.decide import (
    EQUIVALENT_TOLERANCE, FLOOR, NOISY_LIMIT, PAIRED_FLOOR, DecisionContext, decide, reference,
)
from kronos_tune.benchmark.selection import LEFT_OUT
from kronos_tune.benchmark.quality import compute_deltas, guard_all
from kronos_tune.benchmark.recommendation import Recommendation
from kronos_tune.benchmark.results import NOISE_PROBE, BenchmarkReport, TrialResult
from kronos_tune.benchmark.train.verdicts import OneTimeCost

FLOPS_FORMULA = ("model FLOPs per token = 6N + 12·L·H·Q·T (PaLM appendix B): N non-embedding parameters of the "
                 "predictor, L transformer layers, H heads, Q head dimension, T tokens per window; the frozen "
                 "tokenizer's encode pass and the causal mask are not counted")
TIMING_RULE = ("paired comparisons (the trial's worker and a live baseline worker in alternating short blocks, the "
               "order drawn at random from the run's seed for each pair of rounds and mirrored in the second): one "
               "ratio per round, the trial block's median step time over the baseline block's; the Hodges-Lehmann "
               "centre of the ratios with its 95% Wilcoxon signed-rank interval; faster when the interval lies "
               "below 1 and the centre is at "
               f"least max({100 * PAIRED_FLOOR:g}%, the run's resolution) below 1 (slower mirrored), the "
               "resolution being how far the A/A comparison's interval (noise-probe vs baseline, interleaved the "
               "same way) reaches from 1; else on its own interval: faster when the whole interval lies at least "
               f"max({100 * PAIRED_FLOOR:g}%, the pooled resolution) below 1, the pooled resolution being the A/A's "
               "interval at the winsorized spread pooled over the A/A and every paired change (not when the A/A "
               "itself came out different). Sequential comparisons (the trial alone, where two workers cannot live "
               "side by side): the ratio of median step times with a 95% bootstrap interval against "
               f"max({100 * FLOOR:g}% floor, drift), drift = the largest distance of the baseline's "
               f"re-measurements from its median. Unresolved when the interval reaches past the threshold on both "
               f"sides. Above {100 * NOISY_LIMIT:g}% (the resolution, or the drift threshold) the run is too noisy "
               f"to decide on it: only a change called on its own interval is recommended, else the baseline is "
               f"kept")


def model_has_dropout(model_size: str | None) -> bool:
    spec = SIZES.get(model_size or "")
    if spec is None:
        return False
    return any(float(spec.model.get(key, 0.0)) > 0 for key in
               ("ffn_dropout_p", "attn_dropout_p", "resid_dropout_p", "token_dropout_p"))


def _find(trials: list[TrialResult], name: str) -> TrialResult | None:
    return next((t for t in trials if t.name == name), None)


def _warmup_evidence(trials: list[TrialResult]) -> dict[str, Any]:
    """Per trial: warm-up step times, whether they settled, and the last one against the measured median."""
    evidence = {}
    for t in trials:
        if not t.warmup_times_s or t.step_time_s is None:
            continue
        last = t.warmup_times_s[-1]
        evidence[t.name] = {"warmup_times_s": t.warmup_times_s, "settled": bool(t.timing.get("settled")),
                            "first_over_median": t.warmup_times_s[0] / t.step_time_s.median,
                            "last_over_median": last / t.step_time_s.median}
    return evidence


def recommendation(report: BenchmarkReport, decision_source: str, reason: str, preset: Preset | None
                   ) -> Recommendation:
    chosen = _find(report.trials, decision_source) or reference(report.trials)
    config = dict(chosen.config) if chosen is not None and chosen.config else {}
    if report.job is not None:  # the user's own config, with what the chosen trial changed
        config = {**report.job["values"], **chosen_changes(report, chosen)}
    elif preset is not None:
        config["eval_samples"] = max(1, preset.workload.eval_samples)
    if config and report.job is None:
        config["output_dir"] = f"runs/train/{report.preset}"
    nproc = chosen.nproc if chosen is not None else 1
    toml = str(Path(report.out_dir) / "recommended.toml") if report.out_dir else "recommended.toml"
    command = f"kronos-tune train --config {toml}" + (f" --nproc {nproc}" if nproc > 1 else "")
    return Recommendation(chosen.name if chosen is not None else "baseline", reason,
                          dict(chosen.changes) if chosen is not None else {}, command, report.partial,
                          list(report.missing), config=config, nproc=nproc)


# What the benchmark sets on every trial for its own measuring, never a change it recommends.
MEASURING_KEYS = ("data", "symbol_column", "date_format", "train_until", "seed", "eval_samples", "output_dir",
                  "device", "predictor_dir", "tokenizer_dir")


def chosen_changes(report: BenchmarkReport, chosen: TrialResult | None) -> dict[str, Any]:
    """The TrainConfig keys the chosen trial runs differently from the baseline."""
    base = reference(report.trials)
    if chosen is None or base is None or not chosen.config or not base.config:
        return {}
    return {key: value for key, value in chosen.config.items()
            if key not in MEASURING_KEYS and base.config.get(key) != value}


def flops_section(report: BenchmarkReport, preset: Preset | None) -> dict[str, Any] | None:
    if preset is None:
        return None
    work = preset.workload
    spec = SIZES[work.model_size].model
    shape = {"layers": spec["n_layers"], "heads": spec["n_heads"], "head_dim": spec["d_model"] // spec["n_heads"],
             "tokens_per_window": work.lookback_window + work.predict_window}
    peaks = {dtype: preset.peak_flops(dtype) for dtype in ("fp32", "tf32", "bf16", "fp16")}
    return {"formula": FLOPS_FORMULA, "flops_per_token": _flops_per_token(spec, shape, report.flops), **shape,
            "peak_flops_per_device": peaks,
            "mfu_note": None if report.device == preset.hardware.device else
            "MFU not computed: this machine's device differs from the preset's"}


def _flops_per_token(spec: dict[str, Any], shape: dict[str, int], known: dict[str, Any] | None) -> float:
    """The figure `known` (the flops section a rebuilt run's report.json carried) has for this model shape and
    window, else the size's closed form: reading a report needs no torch."""
    if known and known.get("flops_per_token") and all(known.get(key) == value for key, value in shape.items()):
        return known["flops_per_token"]
    return size_train_flops_per_token(spec, shape["tokens_per_window"])


def headroom(report: BenchmarkReport) -> dict[str, Any] | None:
    """How much of the budget the baseline uses, and the micro-batch that would fit (from the bigger-batch
    trial's search), e.g. "5.8 of 140 GiB used: batch 50 -> about 1,200 would fit"."""
    base = reference(report.trials)
    if base is None or not base.peak_memory_bytes or not report.budget_bytes or not base.config:
        return None
    batch = int(base.config.get("batch_size", 0)) * int(base.config.get("accumulation_steps", 1))
    big = next((t for t in report.trials if t.changes.get("memory_allows")), None)  # bigger-batch's search
    fits = (big.changes.get("memory_allows") if big is not None else None) or None
    used, budget = base.peak_memory_bytes / 2**30, report.budget_bytes / 2**30
    text = f"{used:.2f} of {budget:.1f} GiB used ({100 * used / budget:.0f}%)"
    if isinstance(fits, int) and fits > batch:
        text += f": batch {batch} -> about {fits:,} would fit"
    return {"peak_bytes": base.peak_memory_bytes, "budget_bytes": report.budget_bytes, "batch": batch,
            "fits_batch": fits if isinstance(fits, int) else None, "text": text}


def val_resolution(base: TrialResult | None) -> dict[str, Any] | None:
    """The smallest change in mean val loss (% of the baseline's) that the baseline's validation windows resolve:
    2 standard errors of the per-window losses (kronos_tune.train.checks.resolvable_share)."""
    if base is None or not base.val_windows or not base.val_loss:
        return None
    from kronos_tune.train.checks import resolvable_share

    losses = [float(window[0]) for window in base.val_windows]
    mean = sum(losses) / len(losses)
    spread = (sum((loss - mean) ** 2 for loss in losses) / max(len(losses) - 1, 1)) ** 0.5
    return {"windows": len(losses), "pct": 100 * resolvable_share(len(losses)) * spread / abs(base.val_loss)}


def summarize_train(report: BenchmarkReport, preset: Preset | None) -> None:
    """Fill the train report's derived sections from its trials (see the module docstring)."""
    trials = report.trials
    opts = report.options
    base = reference(trials)
    if report.job is not None:
        report.job = {**report.job, "val_resolution": val_resolution(base)}
    factor, floor = float(opts.get("noise_factor", 2.0)), float(opts.get("quality_floor", 0.005))
    quality = guard_all(trials, base, _find(trials, NOISE_PROBE), factor, floor)
    threshold = quality["threshold"]
    margin = opts.get("autobatch_margin")
    context = DecisionContext(budget_bytes=report.budget_bytes, objective=opts.get("objective", "speed"),
                              model_has_dropout=model_has_dropout((base.config or {}).get("model_size")
                                                                  if base is not None else None),
                              **({} if margin is None else {"margin": float(margin)}))
    decision = decide(trials, context)
    for t in trials:
        t.comparison = decision.comparisons.get(t.name)
        t.trajectory = decision.trajectories.get(t.name)
        _projected_total(t, base, decision.costs.get(t.name))
    for t in trials:  # after every projection: a delta is taken from the figures it stands beside
        t.deltas = compute_deltas(t, base, threshold, t.comparison)
    report.quality = {
        **quality,
        "val_loss_step": max((t.val_loss_step or 0 for t in trials), default=0) or None,
        "eval_windows": (base.config or {}).get("eval_samples") if base is not None else None,
        "flagged": [t.name for t in trials if not t.quality_passed],
        "trajectory_rule": (f"training losses step by step against the baseline's: equivalent within "
                            f"{EQUIVALENT_TOLERANCE:g} relative (float error), close within 2%, else approximate; "
                            f"a change promised equivalent or close that is not is a defect"),
        "defects": [name for name, check in decision.trajectories.items() if check.defect]}
    report.timing = {"rule": TIMING_RULE, "threshold_pct": 100 * decision.threshold,
                     "drift_pct": None if decision.drift is None else 100 * decision.drift,
                     "drift_sources": decision.drift_sources, "noisy": decision.noisy,
                     "resolution_pct": None if decision.resolution is None else 100 * decision.resolution,
                     "smallest_change_pct": None if decision.smallest_change is None else
                     100 * decision.smallest_change,
                     "paired_threshold_pct": 100 * decision.paired_threshold, "noisy_limit_pct": 100 * NOISY_LIMIT,
                     "pooled_resolution_pct": _pct(decision.pooled_resolution),
                     "own_threshold_pct": _pct(decision.own_threshold),
                     "evidence": {name: c.evidence for name, c in decision.comparisons.items() if c.evidence},
                     "designs": {t.name: {"design": t.design, "why": t.design_reason} for t in trials if t.design},
                     "left_out": {t.name: t.reason for t in trials if t.status == "skipped" and t.reason
                                  and t.reason.startswith(LEFT_OUT)},
                     "one_time": {name: cost.to_dict() for name, cost in decision.costs.items()},
                     "warmup": _warmup_evidence(trials)}
    report.decision = decision
    report.headroom = headroom(report)
    report.flops = flops_section(report, preset)
    report.recommended = recommendation(report, decision.source, decision.reason, preset)


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction


def _projected_total(trial: TrialResult, base: TrialResult | None, cost: OneTimeCost | None) -> None:
    """The workload's time plus the one-time costs measured in the run: for a compared trial, the baseline's
    workload time x the compared ratio (the figure the rule decides on), else the trial's own median."""
    if cost is not None:
        trial.projected_train_time_s = cost.projected_s
        return
    workload = workload_time_s(trial)
    if workload is not None and trial.status in ("ok", "cancelled"):
        trial.projected_train_time_s = workload + one_time_s(trial)
