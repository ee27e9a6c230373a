"""What a trial is, for the decision rule: data the plan sets on every trial and each result carries.

The decision rule reads a trial's kind, group and promises from its result, never from its name. The predict
task's trial list sets none: its trials are the reference (stage baseline) or a speed change (``untyped_kind``).
"""

from __future__ import annotations

from dataclasses import dataclass

# What a trial is, for the decision rule: the reference itself, the reference measured again, one change that
# should make steps faster, one that saves memory, one that changes what is trained, the helpful changes together.
KINDS = ("reference", "baseline-repeat", "speed", "memory", "optimization", "combination")
LOSS_PROMISES = ("equivalent", "close", "approximate")  # what a change promises about the training losses


@dataclass(frozen=True)
class TrialKind:
    """A trial's kind as the plan sets it: ``kind`` (KINDS), ``group`` (trials of one group change the same thing;
    the combination takes one of them), ``losses`` (the promised class of its training losses against the
    baseline's, None: no promise) and ``redraws_dropout`` (another batch split or kernel order draws other dropout
    masks: its losses are equal to the baseline's only in distribution when the model drops out)."""

    kind: str
    group: str | None = None
    losses: str | None = None
    redraws_dropout: bool = False


def untyped_kind(name: str, stage: str) -> TrialKind:
    """The kind of a trial whose plan set none (the predict task's): the reference, or one change for speed."""
    return TrialKind("reference" if stage == "baseline" else "speed", name)
