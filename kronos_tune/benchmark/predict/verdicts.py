"""What the predict task's decision rule answers, as typed values (predict/decide.py builds them).

``to_dict`` writes the JSON report.json has always held, key for key (the
quality check's keys depend on what was measured, in a fixed order), and
``from_dict`` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kronos_tune.benchmark.report.cells import fmt_rate
from kronos_tune.benchmark.stats import Comparison

# The measured figures a quality check may carry, in the order report.json lists them (None: not measured).
_MEASURED = ("max_abs_diff", "sampled_max_abs_diff", "spearman", "series", "threshold")


def speedup_text(comparison: Comparison | None) -> str:
    """'9.81x (95% interval 9.12x-10.40x)': series/s over the reference's (the inverse of the time ratio)."""
    if comparison is None:
        return "not compared"
    text = f"{1 / comparison.ratio:.2f}x"
    if comparison.low is not None and comparison.high is not None:
        text += f" (95% interval {1 / comparison.high:.2f}x-{1 / comparison.low:.2f}x)"
    return text


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
class SameWork:
    """Two trials of identical work whose shown series/s differ by more than the run's resolution."""

    first: str
    second: str
    first_rate: float  # series/s as every view shows it (report/shown.py)
    second_rate: float
    resolution: float  # the run's: the relative change its rule can tell from noise
    batch: str  # why the batches are the same work
    direct: Comparison | None = None  # `second` against `first`, where one was measured beside the other

    @property
    def gap(self) -> float:
        """How far apart the two figures are: the larger over the smaller, minus one."""
        return max(self.first_rate, self.second_rate) / min(self.first_rate, self.second_rate) - 1

    @property
    def explained(self) -> bool:
        """Measured side by side, the two are not told apart: the gap is drift between other measurements."""
        return self.direct is not None and self.direct.verdict in ("same", "unresolved")

    def text(self) -> str:
        said = (f"{self.second} and {self.first} did identical work ({self.batch}), yet their series/s differ "
                f"by {100 * self.gap:.1f}% ({fmt_rate(self.second_rate)} against {fmt_rate(self.first_rate)}), "
                f"more than the run's resolution of {100 * self.resolution:.1f}%")
        if self.direct is None:
            return (f"{said}; nothing but noise tells two runs of the same work apart, so in this run read "
                    f"differences under {100 * self.gap:.1f}% as noise")
        how = (f"side by side, paired over {self.direct.n} rounds" if self.direct.design == "paired" else
               f"one after the other, {self.direct.n} runs each")
        beside = (f"compared {how}, {self.second} runs at {speedup_text(self.direct)} the series/s of {self.first} "
                  f"({self.direct.verdict})")
        if self.explained:
            return f"{said}: {beside}, so the gap is drift between measurements taken at different times"
        return (f"{said}; {beside} although the work is the same: this run's noise exceeds its resolution, so read "
                f"differences under {100 * self.gap:.1f}% as noise")

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "second": self.second, "first_rate": self.first_rate,
                "second_rate": self.second_rate, "gap": self.gap, "resolution": self.resolution,
                "batch": self.batch, "direct": None if self.direct is None else self.direct.to_dict(),
                "explained": self.explained, "text": self.text()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SameWork:
        return cls(data["first"], data["second"], data["first_rate"], data["second_rate"], data["resolution"],
                   data["batch"], Comparison.from_dict(data.get("direct")))


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
    findings: list[SameWork] = field(default_factory=list)  # identical work, figures apart beyond the resolution

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "reason": self.reason, "threshold": self.threshold,
                "min_spearman": self.min_spearman, "estimator": self.estimator,
                "verdicts": {name: v.to_dict() for name, v in self.verdicts.items()},
                "findings": [pair.to_dict() for pair in self.findings]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PredictDecision:
        return cls(data.get("source"), data.get("reason") or "", data["threshold"], data["min_spearman"],
                   data["estimator"], {name: PredictVerdict.from_dict(v) for name, v in
                                       (data.get("verdicts") or {}).items()},
                   [SameWork.from_dict(pair) for pair in data.get("findings") or []])
