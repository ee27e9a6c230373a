"""What the train task's decision rule answers, as typed values (train/decide.py builds them).

Each type reads and writes the JSON report.json and results.jsonl have always
held (``to_dict`` / ``from_dict``), key for key, so a run rebuilt by this
version writes the same bytes as before and old files still load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kronos_tune.benchmark.stats import Comparison

PAIRED_FLOOR = 0.02  # paired design: relative change below which nothing is called faster or slower


@dataclass(frozen=True)
class Trajectory:
    """A change's training losses against the baseline's over their common steps: the class its kind
    promises (``expected``) against the one measured; a broken promise is a ``defect``."""

    expected: str
    measured: str
    max_rel_deviation: float
    steps: int
    tolerance: float | None
    defect: bool
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"expected": self.expected, "measured": self.measured, "max_rel_deviation": self.max_rel_deviation,
                "steps": self.steps, "tolerance": self.tolerance, "defect": self.defect, "note": self.note}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Trajectory | None:
        if data is None:
            return None
        return cls(data["expected"], data["measured"], data["max_rel_deviation"], data["steps"],
                   data.get("tolerance"), bool(data["defect"]), data.get("note") or "")


@dataclass(frozen=True)
class OneTimeCost:
    """A faster change's one-time cost beyond the baseline's against what it saves over the workload."""

    one_time_s: float
    saving_s: float
    workload_s: float
    worth: bool  # the saving is larger than the cost
    ratio: float  # the compared ratio the saving is from
    projected_s: float  # the workload at the compared speed plus the trial's own one-time costs

    def to_dict(self) -> dict[str, Any]:
        return {"one_time_s": self.one_time_s, "saving_s": self.saving_s, "workload_s": self.workload_s,
                "worth": self.worth, "ratio": self.ratio, "projected_s": self.projected_s}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OneTimeCost:
        return cls(data["one_time_s"], data["saving_s"], data["workload_s"], bool(data["worth"]), data["ratio"],
                   data["projected_s"])


@dataclass(frozen=True)
class Decision:
    """The rule's answer. ``comparisons``: every timed trial against the baseline; ``threshold`` the sequential
    design's (max(floor, drift)), ``paired_threshold`` the paired design's (max(paired floor, resolution));
    ``resolution``: how far the A/A comparison's interval reaches from 1 (None without a paired A/A);
    ``pooled_resolution``: that interval's reach at the run's pooled noise, and ``own_threshold``
    max(paired floor, pooled resolution), what a change's whole interval must lie beyond to be called on its
    own evidence (None without an A/A interval, or when the A/A itself came out different);
    ``costs``: per faster trial, its one-time cost against what it saves over the workload; ``source`` the
    recommended trial and ``reason`` why, in one sentence."""

    threshold: float
    drift: float | None
    drift_sources: list[str]
    noisy: bool
    memory_binds: bool
    memory_reason: str
    resolution: float | None = None
    paired_threshold: float = PAIRED_FLOOR
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    costs: dict[str, OneTimeCost] = field(default_factory=dict)
    eligible: list[str] = field(default_factory=list)
    combination: list[str] = field(default_factory=list)
    source: str = "baseline"
    reason: str = ""
    smallest_change: float | None = None  # the resolution, or in a run that paired nothing the sequential threshold
    pooled_resolution: float | None = None
    own_threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "drift": self.drift, "drift_sources": list(self.drift_sources),
                "noisy": self.noisy, "memory_binds": self.memory_binds, "memory_reason": self.memory_reason,
                "resolution": self.resolution, "paired_threshold": self.paired_threshold,
                "comparisons": {name: c.to_dict() for name, c in self.comparisons.items()},
                "trajectories": {name: t.to_dict() for name, t in self.trajectories.items()},
                "costs": {name: c.to_dict() for name, c in self.costs.items()},
                "eligible": list(self.eligible), "combination": list(self.combination), "source": self.source,
                "reason": self.reason, "smallest_change": self.smallest_change,
                "pooled_resolution": self.pooled_resolution, "own_threshold": self.own_threshold}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        comparisons = {name: Comparison.from_dict(c) for name, c in (data.get("comparisons") or {}).items()}
        trajectories = {name: Trajectory.from_dict(t) for name, t in (data.get("trajectories") or {}).items()}
        return cls(data["threshold"], data.get("drift"), list(data.get("drift_sources") or []),
                   bool(data.get("noisy")), bool(data.get("memory_binds")), data.get("memory_reason") or "",
                   data.get("resolution"), data.get("paired_threshold", PAIRED_FLOOR),
                   {name: c for name, c in comparisons.items() if c is not None},
                   {name: t for name, t in trajectories.items() if t is not None},
                   {name: OneTimeCost.from_dict(c) for name, c in (data.get("costs") or {}).items()},
                   list(data.get("eligible") or []), list(data.get("combination") or []),
                   data.get("source") or "baseline", data.get("reason") or "", data.get("smallest_change"),
                   data.get("pooled_resolution"), data.get("own_threshold"))
