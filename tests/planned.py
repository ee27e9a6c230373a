"""Kinds for trial results the tests build by hand, as the benchmark's plan sets them on a real run."""

from __future__ import annotations

import functools

from kronos_tune.benchmark.results import TrialKind, TrialResult


@functools.cache
def _planned() -> dict[str, TrialKind]:
    from kronos_tune.benchmark.tasks import plan_trials

    return {spec.name: spec.kind for spec in plan_trials("rtx3080") if spec.kind is not None}


def planned_kind(name: str, stage: str) -> TrialKind:
    """The kind the rtx3080 train plan gives a trial of this name (a drift check is a baseline-repeat)."""
    if stage == "drift":
        return TrialKind("baseline-repeat")
    return _planned().get(name, TrialKind("speed", name))


def with_planned_kind(result: TrialResult) -> TrialResult:
    if result.task == "train" and result.kind is None:
        result.set_kind(planned_kind(result.name, result.stage))
    return result
