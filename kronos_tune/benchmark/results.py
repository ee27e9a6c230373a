"""What the benchmark plans, measures, reports and emits: plain dataclasses with to/from dict.

Every figure that was measured more than once is a ``Spread``: a float whose
value is the median, carrying ``min``, ``max`` and ``n`` (so code that wants a
number gets the median, and the spread is never lost on the way to a report).

What a trial is, for the decision rule (``TrialKind``), is data the plan sets on every trial and each result
carries: the rule reads a trial's kind, group and promises from its result, never from its name. The predict
task's trial list sets none: its trials are the reference (stage baseline) or a speed change (``untyped_kind``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Protocol

from kronos_tune.benchmark.recommendation import Recommendation
from kronos_tune.benchmark.stats import Comparison, quantiles
from kronos_tune.benchmark.train.verdicts import Trajectory
from kronos_tune.errors import KronosTuneError

STAGES = ("baseline", "single", "combined", "drift")
STATUSES = ("ok", "oom", "failed", "skipped", "cancelled", "timeout")
TASKS = ("train", "predict")
SCHEMA_VERSION = 3  # 3: kinds, designs and raw block times per trial; 2: raw step times; 1: medians only
DESIGNS = ("paired", "sequential")
NOISE_PROBE = "noise-probe"  # the A/A trial: the baseline again (another sampler seed) against the baseline


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


class Spread(float):
    """The median of ``n`` measurements (the float value) with their ``min``, ``max`` and quartiles
    (``q1``, ``q3``; None for a Spread built from its median and range alone)."""

    median: float
    min: float
    max: float
    n: int
    q1: float | None
    q3: float | None

    def __new__(cls, median: float, min: float, max: float, n: int,  # noqa: A002 (schema names)
                q1: float | None = None, q3: float | None = None) -> Spread:
        value = super().__new__(cls, median)
        value.median, value.min, value.max, value.n = float(median), float(min), float(max), int(n)
        value.q1 = None if q1 is None else float(q1)
        value.q3 = None if q3 is None else float(q3)
        return value

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        """Median, min, max, count and quartiles of `values`; None for no values."""
        if not values:
            return None
        q1, median, q3 = quantiles(values)
        return cls(median, min(values), max(values), len(values), q1, q3)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Spread | None:
        if data is None:
            return None
        return cls(data["median"], data["min"], data["max"], data["n"], data["q1"], data["q3"])

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n, "q1": self.q1, "q3": self.q3}

    @property
    def iqr(self) -> float | None:
        return None if self.q1 is None or self.q3 is None else self.q3 - self.q1

    def __repr__(self) -> str:
        return (f"Spread(median={self.median!r}, min={self.min!r}, max={self.max!r}, n={self.n}, q1={self.q1!r}, "
                f"q3={self.q3!r})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Spread, (self.median, self.min, self.max, self.n, self.q1, self.q3))


@dataclass(frozen=True)
class Delta:
    """Change vs the baseline in percent (positive = larger number); ``noise`` when inside the spread."""

    pct: float
    noise: bool

    def to_dict(self) -> dict[str, Any]:
        return {"pct": self.pct, "noise": self.noise}


@dataclass(frozen=True)
class PredictSettings:
    """One prediction configuration: the preset's predict workload plus how KronosPredictor runs it."""

    model_size: str
    lookback: int
    pred_len: int
    sample_count: int
    series_count: int  # the workload: what the projection is for
    measured_series: int  # series predicted per timed repeat
    use_cache: bool = True
    amp: str = "none"
    weight_dtype: str = "fp32"  # bf16: the weights held in bf16
    max_batch_size: int | None = None  # sequences per predict call; None = KronosPredictor's default
    devices: int = 1
    seed: int = 0
    agreement_series: int | None = None  # series the quality check compares (None: measured_series); the
    #                                      timed series are the first measured_series of them
    chunk_series: int | None = None  # series per chunk of predict's pipeline (None: as predict chooses)
    inputs: dict[str, Any] | None = None  # `benchmark --config`: the user's data and model keys (None: synthetic)

    @property
    def quality_series(self) -> int:
        return max(self.measured_series, self.agreement_series or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrialSpec:
    """One planned trial. ``config``: a TrainConfig (train) or PredictSettings (predict); None when it is
    only decided while the benchmark runs (combined, autobatch). ``skip_reason`` set = not run."""

    name: str
    stage: str
    changes: dict[str, Any]
    config: Any
    skip_reason: str | None = None
    description: str = ""
    warmup_steps: int = 0  # at least (train: then until the step time settles, up to max_warmup_steps)
    measured_steps: int = 0  # at least (train: then until the interval is tight, up to max_measured_steps)
    max_warmup_steps: int = 0
    max_measured_steps: int = 0
    eval_step: int | None = None  # train: the optimizer step the validation loss is taken at (same for all)
    nproc: int = 1  # processes (DDP)
    group: str | None = None  # trials of one group change the same thing; the combination takes one of them
    kind: TrialKind | None = None  # what the trial is, for the decision rule (every train trial's is set by the plan)

    def __post_init__(self) -> None:
        if self.kind is not None and self.group is None:
            self.group = self.kind.group

    @property
    def total_steps(self) -> int:
        """Optimizer steps the trial runs at least (train: up to the evaluation step): for progress bars."""
        if self.eval_step is not None:
            return self.eval_step
        return self.warmup_steps + self.measured_steps

    def to_dict(self) -> dict[str, Any]:
        config = self.config.to_dict() if hasattr(self.config, "to_dict") else self.config
        return {"name": self.name, "stage": self.stage, "changes": dict(self.changes), "config": config,
                "skip_reason": self.skip_reason, "description": self.description,
                "warmup_steps": self.warmup_steps, "measured_steps": self.measured_steps,
                "max_warmup_steps": self.max_warmup_steps, "max_measured_steps": self.max_measured_steps,
                "eval_step": self.eval_step, "nproc": self.nproc, "group": self.group,
                "kind": None if self.kind is None else asdict(self.kind)}


_SPREAD_FIELDS = ("step_time_s", "samples_per_s", "tokens_per_s", "series_per_s")


class OtherSchema(ValueError):
    """A result line written by another build of kronos-tune than this one (an earlier or a newer schema)."""

    def __init__(self, version: int | None) -> None:
        newer = version is not None and version > SCHEMA_VERSION
        super().__init__(f"schema version {version if version is not None else 'none (before 3)'}, "
                         f"{'newer' if newer else 'older'} than the {SCHEMA_VERSION} this kronos-tune reads")
        self.version = version
        self.newer = newer


@dataclass
class TrialResult:
    """What one trial measured (train fields or predict fields; the others stay None)."""

    name: str
    stage: str
    status: str
    changes: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    description: str = ""
    task: str = "train"
    hardware: str = ""
    step_time_s: Spread | None = None
    samples_per_s: Spread | None = None
    tokens_per_s: Spread | None = None
    tokens_per_step: int | None = None
    peak_memory_bytes: int | None = None
    peak_bytes_by_phase: dict[str, int] = field(default_factory=dict)
    val_loss: float | None = None
    val_loss_step: int | None = None
    val_windows: list[list[float]] = field(default_factory=list)  # train: [loss, tokens] per validation window
    projected_train_time_s: float | None = None
    mfu: float | None = None
    warmup_time_s: float | None = None
    train_losses: list[float] = field(default_factory=list)
    series_per_s: Spread | None = None
    projected_predict_time_s: float | None = None
    speedup: float | None = None  # predict: series/s over the reference method's
    output_max_abs_diff: float | None = None  # predict: largest difference from the reference's predictions, in
    #                                           history standard deviations (0 = identical)
    step_times_s: list[float] = field(default_factory=list)  # every timed step (train) or run (predict), raw
    warmup_times_s: list[float] = field(default_factory=list)  # the warm-up steps' times, in order
    timing: dict[str, Any] = field(default_factory=dict)  # how measuring stopped: steps, interval, budget
    comparison: Comparison | None = None  # vs the baseline, as the decision rule compared it (summarize sets it)
    trajectory: Trajectory | None = None  # train/decide.trajectory_check: losses vs the baseline's
    deltas: dict[str, Delta] = field(default_factory=dict)
    quality: dict[str, Any] | None = None  # the guard's verdict (train singles and combined)
    time_to_target: dict[str, Any] | None = None  # train --time-to-target: target.TimeToTarget.to_dict()
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    nproc: int = 1
    wall_time_s: float = 0.0
    resumed: bool = False  # taken from an earlier run's results.jsonl
    kind: str | None = None  # KINDS; with group, losses, redraws_dropout: the plan's TrialKind
    group: str | None = None
    losses: str | None = None
    redraws_dropout: bool = False
    design: str | None = None  # how it was timed against the baseline: paired | sequential (None: not compared)
    design_reason: str | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)  # paired: per round {round, first, trial_s, baseline_s}
    setup_costs_s: dict[str, float] = field(default_factory=dict)  # one-time costs besides warm-up (autobatch search)
    schema_version: int = SCHEMA_VERSION

    @property
    def trial_kind(self) -> TrialKind:
        """The plan's kind; for a result that carries none (a predict trial), the one its stage implies."""
        if self.kind is None:
            return untyped_kind(self.name, self.stage)
        return TrialKind(self.kind, self.group, self.losses, self.redraws_dropout)

    def set_kind(self, kind: TrialKind | None) -> None:
        if kind is not None:
            self.kind, self.group, self.losses, self.redraws_dropout = (kind.kind, kind.group, kind.losses,
                                                                        kind.redraws_dropout)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name in _SPREAD_FIELDS:
                value = None if value is None else value.to_dict()
            elif spec.name == "deltas":
                value = {key: delta.to_dict() for key, delta in value.items()}
            elif spec.name in ("comparison", "trajectory"):
                value = None if value is None else value.to_dict()
            out[spec.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        """A result as results.jsonl keeps it; one of another schema raises OtherSchema."""
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise OtherSchema(version if isinstance(version, int) else None)
        known = {spec.name for spec in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for key in _SPREAD_FIELDS:
            values[key] = Spread.from_dict(values.get(key))
        values["deltas"] = {key: Delta(**delta) for key, delta in (values.get("deltas") or {}).items()}
        values["comparison"] = _derived(Comparison.from_dict, values.get("comparison"))
        values["trajectory"] = _derived(Trajectory.from_dict, values.get("trajectory"))
        return cls(**values)

    @property
    def quality_passed(self) -> bool:
        """Kept its quality: the train guard's verdict or the predict class's (True when none was checked)."""
        return self.quality is None or bool(self.quality.get("passed", True))

    @property
    def finished(self) -> bool:
        """Done for good (a resumed run keeps it); a cancelled trial is run again."""
        return self.status != "cancelled"


def _derived(read: Callable[[dict[str, Any]], Any], data: dict[str, Any] | None) -> Any:
    """A section summarize derives from the results (None until it has)."""
    return read(data) if isinstance(data, dict) else None


class TaskDecision(Protocol):
    """A task's decision (train/verdicts.Decision, predict/verdicts.PredictDecision)."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass
class BenchmarkReport:
    """The whole benchmark: where it ran, every trial, the quality rule, the recommendation."""

    preset: str
    task: str
    device: str
    device_line: str
    budget_bytes: int
    budget_mode: str  # simulated | memory-fraction | whole-card
    trials: list[TrialResult] = field(default_factory=list)
    planned: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    cancelled: bool = False
    environment: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    flops: dict[str, Any] | None = None
    recommended: Recommendation | None = None
    decision: TaskDecision | None = None  # the task's decision: verdicts, drift, combination, why
    headroom: dict[str, Any] | None = None  # the baseline's peak against the budget, and the batch that would fit
    partial: bool = False  # cancelled, or some planned trial has no result
    missing: list[str] = field(default_factory=list)  # planned trials without a result
    preset_source: str | None = None
    out_dir: str | None = None
    started_at: str = ""
    finished_at: str = ""
    wall_time_s: float = 0.0
    job: dict[str, Any] | None = None  # `benchmark --config`: the user's file, data, windows and keys
    schema_version: int = SCHEMA_VERSION

    @property
    def results(self) -> list[TrialResult]:
        """The finished trials (same list as ``trials``)."""
        return self.trials

    def trial(self, name: str) -> TrialResult | None:
        return next((t for t in self.trials if t.name == name), None)

    @property
    def subject(self) -> str:
        """What was benchmarked, for titles: the user's file (`--config`) or the preset."""
        return f"config {self.job['source']}" if self.job else f"preset {self.preset}"

    def to_dict(self) -> dict[str, Any]:
        out = {spec.name: getattr(self, spec.name) for spec in fields(self)}
        out["trials"] = [trial.to_dict() for trial in self.trials]
        for key in ("recommended", "decision"):
            out[key] = None if out[key] is None else out[key].to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any],
                  read_decision: Callable[[dict[str, Any]], TaskDecision] | None = None) -> BenchmarkReport:
        """The report of a report.json; `read_decision` reads its task's decision (tasks.report_from_dict
        passes it), without it the decision is left out (summarize derives it again from the trials)."""
        known = {spec.name for spec in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["trials"] = [TrialResult.from_dict(t) for t in values.get("trials", [])]
        values["recommended"] = Recommendation.from_dict(values.get("recommended"))
        decision = values.get("decision")
        values["decision"] = None if decision is None or read_decision is None else read_decision(decision)
        return cls(**values)


# results.jsonl: the one reader and writer ------------------------------------------------------

RESULTS_FILE = "results.jsonl"


def append_result(path: Path, result: TrialResult) -> None:
    """One JSON line, flushed and fsynced before returning (a crash right after keeps it)."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(result.to_dict()) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@dataclass
class ResultsFile:
    """The trials of one results.jsonl, and the lines that were not valid trial results."""

    trials: list[TrialResult]
    dropped: list[str] = field(default_factory=list)  # e.g. "results.jsonl the last line, cut short: JSONDecodeError"


def read_results(path: str | os.PathLike) -> ResultsFile:
    """The trials of a results.jsonl (or of the folder holding one; none when there is no such file). The last
    line of a name wins (a resumed run re-ran it); a line that is not a valid trial result (a torn last line from a
    crash while writing) is dropped and named; results of another schema are refused in one line."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        return ResultsFile([])
    by_name: dict[str, TrialResult] = {}
    dropped = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            result = TrialResult.from_dict(json.loads(line))
        except OtherSchema as error:
            fix = ("upgrade kronos-tune (pip install -U kronos-tune) to read it" if error.newer else
                   "an earlier build of kronos-tune wrote it; run the benchmark again to measure with this one")
            raise KronosTuneError(f"{path}: line {number} has results of {error}; {fix}") from None
        except (json.JSONDecodeError, TypeError, KeyError, ValueError) as error:
            where = "the last line, cut short" if number == len(lines) else f"line {number}"
            dropped.append(f"{path.name} {where}: {type(error).__name__}")
            continue
        by_name.pop(result.name, None)
        by_name[result.name] = result
    return ResultsFile(list(by_name.values()), dropped)


def load_results(path: str | os.PathLike) -> list[TrialResult]:
    """The valid trials of a results.jsonl (read_results without the dropped lines)."""
    return read_results(path).trials
