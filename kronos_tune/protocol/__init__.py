"""The incremental optimization protocol behind `kronos-tune benchmark`.

    from kronos_tune.protocol import plan_trials, run_protocol, ProtocolOptions
    specs = plan_trials("cpu")                      # baseline, noise probe, single changes, combined
    report = run_protocol("cpu", out_dir="bench")   # runs them; results.jsonl, report.*, recommended.toml

Train: the preset's workload as the reference trains it, then one change at a
time against it (bf16, fp16, activation checkpointing, accumulation,
autobatch, torch.compile, loader workers, fused AdamW, DDP), then the changes
that were faster or smaller and passed the quality guard, together.
Predict: full recompute vs KV cache vs bf16 vs the autobatch chunk vs sharding.
"""

from kronos_tune.protocol.plan import plan_trials
from kronos_tune.protocol.records import (
    Delta,
    PredictSettings,
    PredictStep,
    ProtocolFinished,
    ProtocolOptions,
    ProtocolReport,
    Spread,
    TrialFinished,
    TrialResult,
    TrialSpec,
    TrialStarted,
    TrialStep,
)
from kronos_tune.protocol.report import load_results, write_reports
from kronos_tune.protocol.runner import run_protocol

__all__ = [
    "Delta",
    "PredictSettings",
    "PredictStep",
    "ProtocolFinished",
    "ProtocolOptions",
    "ProtocolReport",
    "Spread",
    "TrialFinished",
    "TrialResult",
    "TrialSpec",
    "TrialStarted",
    "TrialStep",
    "load_results",
    "plan_trials",
    "run_protocol",
    "write_reports",
]
