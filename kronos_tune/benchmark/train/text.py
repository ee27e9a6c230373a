"""What a train benchmark's report says in words: its timing, quality and memory sections, its recommended
config file, and the notes the terminal prints under the table."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from kronos_tune.benchmark.report.cells import fmt_seconds
from kronos_tune.benchmark.results import NOISE_PROBE, BenchmarkReport, TrialResult
from kronos_tune.benchmark.stats import CONFIDENCE, EXTENDED_CONFIDENCE
from kronos_tune.benchmark.train.decide import (
    AA_RESOLUTION, NOISY_LIMIT, OWN_INTERVAL, PAIRED_FLOOR_ONLY, SEQUENTIAL_THRESHOLD,
)
from kronos_tune.benchmark.train.target import summary_lines
from kronos_tune.benchmark.train.verdicts import Decision


def recommended_toml(report: BenchmarkReport) -> str | None:
    """RUN/recommended.toml of a train run: the recommended TrainConfig, for `kronos-tune train --config`."""
    from kronos_core.train.config import TrainConfig  # torch: only when there is a config to write

    rec = report.recommended
    if rec is None or not rec.config:
        return None
    if report.job is not None:
        return user_recommended_toml(report)
    text = TrainConfig.from_dict(rec.config, source="recommended", portable=True).to_toml()
    header = []
    if report.partial:
        header.append(f"# partial: the benchmark did not finish (missing trials: {', '.join(report.missing) or 'none'}"
                      f"{'; cancelled' if report.cancelled else ''}); the recommendation is from the trials that ran")
    header += [f"# kronos-tune benchmark, preset {report.preset}: {rec.source}",
               *textwrap.wrap(f"why: {rec.reason}", 110, initial_indent="# ", subsequent_indent="#   "),
               f"# run: {rec.command}"]
    return "\n".join(header) + "\n" + text


def _effect(trial: TrialResult | None, base: TrialResult | None) -> str:
    """What the benchmark measured of a trial against the baseline, in one phrase."""
    if trial is None or base is None:
        return "not measured"
    parts = []
    comparison = trial.comparison
    if comparison is not None:
        interval = "" if comparison.low is None or comparison.high is None else \
            f" [{comparison.low:.3f}, {comparison.high:.3f}]"
        parts.append(f"time/step x{comparison.ratio:.3f}{interval} ({comparison.verdict})")
    if trial.peak_memory_bytes and base.peak_memory_bytes:
        parts.append(f"peak memory {trial.peak_memory_bytes / 2**20:,.0f} MiB vs {base.peak_memory_bytes / 2**20:,.0f}")
    loss = (trial.deltas or {}).get("val_loss")
    if loss is not None:
        parts.append(f"val loss {loss.pct:+.2f}%")
    return ", ".join(parts) or "no figure"


def user_recommended_toml(report: BenchmarkReport) -> str:
    """The user's file as TOML (also for a YAML) with the chosen changes in the benchmarked phase, under a
    header naming each change and what it measured."""
    from kronos_core.train.train_file import TrainFile
    from kronos_tune.benchmark.train.decide import reference
    from kronos_tune.benchmark.train.summary import chosen_changes
    from kronos_tune.train.convert import train_file_toml

    job, rec = report.job or {}, report.recommended
    assert rec is not None
    chosen = report.trial(rec.source)
    base = reference(report.trials)
    changes = chosen_changes(report, chosen)
    shared = dict(job.get("shared") or {})
    phases = {name: dict(keys) for name, keys in (job.get("phases") or {}).items()}
    if phases:
        phases[job["phase"]].update(changes)
    else:
        shared.update(changes)
    header = []
    if report.partial:
        header.append(f"partial: the benchmark did not finish (missing trials: "
                      f"{', '.join(report.missing) or 'none'})")
    header += [f"kronos-tune benchmark of {job.get('source')} ({job.get('phase')} phase, {report.device_line}):"
               f" recommended {rec.source}"]
    header += textwrap.wrap(f"why: {rec.reason}", 108, subsequent_indent="  ")
    if not changes:
        header.append("no change: your config as it is")
    decision = _decision(report)
    members = list(decision.combination) if decision is not None and rec.source == "combined" else [rec.source]
    for key, value in changes.items():
        before = base.config.get(key) if base is not None and base.config else None
        header.append(f"change: {key} = {value!r} (was {before!r})")
    for name in members if changes else []:
        header.append(f"  measured, {name}: {_effect(report.trial(name), base)}")
    if changes and rec.source == "combined":
        header.append(f"  measured, combined: {_effect(chosen, base)}")
    header.append(f"run: {rec.command}")
    file = TrainFile(Path(str(job.get("source"))), shared, phases, upstream=bool(job.get("upstream")),
                     sources=dict(job.get("sources") or {}))
    return train_file_toml(file, header)


def _aa_rounds(report: BenchmarkReport) -> str:
    aa = next((tr for tr in report.trials if tr.name == NOISE_PROBE), None)
    timing = aa.timing if aa is not None else {}
    if not timing.get("rounds"):
        return "not run"
    return f"{timing['rounds']} rounds in {timing.get('measure_time_s', 0):.0f} s"


def _decision(report: BenchmarkReport) -> Decision | None:
    return report.decision if isinstance(report.decision, Decision) else None


def _designs(report: BenchmarkReport, design: str) -> list[TrialResult]:
    """The trials compared with the baseline in `design` (paired | sequential)."""
    return [trial for trial in report.trials if trial.design == design]


def quality_resolution_line(report: BenchmarkReport) -> str | None:
    """"changes in val loss under 0.21% could not be seen (...)": the quality resolution of the run (train)."""
    q = report.quality or {}
    aa = q.get("aa")
    if q.get("resolution_pct") is not None and aa:
        return (f"changes in val loss under {q['resolution_pct']:.2f}% could not be seen in this run (the A/A "
                f"comparison: the noise-probe against the baseline on the same {aa['windows']} validation "
                f"windows, {aa['change_pct']:+.2f}% [{aa['low_pct']:+.2f}%, {aa['high_pct']:+.2f}%]"
                f"{', itself above the floor' if aa.get('flagged') else ''})")
    if q.get("method") == "windows":
        return (f"the quality resolution was not measured: the noise-probe (the A/A comparison) has no validation "
                f"loss, so the guard tolerated the {100 * float(q.get('floor', 0)):g}% floor alone")
    return None


def resolution_line(report: BenchmarkReport) -> str | None:
    """"changes under 3.8% could not be told from noise in this run (...)": the run's own resolution (train),
    speed, then quality."""
    speed, quality = _speed_resolution(report), quality_resolution_line(report)
    if speed and quality:
        return f"{speed}; {quality}"
    return speed or quality


def _speed_resolution(report: BenchmarkReport) -> str | None:
    decision = _decision(report)
    if decision is None:
        return None
    if decision.resolution is not None:
        return (f"changes under {100 * decision.resolution:.1f}% could not be told from noise in this run (the A/A "
                f"comparison: the noise-probe against the baseline, interleaved the same way)")
    if decision.smallest_change is not None and decision.comparisons:
        return (f"changes under {100 * decision.smallest_change:.1f}% could not be told from noise in this run "
                f"(the sequential design's threshold: the larger of its floor and the drift of the baseline's "
                f"re-measurements)")
    if _designs(report, "paired"):
        return (f"this run did not measure its resolution: the noise-probe (the A/A comparison) did not run, so "
                f"paired verdicts used the paired threshold's ±{100 * decision.paired_threshold:.1f}% floor alone")
    return None


def evidence_line(report: BenchmarkReport, own_only: bool = False) -> str | None:
    """Each change's verdict and the evidence that decided it, with the figures, e.g. "fused-adamw faster: its own
    interval (-23.9% to -20.4%) lies wholly beyond the pooled resolution 18.1% (the A/A's own 36.9%)";
    `own_only`: only the verdicts called on their own interval."""
    decision = _decision(report)
    if decision is None:
        return None
    parts = [f"{name} {comparison.verdict}: {_evidence(comparison, decision)}"
             for name, comparison in decision.comparisons.items()
             if name != NOISE_PROBE and (not own_only or comparison.evidence == OWN_INTERVAL)]
    return "; ".join(parts) or None


def _evidence(comparison: Any, decision: Decision) -> str:
    said = _evidence_alone(comparison, decision)
    if comparison.confidence == CONFIDENCE:
        return said
    return (f"{said}; measured on after its first rounds left the verdict open, so judged on a "
            f"{100 * comparison.confidence:g}% interval")


def _evidence_alone(comparison: Any, decision: Decision) -> str:
    called = comparison.verdict in ("faster", "slower")
    if comparison.evidence == OWN_INTERVAL:
        span = comparison.interval_text().split(" interval ", 1)[-1]
        return (f"its own interval ({span}) lies wholly beyond "
                f"the pooled resolution {_pct(decision.own_threshold)} (the A/A's own {_pct(decision.resolution)})")
    if comparison.evidence == AA_RESOLUTION:
        where = "beyond" if called else "not beyond"
        own = ("" if called or decision.own_threshold is None else
               f", nor its own interval wholly beyond the pooled {_pct(decision.own_threshold)}")
        trusted = " (too noisy to recommend on)" if called and decision.noisy else ""
        return f"{where} the A/A's resolution {_pct(decision.paired_threshold)}{trusted}{own}"
    if comparison.evidence == PAIRED_FLOOR_ONLY:
        return f"{'beyond' if called else 'not beyond'} the paired floor {_pct(decision.paired_threshold)} (no A/A)"
    if comparison.evidence == SEQUENTIAL_THRESHOLD:
        return f"{'beyond' if called else 'not beyond'} the sequential threshold {_pct(decision.threshold)}"
    return "the rule named no evidence"


def _pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.1f}%"


def _too_noisy(decision: Decision) -> str:
    return f"changes under {100 * (decision.smallest_change or 0):.1f}% could not be told from noise"


def _noisy_outcome(decision: Decision) -> str:
    own = [name for name, c in decision.comparisons.items() if c.evidence == OWN_INTERVAL and c.verdict == "faster"]
    if own:
        return (f"only changes called on their own interval stand ({', '.join(own)}: wholly beyond the pooled "
                f"resolution {_pct(decision.own_threshold)})")
    return "no change's own interval lay wholly beyond the pooled resolution, so the baseline is kept; rerun on a " \
           "quieter machine"


def _drift_pct(decision: Decision) -> float | None:
    return None if decision.drift is None else 100 * decision.drift


def timing_lines(report: BenchmarkReport) -> list[str]:
    """Plain sentences on how the timings were taken and how far they can be trusted (train)."""
    t, opts, decision = report.timing, report.options, _decision(report)
    if not t or decision is None:
        return []
    lines = []
    resolution = resolution_line(report)
    if resolution:
        lines.append(f"**Resolution**: {resolution}.")
    probe = report.trial(NOISE_PROBE)
    aa = probe.comparison if probe is not None else None
    if aa is not None and aa.design == "paired" and aa.verdict in ("faster", "slower"):
        lines.append(f"The A/A comparison itself came out {aa.verdict} ({100 * (aa.ratio - 1):+.1f}%): two "
                     f"workers of one configuration differed beyond the floor, which is why the resolution is as "
                     f"wide as it is.")
    paired = [trial.name for trial in _designs(report, "paired")]
    sequential = {trial.name: trial.design_reason for trial in _designs(report, "sequential")}
    if paired:
        steps = sorted({tr.timing["steps_per_block"] for tr in report.trials if tr.timing.get("steps_per_block")})
        size = f"{'/'.join(str(n) for n in steps)} step(s)" if steps else f"about {opts.get('block_s', 0.5):g} s"
        lines.append(f"Paired design ({', '.join(paired)}): each against a live, warmed-up baseline worker in "
                     f"alternating blocks of {size}, the order drawn at random for each pair of rounds and "
                     f"mirrored in the second, so that each side leads equally often (seed {opts.get('seed')} and "
                     f"the trial's name), rounds added until the interval of "
                     f"the block ratios is within ±{100 * opts.get('target_ci', 0.02):.0f}% or the trial's budget is "
                     f"spent (the A/A comparison, whose reach is the resolution, runs its whole budget: "
                     f"{_aa_rounds(report)}); decision threshold ±{100 * decision.paired_threshold:.1f}%.")
    if sequential:
        lines.append("Sequential design (the trial alone against the baseline's own measurement, threshold "
                     f"±{100 * decision.threshold:.1f}%): " + "; ".join(f"{name}: {why}"
                                                                      for name, why in sequential.items()) + ".")
    drift = _drift_pct(decision)
    if not paired or sequential or drift is not None:
        drift_text = "not measured" if drift is None else f"{drift:.1f}% ({', '.join(decision.drift_sources)})"
        lines.append(f"Timing: each trial warms up until a step is within "
                     f"{100 * opts.get('settle_tolerance', 0.1):.0f}% of the one before (at least {opts.get('warmup')} "
                     f"steps); a sequential trial then measures at least {opts.get('steps')} steps, until the "
                     f"median's 95% interval is within ±{100 * opts.get('target_ci', 0.02):.0f}% or its time budget "
                     f"is spent. Drift of the baseline's re-measurements: {drift_text}; sequential threshold "
                     f"±{100 * decision.threshold:.1f}%.")
    evidence = evidence_line(report)
    if evidence:
        lines.append(f"**Verdicts**, each with the evidence that decided it: {evidence}.")
    if decision.noisy:
        lines.append(f"**Too noisy to decide on the A/A**: {_too_noisy(decision)}, past the {100 * NOISY_LIMIT:g}% "
                     f"the rule accepts; {_noisy_outcome(decision)}.")
    paid = [f"{name}: {cost.one_time_s:.1f} s once vs {cost.saving_s:+.1f} s saved over the workload"
            for name, cost in decision.costs.items() if cost.one_time_s >= 0.5]
    if paid:
        lines.append("One-time costs beyond the baseline's (warm-up, compilation, searches) against what each change "
                     "saves over the preset's workload: " + "; ".join(paid) + ".")
    left = t.get("left_out") or {}
    if left:
        lines.append(f"Left out of this quick run: {', '.join(left)}; add them all with `--full`, or one with "
                     f"`--only NAME` (each reason is in its row).")
    warm = t.get("warmup") or {}
    if warm:
        parts = []
        for name, item in warm.items():
            times = ", ".join(fmt_seconds(v) for v in item["warmup_times_s"])
            state = "settled" if item["settled"] else "not settled in the allowed steps"
            parts.append(f"{name}: {times} ({state}; first step {item['first_over_median']:.1f}x, last "
                         f"{item['last_over_median']:.2f}x the measured median)")
        lines.append("Warm-up evidence (step times before measuring): " + "; ".join(parts) + ".")
    stops = [f"{tr.name} n={_measured_count(tr)} ({tr.timing.get('stop')}, ±{100 * tr.timing['ci_halfwidth']:.1f}%)"
             for tr in report.trials if tr.timing.get("stop") and tr.timing.get("ci_halfwidth") is not None]
    if stops:
        lines.append("Measured steps (paired: rounds) and why measuring stopped (interval = the 95% interval reached "
                     "its target, budget = time budget spent, extended = measured on because the first rounds "
                     f"left the verdict open, then judged on a {100 * EXTENDED_CONFIDENCE:g}% interval; time-cap, "
                     "max-steps/max-rounds): " + "; ".join(stops) + ".")
    return lines


def _measured_count(trial: TrialResult) -> int:
    return len(trial.blocks) if trial.blocks else len(trial.step_times_s)


def markdown_lines(report: BenchmarkReport) -> list[str]:
    """report.md's train section: what every trial shares, the timing, memory, the quality guard, MFU."""
    opts = report.options
    lines: list[str] = []
    q = report.quality
    lines += ["", f"Every trial: seed {opts.get('seed')}, the same windows and tokens per optimizer step; "
                  f"validation loss after {q.get('val_loss_step')} optimizer steps from the same initial "
                  f"weights on {q.get('eval_windows')} validation windows."]
    lines += [""] + timing_lines(report)
    if report.headroom:
        lines += ["", f"Memory: {report.headroom['text']}."]
    lines += ["", f"Quality guard: {q.get('rule')}. {_guard_figures(q)}. "
                  f"Training losses: {q.get('trajectory_rule', '')}."]
    guarded = [f"{t.name} {t.quality['text']}" for t in report.trials if t.quality and t.quality.get("text")]
    if guarded:
        lines += ["", "Val loss vs the baseline, paired per window (95% interval): " + "; ".join(guarded) + "."]
    if q.get("defects"):
        lines += ["", f"**Defects**: {', '.join(q['defects'])} should reproduce the baseline's losses and do not."]
    reached = summary_lines(report.trials)
    if reached:
        lines += ["", "Time to target (each candidate trained with other seeds until the baseline's val loss at "
                      f"step {q.get('val_loss_step')}; optimizer steps only, median and range over the seeds): "
                  + "; ".join(reached) + "."]
    if report.flops:
        lines += ["", f"MFU: {report.flops['formula']}; {report.flops['flops_per_token']:.4g} FLOPs per token."]
    return lines


def _guard_figures(q: dict[str, Any]) -> str:
    """The guard's figures in words: the tolerated worsening and what it came from."""
    threshold = "n/a" if q.get("threshold_pct") is None else f"+{q['threshold_pct']:.2f}%"
    if q.get("method") == "windows":
        resolution = "not measured" if q.get("resolution_pct") is None else f"{q['resolution_pct']:.2f}%"
        return f"tolerated worsening {threshold} (quality resolution {resolution})"
    noise = "not measured" if q.get("noise") is None else f"{q['noise']:.5f}"
    return f"noise {noise}, threshold {threshold} (the repeat rule: results without per-window losses)"


def user_job_line(report: BenchmarkReport) -> str | None:
    """`benchmark --config`: whose job was measured, on how many windows, and the change in val loss those
    windows resolve (from the baseline's per-window spread)."""
    job = report.job
    if not job:
        return None
    windows = job.get("windows") or {}
    line = (f"your job: {job.get('source')} ({job.get('phase')} phase) on {', '.join(map(str, job.get('data') or []))}: "
            f"{windows.get('train', 0):,} training windows, {windows.get('evaluated', 0):,} of its "
            f"{windows.get('val', 0):,} validation windows evaluated by every trial")
    resolution = job.get("val_resolution")
    if resolution:
        line += (f"; a change in val loss under {resolution['pct']:.2f}% cannot be resolved with "
                 f"{resolution['windows']} windows")
    return line


def console_notes(report: BenchmarkReport) -> list[str]:
    """The lines the terminal prints under the table: the quality guard, the timing designs, what the quick run
    left out, memory and MFU; none of them when no trial was measured (an interrupted run says so itself)."""
    q, t = report.quality, report.timing
    job_line = user_job_line(report)
    if not any(trial.status == "ok" for trial in report.trials):
        return [job_line] if job_line else []
    measured = (f", val loss after {q.get('val_loss_step')} steps on {q.get('eval_windows')} windows"
                if q.get("val_loss_step") is not None else ", no val loss measured")
    lines = [f"quality guard: {q.get('rule')}; {_guard_figures(q)}{measured}; Δ loss shows the 95% interval of "
             f"the paired windows"] if q else []
    if job_line:
        lines.insert(0, job_line)
    decision = _decision(report)
    paired = [trial.name for trial in _designs(report, "paired")]
    sequential = [f"{trial.name} ({trial.design_reason})" for trial in _designs(report, "sequential")]
    if paired and decision is not None:
        lines.append(f"timing: paired with a live baseline in alternating blocks ({', '.join(paired)}), "
                     f"paired threshold ±{100 * decision.paired_threshold:.1f}%; Δ shows the 95% interval of the "
                     f"block ratios; ~ = the rule calls it neither faster nor slower")
    if decision is not None and (sequential or not paired):
        drift = _drift_pct(decision)
        lines.append(f"timing: sequential{': ' + '; '.join(sequential) if sequential else ''}; sequential threshold "
                     f"±{100 * decision.threshold:.1f}% (drift of the baseline's re-measurements "
                     f"{'not measured' if drift is None else f'{drift:.1f}%'})")
    left = t.get("left_out") or {}
    if left:
        lines.append(f"left out of this quick run: {', '.join(left)}; add them with --full (or one with --only "
                     f"NAME)")
    evidence = evidence_line(report)
    if evidence:
        lines.append(f"verdicts: {evidence}")
    if decision is not None and decision.noisy:
        lines.append(f"too noisy to decide on the A/A: {_too_noisy(decision)} (limit {100 * NOISY_LIMIT:g}%); "
                     f"{_noisy_outcome(decision)}")
    reached = summary_lines(report.trials)
    if reached:
        lines.append(f"time to the baseline's val loss at step {q.get('val_loss_step')} (other seeds): "
                     + "; ".join(reached))
    if report.headroom:
        lines.append(f"memory: {report.headroom['text']}")
    if report.flops:
        lines.append(f"MFU: {report.flops['formula']}")
    return lines
