"""What a trial is, for the decision rule: data the plan sets on every trial and each result carries.

The decision rule reads a trial's kind, group and promises from its result, never from its name; results
written before kinds were kept (schema 1-2) get theirs from ``legacy_kind``, the one place a name implies one.
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


# Results written before kinds were kept (schema 1-2): their kind by name, in this one place.
_LEGACY_KINDS = {
    "baseline": TrialKind("reference"), "recompute": TrialKind("reference"),
    "noise-probe": TrialKind("baseline-repeat"), "baseline-repeat": TrialKind("baseline-repeat"),
    "bf16": TrialKind("speed", "precision", "approximate"), "fp16": TrialKind("speed", "precision", "approximate"),
    "tf32": TrialKind("speed", "matmul", "close"),
    "compile": TrialKind("speed", "compile", "close", True),
    "compile-cudagraphs": TrialKind("speed", "compile", "close", True),
    "dataloader": TrialKind("speed", "dataloader", "equivalent"),
    "fused-adamw": TrialKind("speed", "optimizer", "close"),
    "ddp": TrialKind("speed", "parallel", "equivalent", True),
    "checkpointing": TrialKind("memory", "checkpointing", "equivalent"),
    "accumulation": TrialKind("memory", "batch", "equivalent", True),
    "autobatch": TrialKind("memory", "batch", "equivalent", True),
    "fsdp": TrialKind("memory", "parallel", "equivalent", True),
    "bigger-batch": TrialKind("optimization", "batch"),
    "combined": TrialKind("combination"),
}


def _legacy_train_kind(name: str, stage: str) -> TrialKind:
    if stage == "drift":
        return TrialKind("baseline-repeat")
    if name in _LEGACY_KINDS:
        return _LEGACY_KINDS[name]
    return TrialKind({"baseline": "reference", "combined": "combination"}.get(stage, "speed"), name)


def _legacy_predict_kind(name: str, stage: str) -> TrialKind:
    return TrialKind("reference" if stage == "baseline" else "speed", name)


_LEGACY_RULES = {"train": _legacy_train_kind, "predict": _legacy_predict_kind}  # by the task the results name


def legacy_kind(name: str, stage: str, task: str = "train") -> TrialKind:
    """The kind of a trial from a results file that did not record it (inferred from its name and stage)."""
    return _LEGACY_RULES.get(task, _legacy_train_kind)(name, stage)
