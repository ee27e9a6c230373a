"""What a backtest was asked to do: the data, the model, the origins, the portfolio, the prediction settings.

A `PredictionSetting` is everything about *how* the predictor runs that may
change its output (window mode, autocast, sampling, context). `--compare SPEC`
derives a second setting from the first: SPEC is comma-separated ``key=value``
pairs (keys: window-mode, amp, sample-count, T, top-p, sample-top-k,
max-context, and checkpoint / tokenizer for another model on the same origins) or the shorthands exact,
shift, fp32, bf16, fp16.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kronos_core.launch import LaunchSpec, check_launch
from kronos_core.sizes import size_spec
from kronos_tune.predict.times import exchange_calendar
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.config import InputSpec, check_input_spec

DEVICES = ("auto", "cpu", "cuda")
AMP_CHOICES = ("none", "bf16", "fp16")
DEFAULT_SYNTHETIC_ORIGINS = 20
DEFAULT_MAX_CONTEXT = 512


@dataclass(frozen=True)
class PredictionSetting:
    window_mode: str = "refill"
    amp: str = "none"
    sample_count: int = 1
    temperature: float = 1.0
    top_p: float = 0.9
    sample_top_k: int = 0
    max_context: int | None = None  # None: the model size's context (512 for checkpoints)
    checkpoint: str | None = None   # another model (--compare checkpoint=DIR); None: the run's --checkpoint/--size
    tokenizer: str | None = None    # that model's tokenizer; None: found beside its training run, or --tokenizer

    def label(self) -> str:
        """Short name for tables, naming what the setting is: 'float32', 'bf16 autocast', 'shift float32' (the
        window mode only when it is not the exact refill), then what differs from the defaults."""
        parts = [self.window_mode] if self.window_mode != "refill" else []
        parts.append("float32" if self.amp == "none" else f"{self.amp} autocast")
        for name, default in (("sample_count", 1), ("temperature", 1.0), ("top_p", 0.9), ("sample_top_k", 0),
                              ("max_context", None)):
            value = getattr(self, name)
            if value != default:
                parts.append(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}")
        if self.checkpoint is not None:
            parts.append(f"checkpoint={short_model_name(self.checkpoint)}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def short_model_name(checkpoint: str | Path) -> str:
    """A checkpoint folder's name for tables; a training run's best/ keeps its run's name ('run-1/best')."""
    path = Path(str(checkpoint))
    return f"{path.parent.name}/{path.name}" if path.name == "best" and path.parent.name else path.name or str(path)


SETTING_KEYS: dict[str, tuple[str, type]] = {
    "window-mode": ("window_mode", str), "amp": ("amp", str), "sample-count": ("sample_count", int),
    "t": ("temperature", float), "top-p": ("top_p", float), "sample-top-k": ("sample_top_k", int),
    "max-context": ("max_context", int), "checkpoint": ("checkpoint", str), "tokenizer": ("tokenizer", str),
}
SHORTHANDS: dict[str, tuple[str, str]] = {
    "exact": ("window_mode", "refill"), "refill": ("window_mode", "refill"), "shift": ("window_mode", "shift"),
    "fp32": ("amp", "none"), "bf16": ("amp", "bf16"), "fp16": ("amp", "fp16"),
}


def parse_setting(spec: str, base: PredictionSetting) -> PredictionSetting:
    """The setting `base` with the changes in SPEC (see the module doc)."""
    changes: dict[str, Any] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if item.lower() in SHORTHANDS:
            field_name, value = SHORTHANDS[item.lower()]
            changes[field_name] = value
            continue
        key, sep, raw = item.partition("=")
        key = key.strip().lower().replace("_", "-")
        if not sep or key not in SETTING_KEYS:
            raise KronosTuneError(f"--compare {spec}: '{item}' is not a setting; use key=value with keys "
                                  f"{', '.join(SETTING_KEYS)} or one of {', '.join(SHORTHANDS)}")
        field_name, kind = SETTING_KEYS[key]
        try:
            changes[field_name] = kind(raw.strip())
        except ValueError:
            raise KronosTuneError(f"--compare {spec}: {key}={raw.strip()} is not a {kind.__name__}") from None
    if not changes:
        raise KronosTuneError(f"--compare '{spec}': no change given; e.g. --compare shift, bf16 or sample-count=10")
    return replace(base, **changes)


def check_setting(setting: PredictionSetting, device: str, flag: str) -> None:
    from kronos_core.predict.generation import WINDOW_MODES  # torch: the command's first checks need none

    if setting.window_mode not in WINDOW_MODES:
        raise KronosTuneError(f"{flag}: window mode '{setting.window_mode}'; choose one of {', '.join(WINDOW_MODES)}")
    if setting.amp not in AMP_CHOICES:
        raise KronosTuneError(f"{flag}: amp '{setting.amp}'; choose one of {', '.join(AMP_CHOICES)}")
    if setting.amp == "fp16" and device == "cpu":
        raise KronosTuneError(f"{flag}: amp fp16 needs a CUDA device; use bf16 or none on CPU")
    if setting.sample_count < 1:
        raise KronosTuneError(f"{flag}: sample count {setting.sample_count}; must be at least 1")
    if not setting.temperature > 0 or not math.isfinite(setting.temperature):
        raise KronosTuneError(f"{flag}: temperature {setting.temperature}; must be a number > 0")
    if not 0 < setting.top_p <= 1:
        raise KronosTuneError(f"{flag}: top-p {setting.top_p}; must be in (0, 1]")
    if setting.sample_top_k < 0:
        raise KronosTuneError(f"{flag}: sample top-k {setting.sample_top_k}; must be >= 0 (0 off, 1 greedy)")
    if setting.max_context is not None and setting.max_context < 1:
        raise KronosTuneError(f"{flag}: max context {setting.max_context}; must be at least 1")


@dataclass(frozen=True)
class BacktestConfig(InputSpec):
    """Everything `kronos-tune backtest` was asked to do; see the command's --help for each field."""

    origins: int | None = None
    every: int | str | None = None  # bars, "day", or None = pred_len
    top_k: int = 10
    cost_bps: float = 10.0
    long_only: bool = False
    chunk_series: int | None = None  # symbol-origins per chunk (None: chosen from the job, chunk_size.py)
    nproc: int = 1                 # processes predicting (torchrun ranks claiming chunks)
    max_restarts: int = 0          # torchrun restarts a failed group this many times (it continues)
    nnodes: str | None = None      # torchrun's nodes (--out on storage they share; rank 0's node scores)
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_backend: str | None = None
    device: str = "auto"
    setting: PredictionSetting = PredictionSetting()
    compare: PredictionSetting | None = None
    seed: int = 0
    periods_per_year: float | None = None
    out: Path | None = None
    resume: bool = False
    overwrite: bool = False
    calendar: str | None = None  # exchange calendar for the model's future stamps; None: each symbol's own bars
    symbol_column: str | None = None  # --data files are panels with this column (None: detected, load_universe)
    allow_overlap: bool = False  # score origins inside a checkpoint's training span (marked in-sample)

    @property
    def launch(self) -> LaunchSpec:
        return LaunchSpec(self.nproc, self.nnodes, self.node_rank, self.rdzv_endpoint, self.rdzv_id, self.rdzv_backend,
                          self.max_restarts)

    @property
    def every_bars(self) -> int | str:
        return self.pred_len if self.every is None else self.every

    def max_context(self, setting: PredictionSetting) -> int:
        if setting.max_context is not None:
            return setting.max_context
        return size_spec(self.size).context if self.size is not None else DEFAULT_MAX_CONTEXT

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues (everything that changes its results)."""
        return {
            "data": [str(p) for p in self.data], "synthetic": self.synthetic,
            "model": str(self.checkpoint) if self.checkpoint else self.size,
            "tokenizer": None if self.tokenizer is None else str(self.tokenizer),
            "lookback": self.lookback, "pred_len": self.pred_len, "origins": self.origins,
            "every": self.every_bars, "top_k": self.top_k, "cost_bps": self.cost_bps, "long_only": self.long_only,
            "chunk_series": self.chunk_series, "device": self.device, "seed": self.seed,
            "periods_per_year": self.periods_per_year, "setting": self.setting.to_dict(),
            "compare": None if self.compare is None else self.compare.to_dict(),
            "draws": _draws(), "calendar": self.calendar, "symbol_column": self.symbol_column,
            "date_format": self.date_format, "allow_overlap": self.allow_overlap,
        }

    def model_name(self, setting: PredictionSetting) -> str:
        """Which weights a setting predicts with, for tables: a checkpoint's short name or 'random SIZE'."""
        if setting.checkpoint is not None:
            return short_model_name(setting.checkpoint)
        return short_model_name(self.checkpoint) if self.checkpoint is not None else f"random {self.size}"

    def titles(self, settings: list[PredictionSetting]) -> list[str]:
        """Column titles: the settings' labels, or the model names when the settings differ in the model."""
        labels = [s.label() for s in settings]
        if not any(s.checkpoint is not None for s in settings):
            return labels
        plain = [replace(s, checkpoint=None, tokenizer=None).label() for s in settings]
        names = [self.model_name(s) for s in settings]
        return names if len(set(plain)) == 1 else [f"{n} ({p})" for n, p in zip(names, plain)]


def _draws() -> str:
    from kronos_core.predict.streams import DRAWS  # torch: only where a run's identity is written or compared

    return DRAWS


def check_config(config: BacktestConfig, device: str) -> None:
    """Every flag that can be judged without reading data or weights (`device` already resolved)."""
    check_input_spec(config)
    if not config.data and config.synthetic is None:
        raise KronosTuneError("no universe: give --data (a folder of per-symbol files or one panel file with a "
                              "symbol column) or --synthetic N")
    if config.symbol_column is not None and not config.data:
        raise KronosTuneError("--symbol-column reads panel files; give them with --data")
    if config.synthetic is not None and config.synthetic < 2:
        raise KronosTuneError(f"--synthetic {config.synthetic}: a cross-section needs at least 2 symbols")
    for flag, value in (("--chunk-series", config.chunk_series), ("--top-k", config.top_k), ("--nproc", config.nproc)):
        if value is not None and value < 1:
            raise KronosTuneError(f"{flag} {value}: must be at least 1")
    if config.max_restarts < 0:
        raise KronosTuneError(f"--max-restarts {config.max_restarts}: must be 0 or more")
    if config.max_restarts and not config.launch.launched:
        raise KronosTuneError(f"--max-restarts {config.max_restarts} restarts torchrun's ranks; add --nproc N "
                              f"(2 or more)")
    check_launch(config.launch)  # before anything is written
    if config.launch.multi_node and config.out is None:
        raise KronosTuneError(f"--nnodes {config.nnodes} needs --out DIR on storage every node shares (the same "
                              f"folder on each: the chunks are claimed there, and the node that runs rank 0 scores "
                              f"the run in it)")
    if config.origins is not None and config.origins < 1:
        raise KronosTuneError(f"--origins {config.origins}: ask for at least 1 origin")
    if not math.isfinite(config.cost_bps) or config.cost_bps < 0:
        raise KronosTuneError(f"--cost-bps {config.cost_bps}: a transaction cost must be >= 0 basis points")
    if config.periods_per_year is not None and not config.periods_per_year > 0:
        raise KronosTuneError(f"--periods-per-year {config.periods_per_year}: must be > 0")
    if config.synthetic is not None:
        needed = 2 * config.top_k if not config.long_only else config.top_k
        if needed > config.synthetic:
            raise_top_k(config, config.synthetic)
    if config.device not in DEVICES:
        raise KronosTuneError(f"--device {config.device}: choose one of {', '.join(DEVICES)}")
    check_setting(config.setting, device, "--window-mode/--amp/sampling flags")
    if config.compare is not None:
        check_setting(config.compare, device, "--compare")
    if config.calendar is not None:
        exchange_calendar(config.calendar)


def raise_top_k(config: BacktestConfig, symbols: int) -> None:
    if config.long_only:
        raise KronosTuneError(f"--top-k {config.top_k} is larger than the universe ({symbols} symbols); "
                              f"use --top-k {symbols} or less")
    raise KronosTuneError(f"--top-k {config.top_k}: a long-short book needs 2 x top-k = {2 * config.top_k} symbols "
                          f"but the universe has {symbols}; use --top-k {max(1, symbols // 2)} or less, "
                          f"or --long-only")
