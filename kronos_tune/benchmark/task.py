"""What a benchmark task is: the trials it plans and runs, how it decides and reports. `tasks.py` holds them by
name ("train", "predict"); the runner, the reports and the commands ask the task instead of testing its name.

A task's trials see the run they belong to through `RunContext`: `runner.BenchmarkRun` owns the run (folder,
events, the order of trials) and hands itself to them, so the trial modules depend on this interface and not on
the runner that calls them."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.report.cells import Cell
from kronos_tune.benchmark.results import BenchmarkReport, TaskDecision, TrialResult, TrialSpec
from kronos_tune.presets import Preset

if TYPE_CHECKING:
    from kronos_tune.benchmark.run.isolation import Outcome


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


class BenchmarkTask(ABC):
    name: str
    trial_names: tuple[str, ...]  # every trial the task knows, for --skip/--only
    columns: tuple[str, ...]  # the report table's header
    config_command: str  # the command its recommended.toml is for: kronos-tune <config_command> --config FILE
    probes_in_process: bool = False  # it probes the device in the runner's process: a CUDA budget is capped there
    # Its timing: the TrialResult field every view shows as one estimate (report/shown.py), in this table column
    time_key: str  # seconds per step, lower is faster; or, with time_is_rate, per second, higher is faster
    time_is_rate: bool = False
    time_column: str
    time_text: str  # what the figure is, after the number ("per step", "series/s")
    throughput_key: str  # its throughput field and unit, as a finished trial's log line says it
    throughput_unit: str
    dashboard_trains: bool = False  # the dashboard's `t` can train with its recommended.toml
    no_recommendation: str  # the answer's line when the run recommends nothing

    def check(self, options: BenchmarkOptions) -> None:
        """Refuse options the task cannot use (KronosTuneError, one line)."""

    @abstractmethod
    def plan(self, preset: Preset, options: BenchmarkOptions, device: str) -> list[TrialSpec]:
        """Every trial in run order, skipped ones with their reason."""

    @abstractmethod
    def resolve(self, run: RunContext, spec: TrialSpec, work: Path) -> tuple[TrialSpec, list[str]]:
        """Decide what is only known while running (autobatch's pick, the combination); notes for the row."""

    @abstractmethod
    def run_trial(self, run: RunContext, spec: TrialSpec, work: Path) -> TrialResult:
        """Measure one trial (in its own worker processes)."""

    def will_run(self, run: RunContext, spec: TrialSpec) -> bool:
        """Whether the trial is likely to run, from what is known before resolving it (for the time estimate)."""
        return spec.skip_reason is None

    def measuring_budget_s(self, run: RunContext, spec: TrialSpec) -> float | None:
        """The seconds of measuring the trial is given (None: it measures a count of runs, not a time)."""
        return None

    def after_trials(self, run: RunContext) -> list[TrialResult]:
        """Work after the last trial (train: the time-to-target comparison); the results it added to."""
        return []

    def report_options(self, specs: Sequence[TrialSpec]) -> dict[str, Any]:
        """What the report's options add from the planned trials."""
        return {}

    @abstractmethod
    def decide(self, report: BenchmarkReport, preset: Preset | None) -> None:
        """Fill the derived sections of `report` (a copy `summarize` owns) from its trials: comparisons,
        deltas, quality, timing, the decision and the recommendation."""

    @abstractmethod
    def read_decision(self, data: dict[str, Any]) -> TaskDecision:
        """The task's decision as report.json keeps it, read back."""

    @abstractmethod
    def cells(self, trial: TrialResult, compact: bool) -> dict[str, Cell]:
        """The task's own cells of a trial's table row, by column name (the shared ones come from the table)."""

    @abstractmethod
    def recommended_toml(self, report: BenchmarkReport) -> str | None:
        """RUN/recommended.toml, for `kronos-tune <config_command> --config`; None without a recommendation."""

    @abstractmethod
    def markdown_lines(self, report: BenchmarkReport) -> list[str]:
        """report.md's section between the notes and the table."""

    @abstractmethod
    def notes(self, report: BenchmarkReport) -> list[str]:
        """The plain lines a terminal prints under the table."""

    def resolution_line(self, report: BenchmarkReport) -> str | None:
        """The run's own resolution in one sentence, where the task measures one."""
        return None

    def evidence_line(self, report: BenchmarkReport, own_only: bool = False) -> str | None:
        """Each verdict with the evidence that decided it, where the rule has more than one kind; `own_only`: only
        those called on their own interval rather than on the run's resolution."""
        return None

    @abstractmethod
    def scatter_unit(self, trials: Sequence[TrialResult]) -> str:
        """What the picture's time axis is per: step | sample | series."""
