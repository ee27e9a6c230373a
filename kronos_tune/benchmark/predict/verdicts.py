"""What the predict task's decision rule answers, as typed values (predict/decide.py builds them).

``to_dict`` writes the JSON report.json has always held, key for key (the
quality check's keys depend on what was measured, in a fixed order), and
``from_dict`` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kronos_tune.benchmark.stats import Comparison

# The measured figures a quality check may carry, in the order report.json lists them (None: not measured).
_MEASURED = ("max_abs_diff", "sampled_max_abs_diff", "spearman", "series", "threshold")


@dataclass(frozen=True)
class QualityCheck:
    """A trial's outputs against the exact reference's, by the promise of its exactness class: ``exact``
    (identical greedy, and sampled, output) or ``approximate`` (ranking agreement of at least ``threshold``)."""

    exactness: str  # "class" in report.json
    passed: bool
    text: str
    max_abs_diff: float | None = None
    sampled_max_abs_diff: float | None = None
    spearman: float | None = None
    series: int | None = None
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        measured = {key: getattr(self, key) for key in _MEASURED if getattr(self, key) is not None}
        return {"class": self.exactness, "passed": self.passed, **measured, "text": self.text}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QualityCheck:
        return cls(data["class"], bool(data["passed"]), data.get("text", ""),
                   **{key: data.get(key) for key in _MEASURED})


@dataclass(frozen=True)
class PredictVerdict:
    """One trial against its reference: speed, quality, and whether it may be recommended (``why`` if not)."""

    name: str
    reference: str
    exactness: str
    vs_reference: Comparison | None
    vs_baseline: Comparison | None
    quality: QualityCheck
    eligible: bool
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reference": self.reference, "exactness": self.exactness,
                "vs_reference": None if self.vs_reference is None else self.vs_reference.to_dict(),
                "vs_baseline": None if self.vs_baseline is None else self.vs_baseline.to_dict(),
                "quality": self.quality.to_dict(), "eligible": self.eligible, "why": self.why}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PredictVerdict:
        return cls(data["name"], data["reference"], data["exactness"], Comparison.from_dict(data.get("vs_reference")),
                   Comparison.from_dict(data.get("vs_baseline")), QualityCheck.from_dict(data["quality"]),
                   bool(data["eligible"]), data.get("why") or "")


@dataclass(frozen=True)
class PredictDecision:
    """The recommended trial (``source``; None when the reference itself did not run) and why, with each
    trial's verdict against its reference."""

    source: str | None
    reason: str
    threshold: float
    min_spearman: float
    estimator: str
    verdicts: dict[str, PredictVerdict] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "reason": self.reason, "threshold": self.threshold,
                "min_spearman": self.min_spearman, "estimator": self.estimator,
                "verdicts": {name: v.to_dict() for name, v in self.verdicts.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PredictDecision:
        return cls(data.get("source"), data.get("reason") or "", data["threshold"], data["min_spearman"],
                   data["estimator"], {name: PredictVerdict.from_dict(v) for name, v in
                                       (data.get("verdicts") or {}).items()})
