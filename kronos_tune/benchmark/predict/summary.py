"""What a finished (or partial) predict benchmark run means: its decision, deltas and recommended settings.

``summarize_predict`` is summary.summarize's predict half: it fills the
report's comparisons and deltas (each trial against the recompute baseline),
its decision (predict/decide.py, decide_predict) and its recommendation, the
prediction settings written to RUN/recommended.toml for
`kronos-tune predict --config` (kronos_tune.predict.config_file). Nothing here
touches a device.
"""

from __future__ import annotations

import textwrap
from dataclasses import fields
from pathlib import Path
from typing import Any

from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.config_file import SETTINGS_KEYS, predict_file_toml
from kronos_tune.benchmark.train.decide import FLOOR, drift_estimate
from kronos_tune.benchmark.predict.decide import (
    BASELINE, BOOTSTRAP, DEFAULT_MIN_SPEARMAN, EXACT_TOLERANCE, decide_predict,
)
from kronos_tune.benchmark.predict.verdicts import PredictDecision, speedup_text
from kronos_tune.benchmark.quality import compute_deltas
from kronos_tune.benchmark.recommendation import Recommendation
from kronos_tune.benchmark.results import BenchmarkReport, TrialResult
from kronos_tune.benchmark.stats import Comparison

PREDICT_RULE = ("each trial's run times against its reference's (kv-cache against the full recompute; bf16, the "
                "autobatch chunk and sharding against kv-cache, and the recompute too) as a ratio with a 95% "
                "interval (paired where a trial's timed runs alternated with its reference's in one worker: the "
                "per-round ratios, as the train task decides); faster when the interval lies below 1 and the ratio "
                "is at least the threshold below 1; "
                "quality by exactness class: exact = identical greedy output to the reference's (within "
                f"{EXACT_TOLERANCE:g} history standard deviations), approximate = Spearman rank agreement of the "
                "predicted returns with the reference's at least the threshold; recommended: the fastest trial that "
                "is faster than its reference and the recompute and keeps its quality, else the reference")


def recommended_settings(config: dict[str, Any], device: str) -> dict[str, Any]:
    """The `kronos-tune predict` config of a predict trial's PredictSettings (as a dict) measured on `device`:
    every key the trial ran with (the benchmark builds its own job from these keys: pipeline.predict_config),
    the data being the trial's synthetic series. max_batch_size None = the predictor's default."""
    cached = bool(config.get("use_cache", True))
    return {"size": config.get("model_size"), "lookback": config.get("lookback"), "pred_len": config.get("pred_len"),
            "sample_count": config.get("sample_count"), "synthetic": config.get("measured_series"),
            "seed": config.get("seed", 0), "temperature": 1.0, "top_k": 0, "top_p": 0.9,
            "device": device if device in ("cpu", "cuda") else None, "max_batch_size": config.get("max_batch_size"),
            "window_mode": "refill", "amp": config.get("amp", "none"),
            "weight_dtype": config.get("weight_dtype", "fp32"), "cuda_graphs": device == "cuda" and cached,
            "kv_cache": cached, "nproc": int(config.get("devices", 1)), "chunk_series": config.get("chunk_series")}


def _find(trials: list[TrialResult], name: str) -> TrialResult | None:
    return next((t for t in trials if t.name == name), None)


def summarize_predict(report: BenchmarkReport) -> None:
    """Fill the predict report's comparisons, deltas, quality verdicts, decision, timing and recommendation."""
    trials = report.trials
    drift, _ = drift_estimate(trials)
    threshold = max(FLOOR, drift or 0.0)
    min_spearman = float(report.options.get("min_spearman", DEFAULT_MIN_SPEARMAN))
    decision = decide_predict(trials, threshold, min_spearman)
    base = _find(trials, BASELINE)
    for t in trials:
        verdict = decision.verdicts.get(t.name)
        comparison: Comparison | None = verdict.vs_baseline if verdict is not None else None
        t.comparison = comparison
        t.deltas = compute_deltas(t, base, None, comparison)
        if base is not None and (t.config or {}).get("measured_series") != (base.config or {}).get("measured_series"):
            t.deltas.pop("peak_memory_bytes", None)  # the reference's peak is for fewer series: not comparable
        if verdict is not None and t.status == "ok":
            t.quality = {**(t.quality or {}), **verdict.quality.to_dict()}  # what was measured, and the verdict
    report.timing = {"rule": PREDICT_RULE, "threshold_pct": 100 * threshold,
                     "drift_pct": None if drift is None else 100 * drift, "estimator": BOOTSTRAP}
    report.decision = decision
    report.recommended = None
    chosen = _find(trials, decision.source) if decision.source else None
    if chosen is None or not chosen.config:
        return
    settings = recommended_settings(chosen.config, report.device)
    toml = str(Path(report.out_dir) / "recommended.toml") if report.out_dir else "recommended.toml"
    report.recommended = Recommendation(
        chosen.name, decision.reason, {key: settings[key] for key in SETTINGS_KEYS if settings.get(key) is not None},
        f"kronos-tune predict --config {toml}", report.partial, list(report.missing), settings=settings)


def recommended_predict_toml(report: BenchmarkReport) -> str | None:
    """RUN/recommended.toml of a predict run: its recommended settings as a [predict] table."""
    rec = report.recommended
    if rec is None or not rec.settings:
        return None
    if report.job:
        return user_predict_toml(report)
    header = []
    if report.partial:
        header.append(f"partial: the benchmark did not finish (missing trials: {', '.join(report.missing) or 'none'}"
                      f"{'; cancelled' if report.cancelled else ''}); the recommendation is from the trials that ran")
    header += [f"kronos-tune benchmark --task predict, preset {report.preset}: {rec.source}",
               *textwrap.wrap(f"why: {rec.reason}", 110, subsequent_indent="  "),
               f"run: {rec.command} predicts the benchmark's own synthetic series, as timed; add --data FILE "
               f"for yours (and --checkpoint DIR --tokenizer DIR for trained weights; flags given on the command "
               f"line win over this file)"]
    settings = dict(rec.settings)
    if settings.get("max_batch_size") is None:
        header.append("max_batch_size not set: the predictor's default (from free memory), as measured")
    return predict_file_toml(settings, header)


def user_predict_toml(report: BenchmarkReport) -> str:
    """The user's [predict] file with the chosen trial's settings, under a header naming each change and what the
    benchmark measured of it."""
    rec, job = report.recommended, report.job or {}
    assert rec is not None and rec.settings is not None
    values = dict(job.get("values") or {})
    defaults = {spec.name: spec.default for spec in fields(PredictConfig)}
    before = {key: values.get(key, defaults.get(key)) for key in SETTINGS_KEYS}
    if report.device != "cuda":
        before["cuda_graphs"] = False  # unset means on with CUDA only
    changes = {key: rec.settings[key] for key in SETTINGS_KEYS
               if rec.settings.get(key) is not None and before[key] != rec.settings[key]}
    header = []
    if report.partial:
        header.append(f"partial: the benchmark did not finish (missing trials: {', '.join(report.missing) or 'none'})")
    header += [f"kronos-tune benchmark --task predict of {job.get('source')} ({report.device_line}): "
               f"recommended {rec.source}", *textwrap.wrap(f"why: {rec.reason}", 110, subsequent_indent="  ")]
    chosen = _find(report.trials, rec.source)
    for key, value in changes.items():
        header.append(f"change: {key} = {value!r} (was {'not set' if before[key] is None else repr(before[key])})")
    if changes and chosen is not None and chosen.name != BASELINE:
        speed = f"{chosen.speedup:.2f}x the recompute's series/s" if chosen.speedup else "speed not measured"
        header.append(f"  measured, {chosen.name}: {speed}, {(chosen.quality or {}).get('class')} output")
    elif changes:
        header.append(f"  measured: {BASELINE}, the reference method, as no other setting was faster (why above)")
    if not changes:
        header.append("no change: your settings as they are")
    header.append(f"run: {rec.command}")
    return predict_file_toml({**values, **changes}, header)


def predict_setup_line(report: BenchmarkReport) -> str:
    """What every predict trial predicted and how often (from the trials' settings)."""
    configs = [t.config for t in report.trials if t.config]
    timed = max((int(c.get("measured_series") or 0) for c in configs), default=0)
    compared = max((max(int(c.get("measured_series") or 0), int(c.get("agreement_series") or 0)) for c in configs),
                   default=0)
    base = _find(report.trials, BASELINE)
    reference = int((base.config or {}).get("measured_series") or 0) if base is not None else 0
    subset = (f" (the recompute reference the first {reference} of them: its cost per series does not fall with "
              f"more)" if 0 < reference < timed else "")
    what = (f"series of {', '.join(report.job['data'])} (your job: {report.job['source']})" if report.job
            else "synthetic series")
    return (f"Every trial times the same {timed} {what}{subset}, greedy: one metered run, then "
            f"{report.options.get('predict_repeats')} timed runs; quality compares the outputs of {compared} series.")


def predict_decision_lines(report: BenchmarkReport) -> list[str]:
    """Plain sentences on the predict run and its decision: what was predicted, the rule, then each trial's
    verdict against its reference."""
    decision = report.decision
    lines = [predict_setup_line(report)]
    if not isinstance(decision, PredictDecision):
        return lines
    lines.append(f"Decision: {report.timing.get('rule', PREDICT_RULE)}. Threshold ±{100 * decision.threshold:.1f}%, "
                 f"minimum Spearman {decision.min_spearman:g}; {decision.estimator}.")
    for name, verdict in decision.verdicts.items():
        vs_ref = verdict.vs_reference
        paired = vs_ref is not None and vs_ref.design == "paired"
        how = f"paired over {vs_ref.n} rounds" if paired else "sequential"
        speed = (f"{speedup_text(vs_ref)} the series/s of {verdict.reference} ({vs_ref.verdict}, {how})"
                 if vs_ref is not None else "not timed")
        state = "eligible" if verdict.eligible else f"left out: {verdict.why}"
        lines.append(f"{name} ({verdict.exactness}): {speed}; {verdict.quality.text}; {state}.")
    lines += [f"Finding: {pair.text()}." for pair in decision.findings]
    return lines


def predict_markdown_lines(report: BenchmarkReport) -> list[str]:
    """report.md's predict section: the setup and the rule as paragraphs, each trial's verdict as a bullet."""
    setup, *rest = predict_decision_lines(report)
    lines = [setup]
    if rest:
        lines += ["", rest[0]]
    if rest[1:]:
        lines += [""] + [f"- {line}" for line in rest[1:]]
    return lines
