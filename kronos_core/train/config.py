"""TrainConfig: every knob of a Kronos fine-tuning run, as one flat dataclass.

The field names are the TOML keys: `TrainConfig(**tomllib.load(f))` and
`TrainConfig.from_toml(path)` build the same config, `to_toml()` writes it back.
Defaults follow the reference fine-tuning scripts (shiyu-coder/Kronos finetune/).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_core.data.day_month import check_date_format
from kronos_core.errors import KronosError
from kronos_core.sizes import SIZES
from kronos_core.train.data_span import parse_train_until
from kronos_core.validate import NO_EXAMPLE, check_known_keys, check_value, field_types
from kronos_core.files import dumps_toml, load_toml, write_text_atomic

WHAT = ("predictor", "tokenizer")
AMP = ("none", "bf16", "fp16")
CHECKPOINTING = ("none", "all", "every_n")
COMPILE = ("off", "default", "reduce-overhead", "max-autotune")
MATMUL_PRECISION = ("highest", "high", "medium")
OPTIMIZER_IMPL = ("auto", "fused", "foreach", "for-loop")
SCHEDULES = ("onecycle", "plateau")
PRELOAD = ("ram", "memmap")
DEVICES = ("auto", "cpu", "cuda")
PARALLELISM = ("ddp", "fsdp")
SYNTHETIC = "synthetic"

DEFAULT_LR = {"predictor": 4e-5, "tokenizer": 2e-4}
DEFAULT_GRAD_CLIP = {"predictor": 3.0, "tokenizer": 2.0}


@dataclass(init=False)
class TrainConfig:
    """A fine-tuning run. Build with keywords (the TOML keys); invalid values raise KronosError.

    Steps are optimizer steps. One optimizer step consumes `accumulation_steps`
    micro-batches of `batch_size` windows on every process, so its global batch
    is batch_size x accumulation_steps x processes. An epoch is
    `samples_per_epoch // global batch` optimizer steps. `eval_every` and
    `save_every` (training-state saves) are in optimizer steps; 0 means at the end of every epoch.
    The onecycle schedule also cycles Adam's beta1 between 0.85 and 0.95, as the
    reference's OneCycleLR does; plateau halves the lr (`plateau_factor`) after
    `plateau_patience` evaluations without a better validation loss.

    `parallelism` applies under torchrun: "ddp" replicates the model on every
    process, "fsdp" shards parameters, gradients and AdamW state over them
    (kronos_core.train.fsdp; needs 2+ processes). With fsdp and accumulation,
    non-final micro-batches keep unsharded gradients locally and skip the
    reduce-scatter unless `fsdp_sync_micro_batches` (less memory, more traffic).
    """

    what: str = "predictor"
    model_size: str = "small"
    tokenizer_dir: str | None = None
    predictor_dir: str | None = None
    data: list[str] = field(default_factory=lambda: [SYNTHETIC])
    symbol_column: str | None = None  # data files are panels (one long table); this column names each series
    date_format: str | None = None    # strptime directives of the files' text dates (None: read as they allow)
    synthetic_series: int = 8
    synthetic_rows: int = 2000
    train_until: str | None = None    # train on bars up to this date, or this fraction of the timeline
    val_fraction: float = 0.1
    lookback_window: int = 90
    predict_window: int = 10
    clip: float = 5.0
    batch_size: int = 50
    accumulation_steps: int = 1
    amp: str = "none"
    activation_checkpointing: str = "none"
    activation_checkpointing_every_n: int = 2
    compile: str = "off"
    matmul_precision: str = "highest"
    optimizer_impl: str = "auto"
    lr: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    schedule: str = "onecycle"
    pct_start: float = 0.03
    div_factor: float = 10.0
    plateau_factor: float = 0.5
    plateau_patience: int = 2
    grad_clip: float | None = None
    num_workers: int = 0
    pin_memory: bool = False
    preload: str = "ram"
    teacher_forcing: bool = True
    seed: int = 100
    samples_per_epoch: int = 100_000
    epochs: int = 30
    eval_samples: int = 20_000
    eval_every: int = 0
    save_every: int = 0
    output_dir: str = "runs/kronos"
    device: str = "auto"
    parallelism: str = "ddp"
    fsdp_reshard_after_forward: bool = True
    fsdp_cpu_offload: bool = False
    fsdp_sync_micro_batches: bool = False

    def __init__(self, **values: Any) -> None:
        self._assign(values, "TrainConfig")

    def _assign(self, values: dict[str, Any], source: str) -> None:
        check_keys(values, source)
        for spec in dataclasses.fields(self):
            if spec.name in values:
                value = values[spec.name]
            elif spec.default_factory is not dataclasses.MISSING:
                value = spec.default_factory()
            else:
                value = spec.default
            object.__setattr__(self, spec.name, value)
        self._source = source
        self.__post_init__()

    def __post_init__(self) -> None:
        self._normalize()
        self.validate()

    # Construction from / to files ----------------------------------------------------

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config", portable: bool = False) -> TrainConfig:
        """Build from a flat mapping; `source` (e.g. a file path) starts every error message.

        `portable`: a config for another machine (a GPU run's recommendation written on a laptop): the checks
        that ask this machine for its devices are skipped; everything else is validated."""
        config = cls.__new__(cls)
        object.__setattr__(config, "_portable", portable)
        config._assign(dict(values), source)
        return config

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> TrainConfig:
        data = load_toml(path, what="training config")
        if isinstance(data.get("predict"), dict):  # e.g. the predict benchmark's recommended.toml
            raise KronosError(f"{path}: a prediction config (a [predict] table), not a training config; predict "
                              f"with `kronos-tune predict --config {path}`, or give train a file of TrainConfig "
                              f"keys (`kronos-tune config keys`)")
        for key, value in data.items():
            if isinstance(value, dict):
                raise KronosError(f"{path}: [{key}] is a table; a training config is flat key = value lines, "
                                  f"move its keys to the top level")
        return cls.from_dict(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """Plain values, TOML-ready: lists instead of tuples, None kept."""
        out: dict[str, Any] = {}
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            out[spec.name] = list(value) if isinstance(value, (list, tuple)) else value
        return out

    def to_toml(self, path: str | os.PathLike | None = None) -> str:
        """The config as TOML (None fields left out: they take their defaults); written atomically to `path`."""
        text = dumps_toml(self.to_dict(), header="kronos-tune training config (kronos_core.train.TrainConfig)")
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, text)
        return text

    def replace(self, **changes: Any) -> TrainConfig:
        values = self.to_dict()
        values.update(changes)
        return TrainConfig.from_dict(values, source=self._source)

    # Derived values ------------------------------------------------------------------

    @property
    def window_length(self) -> int:
        """Rows per sample: lookback + predict + 1 (inputs plus the shifted targets)."""
        return self.lookback_window + self.predict_window + 1

    @property
    def effective_lr(self) -> float:
        return DEFAULT_LR[self.what] if self.lr is None else self.lr

    @property
    def effective_grad_clip(self) -> float:
        return DEFAULT_GRAD_CLIP[self.what] if self.grad_clip is None else self.grad_clip

    @property
    def activation_checkpointing_blocks(self) -> int:
        """Argument for `set_activation_checkpointing`: 0 off, 1 every block, n every n-th."""
        every_n = self.activation_checkpointing_every_n
        return {"none": 0, "all": 1, "every_n": every_n}[self.activation_checkpointing]

    @property
    def is_synthetic(self) -> bool:
        return self.data == [SYNTHETIC]

    def resolved_device(self) -> str:
        if getattr(self, "_portable", False) and self.device == "auto":
            return "auto"  # another machine's: unknown here
        if self.device == "auto":
            return "cuda" if _cuda_visible() else "cpu"
        return self.device

    # Validation ----------------------------------------------------------------------

    def _fail(self, key: str, problem: str, fix: str) -> KronosError:
        return KronosError(f"{self._source}: {key}={getattr(self, key, None)!r} {problem}; {fix}")

    def _normalize(self) -> None:
        for key in ("tokenizer_dir", "predictor_dir", "output_dir"):
            value = getattr(self, key)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, key, os.fspath(value))
        if isinstance(self.train_until, (int, float)) and not isinstance(self.train_until, bool):
            object.__setattr__(self, "train_until", str(self.train_until))  # TOML: train_until = 0.75
        data = self.data
        if isinstance(data, (str, os.PathLike)):
            data = [data]
        if isinstance(data, (list, tuple)) and all(isinstance(d, (str, os.PathLike)) for d in data):
            object.__setattr__(self, "data", [os.fspath(d) for d in data])

    def validate(self) -> None:
        """Raise KronosError (one line: what, where, what to do) for impossible values."""
        self._check_types()
        choices = {"what": WHAT, "amp": AMP, "activation_checkpointing": CHECKPOINTING, "compile": COMPILE,
                   "optimizer_impl": OPTIMIZER_IMPL, "schedule": SCHEDULES, "preload": PRELOAD, "device": DEVICES,
                   "model_size": tuple(SIZES), "parallelism": PARALLELISM,
                   "matmul_precision": MATMUL_PRECISION}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise self._fail(key, "is not a valid choice", f"use one of {', '.join(allowed)}")
        positive_ints = ("batch_size", "accumulation_steps", "samples_per_epoch", "epochs", "eval_samples",
                         "activation_checkpointing_every_n", "synthetic_series", "plateau_patience", "lookback_window")
        for key in positive_ints:
            if getattr(self, key) < 1:
                raise self._fail(key, "must be >= 1", f"set {key} to a positive integer")
        for key in ("predict_window", "num_workers", "eval_every", "save_every", "seed"):
            if getattr(self, key) < 0:
                raise self._fail(key, "must be >= 0", f"set {key} to 0 or more")
        for key in ("lr", "grad_clip", "clip", "div_factor"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise self._fail(key, "must be > 0", f"set a positive {key}" +
                                 (" or leave it out for the default" if key in ("lr", "grad_clip") else ""))
        if self.weight_decay < 0:
            raise self._fail("weight_decay", "must be >= 0", "use e.g. 0.1 (the reference) or 0")
        if not 0.0 < self.pct_start < 1.0:
            raise self._fail("pct_start", "must be between 0 and 1", "use e.g. 0.03 (the reference)")
        if not 0.0 < self.val_fraction < 1.0:
            raise self._fail("val_fraction", "must be between 0 and 1", "use e.g. 0.1")
        if not 0.0 < self.plateau_factor < 1.0:
            raise self._fail("plateau_factor", "must be between 0 and 1", "use e.g. 0.5")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise self._fail("betas", "must be two numbers in [0, 1)", "use e.g. [0.9, 0.95] (the reference)")
        if not self.data or any(not d for d in self.data):
            raise self._fail("data", "is empty", f"give CSV/Parquet files or folders, or \"{SYNTHETIC}\"")
        if SYNTHETIC in self.data and len(self.data) > 1:
            raise self._fail("data", f"mixes \"{SYNTHETIC}\" with files", f"use either \"{SYNTHETIC}\" or paths")
        if self.symbol_column is not None and (self.is_synthetic or not self.symbol_column.strip()):
            raise self._fail("symbol_column", "needs panel files in data" if self.is_synthetic else "is empty",
                             "give data = [\"panel.csv\"] or leave symbol_column out")
        if self.date_format is not None:
            if self.is_synthetic:
                raise self._fail("date_format", "needs data files", "give data = [\"prices.csv\"] or leave "
                                 "date_format out")
            try:
                check_date_format(self.date_format, "date_format")
            except KronosError as error:
                raise KronosError(f"{self._source}: {error}") from None
        if self.train_until is not None:
            try:
                parse_train_until(self.train_until)
            except KronosError as error:
                raise KronosError(f"{self._source}: {error}") from None
        if self.is_synthetic and self.synthetic_rows < 2 * self.window_length:
            raise self._fail("synthetic_rows", f"is too short for a training and a validation window of "
                             f"{self.window_length} rows each", f"use at least {2 * self.window_length}")
        context = SIZES[self.model_size].context
        if self.window_length > context:
            raise self._fail("lookback_window", f"+ predict_window {self.predict_window} + 1 = {self.window_length} "
                             f"exceeds the {context}-token context of model_size '{self.model_size}'",
                             f"shorten the windows to at most {context} rows in total")
        per_step = self.batch_size * self.accumulation_steps
        if self.samples_per_epoch < per_step:
            raise self._fail("samples_per_epoch", f"is less than one optimizer step (batch_size {self.batch_size} "
                             f"x accumulation_steps {self.accumulation_steps} = {per_step})",
                             f"raise samples_per_epoch to at least {per_step} or lower accumulation_steps")
        device = self.device
        if device == "cuda" and not getattr(self, "_portable", False) and not _cuda_visible():
            raise self._fail("device", "but no CUDA device is visible", "use device = \"cpu\" or \"auto\"")
        if self.amp == "fp16" and self.resolved_device() == "cpu":
            raise self._fail("amp", "needs a CUDA device (this run is on CPU)", "use amp = \"bf16\" or \"none\" on CPU")
        self._check_parallelism()

    def _check_parallelism(self) -> None:
        """Combinations FSDP does not support here fail now, not at the first step."""
        if self.parallelism != "fsdp":
            if self.fsdp_sync_micro_batches:
                raise self._fail("fsdp_sync_micro_batches", "needs parallelism = \"fsdp\"",
                                 "set parallelism = \"fsdp\" or fsdp_sync_micro_batches = false")
            if self.fsdp_cpu_offload:
                raise self._fail("fsdp_cpu_offload", "needs parallelism = \"fsdp\"",
                                 "set parallelism = \"fsdp\" or fsdp_cpu_offload = false")
            return
        if self.amp == "fp16":
            raise self._fail("amp", "is not supported with parallelism = \"fsdp\" (fp16 needs a grad scaler "
                             "over sharded gradients)", "use amp = \"bf16\" or \"none\"")
        if self.fsdp_cpu_offload and self.resolved_device() not in ("cuda", "auto"):
            raise self._fail("fsdp_cpu_offload", "needs a CUDA device (on the CPU the parameters already live in "
                             "host memory)", "set fsdp_cpu_offload = false or train on a GPU")
        if self.compile != "off":
            raise self._fail("compile", "is not supported with parallelism = \"fsdp\" here (compiling the "
                             "sharded model is untested in this project)", "use compile = \"off\" with fsdp")

    def _check_types(self) -> None:
        examples = {spec.name: spec.default if spec.default_factory is dataclasses.MISSING else spec.default_factory()
                    for spec in dataclasses.fields(self)}
        for key, annotation in field_types(TrainConfig).items():
            value = check_value(key, getattr(self, key), annotation, where=self._source,
                                example=examples.get(key, NO_EXAMPLE))
            object.__setattr__(self, key, value)


def field_names() -> list[str]:
    return [spec.name for spec in dataclasses.fields(TrainConfig)]


def check_keys(values: dict[str, Any], source: str) -> None:
    """Unknown keys -> KronosError naming them and the closest valid key."""
    check_known_keys(values, field_names(), where=source, noun="config key",
                     fix="valid keys are the TrainConfig fields (list them: `kronos-tune config keys`)")


def _cuda_visible() -> bool:
    import torch  # only when this machine's device is asked: a config alone (a report, another machine's) needs none

    return torch.cuda.is_available()
