"""What the benchmark protocol plans, measures, reports and emits: plain dataclasses with to/from dict.

Every figure that was measured more than once is a ``Spread``: a float whose
value is the median, carrying ``min``, ``max`` and ``n`` (so code that wants a
number gets the median, and the spread is never lost on the way to a report).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any

STAGES = ("baseline", "single", "combined")
STATUSES = ("ok", "oom", "failed", "skipped", "cancelled")
TASKS = ("train", "predict")
SCHEMA_VERSION = 1


class Spread(float):
    """The median of ``n`` measurements (the float value) with their ``min`` and ``max``."""

    median: float
    min: float
    max: float
    n: int

    def __new__(cls, median: float, min: float, max: float, n: int) -> Spread:  # noqa: A002 (schema names)
        value = super().__new__(cls, median)
        value.median, value.min, value.max, value.n = float(median), float(min), float(max), int(n)
        return value

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        """Median, min, max and count of `values`; None for no values."""
        if not values:
            return None
        return cls(statistics.median(values), min(values), max(values), len(values))

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Spread | None:
        if data is None:
            return None
        return cls(data["median"], data["min"], data["max"], data["n"])

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}

    def overlaps(self, other: Spread) -> bool:
        """True when either median lies inside the other's [min, max]: the difference is within the noise."""
        return other.min <= self.median <= other.max or self.min <= other.median <= self.max

    def __repr__(self) -> str:
        return f"Spread(median={self.median!r}, min={self.min!r}, max={self.max!r}, n={self.n})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Spread, (self.median, self.min, self.max, self.n))


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
    max_batch_size: int | None = None  # sequences per chunk; None = KronosPredictor's default
    devices: int = 1
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProtocolOptions:
    """How to run the protocol. Defaults size the `cpu` preset's train protocol to a few minutes on 2 cores.

    steps / warmup: measured and excluded optimizer steps per trial (train runs at least 2 warm-up steps: the
    last one is metered, and AdamW's state only exists from the second step on); ``compile_warmup`` is the
    compile trial's own warm-up (its first steps compile and recompile), taken out of its measured steps.
    Every trial is evaluated after the same number of optimizer steps.
    skip / only: trial names. budget_bytes overrides the preset's per-device budget. eval_windows caps the
    validation windows of the quality check. noise_factor and quality_floor set the quality guard
    (worse than baseline by more than max(noise_factor x noise, quality_floor x baseline) is flagged).
    predict_series / predict_repeats: series per timed prediction run (None: up to 4) and timed runs.
    autobatch_estimate: search on fake tensors (None: on the CPU, where real probes are slow).
    """

    steps: int = 4
    warmup: int = 2
    compile_warmup: int = 2
    skip: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    cpu_ddp: bool = False
    budget_bytes: int | None = None
    seed: int = 100
    eval_windows: int = 16
    noise_factor: float = 2.0
    quality_floor: float = 0.005
    predict_series: int | None = None
    predict_repeats: int = 3
    autobatch_estimate: bool | None = None
    autobatch_margin: float | None = None  # None: autobatch's default for the device

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["skip"], out["only"] = list(self.skip), list(self.only)
        return out

    def measurement_key(self) -> dict[str, Any]:
        """The options that change what a trial measures: a resumed run must use the same."""
        keys = ("steps", "warmup", "compile_warmup", "budget_bytes", "seed", "eval_windows", "predict_series",
                "predict_repeats", "cpu_ddp")
        return {key: getattr(self, key) for key in keys}


@dataclass
class TrialSpec:
    """One planned trial. ``config``: a TrainConfig (train) or PredictSettings (predict); None when it is
    only decided while the protocol runs (combined, autobatch). ``skip_reason`` set = not run."""

    name: str
    stage: str
    changes: dict[str, Any]
    config: Any
    skip_reason: str | None = None
    description: str = ""
    warmup_steps: int = 0
    measured_steps: int = 0
    pad_steps: int = 0  # untimed steps after the measured ones, so every trial is evaluated at the same step
    nproc: int = 1  # processes (DDP)
    group: str | None = None  # trials of one group change the same thing; the combination takes one of them

    @property
    def total_steps(self) -> int:
        """Optimizer steps the trial runs (warm-up + measured + padding): for progress bars."""
        return self.warmup_steps + self.measured_steps + self.pad_steps

    def to_dict(self) -> dict[str, Any]:
        config = self.config.to_dict() if hasattr(self.config, "to_dict") else self.config
        return {"name": self.name, "stage": self.stage, "changes": dict(self.changes), "config": config,
                "skip_reason": self.skip_reason, "description": self.description,
                "warmup_steps": self.warmup_steps, "measured_steps": self.measured_steps,
                "pad_steps": self.pad_steps, "nproc": self.nproc, "group": self.group}


_SPREAD_FIELDS = ("step_time_s", "samples_per_s", "tokens_per_s", "series_per_s")


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
    projected_train_time_s: float | None = None
    mfu: float | None = None
    warmup_time_s: float | None = None
    train_losses: list[float] = field(default_factory=list)
    series_per_s: Spread | None = None
    projected_predict_time_s: float | None = None
    speedup: float | None = None  # predict: series/s over the reference method's
    output_max_abs_diff: float | None = None  # predict: largest difference from the reference's predictions, in
    #                                           history standard deviations (0 = identical)
    deltas: dict[str, Delta] = field(default_factory=dict)
    quality: dict[str, Any] | None = None  # the guard's verdict (train singles and combined)
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    nproc: int = 1
    wall_time_s: float = 0.0
    resumed: bool = False  # taken from an earlier run's results.jsonl

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name in _SPREAD_FIELDS:
                value = None if value is None else value.to_dict()
            elif spec.name == "deltas":
                value = {key: delta.to_dict() for key, delta in value.items()}
            out[spec.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        known = {spec.name for spec in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for key in _SPREAD_FIELDS:
            values[key] = Spread.from_dict(values.get(key))
        values["deltas"] = {key: Delta(**delta) for key, delta in (values.get("deltas") or {}).items()}
        return cls(**values)

    @property
    def finished(self) -> bool:
        """Done for good (a resumed run keeps it); a cancelled trial is run again."""
        return self.status != "cancelled"


@dataclass
class ProtocolReport:
    """The whole protocol: where it ran, every trial, the quality rule, the recommendation."""

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
    recommended: dict[str, Any] | None = None
    preset_source: str | None = None
    out_dir: str | None = None
    started_at: str = ""
    finished_at: str = ""
    wall_time_s: float = 0.0
    schema_version: int = SCHEMA_VERSION

    @property
    def results(self) -> list[TrialResult]:
        """The finished trials (same list as ``trials``)."""
        return self.trials

    def trial(self, name: str) -> TrialResult | None:
        return next((t for t in self.trials if t.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        out = {spec.name: getattr(self, spec.name) for spec in fields(self)}
        out["trials"] = [trial.to_dict() for trial in self.trials]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProtocolReport:
        known = {spec.name for spec in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["trials"] = [TrialResult.from_dict(t) for t in values.get("trials", [])]
        return cls(**values)


@dataclass(frozen=True)
class TrialStarted:
    spec: TrialSpec
    index: int
    total: int


@dataclass(frozen=True)
class TrialStep:
    trial_name: str
    record: Any  # kronos_core.train.StepRecord (train) or PredictStep (predict)


@dataclass(frozen=True)
class TrialFinished:
    result: TrialResult


@dataclass(frozen=True)
class ProtocolFinished:
    report: ProtocolReport


@dataclass(frozen=True)
class PredictStep:
    """Progress of a predict trial: one prediction run (``step`` of ``total``, counting the metered
    warm-up run first, as the trial's warmup_steps + measured_steps do), shaped like a StepRecord.

    ``tokens`` are generated tokens (series x sample paths x pred_len); ``loss`` is NaN (no loss here).
    """

    step: int
    total: int
    series: int
    tokens: int
    step_time_s: float
    timed: bool = True  # False for the metered warm-up run
    loss: float = float("nan")

    @property
    def series_per_s(self) -> float:
        return self.series / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0
