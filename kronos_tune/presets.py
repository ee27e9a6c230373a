"""Presets: one machine (hardware) plus the training and prediction work to run on it, read from TOML.

A preset file has a top-level `name` and `description` and three tables,
`[hardware]`, `[workload]` (fine-tuning: the job the user will run) and
`[predict]` (batch prediction), and an optional `[benchmark]` table: how long
`kronos-tune benchmark` may measure each trial, kept apart from the workload
it measures for; `presets/*.toml` in the repository holds the built-in ones.

Units: every `*_gb` key is in GiB (2**30 bytes), because that is what a
"12 GB" graphics card actually has (12288 MiB) and what `nvidia-smi` and
`torch.cuda.mem_get_info` count in. `*_tflops` keys are 10**12 FLOP/s, dense
(no 2:4 sparsity), per device.

Lookup: the built-in folder comes first, then the folders in the environment
variable KRONOS_TUNE_PRESET_DIR (os.pathsep separated), then `--preset-dir`
folders; a later preset with the same `name` replaces an earlier one.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shlex
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kronos_tune
from kronos_core.errors import KronosError
from kronos_core.files import dumps_toml, load_toml
from kronos_core.sizes import SIZES
from kronos_core.validate import check_known_keys, check_value
from kronos_tune.errors import KronosTuneError

MODEL_SIZES: tuple[str, ...] = ("tiny", *(name for name in SIZES if name != "tiny"))  # tiny: the tests' size
DEVICES: tuple[str, ...] = ("cuda", "cpu")
TOKENIZERS: tuple[str, ...] = ("base", "2k", "tiny")
AMP_MODES: tuple[str, ...] = ("none", "bf16", "fp16")
PEAK_DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")
PRESET_DIR_ENV = "KRONOS_TUNE_PRESET_DIR"
BF16_AUTO = "auto"
BYTES_PER_GIB = 2**30

_TOP_KEYS = ("name", "description", "hardware", "workload", "predict", "benchmark")
_HARDWARE_KEYS = (
    "device", "device_count", "memory_per_device_gb", "bf16_supported", "peak_tflops",
    "peak_tflops_source", "cuda_context_overhead_gb", "interconnect",
)
_WORKLOAD_KEYS = (
    "model_size", "tokenizer", "lookback_window", "predict_window", "batch_size",
    "accumulation_steps", "epochs", "samples_per_epoch", "eval_samples", "amp", "trial_timeout_s",
)
_PREDICT_KEYS = ("series_count", "lookback", "pred_len", "sample_count")
_BENCHMARK_KEYS = ("trial_budget_s", "resolution_budget_s", "trial_timeout_s")
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MISSING: Any = object()


@dataclass(frozen=True)
class HardwareSpec:
    """One machine: `device_count` identical devices of `memory_per_device_gb` GiB each."""

    device: str
    device_count: int
    memory_per_device_gb: float
    bf16_supported: bool | str  # true / false as the preset forces it, or "auto": the device the run uses decides
    cuda_context_overhead_gb: float
    peak_fp32_tflops: float | None = None
    peak_tf32_tflops: float | None = None
    peak_bf16_tflops: float | None = None
    peak_fp16_tflops: float | None = None
    peak_tflops_source: str | None = None
    interconnect: str | None = None

    @property
    def memory_per_device_bytes(self) -> int:
        return round(self.memory_per_device_gb * BYTES_PER_GIB)

    @property
    def cuda_context_overhead_bytes(self) -> int:
        return round(self.cuda_context_overhead_gb * BYTES_PER_GIB)

    @property
    def budget_bytes(self) -> int:
        """Bytes per device left for weights, activations and optimizer state after the CUDA context."""
        return self.memory_per_device_bytes - self.cuda_context_overhead_bytes

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak of one device in TFLOP/s for `dtype` (fp32, tf32, bf16, fp16); None if unknown."""
        if dtype not in PEAK_DTYPES:
            choices = ", ".join(PEAK_DTYPES)
            raise KronosTuneError(f"unknown dtype '{dtype}' for a peak FLOP/s figure; use one of {choices}")
        value: float | None = getattr(self, f"peak_{dtype}_tflops")
        return value

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak of one device in FLOP/s for `dtype`; None when the preset gives no figure (MFU unknown)."""
        tflops = self.peak_tflops(dtype)
        return None if tflops is None else tflops * 1e12


@dataclass(frozen=True)
class TrainWorkload:
    """A fine-tuning run in the shape of the reference finetune script (windows in time steps)."""

    model_size: str
    tokenizer: str
    lookback_window: int
    predict_window: int
    batch_size: int
    accumulation_steps: int
    epochs: int
    samples_per_epoch: int
    eval_samples: int
    amp: str = "none"
    trial_timeout_s: float | None = None  # the benchmark's per-trial watchdog; None: DEFAULT_TRIAL_TIMEOUT_S

    @property
    def context_tokens(self) -> int:
        """The longest sequence the model size accepts."""
        return SIZES[self.model_size].context

    @property
    def window_tokens(self) -> int:
        """Time steps in one training sample: lookback + predict + 1 (inputs and shifted targets)."""
        return self.lookback_window + self.predict_window + 1


@dataclass(frozen=True)
class PredictWorkload:
    """Batch prediction: `series_count` series, `lookback` steps in, `pred_len` steps out, `sample_count` paths each."""

    series_count: int
    lookback: int
    pred_len: int
    sample_count: int


@dataclass(frozen=True)
class BenchmarkBudget:
    """The benchmark's own measuring budget (not the workload's size): seconds of measuring per trial and the
    per-trial watchdog; None: the benchmark's defaults for the device. ``resolution_budget_s`` is the A/A
    comparison's (the noise-probe against the baseline): it states the smallest change the run can resolve for
    every other comparison, so it gets more rounds (default: 3 x the trial budget)."""

    trial_budget_s: float | None = None
    resolution_budget_s: float | None = None
    trial_timeout_s: float | None = None


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    hardware: HardwareSpec
    workload: TrainWorkload
    predict: PredictWorkload
    source_path: Path | None = None
    benchmark: BenchmarkBudget = BenchmarkBudget()
    job: dict[str, Any] | None = None  # `benchmark --config`: the user's finetune (kronos_tune.benchmark.user_job)

    @property
    def budget_bytes(self) -> int:
        """Per-device memory budget in bytes (see HardwareSpec.budget_bytes)."""
        return self.hardware.budget_bytes

    def peak_flops(self, dtype: str) -> float | None:
        """Per-device dense peak FLOP/s for `dtype`, or None when unknown."""
        return self.hardware.peak_flops(dtype)

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all devices."""
        return self.workload.batch_size * self.workload.accumulation_steps * self.hardware.device_count


class _Table:
    """One TOML table under validation; every error names the file and the dotted key."""

    def __init__(self, path: Path, prefix: str, data: Any, allowed: tuple[str, ...]) -> None:
        self.path, self.prefix = path, prefix
        header = f"[{prefix[:-1]}]" if prefix else "the top of the file"
        if prefix:
            check_value(prefix[:-1], data, dict, where=str(path), error=KronosTuneError)
        self.data: dict[str, Any] = data
        self.where = f"under {header}" if prefix else "at the top of the file"
        check_known_keys(data, allowed, where=str(path), prefix=prefix, error=KronosTuneError,
                         fix=f"rename or remove it (valid keys {self.where}: {', '.join(allowed)})")

    def fail(self, key: str, problem: str, fix: str) -> KronosTuneError:
        return KronosTuneError(f"{self.path}: {self.prefix}{key} {problem}; {fix}")

    def _get(self, key: str, default: Any, example: str) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise self.fail(key, "is missing", f"add `{key} = {example}` {self.where}")
        return default

    def _typed(self, key: str, value: Any, kind: type, example: Any) -> Any:
        if value is None:  # an optional key left out
            return value
        return check_value(self.prefix + key, value, kind, where=str(self.path), example=example,
                           error=KronosTuneError)

    def section(self, key: str) -> Any:
        """A required sub-table, validated by its own _Table."""
        if key not in self.data:
            header = f"[{self.prefix}{key}]"
            raise KronosTuneError(f"{self.path}: {header} table is missing; add a {header} section")
        return self.data[key]

    def integer(self, key: str, minimum: int, default: Any = _MISSING) -> int:
        value = self._get(key, default, str(max(minimum, 1)))
        value = self._typed(key, value, int, max(minimum, 1))
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum} (got {value})", f"set it to {minimum} or more")
        return value

    def number(self, key: str, *, positive: bool, default: Any = _MISSING) -> float:
        value = self._typed(key, self._get(key, default, "1.0"), float, 1.0)
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "> 0" if positive else ">= 0"
            raise self.fail(key, f"must be {bound} (got {value})", f"set it to a number {bound}")
        return float(value)

    def string(self, key: str, choices: tuple[str, ...] | None = None, default: Any = _MISSING) -> str:
        value = self._get(key, default, f'"{choices[0]}"' if choices else '"..."')
        value = self._typed(key, value, str, choices[0] if choices else "...")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)} (got '{value}')", "pick one of those")
        return value


def _parse_hardware(path: Path, data: Any) -> HardwareSpec:
    table = _Table(path, "hardware.", data, _HARDWARE_KEYS)
    memory_gb = table.number("memory_per_device_gb", positive=True)
    overhead_gb = table.number("cuda_context_overhead_gb", positive=False)
    if overhead_gb >= memory_gb:
        problem = f"({overhead_gb}) must be below memory_per_device_gb ({memory_gb})"
        raise table.fail("cuda_context_overhead_gb", problem, "lower it")
    peaks: dict[str, float] = {}
    if "peak_tflops" in table.data:
        peak_table = _Table(path, "hardware.peak_tflops.", table.data["peak_tflops"], PEAK_DTYPES)
        peaks = {f"peak_{dtype}_tflops": peak_table.number(dtype, positive=True) for dtype in peak_table.data}
    source = table.string("peak_tflops_source") if "peak_tflops_source" in table.data else None
    if peaks and not source:
        fix = 'add `peak_tflops_source = "<datasheet or whitepaper>"` under [hardware]'
        raise table.fail("peak_tflops_source", "is missing", fix)
    interconnect = table.string("interconnect") if "interconnect" in table.data else None
    return HardwareSpec(
        device=table.string("device", DEVICES),
        device_count=table.integer("device_count", 1),
        memory_per_device_gb=memory_gb,
        bf16_supported=_bf16_setting(table),
        cuda_context_overhead_gb=overhead_gb,
        peak_tflops_source=source,
        interconnect=interconnect,
        **peaks,
    )


def _bf16_setting(table: _Table) -> bool | str:
    """hardware.bf16_supported: true, false, or "auto" (the default: decided on the device a run uses)."""
    value = table.data.get("bf16_supported", BF16_AUTO)
    if value == BF16_AUTO or isinstance(value, bool):
        return value
    raise table.fail("bf16_supported", f"must be true, false or \"{BF16_AUTO}\" (got {value!r})",
                     f'set it to "{BF16_AUTO}" (detected on the device the run uses) or true / false to force it')


def _parse_workload(path: Path, data: Any, hardware: HardwareSpec) -> TrainWorkload:
    table = _Table(path, "workload.", data, _WORKLOAD_KEYS)
    size = table.string("model_size", MODEL_SIZES)
    tokenizer = table.string("tokenizer", TOKENIZERS)
    if tokenizer != SIZES[size].tokenizer:
        fix = f'set tokenizer = "{SIZES[size].tokenizer}"'
        raise table.fail("tokenizer", f"'{tokenizer}' does not fit model_size '{size}'", fix)
    workload = TrainWorkload(
        model_size=size,
        tokenizer=tokenizer,
        lookback_window=table.integer("lookback_window", 1),
        predict_window=table.integer("predict_window", 1),
        batch_size=table.integer("batch_size", 1),
        accumulation_steps=table.integer("accumulation_steps", 1),
        epochs=table.integer("epochs", 1),
        samples_per_epoch=table.integer("samples_per_epoch", 1),
        eval_samples=table.integer("eval_samples", 0),
        amp=table.string("amp", AMP_MODES, default="none"),
        trial_timeout_s=table.number("trial_timeout_s", positive=True) if "trial_timeout_s" in table.data else None,
    )
    if workload.window_tokens > workload.context_tokens:
        raise table.fail(
            "lookback_window",
            f"+ predict_window + 1 = {workload.window_tokens} exceeds the {workload.context_tokens}-token context"
            f" of model_size '{size}'",
            "shorten lookback_window or predict_window",
        )
    per_step = workload.batch_size * workload.accumulation_steps * hardware.device_count
    if workload.samples_per_epoch < per_step:
        raise table.fail(
            "samples_per_epoch",
            f"({workload.samples_per_epoch}) is less than one optimizer step"
            f" (batch_size x accumulation_steps x device_count = {per_step})",
            f"set it to at least {per_step}",
        )
    if workload.amp == "bf16" and hardware.bf16_supported is False:
        raise table.fail("amp", "is 'bf16' but hardware.bf16_supported is false", 'use amp = "fp16" or "none"')
    return workload


def _parse_predict(path: Path, data: Any, context_tokens: int) -> PredictWorkload:
    table = _Table(path, "predict.", data, _PREDICT_KEYS)
    predict = PredictWorkload(
        series_count=table.integer("series_count", 1),
        lookback=table.integer("lookback", 1),
        pred_len=table.integer("pred_len", 1),
        sample_count=table.integer("sample_count", 1),
    )
    if predict.lookback > context_tokens:
        problem = f"({predict.lookback}) exceeds the {context_tokens}-token model context"
        raise table.fail("lookback", problem, f"set it to {context_tokens} or less")
    return predict


def _parse_benchmark(path: Path, data: Any) -> BenchmarkBudget:
    table = _Table(path, "benchmark.", data, _BENCHMARK_KEYS)
    return BenchmarkBudget(**{key: table.number(key, positive=True) for key in _BENCHMARK_KEYS if key in table.data})


def parse_preset(data: dict[str, Any], path: Path) -> Preset:
    """Validate an already-parsed TOML document; `path` only names the file in errors."""
    top = _Table(path, "", data, _TOP_KEYS)
    name = top.string("name")
    if not _NAME_PATTERN.fullmatch(name):
        raise top.fail("name", f"'{name}' is not a usable preset name", "use letters, digits, '.', '-' and '_' only")
    description = top.string("description")
    hardware = _parse_hardware(path, top.section("hardware"))
    workload = _parse_workload(path, top.section("workload"), hardware)
    predict = _parse_predict(path, top.section("predict"), workload.context_tokens)
    benchmark = _parse_benchmark(path, data["benchmark"]) if "benchmark" in data else BenchmarkBudget()
    return Preset(name, description, hardware, workload, predict, source_path=path, benchmark=benchmark)


def load_preset_file(path: Path | str) -> Preset:
    """Read and validate one preset file; every problem is a one-line KronosTuneError naming the file and key."""
    path = Path(path)
    try:
        data = load_toml(path, what="preset file", fix="check the path (kronos-tune presets lists the known presets)")
    except KronosError as error:
        raise KronosTuneError(str(error)) from None
    return parse_preset(data, path)


INSTALLED_PRESET_SUBDIR = Path("share", "kronos-tune", "presets")  # pyproject's data-files target


def builtin_preset_dir() -> Path:
    """The built-in presets: the repository's `presets/` folder in a checkout or an
    editable install, else the copy a wheel installed under the environment's data
    path (`<prefix>/share/kronos-tune/presets`, or the user scheme's for --user)."""
    checkout = Path(kronos_tune.__file__).resolve().parent.parent / "presets"
    if checkout.is_dir():
        return checkout
    schemes = [sysconfig.get_default_scheme(), f"{os.name}_user"]
    candidates = [Path(sysconfig.get_path("data", scheme)) / INSTALLED_PRESET_SUBDIR for scheme in schemes]
    candidates.append(Path(sys.prefix) / INSTALLED_PRESET_SUBDIR)
    return next((folder for folder in candidates if folder.is_dir()), checkout)


def _checked_dir(raw: str | Path, origin: str) -> Path:
    folder = Path(raw).expanduser()
    if not folder.is_dir():
        problem = f"preset directory '{folder}' does not exist or is not a folder"
        raise KronosTuneError(f"{origin}: {problem}; create it or fix the path")
    return folder


def preset_dirs(extra: list[Path] | None = None) -> list[Path]:
    """Folders searched for presets, lowest priority first: built-in, KRONOS_TUNE_PRESET_DIR, then `extra`."""
    builtin = builtin_preset_dir()
    dirs = [builtin] if builtin.is_dir() else []
    env_value = os.environ.get(PRESET_DIR_ENV, "")
    dirs += [_checked_dir(entry, PRESET_DIR_ENV) for entry in env_value.split(os.pathsep) if entry.strip()]
    dirs += [_checked_dir(entry, "--preset-dir") for entry in extra or []]
    return dirs


def list_presets(extra_dirs: list[Path] | None = None) -> list[Preset]:
    """Every preset by name, later folders overriding earlier ones; sorted by name."""
    by_name: dict[str, Preset] = {}
    for folder in preset_dirs(extra_dirs):
        seen_here: dict[str, Path] = {}
        for file in sorted(folder.glob("*.toml")):
            preset = load_preset_file(file)
            if preset.name in seen_here:
                problem = f"name '{preset.name}' is also used by {seen_here[preset.name]}"
                raise KronosTuneError(f"{file}: {problem}; give each preset in {folder} its own name")
            seen_here[preset.name] = file
            by_name[preset.name] = preset
    return [by_name[name] for name in sorted(by_name)]


def plan_command(preset: Preset) -> str:
    """`kronos-tune plan` for this preset: by name when it is built in, else by its file."""
    source = preset.source_path
    builtin = source is None or Path(source).parent == builtin_preset_dir()
    return f"kronos-tune plan --preset {shlex.quote(preset.name if builtin else str(source))}"


def resolve_preset(name_or_path: str | Path, extra_dirs: list[Path] | None = None) -> Preset:
    """A preset by name, or by path when the argument ends in .toml or contains a path separator."""
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or text.endswith(".toml") or "/" in text or os.sep in text:
        return load_preset_file(Path(text).expanduser())
    presets = {preset.name: preset for preset in list_presets(extra_dirs)}
    if text in presets:
        return presets[text]
    close = difflib.get_close_matches(text, list(presets), n=3, cutoff=0.5)
    hint = f"did you mean: {', '.join(close)}?" if close else f"known presets: {', '.join(presets) or 'none'}"
    raise KronosTuneError(f"unknown preset '{text}'; {hint} (kronos-tune presets lists them)")


def preset_to_dict(preset: Preset) -> dict[str, Any]:
    """The TOML document of a preset, defaults filled in and unset optional keys left out."""
    hw = preset.hardware
    scalar_keys = [key for key in _HARDWARE_KEYS if key != "peak_tflops" and getattr(hw, key) is not None]
    hardware: dict[str, Any] = {key: getattr(hw, key) for key in scalar_keys}
    peaks = {dtype: hw.peak_tflops(dtype) for dtype in PEAK_DTYPES if hw.peak_tflops(dtype) is not None}
    if peaks:
        hardware["peak_tflops"] = peaks
    wl, pr = preset.workload, preset.predict
    out = {
        "name": preset.name,
        "description": preset.description,
        "hardware": hardware,
        "workload": {key: getattr(wl, key) for key in _WORKLOAD_KEYS if getattr(wl, key) is not None},
        "predict": {key: getattr(pr, key) for key in _PREDICT_KEYS},
    }
    bench = {key: getattr(preset.benchmark, key) for key in _BENCHMARK_KEYS if getattr(preset.benchmark, key)}
    if bench:
        out["benchmark"] = bench
    return out


def preset_to_toml(preset: Preset) -> str:
    """TOML text that load_preset_file reads back to an equal preset."""
    return dumps_toml(preset_to_dict(preset))
