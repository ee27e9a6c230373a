"""A benchmark's recommendation: the trial whose settings to run, why, and the command that runs them.

Both tasks share it: the train task's carries the TrainConfig (``config``) and
its process count (``nproc``), the predict task's the ``[predict]`` settings
written to recommended.toml (``settings``). ``to_dict`` writes the keys
report.json has always held for each, in their order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Recommendation:
    source: str  # the recommended trial
    reason: str  # why, in one sentence with the numbers
    changes: dict[str, Any]
    command: str
    partial: bool = False  # from a run that did not finish
    missing: list[str] = field(default_factory=list)  # its planned trials without a result
    config: dict[str, Any] | None = None  # train: the TrainConfig's keys
    nproc: int | None = None  # train: processes (DDP)
    settings: dict[str, Any] | None = None  # predict: the [predict] keys written

    def with_command(self, command: str) -> Recommendation:
        return replace(self, command=command)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "reason": self.reason}
        if self.settings is not None:
            out["settings"] = self.settings
        out["changes"] = self.changes
        if self.config is not None:
            out["config"], out["nproc"] = self.config, self.nproc
        out.update(command=self.command, partial=self.partial, missing=list(self.missing))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Recommendation | None:
        if data is None:
            return None
        return cls(data["source"], data.get("reason") or "", dict(data.get("changes") or {}), data["command"],
                   bool(data.get("partial")), list(data.get("missing") or []), data.get("config"),
                   data.get("nproc"), data.get("settings"))
