"""What a trial needs of the run it belongs to.

`train/trials.py` and `predict/trials.py` measure one trial each; `runner.BenchmarkRun` owns the run (folder,
events, the order of trials) and hands itself to them. They see it through `RunContext`, so the trial
modules depend on this interface and not on the runner that calls them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from kronos_tune.presets import Preset
from kronos_tune.benchmark.run.isolation import Outcome
from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.results import TrialResult, TrialSpec


class RunContext(Protocol):
    preset: Preset
    task: str
    options: BenchmarkOptions
    device: str
    budget_bytes: int
    cancel: threading.Event
    specs: list[TrialSpec]
    results: dict[str, TrialResult]
    references: dict[str, Any]  # predict: the reference method's outputs
    trial_timeout_s: float
    paired: Any  # paired.BaselineWorkers: the live baseline worker of the paired design
    setup_costs: dict[str, dict[str, float]]  # per trial: one-time costs measured while resolving it (autobatch)

    def emit(self, event: Any) -> None: ...

    def launch(self, spec: TrialSpec, work: Path, job: dict[str, Any],
               on_event: Callable[[dict[str, Any]], None],
               deadline: Callable[[], float | None] | None = None) -> tuple[Outcome, Path]: ...

    def noise(self) -> float | None: ...
