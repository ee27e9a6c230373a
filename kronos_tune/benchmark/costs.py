"""Time to the answer: what a trial pays once, and whether a faster change earns it back over the workload.

A change that makes every step faster but costs minutes before its first
steady step (torch.compile's compilation, an autobatch search) only pays for a
workload long enough: ``one_time_costs`` sets the one-time cost beyond the
baseline's against the time the change saves on the preset's workload
(epochs x samples per epoch at the baseline's throughput, times one minus the
compared ratio). Pure functions of the results, like the decision rule.
"""

from __future__ import annotations

from kronos_tune.benchmark.results import TrialResult
from kronos_tune.benchmark.stats import Comparison
from kronos_tune.benchmark.train.verdicts import OneTimeCost


def one_time_s(result: TrialResult) -> float:
    """What a trial pays once, before its steps run at their steady speed: the warm-up beyond that many steady
    steps (compilation, autotuning, allocator growth) and the searches that chose its settings (autobatch)."""
    extra = sum(result.setup_costs_s.values())
    if result.warmup_times_s and result.step_time_s is not None:
        extra += max(0.0, sum(result.warmup_times_s) - len(result.warmup_times_s) * result.step_time_s.median)
    return extra


def workload_time_s(result: TrialResult) -> float | None:
    """The preset's workload (epochs x samples per epoch) at the trial's median throughput."""
    config = result.config or {}
    if not result.samples_per_s or not config.get("epochs") or not config.get("samples_per_epoch"):
        return None
    return config["epochs"] * config["samples_per_epoch"] / result.samples_per_s.median


def one_time_costs(result: TrialResult, base: TrialResult | None, comparison: Comparison | None
                   ) -> OneTimeCost | None:
    """A change's one-time cost beyond the baseline's against what it saves over the workload (the
    baseline's workload time x (1 - the compared ratio)); ``worth`` when the saving is larger."""
    workload = workload_time_s(base) if base is not None else None
    if comparison is None or workload is None:
        return None
    extra = max(0.0, one_time_s(result) - one_time_s(base))
    saving = workload * (1 - comparison.ratio)
    return OneTimeCost(extra, saving, workload, saving > extra, comparison.ratio,
                       workload * comparison.ratio + one_time_s(result))
