"""`kronos-tune benchmark`: the baseline, one change at a time against it, then the helpful changes together.

    from kronos_tune.benchmark import plan_trials, run_benchmark, BenchmarkOptions
    specs = plan_trials("cpu")                      # baseline, noise probe, single changes, combined
    report = run_benchmark("cpu", out_dir="bench")   # runs them; results.jsonl, report.*, recommended.toml

Train: the preset's workload as the reference trains it, then one change at a
time against it (bf16, fp16, activation checkpointing, accumulation,
autobatch, torch.compile, loader workers, fused AdamW, DDP), then the changes
that were faster or smaller and passed the quality guard, together.
Predict: full recompute vs KV cache vs bf16 vs the autobatch chunk vs sharding.

One folder or module per stage: options, tasks (by name), selection (--skip/--only/--full), run/
(processes and workers), train/ and predict/ (trial list, measure, trials, decide), results (the
dataclasses and results.jsonl), events (what a run tells its views), report/ (shown: the figures, the table
and summarize; cells, files, pareto, picture, rebuild).
The names below load their module on first use, so reading a report never imports the runner (or torch).
"""

from __future__ import annotations

from kronos_core.deferred import lazy_exports

_HOMES = {
    "BenchmarkOptions": "kronos_tune.benchmark.options",
    "plan_trials": "kronos_tune.benchmark.tasks",
    "run_benchmark": "kronos_tune.benchmark.run.runner",
    "load_results": "kronos_tune.benchmark.results",
    "write_reports": "kronos_tune.benchmark.report.files",
    **{name: "kronos_tune.benchmark.results" for name in (
        "Delta", "PredictSettings", "BenchmarkReport", "Spread", "TrialResult", "TrialSpec")},
    **{name: "kronos_tune.benchmark.events" for name in (
        "PredictStep", "BenchmarkFinished", "TrialFinished", "TrialStarted", "TrialStep")},
}

__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
